"""The scripted offline model's summary: who talked, and the latest turn, folded after the prior summary."""

from __future__ import annotations

from familiar_pipeline.projectors.prompting import first_sentence, messages_text, parse_prompt_turns

from .prompt import REDACT_MARK, SYSTEM_MARK


def summarize(user_text: str) -> str:
    turns = parse_prompt_turns(user_text)
    if not turns:
        return ""
    speakers = sorted({speaker for _, speaker, _ in turns})
    prior = ""
    if user_text.startswith("Previous summary:"):
        prior = user_text.split("\n", 2)[1]
    latest = first_sentence(turns[-1][2], 80)
    head = f"Through turn {turns[-1][0]}: {', '.join(speakers)} talked; latest: {latest}."
    return (prior + " " + head).strip()[-1500:]


def redact(user_text: str) -> str:
    """The summary with each removed turn's words (as `summarize` quotes them) cut, or replaced by the edit."""
    summary = user_text.split("\n", 2)[1] if user_text.startswith("Summary:\n") else ""
    edits: dict[int, str] = {}
    if "Edited to read (id: new text):" in user_text:
        for row in user_text.split("Edited to read (id: new text):\n", 1)[1].splitlines():
            edited_id, _, new_text = row.partition(": ")
            edits[int(edited_id)] = new_text
    for turn_id, _, content in parse_prompt_turns(user_text):
        new = edits.get(turn_id)
        summary = summary.replace(first_sentence(content, 80), first_sentence(new, 80) if new else "(removed)")
    return summary


def answer(messages: list[dict]) -> str | None:
    system, user = messages_text(messages)
    if REDACT_MARK in system:
        return redact(user)
    return summarize(user) if SYSTEM_MARK in system else None
