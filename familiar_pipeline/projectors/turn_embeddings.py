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

from familiar_pipeline.projectors.embeddings import embedder_or_skip
from familiar_pipeline.projectors.spec import TURN_INDEX, DropRule, ProjectorSpec, knob
from familiar_pipeline.projectors.turns_index import search_text

PROJECTOR = "turn_embedding"


@dataclass(frozen=True)
class TurnEmbeddingConfig:
    """[providers.memory.turn_embedding]"""

    batch_size: int = knob(64, minimum=1)


def embedding_text(turn) -> str:
    """What a turn's vector encodes: the same "speaker: text" the full-text index holds."""
    return search_text(turn)


def run(rt, report, *, rebuild: bool = False) -> None:
    embedder = embedder_or_skip(rt, report, PROJECTOR)
    if embedder is None:
        return
    batch_size = rt.config.memory.turn_embedding.batch_size
    turn_log = rt.turn_log()
    with rt.store() as store:
        mark = store.get_watermark(PROJECTOR)
        restart = mark.turn_id > 0 and store.turn_embedding_count(embedder.name) == 0
    turn_wm, change_wm = (0, 0) if restart else (mark.turn_id, mark.change_seq)
    report.watermark_before = {"turn_id": mark.turn_id, "change_seq": mark.change_seq}
    report.extra["model"] = embedder.name
    if restart:
        report.extra["restarted"] = f"no vectors under {embedder.name}; embedding every turn"
    latest_change = turn_log.latest_change_seq()
    if turn_wm == 0:
        change_wm = latest_change  # every turn is read with its current text below

    def write(batch: list, position: int) -> bool:
        vectors = embedder.embed([embedding_text(t) for t in batch])
        if len(vectors) != len(batch):
            report.drop("length_mismatch", len(batch))
            report.extra["mismatch"] = f"{len(batch)} texts, {len(vectors)} vectors"
            return False
        with rt.store() as store:
            with store.transaction():
                store.set_turn_embeddings(embedder.name, [(t.id, v) for t, v in zip(batch, vectors)])
                store.set_watermark(PROJECTOR, turn_id=position, change_seq=change_wm)
            rt.publish(store)
        report.batches += 1
        report.rows_written += len(batch)
        return True

    for _ in range(rt.config.pipeline.max_batches_per_run):
        chunk = turn_log.turns_after(turn_wm, limit=batch_size)
        if not chunk:
            break
        report.turns_read += len(chunk)
        live = [t for t in chunk if not t.deleted and t.content.strip()]
        if live and not write(live, chunk[-1].id):
            break
        if not live:
            with rt.store() as store:
                store.set_watermark(PROJECTOR, turn_id=chunk[-1].id, change_seq=change_wm)
        turn_wm = chunk[-1].id

    # Edits and deletions of turns already embedded.
    if not report.dropped and change_wm < latest_change:
        changed = sorted({c.turn_id for c in turn_log.changes_after(change_wm)
                          if c.seq <= latest_change and c.turn_id <= turn_wm})
        current = {t.id: t for t in turn_log.turns_by_ids(changed)}
        gone = [tid for tid in changed if tid not in current or current[tid].deleted]
        edited = [current[tid] for tid in changed if tid in current and not current[tid].deleted]
        change_wm = latest_change
        with rt.store() as store:
            report.extra["removed"] = store.delete_turn_embeddings(gone)
        ok = True
        for start in range(0, len(edited), batch_size):
            ok = write(edited[start:start + batch_size], turn_wm)
            if not ok:
                break
        if ok:
            with rt.store() as store:
                store.set_watermark(PROJECTOR, turn_id=turn_wm, change_seq=change_wm)
                rt.publish(store)
    report.watermark_after = {"turn_id": turn_wm, "change_seq": change_wm}
    report.extra["dim"] = embedder.dim
    if report.batches == 0 and not report.dropped and not report.extra.get("removed"):
        report.no_op(f"every live turn has a vector for {embedder.name}")


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="turn_embeddings",
    run=run,
    description="""Opt-in: a vector per live turn for the active embedding model (projector `turn_embedding`).

    New turns are embedded in batches of `batch_size`, edited turns re-embedded, deleted turns' vectors
    removed; `rag_context` fuses the cosine with BM25 (`[memory.retrieval].turn_embedding_weight`).
    Needs [providers.embedding].backend other than "off".
    """,
    group="turns",
    kinds={"duckdb"},
    trigger=TURN_INDEX,
    needs_llm=False,
    needs_embedder=True,
    knobs=TurnEmbeddingConfig,
    drop=DropRule(tables=("turn_embeddings",)),  # every turn vector, all models
)
