"""Retrieval for ``rag_context``: facts ranked by fused signals, plus earlier turns.

Facts. Candidates come from ``fts/facts`` (the cue's analyzer tokens OR-ed, so
any text is a valid query), over-fetched ``fact_overfetch x max_rag_facts`` and
filtered to current facts through the snapshot (the index keeps retired facts;
the snapshot knows which are retired or expired). Each signal is normalised
within the candidate batch, then weighted by ``[memory.retrieval]``:

* bm25: min-max over the batch; 1.0 for all when the scores are equal;
* recency: rank of the fact id among the batch's ids, ``i/(n-1)`` (newest 1.0;
  a lone candidate 1.0);
* importance: ``importance/10``; 0.5 when the fact has none;
* embedding: ``(cos+1)/2`` against the cue; 0.5 for a fact with no stored vector
  under the active model (``embedder.name``). The cue is embedded only when the
  weight is positive *and* some candidate has a vector, so a cold side-index
  costs no model call.

``total = sum(weight x signal)``; ties keep BM25 order. Every candidate's signals
go into the debug structure so ``/context`` can explain a ranking.

Turns. Candidates are the top ``turn_candidates`` hits from ``fts/turns`` (which
indexes "speaker: text") and, when the opt-in ``turn_embedding`` projection is
active with ``turn_embedding_weight > 0``, the top ``turn_candidates`` turns by
cosine to the cue (one matrix product over the snapshot's turn vectors). Every
candidate gets its own cosine, BM25 hits included, blended with the mean cosine
of its context window (``turn_context``: the turn and its ``turn_context_span``
nearest same-channel turns each side). A long turn with passage vectors (the opt-in
``turn_passage_embedding`` projection) has the larger of that cosine and
``turn_passage_weight`` x its best passage's: one vector per long reply reads only its
opening, its passages read the rest (one product over the passage matrix per reply, aggregated
per turn with ``np.maximum.at``). Over the union each signal is min-max
normalised and the two are summed with ``bm25_weight`` and
``turn_embedding_weight`` (``turn_fusion = "rrf"`` swaps in reciprocal rank
fusion, which measured worse on LoCoMo: docs/benchmarks.md). What the words
cannot say is added next (:mod:`familiar_bot.prompt.turn_signals`): who the cue
names (their turns count, turns addressed to them do not), when (turns said in a
window the cue names; those turns also join the candidates by cosine), and the
reply after a matching question; the best candidates are then re-ordered by their
substance (:mod:`familiar_bot.prompt.substance`: a short pleasantry or a question
gives way to a turn with content), unless the scope reads as a person talking with the
familiar (:mod:`familiar_bot.prompt.genre`: its long replies then weigh less, substance is off,
and a request for advice favours the person's own taste). The ranked turns
are then filtered: minus the turns ``recent_history`` already shows
(the ids actually in that window, not id arithmetic: ids are global across
channels) and minus deleted turns; only turns said in the reply's visible scopes
(:mod:`~familiar_bot.prompt.scoping`: its own server or DM, plus what
``[memory.scopes]`` joins) are candidates at all, filtered by id before any row
is read and, for the cosine search, by a per-snapshot row mask, so other scopes'
turns never crowd a small scope out. Facts are filtered the same way by their
``scope`` column. Each of the best
``turn_neighbour_hits`` hits brings its ``turn_neighbours`` nearest neighbours
before and after in the same channel (the rest come alone);
hits join in rank order while they and their neighbours fit the section's
token budget (a long turn as its passage that best matches the cue's words, else the one
whose vector matched it: :mod:`familiar_bot.prompt.passages`), and the lot is grouped by date in ``display_tz``. The debug
structure records which facts and turns survived the token cut
(``shown_fact_ids``, ``shown_turn_ids``), which the LoCoMo evaluation scores as rendered recall.

One module (~700 lines) because ranking, the token cut and the debug structure share every
candidate's signals; what the cue says about people and time is read apart (``cue_people``,
``cue_time``, ``turn_signals``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

import numpy as np

from familiar_pipeline.models.embedders import cosines as cue_cosines
from familiar_pipeline.models.embedders import row_dots
from familiar_pipeline.projectors.fact_embeddings.tables import fact_vector_count
from familiar_pipeline.projectors.fact_embeddings.tables import vectors_in as fact_vectors
from familiar_pipeline.projectors.facts.reads import current_facts
from familiar_pipeline.projectors.turn_embeddings.tables import turn_matrix
from familiar_pipeline.projectors.turn_passage_embeddings.tables import passage_matrix
from familiar_pipeline.projectors.turn_windows.tables import context_turn_matrix
from familiar_pipeline.storage.passages import long_turn_spans
from familiar_pipeline.storage.scopes import turn_visible
from familiar_pipeline.storage.turns import context_windows

from familiar_bot.prompt.cue_people import PeopleCue, read_people
from familiar_bot.prompt.cue_time import TimeCue, parse_time_cue
from familiar_bot.prompt.genre import (FAMILIAR, PEOPLE, Genre, asks_advice, asks_its_words, is_familiars,
                                      scope_genre, tells_taste)
from familiar_bot.prompt.layers.common import Labels, clock_12h, local_date, one_line
from familiar_bot.prompt.passages import cue_tokens, shown_part
from familiar_bot.prompt.scoping import keep_ids, visible_fact_ids, visible_scopes
from familiar_bot.prompt.spread import asks_for_many, asks_for_order, spread_days
from familiar_bot.prompt.substance import rerank_by_substance
from familiar_bot.prompt.threads import asks_for_now, follow_threads
from familiar_bot.prompt.tokens import cap_blocks, estimate_tokens, truncate_to_tokens
from familiar_bot.prompt.turn_signals import (CueSignals, add_signals, credit_replies,
                                              next_replies, window_id_ranges)

FACTS_HEADER = "## Possibly relevant facts"
TURNS_HEADER = "## Possibly relevant earlier turns"
# When a thread was followed (a later turn on the same subject lifted above an earlier one,
# :mod:`threads`), the days are listed newest first and the header says so, so the reply
# can tell the current word from the old one ("it used to be the 7th, now the 14th").
NEWEST_FIRST_HEADER = TURNS_HEADER + " (newest first: a later turn may update an earlier one)"
NEUTRAL = 0.5
NEIGHBOUR_SPAN = 3  # how far (in ids) to look for a hit's same-channel neighbours
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


# --------------------------------------------------------------------------- fusion (pure)


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


# --------------------------------------------------------------------------- facts


def current_fact_rows(snapshot, ids, now: datetime) -> dict:
    """``{id: Fact}`` for the facts among ``ids`` that are current at ``now`` (the snapshot's ``FactView``)."""
    if not ids:
        return {}
    return {f.id: f for f in current_facts(snapshot, now, ids=ids)}


def _all_fact_ids(snapshot) -> np.ndarray:
    snap = snapshot.current()
    return snap.cached(("scope-all-ids", "facts"), lambda: np.unique(
        np.asarray(snap.table("facts")["id"].to_numpy(), dtype=np.int64)))


def _current_candidates(cue: str, memory, limit: int, wanted: int,
                        visible: tuple[str, ...] | None = None) -> tuple[list[tuple[Any, float]], int, int]:
    """``[(fact, bm25)]`` of current facts in BM25 order, fetching more while retired ones (or, with
    ``visible``, other scopes' facts) crowd the top; plus the hits fetched and the hits whose scope
    is not visible (filtered by id before any row is read)."""
    now = datetime.now(timezone.utc)
    fetch = limit
    allowed = None if visible is None else visible_fact_ids(memory, visible)
    excluded = 0
    round_ = 0
    while True:
        hits = memory.fts_facts.search(cue, fetch)
        if allowed is not None:
            ids = [h[0] for h in hits]
            keep = keep_ids(ids, allowed)
            excluded = int((~keep & keep_ids(ids, _all_fact_ids(memory.snapshot))).sum())
            hits_here = [h for h, k in zip(hits, keep) if k]
        else:
            hits_here = hits
        rows = current_fact_rows(memory.snapshot, [h[0] for h in hits_here], now)
        found = [(rows[fid], score) for fid, score in hits_here if fid in rows]
        round_ += 1
        rounds = MAX_REFETCH_ROUNDS + (SCOPE_REFETCH_ROUNDS if excluded else 0)
        if len(found) >= wanted or len(hits) < fetch or round_ >= rounds:
            return found[:limit], len(hits), excluded
        fetch *= 4


def _similarities(cue: str, memory, fact_ids: list[int]) -> tuple[dict[int, float], bool]:
    """Cosines for candidates with a stored vector; embeds the cue only if there is one."""
    embedder = memory.embedder
    vectors = fact_vectors(memory.snapshot, embedder.name, fact_ids)
    if not vectors:
        return {}, False
    cue_vec = memory.cue_vector(cue)
    return cue_cosines(cue_vec, vectors), True


def retrieve_facts(cue: str, memory, budget, visible: tuple[str, ...] | None = None) -> tuple[list, dict[str, Any]]:
    """The top ``max_rag_facts`` current facts for ``cue`` and the scoring debug; with
    ``visible``, only facts whose scope is among those scopes."""
    retrieval = memory.config.memory.retrieval
    weights = Weights.from_config(retrieval)
    if weights.embedding > 0 and memory.embedder is None:
        # The shipped weight is inert while fact embeddings are off; warn only when they are on.
        if not memory.config.memory.is_active("fact_embedding"):
            weights = Weights(weights.bm25, weights.recency, weights.importance, 0.0)
    if weights.embedding > 0 and memory.embedder is None:
        memory.warn_once(
            "rag-no-embedder",
            "[memory.retrieval].embedding_weight=%.2f but no embedder is configured "
            "([providers.embedding].backend is off); ranking facts without the embedding signal",
            weights.embedding,
        )
        weights = Weights(weights.bm25, weights.recency, weights.importance, 0.0)
    max_facts = budget.max_rag_facts
    found, fetched, out_of_scope = _current_candidates(cue, memory, retrieval.fact_overfetch * max_facts,
                                                       max_facts, visible)
    facts = {f.id: f for f, _ in found}
    similarities: dict[int, float] = {}
    embedded = False
    if weights.embedding > 0 and found:
        similarities, embedded = _similarities(cue, memory, list(facts))
    scored = fuse_facts([(f.id, s, f.importance) for f, s in found], similarities, weights)
    for position, s in enumerate(scored):
        s["selected"] = position < max_facts
        s["text"] = facts[s["fact_id"]].text
    debug = {"cue": cue, "weights": weights.as_dict(), "embedded_cue": embedded,
             "fetched_facts": fetched, "facts": scored, "scope_excluded_facts": out_of_scope}
    return [facts[s["fact_id"]] for s in scored[:max_facts]], debug


def rename_note(fact, labels: Labels) -> str:
    """``" (Cass is now known as peeks)"`` for subjects whose name changed since the fact was written."""
    notes = []
    seen = set()
    for subject in fact.subjects:
        key, then = subject.canonical_key, one_line(subject.display_at_write)
        if key in seen or not then:
            continue
        seen.add(key)
        now = labels(key)
        if now in (key.partition(":")[2], then):
            continue
        notes.append(f"{then} is now known as {now}")
    return f" ({'; '.join(notes)})" if notes else ""


# --------------------------------------------------------------------------- turns


def fuse_turns(bm25: dict[int, float], cosines: dict[int, float], bm25_weight: float,
               embedding_weight: float, order: list[int]) -> list[dict[str, Any]]:
    """Weighted sum of min-max normalised BM25 and cosine over the candidate union, best first.

    ``order`` is the union in first-seen order (BM25 hits first), which breaks
    ties. A turn outside the BM25 hits scores 0 on that signal (it ranked below
    every hit). ``cosines`` should hold the cosine of *every* candidate, the
    BM25-only ones too: a BM25 hit given a made-up neutral cosine instead of
    its own lost 5 points any@10 on LoCoMo (docs/benchmarks.md). Only a turn
    with no vector at all gets the neutral 0.5. Measured on LoCoMo: this beat
    reciprocal rank fusion.
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


MAX_CONTEXT_CANDIDATES = 100  # candidates whose cosine is blended with their window (the nearest first)
MAX_WINDOW_ROWS = 20000  # turn vectors scored for a time window named in the cue (the newest of it)


def _dense_turns(cue: str, memory, limit: int, also: list[int],
                 windows: Callable[[list[int]], dict[int, list[int]]] | None = None,
                 cache: dict | None = None, id_ranges: Iterable[tuple[int, int]] = ()) -> dict[int, float]:
    """Cosines of the ``limit`` turns nearest to the cue and of the turns ``also`` (the BM25 hits),
    when turn vectors are on and present.

    With ``turn_context > 0`` each turn's cosine becomes ``(1 - share) x own +
    share x its context window's``: a reply is often about what the turns just
    before it said ("Which one?" after a question about dogs). When the
    ``turn_window_embedding`` projection is on, the window's cosine is that of
    its window vector, precombined with the turn's own into one matrix per
    snapshot (no extra work per reply). Otherwise, with ``windows`` (candidate
    id -> the ids of its context window, itself included), it is the mean of
    the window turns' own cosines, already in the matrix product; only the
    ``MAX_CONTEXT_CANDIDATES`` nearest candidates are blended, so a deep
    refetch does not look up thousands of windows. The nearest turns are
    searched among the newest ``turn_vector_search_rows`` vectors (see
    :class:`TurnScores`); ``also`` gets its cosines wherever it lies. Each of
    ``id_ranges`` (the turns of a time the cue names) adds its own ``limit``
    nearest. ``cache`` keeps the scores for the next refetch round of the same reply.
    """
    retrieval = memory.config.memory.retrieval
    embedder = memory.embedder
    if not _dense_turns_on(memory):
        return {}
    cache = {} if cache is None else cache
    if "sims" not in cache:
        cache["sims"] = _turn_similarities(cue, memory, embedder, cache.get("visible"))
    if cache["sims"] is None:
        return {}
    scores: TurnScores = cache["sims"]
    out = scores.nearest(limit)
    for first, last in id_ranges:
        out.update(scores.nearest_in(first, last, limit))
    if also:
        out.update(scores.of(also))
    if scores.blended or windows is None or retrieval.turn_context <= 0 or not out:
        return out
    share = retrieval.turn_context
    window = windows(sorted(out, key=lambda t: -out[t])[:MAX_CONTEXT_CANDIDATES])
    around = scores.of({t for members in window.values() for t in members})
    for tid, own in out.items():
        near = [around[t] for t in window.get(tid, ()) if t in around]
        if near:
            out[tid] = (1 - share) * own + share * sum(near) / len(near)
    return out


def _dense_turns_on(memory) -> bool:
    """Whether turns are ranked by cosine too (``turn_embedding`` on, a positive weight, an embedder)."""
    return (memory.config.memory.retrieval.turn_embedding_weight > 0 and memory.embedder is not None
            and memory.config.memory.is_active("turn_embedding"))


def needs_cue_vector(memory) -> bool:
    """Whether a reply here will embed its cue: cosines are on for facts or turns and the
    snapshot holds vectors under the embedder's model for them (a cold side-index costs
    no model call). What ``rag_context`` checks before starting the embedding early."""
    embedder = memory.embedder
    if embedder is None:
        return False
    snapshot = memory.snapshot
    if memory.config.memory.retrieval.embedding_weight > 0 and fact_vector_count(snapshot, embedder.name) > 0:
        return True
    return _dense_turns_on(memory) and len(turn_matrix(snapshot, embedder.name)[0]) > 0


def top_rows(scores: np.ndarray, limit: int) -> np.ndarray:
    """Row numbers of the ``limit`` highest scores, in no particular order (argpartition, not a sort)."""
    if len(scores) <= limit:
        return np.arange(len(scores))
    return np.argpartition(-scores, limit - 1)[:limit]


@dataclass(frozen=True)
class TurnScores:
    """Cosines of one cue to the turn vectors (rows ascending by turn id).

    Only the newest ``len(ids) - start`` rows are scored at once (``sims``): a
    reply's nearest-turn search covers the newest ``turn_vector_search_rows``
    turns, so its cost stays flat as the log grows past that (one product over
    100k x 384 floats was most of a reply's time at 100k turns; docs/benchmarks.md).
    Older turns still get their exact cosine when named (the BM25 hits): a few
    rows' product each time. ``blended`` says the rows already hold the window blend.
    """

    ids: np.ndarray
    matrix: np.ndarray
    cue: np.ndarray
    start: int
    sims: np.ndarray
    blended: bool
    # Rows the nearest-turn searches may return (turns of the reply's visible scopes); None: all.
    visible: np.ndarray | None = None
    # The turns' best passage cosines (passage vectors on and present), which raise their own.
    passages: "PassageScores | None" = None

    def _dots(self, rows: Any) -> np.ndarray:
        """Cosines of ``rows`` (row numbers) not in ``sims``, raised to their best passage's."""
        dots = row_dots(self.matrix[rows], self.cue)
        return dots if self.passages is None else np.maximum(dots, self.passages.floor_at(rows))

    def _rows_of(self, turn_ids: Iterable[int]) -> np.ndarray:
        want = np.fromiter(turn_ids, dtype=np.int64)
        if len(want) == 0 or len(self.ids) == 0:
            return np.zeros(0, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.ids, want), len(self.ids) - 1)
        return np.unique(at[self.ids[at] == want])

    def passage_of(self, turn_id: int) -> int | None:
        """The index of the passage of ``turn_id`` whose vector matched the cue best (None: none)."""
        if self.passages is None:
            return None
        rows = self._rows_of([turn_id])
        if len(rows) == 0:
            return None
        self.passages.floor_at(rows)
        best = int(self.passages.best[rows[0]])
        return best if best >= 0 else None

    def raised_by_passage(self, turn_ids: Iterable[int]) -> dict[int, int]:
        """``{turn id: passage}`` of the ``turn_ids`` whose cosine is their best passage's (above their own)."""
        if self.passages is None:
            return {}
        rows = self._rows_of(turn_ids)
        if len(rows) == 0:
            return {}
        floor = self.passages.floor_at(rows)
        raised = rows[floor > row_dots(self.matrix[rows], self.cue)]
        return {int(self.ids[r]): int(self.passages.best[r]) for r in raised}

    def passage_count(self) -> int:
        """How many turns have a passage vector in these scores."""
        return 0 if self.passages is None else self.passages.turns

    def _hide(self, sims: np.ndarray, low: int) -> np.ndarray:
        """``sims`` of rows ``low..`` with the rows of other scopes at -inf."""
        if self.visible is None:
            return sims
        return np.where(self.visible[low:low + len(sims)], sims, -np.inf)

    def nearest(self, limit: int) -> dict[int, float]:
        """``{turn id: cosine}`` of the ``limit`` best-scoring searched rows."""
        sims = self._hide(self.sims, self.start)
        return {int(self.ids[self.start + r]): float(sims[r]) for r in top_rows(sims, limit)
                if sims[r] > -np.inf}

    def nearest_in(self, first_id: int, last_id: int, limit: int) -> dict[int, float]:
        """``{turn id: cosine}`` of the ``limit`` best turns with ids in ``[first_id, last_id]``
        (a time window's turns: candidates the cue's words may not reach). At most the newest
        :data:`MAX_WINDOW_ROWS` of the range are scored."""
        low, high = (int(x) for x in np.searchsorted(self.ids, [first_id, last_id], side="left"))
        high = min(len(self.ids), high + int(high < len(self.ids) and self.ids[high] == last_id))
        low = max(low, high - MAX_WINDOW_ROWS)
        if high <= low:
            return {}
        split = max(low, min(high, self.start))
        parts = []
        if split > low:
            parts.append(self._dots(np.arange(low, split)))
        if high > split:
            parts.append(self.sims[split - self.start:high - self.start])
        sims = self._hide(np.concatenate(parts) if len(parts) > 1 else parts[0], low)
        return {int(self.ids[low + r]): float(sims[r]) for r in top_rows(sims, limit) if sims[r] > -np.inf}

    def of(self, wanted) -> dict[int, float]:
        """``{turn id: cosine}`` for the ``wanted`` ids that have a vector (a binary search)."""
        want = np.fromiter(wanted, dtype=np.int64)
        if len(want) == 0 or len(self.ids) == 0:
            return {}
        at = np.minimum(np.searchsorted(self.ids, want), len(self.ids) - 1)
        rows = np.unique(at[self.ids[at] == want])
        old, new = rows[rows < self.start], rows[rows >= self.start]
        out = {int(self.ids[r]): float(self.sims[r - self.start]) for r in new}
        if len(old):
            out.update(zip(self.ids[old].tolist(), self._dots(old).tolist()))
        return out


