"""Tolerant JSON parsing of LLM replies.

Every projector asks the model for JSON and every model sometimes answers with
something near it: wrapped in a Markdown fence, preceded by "Sure! Here you go:",
with a trailing comma, or cut off by ``max_tokens`` half-way through an array.
A projection must never stall or crash on that (docs/architecture.md §8), so parsing here never
raises: it either returns a value of the shape the caller asked for, or ``None``,
which callers turn into "no items" and record as dropped output.

Rules of ``coerce_json``, in the order they are tried:

1. Empty or whitespace-only text gives ``None``.
2. Markdown fence markers (three backticks, optionally followed by a language tag
   such as ``json``, any case) are removed wherever they occur.
3. Candidates are parsed with ``json.loads``; the first one of the expected shape
   (a list for ``"array"``, a dict for ``"object"``) wins:
   a. the greedy span from the first opening bracket to the last closing one
      (``[``..``]`` or ``{``..``}``), which skips leading and trailing prose;
   b. the whole de-fenced text (for replies with no matching span at all);
   c. the first complete JSON value starting at the first opening bracket, ignoring
      whatever follows (the greedy span fails when prose after the JSON contains
      another bracket, as in ``[...] (see [1])``).
4. Repair pass, on the text from the first opening bracket to the end:
   a. commas directly before a closing ``]`` or ``}`` are dropped;
   b. arrays only: a truncated array keeps its complete leading items
      (``[{...}, {...}, {..`` becomes ``[{...}, {...}]``), trying the last three
      item boundaries at most; ``coerce_json_array`` also says how many
      trailing items were discarded, so callers can record them as dropped. Objects are not
      truncation-repaired: a half-written object has no safe "complete part",
      and callers act on objects (retiring facts), so a guess could do harm.
5. Anything else gives ``None``. A value of the wrong shape (an object when an
   array was expected, a bare number) is also ``None``: callers never have to
   re-check the type of what they get back.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

Expect = Literal["array", "object"]

_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*")
_BRACKETS = {"array": ("[", "]"), "object": ("{", "}")}

# Structural tokens for the repair scanner. Strings are matched whole (escapes
# included) so brackets and commas inside them are never mistaken for structure;
# group 1 is empty when a string is cut off by the end of the text.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(")?|[\[\]{},]', re.S)

# How many item boundaries a truncated array is cut back to, latest first.
_MAX_CUTS = 3

_INT_TEXT = re.compile(r"-?[0-9]+")

_DECODER = json.JSONDecoder()


def coerce_json(text: str | None, expect: Expect) -> Any | None:
    """Parse ``text`` as a JSON array or object, tolerating common model slips.

    Returns a ``list`` (``expect="array"``) or ``dict`` (``expect="object"``), or
    ``None`` when nothing of that shape can be recovered. Never raises.
    """
    return _coerce_counted(text, expect)[0]


def coerce_json_array(text: str | None) -> tuple[list | None, int]:
    """``coerce_json(text, "array")`` and how many trailing items truncation repair discarded.

    A reply cut off by ``max_tokens`` loses its unfinished last item (and, rarely,
    items before it that did not parse): callers record those as dropped output
    instead of losing them silently.
    """
    return _coerce_counted(text, "array")


def coerce_json_items(text: str | None, key: str) -> tuple[list | None, int]:
    """The item list of a reply asked for as ``{key: [...]}``, or a bare array; and items truncation discarded.

    Structured output wraps lists in an object (OpenAI's strict schemas want an
    object at the top), while a model without a schema often answers with the
    bare array it was shown: both are accepted, the object first.
    """
    value = coerce_json(text, "object")
    if isinstance(value, dict) and isinstance(value.get(key), list):
        return value[key], 0
    return coerce_json_array(text)


def _coerce_counted(text: str | None, expect: Expect) -> tuple[Any | None, int]:
    if expect not in _BRACKETS:
        raise ValueError(f"expect must be 'array' or 'object', not {expect!r}")
    if not isinstance(text, str) or not text.strip():
        return None, 0
    try:
        return _coerce(_FENCE.sub("", text), expect)
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return None, 0


def _coerce(text: str, expect: Expect) -> tuple[Any | None, int]:
    want = list if expect == "array" else dict
    open_ch, close_ch = _BRACKETS[expect]
    first = text.find(open_ch)
    last = text.rfind(close_ch)

    candidates: list[str] = []
    if first != -1 and last > first:
        candidates.append(text[first : last + 1])
    candidates.append(text)
    for candidate in candidates:
        value = _loads(candidate)
        if isinstance(value, want):
            return value, 0

    if first == -1:
        return None, 0
    try:
        value, _end = _DECODER.raw_decode(text, first)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, want):
        return value, 0

    for repaired, discarded in _repairs(text[first:], expect):
        value = _loads(repaired)
        if isinstance(value, want):
            return value, discarded
    return None, 0


def _loads(text: str) -> Any | None:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _repairs(tail: str, expect: Expect) -> list[tuple[str, int]]:
    """Repaired versions of ``tail`` (text from the first opening bracket), each with the items it discards."""
    tokens = list(_TOKEN.finditer(tail))
    fixed = _drop_trailing_commas(tail, tokens)
    repaired = [(fixed, 0)]
    if expect == "array":
        if fixed is not tail:
            tokens = list(_TOKEN.finditer(fixed))
        repaired.extend(_truncated_array_prefixes(fixed, tokens))
    return repaired


def _drop_trailing_commas(text: str, tokens: list[re.Match[str]]) -> str:
    """Remove every comma that is followed (after whitespace) by ``]`` or ``}``."""
    drop: list[int] = []
    for current, following in zip(tokens, tokens[1:]):
        if (
            current.group() == ","
            and following.group() in ("]", "}")
            and not text[current.end() : following.start()].strip()
        ):
            drop.append(current.start())
    if not drop:
        return text
    pieces: list[str] = []
    previous = 0
    for index in drop:
        pieces.append(text[previous:index])
        previous = index + 1
    pieces.append(text[previous:])
    return "".join(pieces)


def _truncated_array_prefixes(text: str, tokens: list[re.Match[str]]) -> list[tuple[str, int]]:
    """Closed-off prefixes of a cut-off top-level array, longest first, with the items each discards.

    A prefix ends where a top-level item is known to be complete: at a comma
    between items, or at the very end when the text stops right after an item.
    A prefix with no item at all is never offered: "[" is not an empty answer.
    """
    depth = 0
    item_ends: list[int] = []
    ended_cleanly = True
    for token in tokens:
        kind = token.group()
        if kind in ("[", "{"):
            depth += 1
        elif kind in ("]", "}"):
            depth -= 1
            if depth <= 0:
                return []  # the array closed: truncation is not the problem
        elif kind == ",":
            if depth == 1:
                item_ends.append(token.start())
        elif token.group(1) is None:  # a string cut off by the end of the text
            ended_cleanly = False
    prefixes: list[tuple[str, int]] = []
    last_boundary = item_ends[-1] if item_ends else 0  # 0 is the opening "["
    has_final_item = bool(text[last_boundary + 1 :].strip(" \t\r\n,"))
    if depth == 1 and ended_cleanly and has_final_item:
        prefixes.append((text.rstrip().rstrip(",") + "]", 0))
    # Only the last few cut points: earlier ones only help when an item that
    # looked complete is itself invalid, and each try copies the whole prefix.
    # Cutting at the k-th boundary from the end discards k items (the last one
    # only when something was written after the final comma).
    cuts = item_ends[-_MAX_CUTS:]
    for k, end in enumerate(reversed(cuts), start=1):
        prefixes.append((text[:end] + "]", k - 1 + int(has_final_item)))
    return prefixes


def as_int(value: Any) -> int | None:
    """Read an integer id or score from loosely typed model output.

    Rules: ``bool`` is rejected (``True`` is an int in Python but never an id);
    ints pass through; finite floats truncate toward zero (``3.9`` → 3); strings
    that are whole ASCII integers after trimming whitespace (``"42"``, ``"-7"``)
    convert;
    everything else, including ``"3.5"`` and ``"#4"``, gives ``None``.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, str):
        stripped = value.strip()
        if _INT_TEXT.fullmatch(stripped):
            try:
                return int(stripped)
            except ValueError:  # more digits than Python will convert
                return None
    return None


def as_int_list(value: Any) -> list[int]:
    """Keep the integer items of a model-supplied list, in order.

    Rules: a value that is not a list (or tuple) gives ``[]``; items that are
    ints (not bools) are kept; strings that are whole integers after trimming
    whitespace (``"3"``, ``" -2 "``) are converted;
    everything else (floats, ``"3.5"``, ``None``, nested lists) is dropped.
    Citations and source ids go through this, so a float id is not guessed at.
    """
    if not isinstance(value, (list, tuple)):
        return []
    kept: list[int] = []
    for item in value:
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            kept.append(item)
        elif isinstance(item, str) and _INT_TEXT.fullmatch(item.strip()):
            try:
                kept.append(int(item.strip()))
            except ValueError:
                continue
    return kept
