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

from familiar_pipeline.models.llm import llm_sources
from familiar_pipeline.projectors.prompting import MAX_PROSE_CHARS
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE, turn_scope
from familiar_pipeline.storage.turns import Turn, as_they_were

from . import prompt
from .spec import PROJECTOR
from .tables import delete_summaries, get_summary, put_summary, stored_summaries

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime

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


def ask(rt: FamiliarRuntime, report: ProjectionReport, messages: list[dict], *, turns: list[Turn],
        upto: int | None) -> str | None:
    """One summary call: its text, or None (counted as a drop) when it came back empty or oversized.

    ``turns``: those the prompt quotes; ``upto``: the last turn folded into the summary it quotes
    (None when it quotes none). The cached reply rests on both (`models.llm.llm_sources`): a
    summary compounds every earlier turn of its scope.
    """
    llm_started = time.perf_counter()
    with llm_sources(turns=[t.id for t in turns], upto=upto or None):
        reply = rt.llm.complete(messages)
    report.llm_seconds += time.perf_counter() - llm_started
    text = prompt.parse_reply(reply.text)
    if not text or len(text) > MAX_PROSE_CHARS:
        report.drop("empty_reply" if not text else "oversized_reply")  # the old summary stands
        return None
    return text


def by_scope(window: list[Turn]) -> dict[str, list[Turn]]:
    """The window's turns per scope, in id order; scopes in the order of their first turn."""
    parts: dict[str, list[Turn]] = {}
    for turn in window:
        parts.setdefault(turn_scope(turn), []).append(turn)
    return parts


def fold_scope(rt: FamiliarRuntime, report: ProjectionReport, turns: list[Turn], scope: str,
               window_size: int) -> tuple[str, int] | None:
    """The summary of `scope` folded from its first window over `turns` (the log from its start), or None.

    With the end of the last window that held the scope (the summary's `last_turn_id`, as
    the incremental runs wrote it).

    The windows and prompts are those the incremental runs sent, so every window before the
    first changed one is answered by the response cache; None when a fold came back empty.
    """
    text: str | None = None
    last = 0
    for start in range(0, len(turns) - window_size + 1, window_size):
        window = turns[start:start + window_size]
        visible = [t for t in window if turn_scope(t) == scope and not t.deleted]
        if not visible:
            continue
        folded = ask(rt, report, prompt.build_messages(text, visible), turns=visible, upto=last)
        if folded is None:
            return None
        text, last = folded, window[-1].id
    return (text, last) if text is not None else None


def windows_since(turns: list[Turn], first_id: int, scope: str, window_size: int) -> int:
    """How many whole windows of `turns` from the one holding turn `first_id` on hold a turn of `scope`."""
    start = next((i for i, t in enumerate(turns) if t.id >= first_id), len(turns)) // window_size * window_size
    return sum(1 for w in range(start, len(turns) - window_size + 1, window_size)
               if any(turn_scope(t) == scope for t in turns[w:w + window_size]))


def redact(rt: FamiliarRuntime, report: ProjectionReport, summary: str, last_turn_id: int,
           removed: list[tuple[Turn, str | None]]) -> str | None:
    """One call: `summary` (folded up to `last_turn_id`) without what the removed turns said (or with their
    new text); None when it failed."""
    return ask(rt, report, prompt.build_redact_messages(summary, removed), turns=[t for t, _ in removed],
               upto=last_turn_id)