def _turn_similarities(cue: str, memory, embedder, visible: tuple[str, ...] | None = None) -> TurnScores | None:
    """The cue's :class:`TurnScores`, or None without usable vectors; with ``visible``, its
    nearest-turn searches rank only turns said in those scopes."""
    snapshot = memory.snapshot
    retrieval = memory.config.memory.retrieval
    found = None
    if retrieval.turn_context > 0 and memory.config.memory.is_active("turn_window_embedding"):
        found = context_turn_matrix(snapshot, embedder.name, retrieval.turn_context)
    blended = found is not None
    ids, matrix = found if found is not None else turn_matrix(snapshot, embedder.name)
    if len(ids) == 0:
        return None
    cue_vec = np.asarray(memory.cue_vector(cue), dtype=np.float32)
    if cue_vec.shape[0] != matrix.shape[1]:
        memory.warn_once("turn-dim", "turn vectors under %s have dim %d but the cue has %d; ignoring them",
                         embedder.name, matrix.shape[1], cue_vec.shape[0])
        return None
    cue_vec = cue_vec / (float(np.linalg.norm(cue_vec)) or 1.0)
    searched = retrieval.turn_vector_search_rows
    start = max(0, len(ids) - searched) if searched > 0 else 0
    mask = None
    if visible is not None:
        allowed = memory.scope_turn_ids(visible)
        mask = memory.memo(("turn-scope-mask", snapshot.version, embedder.name, blended, visible),
                           lambda: keep_ids(ids, allowed))
    sims = row_dots(matrix[start:], cue_vec)
    passages = _passage_scores(memory, snapshot, embedder.name, ids, cue_vec, blended, start)
    if passages is not None:
        sims = np.maximum(sims, passages.floor[start:])
    return TurnScores(ids, matrix, cue_vec, start, sims, blended, mask, passages)


