"""The rolling summary (projector `rolling_summary`): one compounding summary of the conversation.

Each model call folds exactly `turns_threshold` consecutive turns into the prior
summary, so windows are a pure function of the turn log (a rebuild replays the
same prompts). One run folds at most `backfill_cap` turns. An empty reply writes
nothing and keeps the watermark: the window is retried on the next run rather
than replaced by an empty summary.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from familiar_pipeline.projectors.prompting import MAX_PROSE_CHARS

from . import prompt
from .tables import get_summary, put_summary

if TYPE_CHECKING:
    from familiar_pipeline.projectors.report import ProjectionReport
    from familiar_pipeline.projectors.runtime import FamiliarRuntime

PROJECTOR = "rolling_summary"
WRITE_GROUP_BATCHES = 20  # see projections.facts: short grouped writes, never across a model call
WRITE_GROUP_SECONDS = 2.0


def write_windows(rt: FamiliarRuntime, pending: list[tuple[int, str]]) -> None:
    """One transaction per folded window (summary + watermark), one snapshot for the group."""
    if not pending:
        return
    with rt.store() as store:
        for watermark, text in pending:
            with store.transaction():
                if text:
                    put_summary(store, text, watermark)
                store.set_watermark(PROJECTOR, turn_id=watermark)
        rt.publish(store)


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    knobs = rt.config.memory.rolling_summary
    window_size = knobs.turns_threshold
    max_windows = max(1, min(rt.config.pipeline.max_batches_per_run, knobs.backfill_cap // window_size))
    turn_log = rt.turn_log()
    with rt.store() as store:
        watermark = store.get_watermark(PROJECTOR).turn_id
        prior = get_summary(store)
    prior_text = prior.summary_text if prior else None
    report.watermark_before = {"turn_id": watermark}
    pending: list[tuple[int, str]] = []
    group_started = time.monotonic()
    for _ in range(max_windows):
        window = turn_log.turns_after(watermark, limit=window_size)
        if len(window) < window_size:
            break
        visible = [t for t in window if not t.deleted]
        report.turns_read += len(window)
        text = ""
        if visible:
            llm_started = time.perf_counter()
            reply = rt.llm.complete(prompt.build_messages(prior_text, visible))
            report.llm_seconds += time.perf_counter() - llm_started
            text = prompt.parse_reply(reply.text)
            if len(text) > MAX_PROSE_CHARS:
                report.drop("oversized_reply")  # kept out like an empty one: the old summary stands
                break
            if not text:
                report.drop("empty_reply")
                break
        report.batches += 1
        watermark = window[-1].id
        pending.append((watermark, text))
        if text:
            prior_text = text
            report.rows_written += 1
        if len(pending) >= WRITE_GROUP_BATCHES or time.monotonic() - group_started >= WRITE_GROUP_SECONDS:
            write_windows(rt, pending)
            pending, group_started = [], time.monotonic()
    write_windows(rt, pending)
    report.watermark_after = {"turn_id": watermark}
    if prior_text:
        report.preview = [{"summary": prior_text[:500]}]
    if report.batches == 0 and not report.dropped:
        report.no_op(f"fewer than turns_threshold={window_size} new turns")
