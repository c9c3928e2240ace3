"""Token estimates and the trimming rules every prompt section shares.

No tokenizer is loaded: a section budget only has to stop one layer from crowding
out the others, and ``ceil(chars / 4)`` is close enough for English chat while
costing nothing. Every section trims itself; there is no whole-prompt cap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

ELLIPSIS = "…"
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators a chat API adds per message


def estimate_tokens(text: str | None) -> int:
    """``ceil(len/4)``; 0 for empty text."""
    if not text:
        return 0
    return math.ceil(len(text) / 4)


def message_tokens(content: str, name: str | None = None) -> int:
    """What one chat message costs: its content, the per-message overhead, and its name."""
    return estimate_tokens(content) + MESSAGE_OVERHEAD_TOKENS + estimate_tokens(name)


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """``text`` if it fits, else cut so that it fits, ending in an ellipsis; "" when ``max_tokens <= 0``."""
    if max_tokens <= 0:
        return ""
    if estimate_tokens(text) <= max_tokens:
        return text
    return text[: max_tokens * 4 - 1] + ELLIPSIS


def cap_blocks(blocks: Iterable[str], max_tokens: int) -> list[str]:
    """Keep blocks in order while they fit in ``max_tokens``.

    The first block is always kept (truncated if it alone is too big), so a
    section with anything to say never renders empty; after that, the first
    block that does not fit ends the walk rather than being cut mid-thought.
    """
    kept: list[str] = []
    remaining = max_tokens
    for block in blocks:
        cost = estimate_tokens(block)
        if cost > remaining and kept:
            break
        block = truncate_to_tokens(block, remaining)
        if not block:
            break
        kept.append(block)
        remaining -= estimate_tokens(block)
    return kept
