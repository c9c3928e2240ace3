"""The scripted offline model's dossier: the prior text followed by the new facts, capped."""

from __future__ import annotations

import json
import re

from familiar_pipeline.projectors.prompting import first_sentence, messages_text, parse_prompt_turns

from .prompt import REDACT_MARK

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def write_dossier(user_text: str) -> str:
    """Prior text (if any) followed by the new facts, capped: what a terse, faithful writer returns."""
    lines = user_text.splitlines()
    prior = ""
    if "Previous dossier:" in lines:
        prior = json.loads(lines[lines.index("Previous dossier:") + 1])
    facts = []
    for line in lines:
        if line.startswith("- "):
            match = _QUOTED.search(line)
            if match:
                tag = line[2 : match.start()]  # echo "(importance N) " like a sloppy model would
                facts.append(tag + json.loads(match.group(0)))
    if not facts:
        return prior
    return (prior + " " + " ".join(facts)).strip()[-1200:]


def redact(user_text: str) -> str:
    """The record with each removed message's first sentence (as the scripted facts quote it) cut or replaced."""
    lines = user_text.splitlines()
    text = json.loads(lines[lines.index("Record:") + 1])
    edits: dict[int, str] = {}
    if "Edited to read (id: new text):" in lines:
        for row in lines[lines.index("Edited to read (id: new text):") + 1:]:
            edited_id, _, new_text = row.partition(": ")
            edits[int(edited_id)] = json.loads(new_text)
    for turn_id, _, content in parse_prompt_turns(user_text):
        new = edits.get(turn_id)
        text = text.replace(first_sentence(content), first_sentence(new) if new else "(removed)")
    return text


def answer(messages: list[dict]) -> str | None:
    system, user = messages_text(messages)
    if REDACT_MARK in system:
        return redact(user)
    if "dossier" not in system and "self-record" not in system:
        return None
    return write_dossier(user)
