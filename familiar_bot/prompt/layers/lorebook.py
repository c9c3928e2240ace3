"""``lorebook``: authored canon whose keys appear in the channel's recent window.

Matching and file handling live in :mod:`familiar_bot.prompt.lorebook`. The scan text
is the channel's recent window (the same turns ``recent_history`` reads) plus
the new message, so an entry fires on the message that names it even before
that message is logged. Capped by ``max_lorebook_entries`` then
``lorebook_tokens``; the key is the file's content hash plus the matched entries.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from familiar_bot.prompt.layers.common import content_hash
from familiar_bot.prompt.layers.recent_history import window_size
from familiar_bot.prompt.layers.spec import BudgetKnob, LayerSpec
from familiar_bot.prompt.lorebook import LoreEntry, Lorebook, select_entries
from familiar_bot.prompt.tokens import cap_blocks

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext

HEADER = "## Lorebook"


class LorebookLayer:
    name = "lorebook"

    def __init__(self) -> None:
        self._books: dict[str, Lorebook] = {}
        self._lock = threading.Lock()

    def book(self, memory: MemoryView) -> Lorebook:
        path = memory.paths.lorebook_toml
        with self._lock:
            book = self._books.get(str(path))
            if book is None:
                book = self._books[str(path)] = Lorebook(path)
            return book

    def _matched(self, ctx: AssemblyContext, memory: MemoryView) -> tuple[str, list[LoreEntry]]:
        file_hash, entries = self.book(memory).current()
        if not entries:
            return file_hash, []
        max_entries = memory.config.budget_for(ctx.tier).max_lorebook_entries
        token = memory.window_token(ctx.channel_id) if ctx.channel_id is not None else None
        size = window_size(ctx, memory)

        def compute() -> list[LoreEntry]:
            turns = memory.channel_window(ctx.channel_id, size) if ctx.channel_id is not None else ()
            haystack = "\n".join([t.content for t in turns] + [ctx.cue])
            return select_entries(entries, haystack, max_entries=max_entries)

        key = ("lore", file_hash, ctx.channel_id, token, size, max_entries, content_hash(ctx.cue))
        return file_hash, memory.memo(key, compute)

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        file_hash, hits = self._matched(ctx, memory)
        tokens = memory.config.budget_for(ctx.tier).lorebook_tokens
        return f"f{file_hash}|m{','.join(str(e.index) for e in hits)}|tok{tokens}"

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        _, hits = self._matched(ctx, memory)
        kept = cap_blocks([e.content for e in hits], memory.config.budget_for(ctx.tier).lorebook_tokens)
        if not kept:
            return ""
        return HEADER + "\n\n" + "\n\n".join(kept)


SPEC = LayerSpec(
    name="lorebook",
    layer=LorebookLayer,
    position=400,
    budget=(BudgetKnob("lorebook_tokens", voice=600, text=1600, background=4000),
            BudgetKnob("max_lorebook_entries", voice=12, text=20, background=32, tokens=False)),
)
