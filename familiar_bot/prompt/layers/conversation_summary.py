"""``conversation_summary``: the rolling summary of the conversation this reply is in.

There is one summary per scope; a reply reads its own scope's, then those of the
scopes ``[memory.scopes]`` joins to it (:mod:`familiar_bot.prompt.scoping`), each
its own paragraph. Every other summary is counted as excluded, never shown. It is
LLM output derived from user turns: header lines are escaped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from familiar_bot.prompt.layers.common import neutralise_headers
from familiar_bot.prompt.layers.spec import BudgetKnob, LayerSpec
from familiar_bot.prompt.scoping import scope_key, scope_mask, visible_scopes
from familiar_bot.prompt.tokens import truncate_to_tokens
from familiar_pipeline.projectors.summary.tables import SUMMARIES, Summary

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext

HEADER = "## Conversation so far"


def _summaries(ctx: AssemblyContext, memory: MemoryView) -> tuple[list[Summary], int]:
    """The visible scopes' summaries (the reply's own first) and how many others exist."""
    snapshot = memory.snapshot
    visible = visible_scopes(ctx, memory)

    def compute() -> tuple[list[Summary], int]:
        snap = snapshot.current()
        table = snap.table("summaries")
        mask = scope_mask(table, visible)
        rows = {r.scope: r for r in snap.records(SUMMARIES, table.filter(mask))}
        shown = [rows[s] for s in visible if s in rows]
        return shown, table.num_rows - len(rows)

    return memory.memo(("summary", snapshot.version, visible), compute)


class ConversationSummaryLayer:
    name = "conversation_summary"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        rows, excluded = _summaries(ctx, memory)
        cap = memory.config.budget_for(ctx.tier).summary_tokens
        if not rows:
            return f"none|{scope_key(ctx, memory)}|x{excluded}"
        parts = ";".join(f"{r.scope}:t{r.last_turn_id}:{r.created_at.isoformat()}" for r in rows)
        return f"{parts}|{scope_key(ctx, memory)}|x{excluded}|cap{cap}"

    def build_with_debug(self, ctx: AssemblyContext, memory: MemoryView) -> tuple[str, dict[str, Any]]:
        rows, excluded = _summaries(ctx, memory)
        debug = {"scope_excluded": excluded, "scopes": [r.scope for r in rows]}
        texts = [neutralise_headers(r.summary_text.strip()) for r in rows]
        text = "\n\n".join(t for t in texts if t)
        if not text:
            return "", debug
        cap = memory.config.budget_for(ctx.tier).summary_tokens
        return f"{HEADER}\n\n{truncate_to_tokens(text, cap)}", debug

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return self.build_with_debug(ctx, memory)[0]


SPEC = LayerSpec(
    name="conversation_summary",
    layer=ConversationSummaryLayer,
    position=500,
    scoped=True,
    budget=(BudgetKnob("summary_tokens", voice=600, text=1600, background=4000),),
)
