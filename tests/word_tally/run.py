"""Tally each closed batch of `batch_size` turns past the watermark: one row per speaker."""

from __future__ import annotations

from familiar_pipeline.engine.report import ProjectionReport
from familiar_pipeline.engine.runtime import FamiliarRuntime
from familiar_pipeline.storage.scopes import scope_of_turns

from .tables import WordTally, write_tallies

PROJECTOR = "word_tally"


def tally(batch: list, min_words: int = 1) -> list[WordTally]:
    """The batch's rows: per user speaker with at least ``min_words``, words said in live turns, citing those turns."""
    by_speaker: dict[str, list] = {}
    for turn in batch:
        if turn.role == "user" and turn.author_key and not turn.deleted:
            by_speaker.setdefault(turn.author_key, []).append(turn)
    end = batch[-1].id
    rows = [WordTally(end, key, sum(len(t.content.split()) for t in turns), tuple(t.id for t in turns),
                      scope_of_turns(turns))
            for key, turns in sorted(by_speaker.items())]
    return [row for row in rows if row.words >= min_words]


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    knobs = rt.config.memory.knobs(PROJECTOR)
    size = knobs.batch_size
    with rt.store() as store:
        watermark = store.get_watermark(PROJECTOR).turn_id
    report.watermark_before = {"turn_id": watermark}
    for _ in range(rt.config.pipeline.max_batches_per_run):
        batch = rt.turn_log().turns_after(watermark, limit=size)
        if len(batch) < size:
            break
        rows = tally(batch, knobs.min_words)
        with rt.store() as store:
            with store.transaction():
                write_tallies(store, rows)
                store.set_watermark(PROJECTOR, turn_id=batch[-1].id)
            rt.publish(store)
        watermark = batch[-1].id
        report.batches += 1
        report.turns_read += len(batch)
        report.rows_written += len(rows)
    report.watermark_after = {"turn_id": watermark}
    if report.batches == 0:
        report.no_op(f"fewer than batch_size={size} new turns")
