"""``recent_history``: the channel's latest turns as chat messages.

Per channel, not cross-channel: a reply in a guild channel must not carry a
direct-message conversation into its prompt. The window is the channel's
``history_window_size`` override, else the tier's ``[providers.history]`` window,
never more than the tier's ``max_history_turns``; deleted turns are left out.

User turns become ``user`` messages with an API-safe ``name`` (from the
canonical key) and, in the default ``prefixed`` rendering, a ``[HH:MM Name]``
prefix in ``display_tz`` (``[YYYY-MM-DD HH:MM Name]`` for a turn not on the day of
the newest turn shown, normally today: imported or old turns keep their dates);
``name_only`` drops the prefix. Turns are shown in timestamp order, so imported
turns sit where they happened, not after the live ones. Fragments from one speaker
without platform message ids (voice, console lines) a few seconds apart are merged,
never across a sentence end; the text tier can fold away
everything before the last long silence. When over ``recent_history_tokens``
the oldest messages go first and the newest is always kept. A reply's history ends
with the turn it answers (``AssemblyContext.answering``); the familiar's replies to earlier
turns sent since are shown after the turn each answers. Tool results are
replayed as user narration, never as ``tool``/``assistant`` messages (that would
orphan a tool call and invite the model to mimic it).

``history_view`` is shared with ``rag_context``: retrieval must exclude exactly
the turns shown here, after merging, folding and trimming.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from typing import TYPE_CHECKING

from familiar_bot.prompt.layers.common import Labels, clock_24h, one_line, sanitize_name
from familiar_bot.prompt.layers.spec import BudgetKnob, LayerSpec
from familiar_bot.prompt.tokens import message_tokens
from familiar_bot.prompt.types import Message

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext
    from familiar_pipeline.storage.turns import Turn

REPLY_SNIPPET_CHARS = 80
# A fragment ending like this ends a sentence: the next one starts a new message.
_SENTENCE_END = re.compile(r"[.!?…]['\"’”)\]]*\s*$")


@dataclass(frozen=True)
class _Run:
    """One message-to-be: a turn, or several merged voice fragments."""

    turn: Turn  # the first turn of the run (its time and author)
    ids: tuple[int, ...]
    content: str
    last_at: datetime  # time of the latest fragment: a long monologue keeps merging


@dataclass(frozen=True)
class HistoryView:
    messages: tuple[Message, ...]
    shown_ids: frozenset[int]  # turn ids behind the kept messages (and those after the turn answered: never retrieved)
    window_ids: frozenset[int]  # every turn id the window read, before folding and trimming


def window_size(ctx: AssemblyContext, memory: MemoryView) -> int:
    cfg = memory.config
    budget = cfg.budget_for(ctx.tier)
    size = cfg.history.voice_window_size if ctx.tier == "voice" else cfg.history.text_window_size
    if ctx.channel_id is not None:
        override = cfg.channel(ctx.channel_id).history_window_size
        if override:
            size = override
    return max(1, min(size, budget.max_history_turns))


def _coalesce(turns: Iterable[Turn], max_gap: float) -> list[_Run]:
    runs: list[_Run] = []
    for t in turns:
        prev = runs[-1] if runs else None
        if (
            prev is not None
            and max_gap > 0
            and t.role == prev.turn.role
            and t.author_key is not None
            and t.author_key == prev.turn.author_key
            and not (t.platform_message_id or t.reply_to_message_id)
            and not (prev.turn.platform_message_id or prev.turn.reply_to_message_id)
            and 0 <= (t.created_at - prev.last_at).total_seconds() <= max_gap
            and not _SENTENCE_END.search(prev.content)
        ):
            runs[-1] = _Run(prev.turn, prev.ids + (t.id,), f"{prev.content} {t.content}", t.created_at)
        else:
            runs.append(_Run(t, (t.id,), t.content, t.created_at))
    return runs


def _up_to(turns: list[Turn], answering: int) -> tuple[list[Turn], frozenset[int]]:
    """A reply's history: it ends with the turn it answers, and what people said after it is neither
    shown nor retrieved for it (the next reply shows it). The familiar's own replies sent meanwhile to
    earlier turns stay, each right after the turn it answers, so it does not repeat itself and the
    prompt still ends with the message being answered (the reply instructions say so). The ids left
    out are returned too."""
    kept = [t for t in turns if t.id <= answering]
    replies = [t for t in turns if t.id > answering and t.role == "assistant"
               and t.reply_to_turn_id is not None and t.reply_to_turn_id < answering]
    for reply in replies:
        at = next((i for i, t in enumerate(kept) if t.id == reply.reply_to_turn_id), None)
        if at is None:
            continue
        while at + 1 < len(kept) and kept[at + 1].role == "assistant":
            at += 1  # after the replies already there
        kept.insert(at + 1, reply)
    shown = {t.id for t in kept}
    return kept, frozenset(t.id for t in turns if t.id not in shown)


def _fold_silence(runs: list[_Run], threshold: float) -> list[_Run]:
    """Keep only what follows the last silence of at least ``threshold`` seconds."""
    if threshold <= 0 or len(runs) < 2:
        return runs
    start = 0
    for i in range(1, len(runs)):
        if (runs[i].turn.created_at - runs[i - 1].turn.created_at).total_seconds() >= threshold:
            start = i
    return runs[start:]


def _stamp(moment: datetime, tz: tzinfo, today: date | None) -> str:
    """``HH:MM`` on `today` (the newest turn's local date), else ``YYYY-MM-DD HH:MM``."""
    local = moment.astimezone(tz)
    clock = clock_24h(moment, tz)
    return clock if local.date() == today else f"{local.date().isoformat()} {clock}"


def _render(run: _Run, labels: Labels, tz: tzinfo, rendering: str, by_message_id: dict[str, Turn],
            today: date | None = None) -> Message:
    t = run.turn
    content = labels.rewrite_mentions(run.content)
    if t.revision:
        content += " (edited)"
    if t.role == "assistant":
        return Message("assistant", content)
    if t.role == "tool":
        return Message("user", f"[tool result] {content}")
    if t.role == "system":
        return Message("user", f"[system note] {content}")
    prefix = ""
    parent = by_message_id.get(t.reply_to_message_id) if t.reply_to_message_id else None
    if parent is not None:
        snippet = one_line(labels.rewrite_mentions(parent.content))
        if len(snippet) > REPLY_SNIPPET_CHARS:
            snippet = snippet[: REPLY_SNIPPET_CHARS - 1] + "…"
        prefix = f"↩ {labels.for_turn(parent)}: {snippet} "
    name = sanitize_name(t.author_key) if t.author_key else None
    if rendering == "name_only" and name:
        return Message("user", prefix + content, name)
    return Message("user", f"[{_stamp(t.created_at, tz, today)} {labels.for_turn(t)}] {prefix}{content}", name)


def _compute(ctx: AssemblyContext, memory: MemoryView) -> HistoryView:
    assert ctx.channel_id is not None  # history_view answers a context without a channel itself
    cfg = memory.config
    # The window is the newest turns by id (arrival); shown in timestamp order.
    turns = sorted(memory.channel_window(ctx.channel_id, window_size(ctx, memory)),
                   key=lambda t: (t.created_at, t.id))
    window_ids = frozenset(t.id for t in turns)
    later: frozenset[int] = frozenset()
    if ctx.answering is not None:
        turns, later = _up_to(turns, ctx.answering)
    runs = _coalesce(turns, cfg.history.coalesce_max_gap_seconds)
    if ctx.tier == "text":
        runs = _fold_silence(runs, cfg.history.text_silence_gap_fold_seconds)
    labels = memory.labels(ctx.guild_id)
    by_message_id = {t.platform_message_id: t for t in turns if t.platform_message_id}
    rendering = cfg.channel(ctx.channel_id).message_rendering
    tz = cfg.tz
    today = turns[-1].created_at.astimezone(tz).date() if turns else None
    rendered = []
    for r in runs:
        parent = by_message_id.get(r.turn.reply_to_message_id) if r.turn.reply_to_message_id else None
        # Rendering 200 messages per reply adds up; a message is reused while nothing it shows changed.
        key = None if "<@" in r.content or parent is not None else (
            "msg", r.ids, r.content, r.turn.revision, labels.for_turn(r.turn), rendering, cfg.display_tz, today)
        cached = memory.memo_get(key) if key else None
        if cached is None:
            message = _render(r, labels, tz, rendering, by_message_id, today)
            cached = (message, message_tokens(message.content, message.name))
            if key:
                memory.memo_put(key, cached, bulk=True)
        rendered.append(cached)
    messages = [m for m, _ in rendered]
    costs = [c for _, c in rendered]
    # Trim oldest-first to the budget; the newest message always stays.
    cap = cfg.budget_for(ctx.tier).recent_history_tokens
    total, start = sum(costs), 0
    while total > cap and start < len(messages) - 1:
        total -= costs[start]
        start += 1
    kept_runs = runs[start:]
    return HistoryView(
        messages=tuple(messages[start:]),
        shown_ids=frozenset(i for r in kept_runs for i in r.ids) | later,
        window_ids=window_ids,
    )


def history_view(ctx: AssemblyContext, memory: MemoryView) -> HistoryView:
    """The channel's rendered history (memoised per channel state and tier)."""
    if ctx.channel_id is None:
        return HistoryView((), frozenset(), frozenset())
    token = memory.window_token(ctx.channel_id)
    return memory.memo(("history", ctx.channel_id, ctx.guild_id, ctx.tier, ctx.answering, token),
                       lambda: _compute(ctx, memory))


class RecentHistoryLayer:
    name = "recent_history"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return "always-rebuild"

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return ""  # contributes messages, not system-prompt text

    def messages(self, ctx: AssemblyContext, memory: MemoryView) -> list[Message]:
        return list(history_view(ctx, memory).messages)


__all__ = ["SPEC", "HistoryView", "RecentHistoryLayer", "history_view", "window_size"]


SPEC = LayerSpec(
    name="recent_history",
    layer=RecentHistoryLayer,
    position=900,  # chat messages after the system prompt
    budget=(BudgetKnob("recent_history_tokens", voice=3000, text=8000, background=24000),
            BudgetKnob("max_history_turns", voice=200, text=400, background=1000, tokens=False)),
)
