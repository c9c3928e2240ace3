"""The scripted offline model's reflections: one per speaker with at least three turns in the window."""

from __future__ import annotations

import json
import re

from familiar_pipeline.projectors.prompting import FACT_LINE, messages_text, parse_prompt_turns

from .prompt import SYSTEM_MARK


def write_reflections(system_text: str, user_text: str) -> list[dict]:
    """One reflection per speaker with at least three turns in the window, citing two of them and a fact naming them."""
    cap = re.search(r"at most (\d+)", system_text)
    limit = int(cap.group(1)) if cap else 3
    by_speaker: dict[str, list[int]] = {}
    for turn_id, speaker, _content in parse_prompt_turns(user_text):
        by_speaker.setdefault(speaker, []).append(turn_id)
    facts = [(int(m.group(1)), json.loads(m.group(2))) for line in user_text.splitlines() if (m := FACT_LINE.match(line))]
    out = []
    for speaker, ids in sorted(by_speaker.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(ids) < 3:
            continue
        cited_facts = [fid for fid, text in facts if speaker in text][:1]
        out.append({
            "text": f"{speaker} keeps coming back to the same threads ({len(ids)} turns in this stretch).",
            "cited_turn_ids": [ids[0], ids[-1]],
            "cited_fact_ids": cited_facts,
        })
    return out[:limit]


def answer(messages: list[dict]) -> str | None:
    system, user = messages_text(messages)
    if SYSTEM_MARK not in system:
        return None
    return json.dumps({"reflections": write_reflections(system, user)})
