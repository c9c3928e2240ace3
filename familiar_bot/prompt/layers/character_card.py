"""``character_card``: the persona, from the familiar's ``character.md``.

Authored canon, trusted and rendered as written. A familiar without its own card
gets the shipped ``_default/character.md`` (the same fallback its config gets
from ``_default/character.toml``), so a freshly created familiar has a persona.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from familiar_pipeline.storage import paths as paths_module

from familiar_bot.prompt.layers.common import content_hash
from familiar_bot.prompt.layers.spec import LayerSpec

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext


def card_path(memory: MemoryView) -> Path | None:
    own = memory.paths.character_md
    if own.is_file():
        return own
    fallback = paths_module.default_dir(memory.paths.root) / "character.md"
    return fallback if fallback.is_file() else None


def _read(memory: MemoryView) -> bytes | None:
    path = card_path(memory)
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError:
        return None


class CharacterCardLayer:
    name = "character_card"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        data = _read(memory)
        return "missing" if data is None else content_hash(data)

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        data = _read(memory)
        return "" if data is None else data.decode("utf-8", "replace").strip()


SPEC = LayerSpec(name="character_card", layer=CharacterCardLayer, position=100)
