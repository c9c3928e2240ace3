"""The scripted offline model's answer to the extraction prompt: one fact per substantive user turn.

Deterministic and read from the prompt itself (its participants and turn lines), so
tests and the demo exercise prompt sizes, parsing, caching and every watermark rule
for real while replies cost nothing.
"""

from __future__ import annotations

import json

from familiar_pipeline.projectors.prompting import (
    first_sentence,
    messages_text,
    parse_prompt_participants,
    parse_prompt_turns,
)

from .prompt import SYSTEM_MARK


def extract_facts(user_text: str) -> list[dict]:
    """One fact per substantive user turn, attributed to its speaker."""
    participants = parse_prompt_participants(user_text)
    facts = []
    for turn_id, speaker, content in parse_prompt_turns(user_text):
        key = participants.get(speaker)
        words = content.split()
        if key is None or key.startswith("ego:") or len(words) < 4:
            continue
        facts.append(
            {
                "text": f"{speaker} said: {first_sentence(content)}",
                "source_turn_ids": [turn_id],
                "subject_keys": [key],
                "importance": 1 + (len(words) % 10),
            }
        )
    return facts


def answer(messages: list[dict]) -> str | None:
    system, user = messages_text(messages)
    if SYSTEM_MARK not in system:
        return None
    return json.dumps({"facts": extract_facts(user)})
