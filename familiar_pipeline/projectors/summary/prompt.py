"""The rolling summary prompt: prior summary + a fixed window of new turns."""

from __future__ import annotations

from typing import Sequence

from familiar_pipeline.projectors.prompting import UNTRUSTED_NOTE, TurnLike, render_turn_lines

# A phrase only this prompt's system message holds (the scripted model routes by it).
SYSTEM_MARK = "running summary"

SYSTEM = (
    "You keep the running summary of a long group conversation for a companion who takes part in it. "
    "Fold the new turns into the previous summary (if any) and return the updated summary only: "
    "who was involved, what was discussed or decided, open threads, and shifts in mood or plans. "
    "Prefer concrete names and details over generalities; drop chit-chat that leaves no trace. "
    "Keep it under about 250 words, in plain prose, no headings, no preamble.\n\n" + UNTRUSTED_NOTE
)


def build_messages(prior_summary: str | None, turns: Sequence[TurnLike]) -> list[dict]:
    parts = []
    if prior_summary:
        parts.append("Previous summary:\n" + prior_summary.strip())
        parts.append("")
        parts.append("New turns (id, channel, speaker, text):")
    else:
        parts.append("Turns (id, channel, speaker, text):")
    parts.extend(render_turn_lines(turns, with_channel=True))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


def parse_reply(text: str | None) -> str:
    """The summary text, or "" when the model returned nothing usable (the caller keeps the old one)."""
    cleaned = (text or "").strip()
    if cleaned.startswith("```") and cleaned.endswith("```"):
        cleaned = cleaned.strip("`").strip()
    return cleaned
