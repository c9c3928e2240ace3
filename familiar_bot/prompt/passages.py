"""A long turn is shown in part: the passage of it that best matches the cue.

The familiar's replies in a DM run to thousands of characters (lists, explanations, code);
shown whole, three or four of them fill the ~2,400-token section and the rest of the
evidence is cut (rendered recall on person-assistant histories fell to 28.8: issue 48). A
turn longer than ``turn_passage_chars`` is cut into passages of about that length, at
paragraph, line or sentence ends, and only the passage sharing the most of the cue's
words (the first on a tie: a reply's opening usually says what it is about) is
shown, marked with "..." where text was left out, under the turn's own time and speaker.

Plain functions over strings and turn rows; ``retrieval.retrieve_turns`` calls
:func:`shown_part` on every turn it is about to fit into the section.
"""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_right
from typing import Any

ELLIPSIS = "…"
MAX_CHARS = 60_000  # a pasted book is cut into passages up to here only (the rest is never shown)
# Where a passage may end: a line end or a sentence end; then between words.
_BOUNDARY = re.compile(r"\n|[.!?:;](?=\s)")
_WORD = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset("""a about an and any are as at be been but by can could did do does for from had has have how i if
in into is it its me my not of on or our so than that the their them then there these they this to was we were
what when where which who why will with would you your""".split())


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


def split_passages(text: str, size: int) -> list[str]:
    """The passages of :func:`passage_spans` as text (stripped)."""
    return [text[a:b].strip() for a, b in passage_spans(text, size)]


def words(text: str) -> frozenset[str]:
    """Lowercased content words cut to their first six letters (a crude stem: "recommended" and
    "recommend" meet)."""
    return frozenset(w[:6] for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS)


def best_passage(text: str, spans: list[tuple[int, int]], cue_tokens: frozenset[str]) -> int:
    """Index of the span of ``text`` holding the most distinct cue words (the first on a tie):
    one regex search for the cue's stems over the whole text, each match counted in its span."""
    if not cue_tokens or len(spans) <= 1:
        return 0
    pattern = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, cue_tokens), key=len, reverse=True)) + ")",
                         re.IGNORECASE)
    starts = [a for a, _ in spans]
    found: list[set[str]] = [set() for _ in spans]
    for match in pattern.finditer(text, 0, spans[-1][1]):
        found[bisect_right(starts, match.start()) - 1].add(match.group(0).lower())
    scores = [len(f) for f in found]
    return scores.index(max(scores))


def passage_of(text: str, cue_tokens: frozenset[str], size: int) -> tuple[str, int, int]:
    """``(shown text, passage index, passage count)``: ``text`` itself when it is short enough."""
    if size <= 0 or len(text) <= size * 1.5:  # half a passage more is cheaper whole than cut
        return text, 0, 1
    spans = passage_spans(text, size)
    if len(spans) <= 1:
        return text, 0, 1
    at = best_passage(text, spans, cue_tokens)
    shown = text[spans[at][0]:spans[at][1]].strip()
    if at > 0:
        shown = f"{ELLIPSIS} {shown}"
    if at < len(spans) - 1:
        shown = f"{shown} {ELLIPSIS}"
    return shown, at, len(spans)


def shown_part(turn: Any, cue_tokens: frozenset[str], size: int) -> Any:
    """``turn`` as shown: a copy whose ``content`` is its best passage when it is long (the
    same turn otherwise; the row itself is never changed)."""
    text = turn.content or ""
    shown, _, count = passage_of(text, cue_tokens, size)
    return turn if count <= 1 else dataclasses.replace(turn, content=shown)


def cue_tokens(cue: str) -> frozenset[str]:
    """The cue's words as :func:`words` reads them (what a passage is matched by)."""
    return words(cue[:4000])
