"""How candidates become a ranking, for facts and turns alike: pure functions over their signals.

Each signal is normalised within the candidate batch, then weighted into one ``total``;
ties keep the candidates' incoming order. Facts (:func:`fuse_facts`, weighted by
``[memory.retrieval]`` through :class:`Weights`):

* bm25: min-max over the batch; 1.0 for all when the scores are equal;
* recency: rank of the fact id among the batch's ids, ``i/(n-1)`` (newest 1.0;
  a lone candidate 1.0);
* importance: ``importance/10``; 0.5 when the fact has none;
* embedding: ``(cos+1)/2`` against the cue; 0.5 for a fact with no stored vector
  under the active model.

``total = sum(weight x signal)``; ties keep BM25 order. Turns (:func:`fuse_turns`): BM25
and cosine, each min-max normalised over the union of both candidate lists, summed with
``bm25_weight`` and ``turn_embedding_weight`` (``turn_fusion = "rrf"`` swaps in reciprocal
rank fusion, :func:`rrf_turns`, which measured worse: docs/benchmarks.md, "What each idea
gained or lost").

Also the refetch bounds both rankings share: a ranking is redone on a deeper candidate
list while retired, deleted or other scopes' rows crowd its candidates out.

Apart from the modules that read candidates (:mod:`facts`, :mod:`turns`) so the scoring is
one place with no reads: the debug structure shows these dicts as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NEUTRAL = 0.5
MAX_REFETCH_ROUNDS = 3
# More rounds (each 4x deeper) while other scopes' rows crowd the candidates out: a
# scope with few rows in a large familiar still fills its section from its own rows.
SCOPE_REFETCH_ROUNDS = 2


@dataclass(frozen=True)
class Weights:
    bm25: float = 1.0
    recency: float = 0.0
    importance: float = 0.0
    embedding: float = 0.0

    @classmethod
    def from_config(cls, retrieval) -> "Weights":
        return cls(retrieval.bm25_weight, retrieval.recency_weight,
                   retrieval.importance_weight, retrieval.embedding_weight)

    def as_dict(self) -> dict[str, float]:
        return {"bm25": self.bm25, "recency": self.recency,
                "importance": self.importance, "embedding": self.embedding}


def fuse_facts(
    candidates: list[tuple[int, float, int | None]],
    similarities: dict[int, float],
    weights: Weights,
) -> list[dict[str, Any]]:
    """Score ``(fact_id, bm25, importance)`` candidates given in BM25 order.

    ``similarities`` holds the cosine of each fact that has a vector. Returns one
    dict per candidate (signals, ``total``, ``candidate_index``), best first.
    """
    if not candidates:
        return []
    scores = [c[1] for c in candidates]
    low, high = min(scores), max(scores)
    ids_sorted = sorted({c[0] for c in candidates})
    rank = {fid: (i / (len(ids_sorted) - 1) if len(ids_sorted) > 1 else 1.0) for i, fid in enumerate(ids_sorted)}
    scored = []
    for index, (fid, bm25_raw, importance) in enumerate(candidates):
        bm25 = (bm25_raw - low) / (high - low) if high > low else 1.0
        imp = NEUTRAL if importance is None else max(0.0, min(1.0, importance / 10))
        emb = (similarities[fid] + 1) / 2 if fid in similarities else NEUTRAL
        total = (weights.bm25 * bm25 + weights.recency * rank[fid]
                 + weights.importance * imp + weights.embedding * emb)
        scored.append({"fact_id": fid, "bm25_raw": bm25_raw, "bm25": bm25, "recency": rank[fid],
                       "importance": imp, "embedding": emb, "has_vector": fid in similarities,
                       "total": total, "candidate_index": index})
    scored.sort(key=lambda s: (-s["total"], s["candidate_index"]))
    return scored


def fuse_turns(bm25: dict[int, float], cosines: dict[int, float], bm25_weight: float,
               embedding_weight: float, order: list[int]) -> list[dict[str, Any]]:
    """Weighted sum of min-max normalised BM25 and cosine over the candidate union, best first.

    ``order`` is the union in first-seen order (BM25 hits first), which breaks
    ties. A turn outside the BM25 hits scores 0 on that signal (it ranked below
    every hit). ``cosines`` should hold the cosine of *every* candidate, the
    BM25-only ones too: a BM25 hit given a made-up neutral cosine instead of
    its own was ranked as if it were average (docs/benchmarks.md, "Baseline vs
    product", missing cosines). Only a turn with no vector at all gets the
    neutral 0.5. Measured on LoCoMo, this beat reciprocal rank fusion.
    """
    def normalised(values: dict[int, float]) -> dict[int, float]:
        if not values:
            return {}
        low, high = min(values.values()), max(values.values())
        return {k: ((v - low) / (high - low) if high > low else 1.0) for k, v in values.items()}

    nb, nc = normalised(bm25), normalised(cosines)
    scored: list[dict[str, Any]] = []
    for index, tid in enumerate(order):
        b = nb.get(tid, 0.0)
        c = nc.get(tid, NEUTRAL) if cosines else NEUTRAL
        total = bm25_weight * b + (embedding_weight * c if cosines else 0.0)
        scored.append({"turn_id": tid, "bm25": bm25.get(tid), "cosine": cosines.get(tid),
                       "total": total, "candidate_index": index})
    scored.sort(key=lambda s: (-s["total"], s["candidate_index"]))
    return scored


RRF_K = 60


def rrf_turns(bm25: dict[int, float], cosines: dict[int, float], bm25_weight: float,
              embedding_weight: float, order: list[int]) -> list[dict[str, Any]]:
    """Reciprocal rank fusion, ``sum(weight / (60 + rank))``: the alternative that measured worse."""
    rank_b = {t: i for i, t in enumerate(sorted(bm25, key=lambda t: -bm25[t]), start=1)}
    rank_c = {t: i for i, t in enumerate(sorted(cosines, key=lambda t: -cosines[t]), start=1)}
    scored: list[dict[str, Any]] = []
    for index, tid in enumerate(order):
        total = ((bm25_weight / (RRF_K + rank_b[tid]) if tid in rank_b else 0.0)
                 + (embedding_weight / (RRF_K + rank_c[tid]) if tid in rank_c else 0.0))
        scored.append({"turn_id": tid, "bm25": bm25.get(tid), "cosine": cosines.get(tid),
                       "total": total, "candidate_index": index})
    scored.sort(key=lambda s: (-s["total"], s["candidate_index"]))
    return scored
