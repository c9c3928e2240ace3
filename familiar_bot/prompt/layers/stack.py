"""The default stack of prompt layers, in ``config.LAYER_NAMES`` order (most stable first)."""

from __future__ import annotations

from familiar_pipeline.config import LAYER_NAMES

from familiar_bot.prompt.layers.character_card import CharacterCardLayer
from familiar_bot.prompt.layers.conversation_summary import ConversationSummaryLayer
from familiar_bot.prompt.layers.lorebook import LorebookLayer
from familiar_bot.prompt.layers.operating_mode import OperatingModeLayer
from familiar_bot.prompt.layers.people_dossier import PeopleDossierLayer
from familiar_bot.prompt.layers.rag_context import RagContextLayer
from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer
from familiar_bot.prompt.layers.reflection import ReflectionLayer
from familiar_bot.prompt.layers.standing_wishes import StandingWishesLayer
from familiar_bot.prompt.types import Layer


def default_layers() -> list[Layer]:
    """One instance of every layer, in ``config.LAYER_NAMES`` order (most stable first)."""
    layers: list[Layer] = [
        CharacterCardLayer(), OperatingModeLayer(), StandingWishesLayer(), LorebookLayer(), ConversationSummaryLayer(),
        ReflectionLayer(), PeopleDossierLayer(), RagContextLayer(), RecentHistoryLayer(),
    ]
    assert tuple(layer.name for layer in layers) == LAYER_NAMES, "default stack out of step with LAYER_NAMES"
    return layers
