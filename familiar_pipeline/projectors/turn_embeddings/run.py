"""Turn embeddings (projector `turn_embedding`, opt-in): a vector per live turn for the active model.

They let ``rag_context`` find earlier turns by meaning as well as by words
(hybrid BM25 + cosine; measured on LoCoMo, see docs/benchmarks.md). Like the
full-text index, the watermark is (last turn id read, last change seq applied):
new turns are embedded in batches of ``batch_size``, edited turns re-embedded,
deleted turns lose their vectors. The watermark advances with each committed
batch, so a killed run resumes where it stopped.

A model swap starts over: when the active model has no vector at all while the
watermark says turns were read, the position restarts at 0 (rows of the old
model stay beside the new, as for facts; reads use only the active name). A
batch whose embed call returns the wrong number of vectors writes nothing and
stops the run (misaligned vectors would attach meaning to the wrong turns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from familiar_pipeline.projectors.turns_index.run import search_text
from familiar_pipeline.projectors.vectors import delete_vectors, embed_all, embedder_or_skip, set_vectors, vector_count
from familiar_pipeline.storage.scopes import turn_scope
from familiar_pipeline.storage.tables import Table
from familiar_pipeline.storage.turns import Turn

from .spec import PROJECTOR
from .tables import TURN_EMBEDDINGS

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime


def embedding_text(turn: Turn) -> str:
    """What a turn's vector encodes: the same "speaker: text" the full-text index holds."""
    return search_text(turn)


@dataclass
class TurnVectorPass:
    """How far one run of a turn-vector projector has read: the watermark it advances."""

    turn_wm: int
    change_wm: int


def run_turn_vectors(rt: FamiliarRuntime, report: ProjectionReport, embedder: Any, *, projector: str, table: Table,
                     batch_size: int, what: str,
                     on_chunk: Callable[[list, TurnVectorPass], bool],
                     on_changes: Callable[[list[int], TurnVectorPass], bool]) -> None:
    """The run shared by the projectors that keep one vector per (turn, model) in ``table``.

    Restarts from turn 0 when the active model has no row while the watermark
    says turns were read (a model swap); hands each new chunk of turns to
    ``on_chunk`` (which writes and advances the watermark, False to stop), then
    the ids of turns edited or deleted since the last change seq to
    ``on_changes`` (True: the watermark moves to the latest change).
    """
    turn_log = rt.turn_log()
    with rt.store() as store:
        mark = store.get_watermark(projector)
        restart = mark.turn_id > 0 and vector_count(store, table, embedder.name) == 0
    state = TurnVectorPass(*((0, 0) if restart else (mark.turn_id, mark.change_seq)))
    report.watermark_before = {"turn_id": mark.turn_id, "change_seq": mark.change_seq}
    report.extra["model"] = embedder.name
    if restart:
        report.extra["restarted"] = f"no {what} under {embedder.name}; embedding every turn"
    latest_change = turn_log.latest_change_seq()
    if state.turn_wm == 0:
        state.change_wm = latest_change  # every turn is read with its current text below

    for _ in range(rt.config.pipeline.max_batches_per_run):
        chunk = turn_log.turns_after(state.turn_wm, limit=batch_size)
        if not chunk:
            break
        report.turns_read += len(chunk)
        if not on_chunk(chunk, state):
            break
        state.turn_wm = chunk[-1].id

    if not report.dropped and state.change_wm < latest_change:
        changed = sorted({c.turn_id for c in turn_log.changes_after(state.change_wm)
                          if c.seq <= latest_change and c.turn_id <= state.turn_wm})
        state.change_wm = latest_change
        if on_changes(changed, state):
            with rt.store() as store:
                store.set_watermark(projector, turn_id=state.turn_wm, change_seq=state.change_wm)
                rt.publish(store)
    report.watermark_after = {"turn_id": state.turn_wm, "change_seq": state.change_wm}
    report.extra["dim"] = embedder.dim
    if report.batches == 0 and not report.dropped and not report.extra.get("removed"):
        report.status = "no-op"
        report.reason = f"every live turn has a {what} for {embedder.name}"


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    embedder = embedder_or_skip(rt, report, PROJECTOR)
    if embedder is None:
        return
    batch_size = rt.config.memory.turn_embedding.batch_size
    turn_log = rt.turn_log()

    def write(batch: list, position: int, state: TurnVectorPass) -> bool:
        vectors = embed_all(embedder, [embedding_text(t) for t in batch], report)
        if vectors is None:
            return False
        with rt.store() as store:
            with store.transaction():
                set_vectors(store, TURN_EMBEDDINGS, embedder.name,
                            [(t.id, v, turn_scope(t)) for t, v in zip(batch, vectors)])
                store.set_watermark(PROJECTOR, turn_id=position, change_seq=state.change_wm)
            rt.publish(store)
        report.batches += 1
        report.rows_written += len(batch)
        return True

    def on_chunk(chunk: list, state: TurnVectorPass) -> bool:
        live = [t for t in chunk if not t.deleted and t.content.strip()]
        if live:
            return write(live, chunk[-1].id, state)
        with rt.store() as store:
            store.set_watermark(PROJECTOR, turn_id=chunk[-1].id, change_seq=state.change_wm)
        return True

    def on_changes(changed: list[int], state: TurnVectorPass) -> bool:
        """Edits and deletions of turns already embedded."""
        current = {t.id: t for t in turn_log.turns_by_ids(changed)}
        gone = [tid for tid in changed if tid not in current or current[tid].deleted]
        edited = [current[tid] for tid in changed if tid in current and not current[tid].deleted]
        with rt.store() as store:
            report.extra["removed"] = delete_vectors(store, TURN_EMBEDDINGS, gone)
        return all(write(edited[start:start + batch_size], state.turn_wm, state)
                   for start in range(0, len(edited), batch_size))

    run_turn_vectors(rt, report, embedder, projector=PROJECTOR, table=TURN_EMBEDDINGS, batch_size=batch_size,
                     what="vector", on_chunk=on_chunk, on_changes=on_changes)
