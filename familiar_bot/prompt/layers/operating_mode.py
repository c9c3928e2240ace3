"""``operating_mode``: how to write for the medium (spoken voice vs. a text channel)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from familiar_bot.prompt.layers.spec import LayerSpec

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext

MODES = {
    "voice": "You are speaking aloud. Keep replies short, one or two sentences, and avoid markdown.",
    "text": "You are chatting in a text channel. Markdown and multi-line replies are fine.",
    "background": "",  # background work writes no replies
}


class OperatingModeLayer:
    name = "operating_mode"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return ctx.tier

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return MODES.get(ctx.tier, "")


SPEC = LayerSpec(name="operating_mode", layer=OperatingModeLayer, position=200)