class PassageScores:
    """One cue's cosines to the passage vectors, aggregated per turn row (the best passage's).

    ``floor[row]``: ``turn_passage_weight`` x the cosine of the turn's best passage (-inf: no
    passage vector); ``best[row]``: which passage (-1). Like :class:`TurnScores`, only the
    passages of the searched rows (``start`` on) are scored at once, one product and one
    ``np.maximum.at``; an older turn's passages are scored when it is asked for (a BM25 hit).
    """

    def __init__(self, rows: np.ndarray, matrix: np.ndarray, passages: np.ndarray, cue: np.ndarray,
                 weight: float, size: int, start: int) -> None:
        self.rows, self.matrix, self.passages, self.cue, self.weight = rows, matrix, passages, cue, weight
        self.floor = np.full(size, -np.inf, dtype=np.float32)
        self.best = np.full(size, -1, dtype=np.int64)
        self.done = np.zeros(size, dtype=bool)
        self.done[start:] = True
        self.turns = int(np.count_nonzero(np.diff(rows))) + 1 if len(rows) else 0
        self._score(np.arange(int(np.searchsorted(rows, start, side="left")), len(rows)))

    def _score(self, at: np.ndarray) -> None:
        """Score the passages at positions ``at`` into their turns' floor and best passage."""
        if len(at) == 0:
            return
        sims = row_dots(self.matrix[at], self.cue) * np.float32(self.weight)
        rows = self.rows[at]
        np.maximum.at(self.floor, rows, sims)
        top = sims >= self.floor[rows]  # each turn's best passage (a tie: one of them)
        self.best[rows[top]] = self.passages[at[top]]

    def floor_at(self, rows: np.ndarray) -> np.ndarray:
        """``floor`` of these turn rows, their passages scored first if they were not yet."""
        rows = np.asarray(rows, dtype=np.int64)
        todo = np.unique(rows[~self.done[rows]])
        if len(todo):
            low = np.searchsorted(self.rows, todo, side="left")
            counts = np.searchsorted(self.rows, todo, side="right") - low
            starts = np.repeat(low, counts)
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            self._score(starts + offsets)
            self.done[todo] = True
        return self.floor[rows]


