"""A scripted "careful model" for tests, benchmarks and offline end-to-end runs.

It answers each projector's real prompt deterministically from the prompt's own
content (the participants and turns it lists), so prompt sizes, parsing, caching
and every watermark rule run for real while the replies cost nothing. Select it
for a familiar with `[llm.background] model = "fake/careful"` and
`FAMILIAR_FAKE_LLM=familiar_pipeline.testing:careful_model`.
"""

from __future__ import annotations

import json
import re

_TURN_LINE = re.compile(r'^- id=(\d+)(?: #-?\d+)? ("(?:[^"\\]|\\.)*"): ("(?:[^"\\]|\\.)*")$')
_PARTICIPANT_LINE = re.compile(r'^- ([a-z][a-z0-9_-]*:[^:\s]+): ("(?:[^"\\]|\\.)*")$')


def parse_prompt_turns(user_text: str) -> list[tuple[int, str, str]]:
    """(id, speaker, content) of every turn line in a projector prompt."""
    turns = []
    for line in user_text.splitlines():
        match = _TURN_LINE.match(line)
        if match:
            turns.append((int(match.group(1)), json.loads(match.group(2)), json.loads(match.group(3))))
    return turns


def parse_prompt_participants(user_text: str) -> dict[str, str]:
    """label -> canonical key from a Participants block."""
    found = {}
    for line in user_text.splitlines():
        match = _PARTICIPANT_LINE.match(line)
        if match:
            found[json.loads(match.group(2))] = match.group(1)
    return found


def _first_sentence(text: str, limit: int = 140) -> str:
    sentence = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return sentence[:limit].rstrip()


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
                "text": f"{speaker} said: {_first_sentence(content)}",
                "source_turn_ids": [turn_id],
                "subject_keys": [key],
                "importance": 1 + (len(words) % 10),
            }
        )
    return facts


def summarize(user_text: str) -> str:
    turns = parse_prompt_turns(user_text)
    if not turns:
        return ""
    speakers = sorted({speaker for _, speaker, _ in turns})
    prior = ""
    if user_text.startswith("Previous summary:"):
        prior = user_text.split("\n", 2)[1]
    latest = _first_sentence(turns[-1][2], 80)
    head = f"Through turn {turns[-1][0]}: {', '.join(speakers)} talked; latest: {latest}."
    return (prior + " " + head).strip()[-1500:]


def careful_model(messages: list[dict]) -> str:
    """Route a projector prompt to its scripted answer."""
    system = messages[0]["content"] if messages else ""
    user = messages[-1]["content"] if messages else ""
    if "atomic facts" in system:
        return json.dumps(extract_facts(user))
    if "running summary" in system:
        return summarize(user)
    return "[]"
