"""Context-window vectors (projector `turn_window_embedding`, opt-in): each live turn embedded
together with its nearest same-channel turns.

A reply is often about what the turns just before it said ("Which one?" after a
question about dogs), so a turn's own vector misses questions its neighbours
answer. `rag_context` blends this vector's cosine with the turn's own
(`[memory.retrieval].turn_context`), precombined once per snapshot into one
matrix, so the blend costs no extra work per reply (docs/benchmarks.md has the
LoCoMo figures and the latency).

The window of turn t is t and up to `span` live (not deleted, not blank)
turns of t's channel on each side, looked for among ids within
`ID_REACH_PER_SPAN x span` of t; its text is their "speaker: text" lines in
id order. So a window depends only on the turns within that reach, which
keeps the work incremental: a new turn re-embeds itself and the already
embedded turns up to the reach before it (their windows gain it); an edited or
deleted turn re-embeds (or removes) the turns within the reach on both sides.
Rebuild == incremental because every turn whose window text changed is
re-embedded from the current log. The watermark is (last turn id read, last
change seq applied) as for the turn vectors; a model swap starts over the
same way. Changing `span` changes every window: rebuild (`backfill --rebuild`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from familiar_pipeline.projectors.turn_embeddings.run import TurnVectorPass, run_turn_vectors
from familiar_pipeline.projectors.turns_index.run import search_text
from familiar_pipeline.projectors.vectors import delete_vectors, embed_all, embedder_or_skip, set_vectors
from familiar_pipeline.storage.scopes import turn_scope
from familiar_pipeline.storage.turns import TurnLog, context_windows

from .spec import PROJECTOR
from .tables import TURN_WINDOW_EMBEDDINGS

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime

ID_REACH_PER_SPAN = 3  # how far (in ids, per neighbour) a window looks for same-channel turns


def window_texts(turn_log: TurnLog, targets: Iterable[int], span: int) -> dict[int, str | None]:
    """``{target: window text}``, None for a target that is not a live, non-blank turn."""
    return {tid: found[0] if found else None for tid, found in windows(turn_log, targets, span).items()}


def windows(turn_log: TurnLog, targets: Iterable[int], span: int) -> dict[int, tuple[str, str] | None]:
    """``{target: (window text, the target's scope)}``, None for a target that is not a live, non-blank turn."""
    targets = sorted({t for t in targets if t > 0})
    if not targets:
        return {}
    reach = ID_REACH_PER_SPAN * span
    around = {i for t in targets for i in range(t - reach, t + reach + 1) if i > 0}
    rows = {t.id: t for t in turn_log.turns_by_ids(around) if not t.deleted and t.content.strip()}
    members_of = context_windows({i: t.channel_id for i, t in rows.items()}, targets, span)
    out: dict[int, tuple[str, str] | None] = {t: None for t in targets}
    for tid, members in members_of.items():
        # Only members within the reach count, so the window depends on nothing further away.
        out[tid] = ("\n".join(search_text(rows[m]) for m in members if abs(m - tid) <= reach), turn_scope(rows[tid]))
    return out


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    embedder = embedder_or_skip(rt, report, PROJECTOR)
    if embedder is None:
        return
    knobs = rt.config.memory.turn_window_embedding
    batch_size, span = knobs.batch_size, knobs.span
    reach = ID_REACH_PER_SPAN * span
    turn_log = rt.turn_log()
    report.extra["removed"] = 0

    def write(targets: list[int], position: int, state: TurnVectorPass) -> bool:
        """(Re)embed the windows of ``targets`` (ids up to ``position``), remove dead targets' rows."""
        texts = windows(turn_log, targets, span)
        live = [(tid, found) for tid, found in texts.items() if found is not None]
        dead = [tid for tid, found in texts.items() if found is None]
        vectors = embed_all(embedder, [text for _, (text, _) in live], report) if live else []
        if vectors is None:
            return False
        with rt.store() as store:
            with store.transaction():
                if dead:
                    report.extra["removed"] += delete_vectors(store, TURN_WINDOW_EMBEDDINGS, dead)
                if live:
                    set_vectors(store, TURN_WINDOW_EMBEDDINGS, embedder.name,
                                [(tid, v, scope) for (tid, (_, scope)), v in zip(live, vectors)])
                store.set_watermark(PROJECTOR, turn_id=position, change_seq=state.change_wm)
            rt.publish(store)
        if live:
            report.batches += 1
            report.rows_written += len(live)
        return True

    def on_chunk(chunk: list, state: TurnVectorPass) -> bool:
        # The new turns, and the embedded turns whose windows may reach them.
        return write(list(range(max(1, chunk[0].id - reach), chunk[-1].id + 1)), chunk[-1].id, state)

    def on_changes(changed: list[int], state: TurnVectorPass) -> bool:
        """Edits and deletions of turns already read: every window within reach of them."""
        targets = sorted({i for c in changed for i in range(c - reach, c + reach + 1) if 0 < i <= state.turn_wm})
        return all(write(targets[start:start + batch_size], state.turn_wm, state)
                   for start in range(0, len(targets), batch_size))

    run_turn_vectors(rt, report, embedder, projector=PROJECTOR, table=TURN_WINDOW_EMBEDDINGS, batch_size=batch_size,
                     what="window vector", on_chunk=on_chunk, on_changes=on_changes)