def _passage_scores(memory, snapshot, model: str, ids: np.ndarray, cue_vec: np.ndarray, blended: bool,
                    start: int) -> PassageScores | None:
    """The cue's :class:`PassageScores` over the turn rows ``ids``, or None when passage vectors are
    off (``turn_passage_weight`` 0 or the ``turn_passage_embedding`` projection inactive) or absent.

    The passage matrix and each passage's turn row are built once per snapshot. A long reply's
    one vector reads its opening only (MiniLM stops at 256-512 word pieces); its passages read the rest.
    """
    if not memory.config.memory.is_active("turn_passage_embedding"):
        return None
    weight = memory.config.memory.retrieval.turn_passage_weight
    if weight <= 0:
        return None
    found = passage_matrix(snapshot, model)
    if len(found.turn_ids) == 0 or found.matrix.shape[1] != cue_vec.shape[0]:
        return None

    def rows_of() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each passage's turn row, its passage matrix rows and passage numbers (passages whose turn
        has no turn vector yet left out), ascending by turn row."""
        at = np.minimum(np.searchsorted(ids, found.turn_ids), max(0, len(ids) - 1))
        keep = ids[at] == found.turn_ids
        if bool(keep.all()):  # the usual case: the served matrix itself, no copy
            return at, found.matrix, found.passages
        return at[keep], np.ascontiguousarray(found.matrix[keep]), found.passages[keep]

    rows, matrix, numbers = snapshot.current().cached(("passage_turn_rows", model, blended, len(ids)), rows_of)
    if len(rows) == 0:
        return None
    return PassageScores(rows, matrix, numbers, cue_vec, weight, len(ids), start)


class _TurnRows:
    """Turn rows read once per reply: the ranked hits and their shown neighbours overlap."""

    def __init__(self, log) -> None:
        self.log = log
        self.rows: dict[int, Any] = {}
        self.asked: set[int] = set()

    def get(self, ids) -> list:
        wanted = {i for i in ids if i > 0}
        missing = wanted - self.asked
        if missing:
            self.rows.update((t.id, t) for t in self.log.turns_by_ids(missing))
            self.asked |= missing
        return [self.rows[i] for i in sorted(wanted) if i in self.rows]


def _same_channel_windows(log, span: int, exclude: frozenset[int]) -> Callable[[list[int]], dict[int, list[int]]]:
    """For :func:`_dense_turns`: each candidate with its ``span`` nearest live same-channel turns each side
    (``context_windows``, the same windows the ``turn_window_embedding`` projector embeds).

    Reads only ids and channels (``live_channels``): building full turn rows for
    every window was most of the blend's cost at 100k turns.
    """
    def windows(candidates: list[int]) -> dict[int, list[int]]:
        reach = NEIGHBOUR_SPAN * span
        channel_of = log.live_channels({i for t in candidates for i in range(t - reach, t + reach + 1) if i > 0})
        eligible = {tid: ch for tid, ch in channel_of.items() if tid not in exclude or tid in candidates}
        return context_windows(eligible, candidates, span)
    return windows


def turn_fetch(memory, budget) -> int:
    """How many turn candidates each ranking asks for first (``retrieve_turns`` grows it on a refetch)."""
    return max(memory.config.memory.retrieval.turn_candidates, budget.max_rag_turns)


def retrieve_turns(cue: str, memory, ctx, budget, exclude: frozenset[int],
                   token_budget: int | None = None,
                   first_hits: list[tuple[int, float]] | None = None,
                   scope_counts: dict[str, int] | None = None) -> tuple[list, list[dict]]:
    """Hit turns (not excluded, not deleted, visible here) with their neighbours, ascending by id.

    Candidates are the union of the top ``turn_candidates`` BM25 hits and, when
    turn embeddings are on, the top ``turn_candidates`` turns by cosine; they
    are ranked by :func:`fuse_turns`. If exclusions and deletions leave fewer
    than the budget's ``max_rag_turns``, the candidate depth grows and the
    ranking is redone. With ``token_budget``, hits join in rank order only
    while they and their neighbours fit it (see :func:`fit_by_rank`).
    ``first_hits``: the full-text search of the first round (``turn_fetch`` hits),
    when the caller already ran it. Only turns said in the reply's visible scopes
    (:mod:`~familiar_bot.prompt.scoping`) are candidates; ``scope_counts["turns"]``
    gets how many candidates another scope's turns were.
    """
    retrieval = memory.config.memory.retrieval
    limit = budget.max_rag_turns
    rows_of = _TurnRows(memory.turn_log)
    visible = visible_scopes(ctx, memory)
    allowed = memory.scope_turn_ids(visible)
    dense_cache: dict = {"visible": visible}
    out_of_scope: set[int] = set()
    fetch = turn_fetch(memory, budget)
    signals = read_cue(cue, memory, ctx)
    genre = turn_genre(memory, visible)
    id_ranges = _time_id_ranges(signals, memory) if signals is not None and _dense_turns_on(memory) else []
    kept: list = []
    ranked: list[dict] = []
    round_ = -1
    while True:
        round_ += 1
        hits = first_hits if round_ == 0 and first_hits is not None else memory.fts_turns.search(cue, fetch)
        bm25 = dict(hits)
        dense = _dense_turns(cue, memory, fetch, list(bm25),
                             _same_channel_windows(memory.turn_log, retrieval.turn_context_span, exclude), dense_cache,
                             id_ranges)
        order = [tid for tid, _ in hits] + [tid for tid in sorted(dense, key=lambda t: -dense[t]) if tid not in bm25]
        fuse = rrf_turns if retrieval.turn_fusion == "rrf" else fuse_turns
        fused = fuse(bm25, dense, retrieval.bm25_weight, retrieval.turn_embedding_weight, order)
        fused = [f for f in fused if f["turn_id"] not in exclude]
        # Other scopes' turns go before any row is read (an id lookup), so they cannot crowd this one out.
        keep = keep_ids([f["turn_id"] for f in fused], allowed)
        out_of_scope = {f["turn_id"] for f, k in zip(fused, keep) if not k}
        fused = [f for f, k in zip(fused, keep) if k]
        if signals is not None and signals.active:
            fused = _with_signals(fused, signals, memory, rows_of, exclude)
        # A person talking with the familiar: its own replies weigh less (unless the cue asks what it
        # said), and substance, learned among people, stays off (its length bonus lifted every long
        # reply: prompt/genre.py).
        if genre.familiar and retrieval.turn_familiar_weight < 1 and not asks_its_words(cue):
            fused = _weigh_familiar(fused, rows_of, retrieval.turn_familiar_weight)
        if genre.familiar and retrieval.turn_taste_weight > 0 and asks_advice(cue):
            fused = _with_taste(fused, rows_of, retrieval.turn_taste_weight, TASTE_DEPTH * limit)
        if retrieval.turn_substance_depth > 0 and not genre.familiar:
            fused = _with_substance(fused, rows_of, retrieval)
        # A question about how one thing stands now follows threads to the newest word; one asking
        # for an order or every time wants every statement, spread over days instead.
        if (retrieval.turn_thread_hits > 0 and dense_cache.get("sims") is not None and asks_for_now(cue)
                and not asks_for_many(cue)):
            fused = _with_threads(fused, dense_cache["sims"], rows_of, retrieval, THREAD_DEPTH * limit)
        if retrieval.turn_day_spread > 0 and asks_for_order(cue):
            fused = _spread(fused, rows_of, memory.config.tz, retrieval, SPREAD_DEPTH * limit)
        kept, ranked = [], []
        # Rows are read in rank order, a few more than still wanted at a time: most
        # candidates rank below the cut and never need their row built.
        at = 0
        while at < len(fused) and len(kept) < limit:
            chunk = fused[at:at + 2 * (limit - len(kept))]
            at += len(chunk)
            rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in chunk)}
            for f in chunk:
                turn = rows.get(f["turn_id"])
                if turn is None or turn.deleted or not turn_visible(turn, visible):
                    continue
                kept.append(turn)
                ranked.append(f)
                if len(kept) == limit:
                    break
        rounds = MAX_REFETCH_ROUNDS + (SCOPE_REFETCH_ROUNDS if out_of_scope else 0)
        if len(kept) >= limit or (len(hits) < fetch and len(dense) < fetch) or round_ >= rounds:
            break
        fetch *= 4
    scores = dense_cache.get("sims")
    raised = scores.raised_by_passage(f["turn_id"] for f in ranked) if scores is not None else {}
    for f in ranked:
        if f["turn_id"] in raised:  # ranked by the passage of it that matched (passage vectors)
            f["passage"] = raised[f["turn_id"]]
    if scope_counts is not None:
        scope_counts["turns"] = len(out_of_scope)
        scope_counts["passage_turns"] = scores.passage_count() if scores is not None else 0
    if not kept:
        return [], []
    reach = retrieval.turn_neighbours
    span = max(NEIGHBOUR_SPAN, 3 * reach)
    # Only the best ``turn_neighbour_hits`` hits bring neighbours; the rest come alone.
    with_context = retrieval.turn_neighbour_hits or len(kept)
    around = ({i for t in kept[:with_context] for i in range(t.id - span, t.id + span + 1) if i > 0}
              if reach else set())
    # Ids and channels first (live turns only), then rows for just the neighbours shown.
    by_channel: dict[int, list[int]] = {}
    for tid, ch in sorted(memory.turn_log.live_channels(around).items()):
        if tid not in exclude:
            by_channel.setdefault(ch, []).append(tid)
    shown: list[list[int]] = []
    for n, hit in enumerate(kept):
        if n >= with_context:
            shown.append([])
            continue
        same = by_channel.get(hit.channel_id, [])
        below, above = bisect_left(same, hit.id), bisect_right(same, hit.id)
        shown.append(same[max(0, below - reach):below] + same[above:above + reach])
    rows = {t.id: t for t in rows_of.get({tid for ids in shown for tid in ids})}
    # a neighbour shows only if the reply may read it too (a joined person's hit in a server
    # brings no one else's turns of that server)
    groups = [[hit] + [rows[tid] for tid in ids if tid in rows and not rows[tid].deleted
                       and turn_visible(rows[tid], visible)] for hit, ids in zip(kept, shown)]
    shown_as = None
    if retrieval.turn_passage_chars > 0:  # a long turn is shown as its passage matching the cue
        tokens, size = cue_tokens(cue), retrieval.turn_passage_chars
        matched = _matched_passage(dense_cache.get("sims"), memory)
        shown_as = lambda t: shown_part(t, tokens, size, lambda: matched(t))  # noqa: E731
    chosen = fit_by_rank(groups, token_budget, shown_as)
    debug = [{k: f[k] for k in ("turn_id", "bm25", "cosine", "total", "speaker", "time", "reply_to", "substance",
                                "updates", "familiar", "taste", "passage")
              if k in f}
             for f in ranked]
    return [chosen[i] for i in sorted(chosen)], debug


def _matched_passage(scores: "TurnScores | None", memory) -> Callable[[Any], tuple[int, int] | None]:
    """For :func:`~familiar_bot.prompt.passages.shown_part`: a turn's offsets of the passage whose
    vector matched the cue best (cut as the ``turn_passage_embedding`` projector cuts), or None."""
    if scores is None or scores.passages is None:
        return lambda turn: None
    chars = getattr(memory.config.memory.knobs("turn_passage_embedding"), "passage_chars",
                    memory.config.memory.retrieval.turn_passage_chars)

    def matched(turn: Any) -> tuple[int, int] | None:
        at = scores.passage_of(turn.id)
        spans = long_turn_spans(turn.content or "", chars) if at is not None else []
        return spans[at] if at is not None and at < len(spans) else None
    return matched


def read_cue(cue: str, memory, ctx) -> CueSignals | None:
    """Who and when the cue names (:class:`CueSignals`), or None when no signal is weighted.

    Never raises: a cue that cannot be read (or a turn log that cannot be) ranks
    by its words alone, with a warning once."""
    knobs = memory.config.memory.retrieval
    if not (knobs.turn_speaker_weight > 0 or knobs.turn_time_weight > 0 or knobs.turn_reply_credit > 0):
        return None
    tz = memory.config.tz
    try:
        people = read_people(cue, memory.people_directory()) if knobs.turn_speaker_weight > 0 else PeopleCue()
        now = getattr(ctx, "now", None) or datetime.now(timezone.utc)
        when = parse_time_cue(cue, now, tz) if knobs.turn_time_weight > 0 else TimeCue()
    except Exception as exc:  # a reply must not fail because of its cue
        memory.warn_once("cue-signals", "reading who and when the cue names failed (%s: %s); "
                         "ranking turns by their words alone", type(exc).__name__, exc)
        return None
    return CueSignals(people, when, tz, knobs)


def _time_id_ranges(signals: CueSignals, memory) -> list[tuple[int, int]]:
    """Turn-id ranges of the windows the cue names (empty without a weighted, dated cue)."""
    if signals.knobs.turn_time_weight <= 0 or not signals.time.windows:
        return []
    try:
        return window_id_ranges(memory.turn_log, signals.time.windows, signals.tz, signals.knobs.turn_time_slack_days)
    except Exception as exc:
        memory.warn_once("cue-time-ids", "finding the turns of the cue's dates failed (%s: %s)",
                         type(exc).__name__, exc)
        return []


def _with_signals(fused: list[dict], signals: CueSignals, memory, rows_of: "_TurnRows",
                  exclude: frozenset[int]) -> list[dict]:
    """``fused`` with the replies' credit and the speaker and time boosts (:mod:`turn_signals`)."""
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in fused)}
    fused = credit_replies(fused, rows, lambda questions: next_replies(
        questions, memory.turn_log.live_channels, rows_of.get), signals.knobs.turn_reply_credit)
    fused = [f for f in fused if f["turn_id"] not in exclude]
    rows.update((t.id, t) for t in rows_of.get(f["turn_id"] for f in fused if f["turn_id"] not in rows))
    return add_signals(fused, rows, signals)


