"""Reflections (projector `reflection`): cited, higher-order syntheses over windows of turns.

Windows are consecutive runs of `turns_threshold` turns by position, so they are
a pure function of the turn log; the prompt shows the newest
`max_turns_per_tick` turns of a window (deleted ones left out) and the
`recent_facts_limit` newest facts that were current at the window's end: facts
up to the fact horizon at the window's last turn, as supersession left them at
that point (see `horizon`). A window waits until the fact extractor (and
supersession, when active) has passed it, so an incremental build and a
rebuild show the model the same facts.

Kept: citations of turns shown in the window and of facts that existed at that
point (retired ones too: a reflection may rest on an earlier belief; readers
mark it stale); items with no valid citation are dropped; at most
`max_reflections_per_tick` rows per window, enforced here, not only asked for.
A window never spans scopes: it is split by scope (`scopes.turn_scope`), one call per
scope, each showing that scope's turns and only facts of that scope, and each row
carries its scope. A single-scope window sends the prompt it always did. A part
whose turns span several channels of one server yields channel-agnostic rows
(channel NULL). The watermark always advances past a window, even when the
reply is `[]`, garbage, or the call failed: a window that produced nothing is
never re-sent, so prompts cannot grow without bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from familiar_pipeline.models.llm import llm_sources
from familiar_pipeline.projectors.facts.store import (
    fact_horizon,
    fact_ids_upto,
    facts_current_at_horizon,
    source_turns,
)
from familiar_pipeline.storage.scopes import turn_scope
from familiar_pipeline.storage.turns import Turn

from . import prompt
from .spec import PROJECTOR
from .tables import append_reflections

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime


def window_channel(turns) -> int | None:
    """The window's channel when all its turns share one, else None (channel-agnostic)."""
    channels = {t.channel_id for t in turns}
    return channels.pop() if len(channels) == 1 else None


def by_scope(window: list[Turn]) -> dict[str, list[Turn]]:
    """The window's turns per scope, in id order; scopes in the order of their first turn."""
    parts: dict[str, list[Turn]] = {}
    for turn in window:
        parts.setdefault(turn_scope(turn), []).append(turn)
    return parts


def filter_items(items, *, shown_turn_ids: set[int], known_fact_ids: set[int], limit: int, report):
    """Reflections worth keeping: non-empty text, at least one valid citation, at most `limit`."""
    kept: list[tuple[str, list[int], list[int]]] = []  # (text, cited turn ids, cited fact ids)
    for item in items:
        turns = [i for i in item.cited_turn_ids if i in shown_turn_ids]
        facts = [i for i in item.cited_fact_ids if i in known_fact_ids]
        if len(turns) + len(facts) < len(item.cited_turn_ids) + len(item.cited_fact_ids):
            report.drop("invalid_citations")
        if not item.text:
            report.drop("empty_text")
        elif not turns and not facts:
            report.drop("uncited")
        elif len(kept) >= limit:
            report.drop("over_max_reflections")
        else:
            kept.append((item.text, turns, facts))
    return kept


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    cfg = rt.config
    knobs = cfg.memory.reflection
    turn_log = rt.turn_log()
    with rt.store() as store:
        mark = store.get_watermark(PROJECTOR)
        rich = store.get_watermark("rich_note").turn_id if cfg.memory.is_active("rich_note") else None
        supersede = store.get_watermark("fact_supersede").fact_id if cfg.memory.is_active("fact_supersede") else None
    report.watermark_before = {"turn_id": mark.turn_id, "fact_id": mark.fact_id}
    turn_wm, fact_wm = mark.turn_id, mark.fact_id
    waiting = ""
    for _ in range(cfg.pipeline.max_batches_per_run):
        window = turn_log.turns_after(turn_wm, limit=knobs.turns_threshold)
        if len(window) < knobs.turns_threshold:
            break
        end = window[-1].id
        if rich is not None and rich < end:
            waiting = "facts have not reached this window yet"
            break
        with rt.store() as store:
            horizon = max(fact_wm, fact_horizon(store, end))
            if supersede is not None and supersede < horizon:
                waiting = "supersession has not reached this window yet"
                break
            parts = []
            for scope, part in by_scope(window).items():
                facts = facts_current_at_horizon(store, horizon, knobs.recent_facts_limit, scope=scope)
                parts.append((scope, part, facts, fact_ids_upto(store, horizon, scope=scope)))
        report.turns_read += len(window)
        report.batches += 1
        written: list[tuple[str, int | None, list]] = []  # (scope, channel, rows) per part
        failed: Exception | None = None
        for scope, part, facts, known in parts:
            shown = [t for t in part if not t.deleted][-knobs.max_turns_per_tick :]
            rows: list = []
            if shown and failed is None:
                messages = prompt.build_messages(shown, [(f.id, f.text) for f in facts],
                                                 max_items=knobs.max_reflections_per_tick)
                try:
                    # rests on the turns shown and those the facts shown were extracted from
                    with llm_sources(turns=[*(t.id for t in shown), *source_turns(facts)]):
                        reply = rt.llm.complete(messages, json_schema=prompt.REPLY_SCHEMA)
                    report.llm_seconds += reply.latency_s
                    items, malformed = prompt.parse_reply(reply.text)
                    report.drop("malformed_items", malformed)
                    rows = filter_items(
                        items, shown_turn_ids={t.id for t in shown}, known_fact_ids=known,
                        limit=knobs.max_reflections_per_tick, report=report,
                    )
                except Exception as exc:  # the watermark still advances: never re-send a window
                    failed = exc
                    report.drop("llm_error")
                    report.extra["llm_error"] = f"{type(exc).__name__}: {exc}"[:300]
            written.append((scope, window_channel(part), rows))
        turn_wm, fact_wm = end, horizon
        with rt.store() as store:
            with store.transaction():
                for scope, channel, rows in written:
                    append_reflections(store, rows, channel_id=channel, last_turn_id=end, last_fact_id=horizon,
                                       scope=scope)
                store.set_watermark(PROJECTOR, turn_id=end, fact_id=horizon)
            rt.publish(store)
        for _, channel, rows in written:
            report.rows_written += len(rows)
            report.preview.extend(
                {"channel": channel, "chars": len(text), "turns": ", ".join(map(str, t)), "facts": ", ".join(map(str, f))}
                for text, t, f in rows
            )
        if failed is not None:
            break  # one failed call per run is enough; the next run tries the next window
    report.watermark_after = {"turn_id": turn_wm, "fact_id": fact_wm}
    if report.batches == 0:
        report.no_op(waiting or f"fewer than turns_threshold={knobs.turns_threshold} new turns")
