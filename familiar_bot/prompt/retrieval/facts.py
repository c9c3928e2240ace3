"""Facts for ``rag_context``: current facts the reply may read, ranked by fused signals.

Candidates come from ``fts/facts`` (the cue's analyzer tokens OR-ed, so any text is a
valid query), over-fetched ``fact_overfetch x max_rag_facts`` and filtered to current
facts through the snapshot (the index keeps retired facts; the snapshot knows which are
retired or expired) and to the facts whose ``scope`` the reply may read (by id, before
any row is read; :mod:`~familiar_bot.prompt.scoping`). Their signals are fused by
:func:`~familiar_bot.prompt.retrieval.ranking.fuse_facts`. The cue is embedded only when
the embedding weight is positive *and* some candidate has a stored vector under the
active model (``embedder.name``), so a cold side-index costs no model call. Every
candidate's signals go into the debug structure so ``/context`` can explain a ranking.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import numpy as np

from familiar_pipeline.models.embedders import cosines as cue_cosines
from familiar_pipeline.projectors.fact_embeddings.tables import vectors_in as fact_vectors
from familiar_pipeline.projectors.facts.reads import current_facts

from familiar_bot.prompt.layers.common import Labels, one_line
from familiar_bot.prompt.retrieval.ranking import MAX_REFETCH_ROUNDS, SCOPE_REFETCH_ROUNDS, Weights, fuse_facts
from familiar_bot.prompt.scoping import keep_ids, visible_fact_ids


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