def turn_genre(memory, visible: tuple[str, ...]) -> Genre:
    """The genre the turns are ranked for: ``turn_genre`` when forced, else read from the scope
    (:func:`~familiar_bot.prompt.genre.scope_genre`); a log that cannot be read ranks as people."""
    forced = memory.config.memory.retrieval.turn_genre
    if forced in (PEOPLE, FAMILIAR):
        return Genre(forced)
    try:
        return scope_genre(memory, visible)
    except Exception as exc:  # a reply must not fail because its genre could not be read
        memory.warn_once("turn-genre", "reading the genre of the scope's talk failed (%s: %s); ranking as "
                         "people talking", type(exc).__name__, exc)
        return Genre(PEOPLE)


def _weigh_familiar(fused: list[dict], rows_of: "_TurnRows", weight: float) -> list[dict]:
    """``fused`` with the familiar's own replies' totals multiplied by ``weight``, re-sorted
    (ties keep the order); each weighed candidate records ``familiar`` for ``/context``."""
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in fused)}
    out = []
    for f in fused:
        turn = rows.get(f["turn_id"])
        if turn is not None and is_familiars(turn):
            f = {**f, "total": f["total"] * weight, "familiar": weight}
        out.append(f)
    order = {id(f): n for n, f in enumerate(out)}
    return sorted(out, key=lambda f: (-f["total"], order[id(f)]))


