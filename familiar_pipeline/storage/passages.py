"""Passages of a long turn: where it is cut, one definition for index time and reply time.

The familiar's replies in a DM run to thousands of characters (issue 48). A turn longer
than :data:`LONG_FACTOR` x ``size`` characters is cut into passages of at most about
``size`` characters at paragraph, line or sentence ends: the ``turn_passage_embedding``
projector embeds each passage (MiniLM reads only a reply's first ~256 word pieces, so one
vector per reply misses what lies deep in it), and the prompt shows a long turn as one
passage (``familiar_bot.prompt.retrieval.passages``). Plain functions over strings.
"""

from __future__ import annotations

import re

MAX_CHARS = 60_000  # a pasted book is cut into passages up to here only (the rest is never shown)
# A turn at most this many passage lengths long is kept whole: half a passage more is cheaper
# whole than cut.
LONG_FACTOR = 1.5
# Where a passage may end: a line end or a sentence end; then between words.
_BOUNDARY = re.compile(r"\n|[.!?:;](?=\s)")


def passage_spans(text: str, size: int) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of ``text`` cut into passages of at most about ``size`` characters,
    at paragraph, line or sentence ends (between words only inside a sentence longer than
    ``size``). Offsets, not copies: one regex pass over a turn every reply may show."""
    text = text[:MAX_CHARS]
    if size <= 0 or len(text) <= size:
        return [(0, len(text))] if text.strip() else []
    cuts = [m.end() for m in _BOUNDARY.finditer(text)] + [len(text)]
    spans: list[tuple[int, int]] = []
    at = 0
    for cut in cuts:
        while cut - at > size:  # one sentence longer than a passage: cut between words
            space = text.rfind(" ", at + 1, at + size)
            end = space if space > at else at + size
            spans.append((at, end))
            at = end
        if cut > at:
            spans.append((at, cut))
        at = cut
    packed: list[tuple[int, int]] = []
    for a, b in spans:
        if packed and b - packed[-1][0] <= size:
            packed[-1] = (packed[-1][0], b)
        else:
            packed.append((a, b))
    return [(a, b) for a, b in packed if text[a:b].strip()]


def is_long(text: str, size: int) -> bool:
    """Whether ``text`` is cut into passages at all (longer than ``LONG_FACTOR x size``)."""
    return size > 0 and len(text) > size * LONG_FACTOR


def long_turn_spans(text: str, size: int) -> list[tuple[int, int]]:
    """The passages of a long ``text`` (two or more), else ``[]``: a short turn is one passage,
    itself, and needs no passage of its own."""
    if not is_long(text, size):
        return []
    spans = passage_spans(text, size)
    return spans if len(spans) > 1 else []
