"""A long turn is shown in part: the passage of it that best matches the cue.

The familiar's replies in a DM run to thousands of characters (lists, explanations, code);
shown whole, a few of them fill the section's token budget and the rest of the evidence is
cut (docs/benchmarks.md, "Both genres": rendered recall with and without passages). A
turn longer than ``turn_passage_chars`` is cut into passages of about that length, at
paragraph, line or sentence ends, and only the passage sharing the most of the cue's
words (the first on a tie: a reply's opening usually says what it is about) is
shown, marked with "..." where text was left out, under the turn's own time and speaker. When
no passage holds a cue word and the turn has passage vectors (``turn_passage_embedding``), the
passage whose vector matched the cue best is shown instead. Where a turn is cut is the
pipeline's (:mod:`familiar_pipeline.storage.passages`), the same cut its passages are indexed by.

Plain functions over strings and turn rows; :func:`turns.retrieve_turns` calls
:func:`shown_part` on every turn it is about to fit into the section.
"""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_right
from typing import Any, Callable, Union

from familiar_pipeline.storage.passages import is_long, passage_spans

ELLIPSIS = "…"
# The offsets of the passage whose vector matched the cue, or a function finding them when asked
# (only when no passage holds a cue word: most shown turns never need it).
Matched = Union[tuple[int, int], Callable[[], Union[tuple[int, int], None]], None]
_WORD = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset("""a about an and any are as at be been but by can could did do does for from had has have how i if
in into is it its me my not of on or our so than that the their them then there these they this to was we were
what when where which who why will with would you your""".split())


def split_passages(text: str, size: int) -> list[str]:
    """The passages of :func:`passage_spans` as text (stripped)."""
    return [text[a:b].strip() for a, b in passage_spans(text, size)]


def words(text: str) -> frozenset[str]:
    """Lowercased content words cut to their first six letters (a crude stem: "recommended" and
    "recommend" meet)."""
    return frozenset(w[:6] for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS)


def passage_scores(text: str, spans: list[tuple[int, int]], cue_tokens: frozenset[str]) -> list[int]:
    """How many distinct cue words each span of ``text`` holds: one regex search for the cue's
    stems over the whole text, each match counted in its span."""
    if not cue_tokens or not spans:
        return [0] * len(spans)
    pattern = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, cue_tokens), key=len, reverse=True)) + ")",
                         re.IGNORECASE)
    starts = [a for a, _ in spans]
    found: list[set[str]] = [set() for _ in spans]
    for match in pattern.finditer(text, 0, spans[-1][1]):
        found[bisect_right(starts, match.start()) - 1].add(match.group(0).lower())
    return [len(f) for f in found]


def best_passage(text: str, spans: list[tuple[int, int]], cue_tokens: frozenset[str]) -> int:
    """Index of the span of ``text`` holding the most distinct cue words (the first on a tie)."""
    if not cue_tokens or len(spans) <= 1:
        return 0
    scores = passage_scores(text, spans, cue_tokens)
    return scores.index(max(scores))


def passage_of(text: str, cue_tokens: frozenset[str], size: int, matched: Matched = None) -> tuple[str, int, int]:
    """``(shown text, passage index, passage count)``: ``text`` itself when it is short enough.

    ``matched``: the offsets of the passage whose vector matched the cue best (the
    ``turn_passage_embedding`` projector's cut), shown when no passage holds a cue word
    (the cue's meaning found what its words cannot)."""
    if not is_long(text, size):  # half a passage more is cheaper whole than cut
        return text, 0, 1
    spans = passage_spans(text, size)
    if len(spans) <= 1:
        return text, 0, 1
    scores = passage_scores(text, spans, cue_tokens)
    if callable(matched):
        matched = matched() if max(scores) == 0 else None
    if matched is not None and max(scores) == 0 and 0 <= matched[0] < matched[1] <= len(text):
        first, last = matched
        at = bisect_right([a for a, _ in spans], first) - 1
    else:
        at = scores.index(max(scores))
        first, last = spans[at]
    shown = text[first:last].strip()
    if text[:first].strip():
        shown = f"{ELLIPSIS} {shown}"
    if text[last:spans[-1][1]].strip():
        shown = f"{shown} {ELLIPSIS}"
    return shown, at, len(spans)


def shown_part(turn: Any, cue_tokens: frozenset[str], size: int, matched: Matched = None) -> Any:
    """``turn`` as shown: a copy whose ``content`` is its best passage when it is long (the
    same turn otherwise; the row itself is never changed). ``matched``: see :func:`passage_of`."""
    text = turn.content or ""
    shown, _, count = passage_of(text, cue_tokens, size, matched)
    return turn if count <= 1 else dataclasses.replace(turn, content=shown)


def cue_tokens(cue: str) -> frozenset[str]:
    """The cue's words as :func:`words` reads them (what a passage is matched by)."""
    return words(cue[:4000])