TASTE_DEPTH = 3  # candidates (x the section's hit limit) read for the person's taste


def _with_taste(fused: list[dict], rows_of: "_TurnRows", weight: float, depth: int) -> list[dict]:
    """A cue asking the familiar's advice: the person's turns among the best ``depth`` candidates that
    tell their taste or situation (:func:`~familiar_bot.prompt.genre.tells_taste`) gain ``weight``."""
    head, tail = [dict(f) for f in fused[:depth]], fused[depth:]
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in head)}
    for f in head:
        turn = rows.get(f["turn_id"])
        if turn is not None and not is_familiars(turn) and tells_taste(turn.content or ""):
            f["total"] += weight
            f["taste"] = weight
    order = sorted(range(len(head)), key=lambda i: (-head[i]["total"], i))
    return [head[i] for i in order] + tail


def _with_substance(fused: list[dict], rows_of: "_TurnRows", knobs) -> list[dict]:
    """``fused`` with its best candidates re-ordered by their substance (:mod:`substance`)."""
    depth = knobs.turn_substance_depth
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in fused[:depth])}
    return rerank_by_substance(fused, rows, depth, knobs.turn_substance_length, knobs.turn_substance_question)


THREAD_DEPTH = 3  # candidates (x the section's hit limit) a thread is followed among


