"""The scripted offline model's summary: who talked, and the latest turn, folded after the prior summary."""

from __future__ import annotations

from familiar_pipeline.projectors.prompting import first_sentence, messages_text, parse_prompt_turns

from .prompt import SYSTEM_MARK


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


def answer(messages: list[dict]) -> str | None:
    system, user = messages_text(messages)
    return summarize(user) if SYSTEM_MARK in system else None
