"""``conversation_summary``: the rolling summary of the whole conversation.

The summary is familiar-wide (one scope), so every channel and tier sees the
same text. It is LLM output derived from user turns: header lines are escaped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from familiar_bot.prompt.layers.common import neutralise_headers
from familiar_bot.prompt.tokens import truncate_to_tokens
from familiar_pipeline.projectors.summary.tables import Summary, summary

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext

HEADER = "## Conversation so far"


def _summary(memory: MemoryView) -> Summary | None:
    snapshot = memory.snapshot
    return memory.memo(("summary", snapshot.version), lambda: summary(snapshot))


class ConversationSummaryLayer:
    name = "conversation_summary"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        row = _summary(memory)
        if not row:
            return "none"
        cap = memory.config.budget_for(ctx.tier).summary_tokens
        return f"t{row.last_turn_id}|{row.created_at.isoformat()}|cap{cap}"

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        row = _summary(memory)
        text = row.summary_text if row else ""
        text = neutralise_headers(text.strip())
        if not text:
            return ""
        cap = memory.config.budget_for(ctx.tier).summary_tokens
        return f"{HEADER}\n\n{truncate_to_tokens(text, cap)}"
