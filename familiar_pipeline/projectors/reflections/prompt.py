"""The reflection prompt (projector `reflection`) and its parser.

Reflections are higher-order observations over a window of turns plus the
newest facts, each citing the turn and fact ids it rests on. Citations are what
make a reflection checkable, so the parser keeps only integer ids and the
projector keeps only ids that were shown.
"""

from __future__ import annotations

from typing import Any, Sequence

from familiar_pipeline.models.replies import IdList, ListReply, ReplyItem, field_validator, id_list
from familiar_pipeline.projectors.prompting import UNTRUSTED_NOTE, TurnLike, quote, render_turn_lines

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


# A phrase only this prompt's system message holds (the scripted model routes by it).
SYSTEM_MARK = "You write short reflections"


class RawReflection(ReplyItem):
    """One item of the model's reply: the schema sent as structured output, and its parser.
    An item whose text is not a string is malformed; citations keep their integer ids, each once."""

    schema_required = ("text", "cited_turn_ids", "cited_fact_ids")

    text: str
    cited_turn_ids: IdList = []
    cited_fact_ids: IdList = []

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        return value.strip()

    @field_validator("cited_turn_ids", "cited_fact_ids", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> list[int]:
        return id_list(value)


# The reply: its JSON schema for `response_format` (see `models.llm`); the parser also takes a bare array.
REPLY = ListReply("reflections", "reflections", RawReflection)
REPLY_SCHEMA = REPLY.schema()


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
    return REPLY.parse(text)