def refold_changed(rt: FamiliarRuntime, report: ProjectionReport, change_seq: int, watermark: int) -> int | None:
    """Take edited and deleted turns out of the summaries that already folded them; the new `change_seq`, or None.

    A summary is a narrative: what a changed turn said cannot be cut out of it by code. A
    change within the last `refold_windows_max` windows of its scope is folded out exactly:
    the scope's summary is folded again from its first window, without the deleted turn or
    with the edited text (the windows before the change are answered by the response cache,
    so it costs one call per window from the changed one on, and equals a rebuild). An
    older change costs one call instead, which rewrites the current summary without the
    removed words. A scope whose call fails loses its summary rather than keep them (the
    next window starts it afresh), and so does the one familiar-wide summary written before
    scopes.
    """
    turn_log = rt.turn_log()
    changes = turn_log.changes_after(change_seq)
    if not changes:
        return None
    knobs = rt.config.memory.rolling_summary
    changed = {t.id: t for t in turn_log.turns_by_ids({c.turn_id for c in changes if c.turn_id <= watermark})}
    scopes = sorted({turn_scope(t) for t in changed.values()})
    texts: dict[str, tuple[str, int] | None] = {}
    redacted = 0
    if scopes:
        turns = turn_log.turns_in_range(0, watermark)
        with rt.store() as store:
            current = {row.scope: row for row in stored_summaries(store)}
        for scope in scopes:
            here = [c for c in changes if c.turn_id in changed and turn_scope(changed[c.turn_id]) == scope]
            if windows_since(turns, min(c.turn_id for c in here), scope, knobs.turns_threshold) \
                    <= knobs.refold_windows_max:
                texts[scope] = fold_scope(rt, report, turns, scope, knobs.turns_threshold)
            elif scope in current:
                text = redact(rt, report, current[scope].summary_text, current[scope].last_turn_id,
                              as_they_were(here, changed))
                texts[scope] = (text, current[scope].last_turn_id) if text else None
                redacted += text is not None
    with rt.store() as store:
        with store.transaction():
            legacy = get_summary(store, FAMILIAR_WIDE)
            gone = [s for s, text in texts.items() if text is None]
            if legacy is not None and changed and min(changed) <= legacy.last_turn_id:
                gone.append(FAMILIAR_WIDE)
            delete_summaries(store, gone)
            for scope, folded in texts.items():
                if folded is not None:
                    put_summary(store, folded[0], folded[1], scope=scope)
            store.set_watermark(PROJECTOR, change_seq=changes[-1].seq)
        rt.publish(store)
    report.extra["changes_followed"] = (f"{len(changed)} changed turn(s) already summarised: "
                                        f"{len(texts) - len([g for g in gone if g in texts]) - redacted} scope(s) "
                                        "folded again, "
                                        f"{redacted} redacted, {len(gone)} summary(ies) deleted")
    return changes[-1].seq


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    knobs = rt.config.memory.rolling_summary
    window_size = knobs.turns_threshold
    max_windows = max(1, min(rt.config.pipeline.max_batches_per_run, knobs.backfill_cap // window_size))
    turn_log = rt.turn_log()
    with rt.store() as store:
        mark = store.get_watermark(PROJECTOR)
    watermark = mark.turn_id
    followed = refold_changed(rt, report, mark.change_seq, watermark)
    with rt.store() as store:
        rows = stored_summaries(store)
    priors: dict[str, str] = {row.scope: row.summary_text for row in rows}
    folded_upto: dict[str, int] = {row.scope: row.last_turn_id for row in rows}  # what each prior rests on
    report.watermark_before = {"turn_id": watermark, "change_seq": mark.change_seq}
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
            text = ask(rt, report, prompt.build_messages(priors.get(scope), visible), turns=visible,
                       upto=folded_upto.get(scope) if priors.get(scope) else None)
            if text is None:
                failed = True
                break
            texts[scope] = text
        if failed:
            break
        report.batches += 1
        watermark = window[-1].id
        pending.append((watermark, texts))
        priors.update(texts)
        folded_upto.update((scope, watermark) for scope in texts)
        report.rows_written += len(texts)
        if len(pending) >= WRITE_GROUP_BATCHES or time.monotonic() - group_started >= WRITE_GROUP_SECONDS:
            write_windows(rt, pending)
            pending, group_started = [], time.monotonic()
    write_windows(rt, pending)
    report.watermark_after = {"turn_id": watermark, "change_seq": followed if followed is not None else mark.change_seq}
    if priors:
        report.preview = [{"scope": scope, "chars": len(text)} for scope, text in sorted(priors.items())]  # never the text
    if report.batches == 0 and not report.dropped and followed is None:
        report.no_op(f"fewer than turns_threshold={window_size} new turns")
