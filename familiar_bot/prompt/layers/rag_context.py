"""``rag_context``: facts and earlier turns relevant to the new message (see :mod:`familiar_bot.prompt.retrieval.hub`).

Always the last system-prompt layer: it changes with every message, so it
stays out of the stable prefix a provider's prompt cache can reuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from familiar_bot.prompt.layers.common import content_hash
from familiar_bot.prompt.layers.recent_history import history_view
from familiar_bot.prompt.layers.spec import BudgetKnob, LayerSpec

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext


def excluded_turns(ctx: AssemblyContext, memory: MemoryView) -> frozenset[int]:
    """What the prompt already shows: the history's turns, or at least the message being answered."""
    if ctx.channel_id is None:
        return frozenset()
    if "recent_history" in memory.config.channel(ctx.channel_id).prompt_layers:
        return history_view(ctx, memory).shown_ids
    return frozenset(t.id for t in memory.channel_window(ctx.channel_id, 1))


class RagContextLayer:
    name = "rag_context"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        cue = ctx.cue.strip()
        if not cue:
            return "no-cue"
        window = memory.window_token(ctx.channel_id) if ctx.channel_id is not None else None
        embedder = getattr(memory.embedder, "name", None)
        return (f"{content_hash(cue)}|ch{ctx.channel_id}|g{ctx.guild_id}|{ctx.tier}|w{window}"
                f"|s{memory.snapshot.version}|ft{memory.fts_turns.generation}"
                f"|ff{memory.fts_facts.generation}|e{embedder}")

    def prefetch(self, ctx: AssemblyContext, memory: MemoryView) -> None:
        """Start embedding the cue on the memory view's worker while the other layers build."""
        cue = ctx.cue.strip()
        # lazy: only a reply needs retrieval; a pipeline process registering this spec never imports it
        from familiar_bot.prompt.retrieval.hub import needs_cue_vector

        if cue and needs_cue_vector(memory):
            memory.prefetch_cue_vector(cue)

    def build_with_debug(self, ctx: AssemblyContext, memory: MemoryView) -> tuple[str, dict[str, Any]]:
        from familiar_bot.prompt.retrieval.hub import retrieve  # lazy: as in prefetch

        return retrieve(ctx, memory, excluded_turns(ctx, memory))

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return self.build_with_debug(ctx, memory)[0]


SPEC = LayerSpec(
    name="rag_context",
    layer=RagContextLayer,
    position=800,  # the last system-prompt layer: it changes with every message
    debug_key="rag",
    scope_parts=("facts", "turns"),  # its debug block counts scope_excluded_facts and scope_excluded_turns
    budget=(BudgetKnob("rag_tokens", voice=900, text=2400, background=8000),
            BudgetKnob("max_rag_turns", voice=10, text=32, background=24, tokens=False),
            BudgetKnob("max_rag_facts", voice=6, text=10, background=16, tokens=False)),
)
