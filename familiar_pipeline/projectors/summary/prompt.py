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


# Redaction: one call that takes changed turns out of a summary (see run.refold_changed).
REDACT_MARK = "must no longer be remembered"

REDACT_SYSTEM = (
    "You keep the running summary of a long group conversation for a companion who takes part in it. "
    "Some messages were deleted or edited by the people who wrote them: what they said there "
    "must no longer be remembered. Rewrite the summary so that nothing in it comes from the removed "
    "text (where an edit gives new text, that is what was said), and keep everything else as it "
    "is. Return the updated summary only, plain prose, no preamble.\n\n" + UNTRUSTED_NOTE
)


def build_redact_messages(summary: str, removed: Sequence[tuple[TurnLike, str | None]]) -> list[dict]:
    """The summary and each changed turn as it was, with its new text when it was edited (None: deleted)."""
    parts = ["Summary:", summary.strip(), "", "Removed (id, channel, speaker, text as it was):"]
    parts.extend(render_turn_lines([turn for turn, _ in removed], with_channel=True))
    edited = [(turn, new) for turn, new in removed if new is not None]
    if edited:
        parts += ["", "Edited to read (id: new text):"]
        parts += [f"{turn.id}: {new}" for turn, new in edited]
    return [{"role": "system", "content": REDACT_SYSTEM}, {"role": "user", "content": "\n".join(parts)}]
