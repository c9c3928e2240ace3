"""A long turn is shown in part: the passage of it that best matches the cue.

The familiar's replies in a DM run to thousands of characters (lists, explanations, code);
shown whole, three or four of them fill the ~2,400-token section and the rest of the
evidence is cut (rendered recall on person-assistant histories fell to 28.8: issue 48). A
turn longer than ``turn_passage_chars`` is cut into passages of about that length, at
paragraph, line or sentence ends, and only the passage sharing the most of the cue's
analyzer tokens (the first on a tie: a reply's opening usually says what it is about) is
shown, marked with "..." where text was left out, under the turn's own time and speaker.

Plain functions over strings and turn rows; ``retrieval.retrieve_turns`` calls
:func:`shown_part` on every turn it is about to fit into the section.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable

from familiar_pipeline.storage.fts import analyze

ELLIPSIS = "…"
MAX_CHARS = 60_000  # a pasted book is cut into passages up to here only (the rest is never shown)
_BREAKS = (re.compile(r"\n\s*\n"), re.compile(r"\n"), re.compile(r"(?<=[.!?])\s+"))


def split_passages(text: str, size: int) -> list[str]:
    """``text`` cut into passages of at most about ``size`` characters (never a word cut in two
    unless a single word is longer), at the coarsest boundary that makes them fit."""
    text = text[:MAX_CHARS].strip()
    if size <= 0 or len(text) <= size:
        return [text] if text else []
    return [p for p in _pack(_pieces(text, size, 0), size) if p]


def _pieces(text: str, size: int, level: int) -> list[str]:
    """Pieces no longer than ``size``: split at paragraphs, then lines, then sentences, then words."""
    if len(text) <= size:
        return [text]
    if level >= len(_BREAKS):
        words, out, line = text.split(" "), [], ""
        for word in words:
            if line and len(line) + 1 + len(word) > size:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        return out + ([line] if line else [])
    parts = [p for p in _BREAKS[level].split(text) if p.strip()]
    if len(parts) <= 1:
        return _pieces(text, size, level + 1)
    return [piece for p in parts for piece in _pieces(p.strip(), size, level + 1)]


def _pack(pieces: Iterable[str], size: int) -> list[str]:
    """Neighbouring pieces joined (by a line break) while the passage stays within ``size``."""
    out: list[str] = []
    for piece in pieces:
        if out and len(out[-1]) + 1 + len(piece) <= size:
            out[-1] = f"{out[-1]}\n{piece}"
        else:
            out.append(piece)
    return out


def best_passage(passages: list[str], cue_tokens: frozenset[str]) -> int:
    """Index of the passage holding the most distinct cue tokens (the first on a tie)."""
    best, best_score = 0, -1
    for i, passage in enumerate(passages):
        score = len(cue_tokens.intersection(analyze(passage))) if cue_tokens else 0
        if score > best_score:
            best, best_score = i, score
    return best


def passage_of(text: str, cue_tokens: frozenset[str], size: int) -> tuple[str, int, int]:
    """``(shown text, passage index, passage count)``: ``text`` itself when it is short enough."""
    if size <= 0 or len(text) <= size * 1.5:  # half a passage more is cheaper whole than cut
        return text, 0, 1
    passages = split_passages(text, size)
    if len(passages) <= 1:
        return text, 0, 1
    at = best_passage(passages, cue_tokens)
    shown = passages[at]
    if at > 0:
        shown = f"{ELLIPSIS} {shown}"
    if at < len(passages) - 1:
        shown = f"{shown} {ELLIPSIS}"
    return shown, at, len(passages)


def shown_part(turn: Any, cue_tokens: frozenset[str], size: int) -> Any:
    """``turn`` as shown: a copy whose ``content`` is its best passage when it is long (the
    same turn otherwise; the row itself is never changed)."""
    text = turn.content or ""
    shown, _, count = passage_of(text, cue_tokens, size)
    return turn if count <= 1 else dataclasses.replace(turn, content=shown)


def cue_tokens(cue: str) -> frozenset[str]:
    """The cue's analyzer tokens (what a passage is matched by)."""
    return frozenset(analyze(cue[:4000]))
