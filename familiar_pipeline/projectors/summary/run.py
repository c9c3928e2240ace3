"""The rolling summary (projector `rolling_summary`): one compounding summary per scope.

The log is read in windows of exactly `turns_threshold` consecutive turns, so windows
are a pure function of the turn log (a rebuild replays the same prompts). A window is
split by scope (`scopes.turn_scope`): each scope's turns of it are folded, one model
call per scope, into that scope's prior summary, never another's, and the summary's
`last_turn_id` becomes the window's end. So the summary of scope S up to turn N has
folded every turn of S with id <= N (a scope absent from a window keeps its row: it
had no turn there). A single-scope window sends the prompt it always did. One run
folds at most `backfill_cap` turns. An empty reply in any scope writes nothing for the
window and keeps the watermark: the window is retried on the next run (its other
scopes' calls are then answered from the response cache) rather than replaced by an
empty summary.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from familiar_pipeline.projectors.prompting import MAX_PROSE_CHARS
from familiar_pipeline.storage.scopes import turn_scope
from familiar_pipeline.storage.turns import Turn

from . import prompt
from .tables import put_summary, stored_summaries

if TYPE_CHECKING:
    from familiar_pipeline.projectors.report import ProjectionReport
    from familiar_pipeline.projectors.runtime import FamiliarRuntime

PROJECTOR = "rolling_summary"
WRITE_GROUP_BATCHES = 20  # see projections.facts: short grouped writes, never across a model call
WRITE_GROUP_SECONDS = 2.0


def write_windows(rt: FamiliarRuntime, pending: list[tuple[int, dict[str, str]]]) -> None:
    """One transaction per folded window (its scopes' summaries + watermark), one snapshot for the group."""
    if not pending:
        return
    with rt.store() as store:
        for watermark, texts in pending:
            with store.transaction():
                for scope, text in texts.items():
                    put_summary(store, text, watermark, scope=scope)
                store.set_watermark(PROJECTOR, turn_id=watermark)
        rt.publish(store)


def by_scope(window: list[Turn]) -> dict[str, list[Turn]]:
    """The window's turns per scope, in id order; scopes in the order of their first turn."""
    parts: dict[str, list[Turn]] = {}
    for turn in window:
        parts.setdefault(turn_scope(turn), []).append(turn)
    return parts


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    knobs = rt.config.memory.rolling_summary
    window_size = knobs.turns_threshold
    max_windows = max(1, min(rt.config.pipeline.max_batches_per_run, knobs.backfill_cap // window_size))
    turn_log = rt.turn_log()
    with rt.store() as store:
        watermark = store.get_watermark(PROJECTOR).turn_id
        priors: dict[str, str] = {row.scope: row.summary_text for row in stored_summaries(store)}
    report.watermark_before = {"turn_id": watermark}
    pending: list[tuple[int, dict[str, str]]] = []
    group_started = time.monotonic()
    for _ in range(max_windows):
        window = turn_log.turns_after(watermark, limit=window_size)
        if len(window) < window_size:
            break
        report.turns_read += len(window)
        texts: dict[str, str] = {}
        failed = False
        for scope, part in by_scope(window).items():
            visible = [t for t in part if not t.deleted]
            if not visible:
                continue
            llm_started = time.perf_counter()
            reply = rt.llm.complete(prompt.build_messages(priors.get(scope), visible))
            report.llm_seconds += time.perf_counter() - llm_started
            text = prompt.parse_reply(reply.text)
            if len(text) > MAX_PROSE_CHARS:
                report.drop("oversized_reply")  # kept out like an empty one: the old summary stands
                failed = True
                break
            if not text:
                report.drop("empty_reply")
                failed = True
                break
            texts[scope] = text
        if failed:
            break
        report.batches += 1
        watermark = window[-1].id
        pending.append((watermark, texts))
        priors.update(texts)
        report.rows_written += len(texts)
        if len(pending) >= WRITE_GROUP_BATCHES or time.monotonic() - group_started >= WRITE_GROUP_SECONDS:
            write_windows(rt, pending)
            pending, group_started = [], time.monotonic()
    write_windows(rt, pending)
    report.watermark_after = {"turn_id": watermark}
    if priors:
        report.preview = [{"scope": scope, "summary": text[:500]} for scope, text in sorted(priors.items())]
    if report.batches == 0 and not report.dropped:
        report.no_op(f"fewer than turns_threshold={window_size} new turns")
