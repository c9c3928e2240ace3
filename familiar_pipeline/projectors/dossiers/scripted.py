"""The scripted offline model's dossier: the prior text followed by the new facts, capped."""

from __future__ import annotations

import json
import re

from familiar_pipeline.projectors.prompting import messages_text

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


def answer(messages: list[dict]) -> str | None:
    system, user = messages_text(messages)
    if "dossier" not in system and "self-record" not in system:
        return None
    return write_dossier(user)
