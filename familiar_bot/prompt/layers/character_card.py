"""``character_card``: the persona, from the familiar's ``character.md``.

Authored canon, trusted and rendered as written. A familiar without its own card
gets the shipped ``_default/character.md`` (the same fallback its config gets
from ``_default/character.toml``), so a freshly created familiar has a persona.
"""

from __future__ import annotations

from pathlib import Path

from familiar_pipeline.storage import paths as paths_module

from familiar_bot.prompt.layers.common import content_hash


def card_path(memory) -> Path | None:
    own = memory.paths.character_md
    if own.is_file():
        return own
    fallback = paths_module.default_dir(memory.paths.root) / "character.md"
    return fallback if fallback.is_file() else None


def _read(memory) -> bytes | None:
    path = card_path(memory)
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError:
        return None


class CharacterCardLayer:
    name = "character_card"

    def invalidation_key(self, ctx, memory) -> str:
        data = _read(memory)
        return "missing" if data is None else content_hash(data)

    def build(self, ctx, memory) -> str:
        data = _read(memory)
        return "" if data is None else data.decode("utf-8", "replace").strip()