def _with_threads(fused: list[dict], scores: "TurnScores", rows_of: "_TurnRows", knobs, depth: int) -> list[dict]:
    """``fused`` with later same-subject turns lifted above the hits they update (:mod:`threads`)."""
    head, tail = fused[:depth], fused[depth:]
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in head)}
    want = np.fromiter((f["turn_id"] for f in head), dtype=np.int64)
    at = np.minimum(np.searchsorted(scores.ids, want), max(0, len(scores.ids) - 1))
    found = scores.ids[at] == want if len(scores.ids) else np.zeros(len(want), dtype=bool)
    vectors = {int(tid): scores.matrix[row] for tid, row, ok in zip(want, at, found) if ok}
    return follow_threads(head, rows, vectors, hits=knobs.turn_thread_hits,
                          threshold=knobs.turn_thread_similarity) + tail


SPREAD_DEPTH = 3  # candidates (x the section's hit limit) a list question's days are spread among


def _spread(fused: list[dict], rows_of: "_TurnRows", tz, knobs, depth: int) -> list[dict]:
    """``fused`` with a list question's best candidates spread over days (:mod:`spread`)."""
    rows = rows_of.get(f["turn_id"] for f in fused[:depth])
    day_of = {t.id: (t.channel_id, local_date(t.created_at, tz)) for t in rows}
    return spread_days(fused, day_of, knobs.turn_day_spread, depth, keep=knobs.turn_day_spread_keep)


GROUP_SLACK_TOKENS = 8  # a date header and a blank line a hit's group may add


def fit_by_rank(groups: list[list], token_budget: int | None,
                shown_as: Callable[[Any], Any] | None = None) -> dict[int, Any]:
    """``{id: turn}`` of the hit groups (a hit and its neighbours, best hit first) that fit the budget.

    The section is shown in time order and cut at the token budget, so without
    this step the cut fell on the *latest* turns, whatever their rank: on
    LoCoMo, 24 hits with neighbours lost 6 points of rendered recall to it
    (docs/benchmarks.md). Whole groups are taken in rank order while their
    estimated lines fit; the first group always comes (the renderer truncates it). ``shown_as``
    turns a row into what the section shows of it (a long turn's passage: :mod:`passages`), applied
    only to the groups reached, so a turn that cannot fit costs nothing.
    """
    chosen: dict[int, Any] = {}
    used = 0
    for group in groups:
        new = [t for t in group if t.id not in chosen]
        if shown_as is not None:
            new = [shown_as(t) for t in new]
        if token_budget is not None:
            cost = sum(estimate_tokens(f"> [12:00 pm {getattr(t, 'author_display', None) or ''}]: {t.content}")
                       for t in new)
            cost += GROUP_SLACK_TOKENS if new else 0
            if chosen and used + cost > token_budget:
                break
            used += cost
        for t in new:
            chosen[t.id] = t
    return chosen


