"""The reflection prompt (projector `reflection`) and its parser.

Reflections are higher-order observations over a window of turns plus the
newest facts, each citing the turn and fact ids it rests on. Citations are what
make a reflection checkable, so the parser keeps only integer ids and the
projector keeps only ids that were shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from familiar_pipeline.models.jsonparse import as_int_list, coerce_json_items

from .common import UNTRUSTED_NOTE, TurnLike, list_reply_schema, quote, render_turn_lines

SYSTEM = """\
You write short reflections for a companion about the recent stretch of a group conversation: \
patterns, recurring tensions, open questions, themes people keep returning to, shifts in how \
people relate. Do not recap the conversation blow by blow (a separate summary does that) and do \
not restate single facts. Each reflection is one or two sentences.

Reply with a JSON object only: {{"reflections": [...]}}, at most {max_items} items, each an object with:
- "text": the reflection;
- "cited_turn_ids": ids of the most representative turns it rests on (not all of them);
- "cited_fact_ids": ids of listed facts it rests on (may be empty).
Every reflection must cite at least one listed turn or fact id. If nothing of substance is \
happening, reply {{"reflections": []}}.

""" + UNTRUSTED_NOTE


# The reply's JSON schema for `response_format` (see `models.llm`); the parser also takes a bare array.
REPLY_KEY = "reflections"
REPLY_SCHEMA = list_reply_schema(
    "reflections",
    REPLY_KEY,
    {
        "text": {"type": "string"},
        "cited_turn_ids": {"type": "array", "items": {"type": "integer"}},
        "cited_fact_ids": {"type": "array", "items": {"type": "integer"}},
    },
    ["text", "cited_turn_ids", "cited_fact_ids"],
)

@dataclass(frozen=True)
class RawReflection:
    text: str
    cited_turn_ids: tuple[int, ...]
    cited_fact_ids: tuple[int, ...]


def build_messages(turns: Sequence[TurnLike], facts: Sequence[tuple[int, str]], *, max_items: int) -> list[dict]:
    lines = ["Recent turns (id, channel, speaker, text):", *render_turn_lines(turns, with_channel=True)]
    if facts:
        lines += ["", "Recent facts (id, text):", *(f"- id={fid}: {quote(text)}" for fid, text in facts)]
    return [
        {"role": "system", "content": SYSTEM.format(max_items=max_items)},
        {"role": "user", "content": "\n".join(lines)},
    ]


def parse_reply(text: str | None) -> tuple[list[RawReflection], int]:
    """Shape-checked items, and how many were malformed or cut off (a non-array reply counts as one)."""
    value, cut_off = coerce_json_items(text or "", REPLY_KEY)
    if not isinstance(value, list):
        return [], (1 if (text or "").strip() else 0)
    items, malformed = [], cut_off
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            malformed += 1
            continue
        items.append(
            RawReflection(
                text=item["text"].strip(),
                cited_turn_ids=tuple(dict.fromkeys(as_int_list(item.get("cited_turn_ids")))),
                cited_fact_ids=tuple(dict.fromkeys(as_int_list(item.get("cited_fact_ids")))),
            )
        )
    return items, malformed
