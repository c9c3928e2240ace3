"""The built-in prompt layers, and the default stack: every registered layer in its order.

Each layer declares itself in its own module (its ``SPEC``, a `LayerSpec`); this module
plugs the built-ins in (`registry.register_layer`), as a plugin does. It is the
``familiar.layers`` entry point (pyproject.toml), so config finds the layers' names, order
and budget keys on first use in any process, the pipeline's included, without importing
the bot. The order of the stack is the specs' ``position`` (most stable first), not the
order of this list.
"""

from __future__ import annotations

from familiar_bot.prompt.layers import (
    character_card,
    conversation_summary,
    lorebook,
    operating_mode,
    people_dossier,
    rag_context,
    recent_history,
    reflection,
    standing_wishes,
)
from familiar_bot.prompt.layers.registry import layer_specs, register_layer
from familiar_bot.prompt.layers.spec import LayerSpec
from familiar_bot.prompt.types import Layer

# The built-in layers. A new built-in is its module plus one line here.
BUILTIN_LAYERS: tuple[LayerSpec, ...] = (
    character_card.SPEC,
    operating_mode.SPEC,
    standing_wishes.SPEC,
    lorebook.SPEC,
    conversation_summary.SPEC,
    reflection.SPEC,
    people_dossier.SPEC,
    rag_context.SPEC,
    recent_history.SPEC,
)
for _spec in BUILTIN_LAYERS:
    register_layer(_spec)


def default_layers() -> list[Layer]:
    """One instance of every registered layer, in the default order (``config.layer_names()``)."""
    layers: list[Layer] = []
    for spec in layer_specs():
        layer = spec.layer()
        if layer.name != spec.name:
            raise ValueError(f"prompt layer {spec.name!r}: its class is named {layer.name!r}")
        layers.append(layer)
    return layers