def turn_lines(turns: list, labels: Labels, tz, newest_first: bool = False) -> list[tuple[str, str]]:
    """``(kind, line)`` pairs: date headers, quoted turn lines, and blank separators."""
    return [(kind, line) for kind, line, _ in owned_turn_lines(turns, labels, tz, newest_first)]


def owned_turn_lines(turns: list, labels: Labels, tz, newest_first: bool = False) -> list[tuple[str, str, int | None]]:
    """``turn_lines`` with the id of the turn each line quotes (None for headers and blanks),
    so the caller can tell which turns survived the token budget. Days in time order, or
    with ``newest_first`` the latest day first (each day's turns still in time order)."""
    lines: list[tuple[str, str, int | None]] = []
    day = None
    ordered = sorted(turns, key=lambda t: (t.created_at, t.id))
    if newest_first:
        by_day: dict[Any, list] = {}
        for t in ordered:
            by_day.setdefault(local_date(t.created_at, tz), []).append(t)
        ordered = [t for date in sorted(by_day, reverse=True) for t in by_day[date]]
    for t in ordered:
        date = local_date(t.created_at, tz)
        if date != day:
            if day is not None:
                lines.append(("blank", "", None))
            lines.append(("date", f"{date}:", None))
            day = date
        body = labels.rewrite_mentions(t.content).splitlines() or [""]
        lines.append(("turn", f"> [{clock_12h(t.created_at, tz)} {labels.for_turn(t)}]: {body[0]}", t.id))
        lines.extend(("turn", f"> {line}" if line.strip() else ">", t.id) for line in body[1:])
    return lines


# --------------------------------------------------------------------------- rendering


def render(fact_lines: list[str], turn_part: list[tuple[str, str]], max_tokens: int,
           turns_header: str = TURNS_HEADER) -> str:
    """Facts first, then turns, within ``max_tokens`` (headers not counted).

    A line that does not fit ends its part once something is kept; the first
    kept line is truncated if it alone is too big. A date header left without
    its turns is dropped.
    """
    return render_counted(fact_lines, turn_part, max_tokens, turns_header)[0]


def render_counted(fact_lines: list[str], turn_part: list[tuple[str, str]], max_tokens: int,
                   turns_header: str = TURNS_HEADER) -> tuple[str, int, int]:
    """``render`` plus how many fact lines and turn-part lines it kept (what the prompt really shows)."""
    facts = cap_blocks(fact_lines, max_tokens)
    remaining = max_tokens - sum(estimate_tokens(line) for line in facts)
    turns: list[str] = []
    kinds: list[str] = []
    for kind, line in turn_part:
        cost = estimate_tokens(line)
        if cost > remaining and (facts or turns):
            break
        if kind != "blank":
            line = truncate_to_tokens(line, remaining)
            if not line:
                break
        turns.append(line)
        kinds.append(kind)
        remaining -= estimate_tokens(line)
    while kinds and kinds[-1] in ("date", "blank"):
        kinds.pop()
        turns.pop()
    parts = []
    if facts:
        parts.append(FACTS_HEADER + "\n\n" + "\n".join(facts))
    if turns:
        parts.append(turns_header + "\n\n" + "\n".join(turns))
    return "\n\n".join(parts), len(facts), len(turns)


def retrieve(ctx, memory, exclude: frozenset[int]) -> tuple[str, dict[str, Any]]:
    """The rendered ``rag_context`` section for ``ctx.cue`` and its debug structure."""
    cue = ctx.cue.strip()
    if not cue:
        return "", {"cue": "", "facts": [], "turns": [], "scope_excluded": 0}
    budget = memory.config.budget_for(ctx.tier)
    labels = memory.labels(ctx.guild_id)
    # The turns' full-text search does not need the cue's vector: run it before the facts'
    # cosines wait for that vector, while the model call (started by ``prefetch``) runs.
    first_hits = memory.fts_turns.search(cue, turn_fetch(memory, budget))
    visible = visible_scopes(ctx, memory)
    facts, debug = retrieve_facts(cue, memory, budget, visible)
    fact_lines = [f"- {one_line(f.text)}{rename_note(f, labels)}" for f in facts]
    fact_tokens = sum(estimate_tokens(line) for line in cap_blocks(fact_lines, budget.rag_tokens))
    scope_counts: dict[str, int] = {}
    turns, turn_debug = retrieve_turns(cue, memory, ctx, budget, exclude,
                                       token_budget=max(0, budget.rag_tokens - fact_tokens),
                                       first_hits=first_hits, scope_counts=scope_counts)
    debug["scope_excluded_turns"] = scope_counts.get("turns", 0)
    debug["turn_genre"] = turn_genre(memory, visible).debug()
    # Passage vectors (turn_passage_embedding): the long turns that have them, and the ranked turns
    # whose cosine their best passage raised.
    debug["turn_passages"] = {"turns_with_vectors": scope_counts.get("passage_turns", 0),
                              "ranked_by_passage": sum("passage" in f for f in turn_debug)}
    debug["scope_excluded"] = debug["scope_excluded_facts"] + debug["scope_excluded_turns"]
    debug["turns"] = turn_debug
    debug["excluded_recent"] = len(exclude)
    # A followed thread whose both ends are shown: newest day first (see NEWEST_FIRST_HEADER).
    shown_ids = {t.id for t in turns}
    threads = [[f["updates"], f["turn_id"]] for f in turn_debug
               if "updates" in f and f["turn_id"] in shown_ids and f["updates"] in shown_ids]
    if threads:
        debug["threads"] = threads
    owned = owned_turn_lines(turns, labels, memory.config.tz, newest_first=bool(threads))
    text, facts_kept, lines_kept = render_counted(fact_lines, [(k, line) for k, line, _ in owned],
                                                  budget.rag_tokens,
                                                  NEWEST_FIRST_HEADER if threads else TURNS_HEADER)
    # What the section really shows after the token cut: the evaluation's rendered recall reads these.
    debug["shown_fact_ids"] = [f.id for f in facts[:facts_kept]]
    debug["shown_turn_ids"] = sorted({tid for _, _, tid in owned[:lines_kept] if tid is not None})
    return text, debug
