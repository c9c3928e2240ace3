"""The reply call's messages, and the reply's text on its way back to a transport.

:func:`build_messages` shapes the assembled prompt into the chat call (the system prompt with
:func:`reply_instructions`, the history, the new message exactly once);
:func:`strip_speaker_prefix` drops a speaker label the model copied from the history format;
:func:`split_message` cuts the reply into pieces a transport can send, code blocks kept whole
across the cut. Pure functions over text.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from familiar_bot.responder.messages import IncomingMessage

DISCORD_MESSAGE_LIMIT = 2000
HISTORY_LAYER = "recent_history"

_FENCE = re.compile(r"^\s*```")


def split_message(text: str, limit: int = DISCORD_MESSAGE_LIMIT) -> list[str]:
    """Cut a reply into pieces of at most `limit` characters, at the gentlest boundary.

    Prefers a paragraph break, then a line break, then a space, in the back half
    of the window; a word longer than that is cut hard. A code block cut in two
    is closed at the end of one piece and reopened (same language) in the next,
    so both render as code. Empty pieces are dropped; "" gives [].
    """
    if limit < 20:
        raise ValueError(f"limit must be at least 20 characters, got {limit}")
    text = text.strip()
    pieces: list[str] = []
    closing = "\n```"
    reopen = ""  # the fence line to start the next piece with, when inside a code block
    while text:
        budget = limit - len(reopen)
        if len(text) <= budget:
            pieces.append(reopen + text)
            break
        cut = _best_cut(text[:budget])
        fence = _open_fence(reopen + text[:cut])
        if fence is not None and len(reopen + text[:cut].rstrip()) + len(closing) > limit:
            cut = _best_cut(text[: budget - len(closing)])  # make room to close the block
            fence = _open_fence(reopen + text[:cut])
        piece, text = reopen + text[:cut].rstrip(), text[cut:]
        if fence is not None:
            piece += closing
            # A long info string would eat the next piece; a bare fence still renders as code.
            reopen = (fence if len(fence) < limit // 4 else "```") + "\n"
        else:
            reopen = ""
        if piece.strip():
            pieces.append(piece)
    return pieces


def _best_cut(window: str) -> int:
    floor = len(window) // 2
    for separator in ("\n\n", "\n", " "):
        at = window.rfind(separator, floor)
        if at > 0:
            return at + len(separator)
    return len(window)


def _open_fence(piece: str) -> str | None:
    """The opening fence line (e.g. "```python") if `piece` ends inside a code block."""
    opener = None
    for line in piece.split("\n"):
        if _FENCE.match(line):
            opener = None if opener is not None else line.strip()
    return opener


def strip_speaker_prefix(reply: str, names: Sequence[str]) -> str:
    """Drop a speaker label the model copied from the history format.

    History shows "[12:04 Fam] text"; models sometimes echo that, or "Fam: text".
    Only the familiar's own names are stripped, and only at the very start.
    """
    words = "|".join(re.escape(n) for n in names if n)
    if not words:
        return reply.strip()
    pattern = re.compile(
        rf"^\s*(?:\[(?:[^\]\n]{{0,24}}\s)?(?:{words})\]\s*:?\s*"  # [12:04 Fam] / [Fam]
        rf"|(?:\[[^\]\n]{{1,40}}\]\s*)?(?:{words})\s*:\s*)",  # Fam: / [12:04] Fam:
        re.IGNORECASE,
    )
    return pattern.sub("", reply, count=1).strip()


def reply_instructions(display_name: str, author_label: str) -> str:
    return (
        f"## Replying\n"
        f"You are {display_name}. The chat messages that follow are the conversation so far; "
        f"the last one is from {author_label}. Write your next message in this conversation: "
        "only the message text, without your name, a timestamp or quotation marks."
    )


def build_messages(prompt: Any, message: IncomingMessage, display_name: str) -> list[dict[str, Any]]:
    """The reply call: system prompt plus instructions, the history, and the new message.

    The user turn was appended before assembly and the history layer always keeps
    the newest turn, so a prompt with history already ends with this message.
    Only when the channel's `prompt_layers` leave history out (or the layer
    failed) is the message added here, so the model sees it exactly once.
    """
    system = "\n\n".join(
        part for part in (prompt.system_prompt.strip(), reply_instructions(display_name, message.author.label)) if part
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for item in prompt.history:
        entry: dict[str, Any] = {"role": item.role, "content": item.content}
        if item.name:
            entry["name"] = item.name
        messages.append(entry)
    if not _shows_history(prompt):
        messages.append({"role": "user", "content": f"{message.author.label}: {message.content}"})
    return messages


def _shows_history(prompt: Any) -> bool:
    return bool(prompt.history) and any(s.name == HISTORY_LAYER and s.text for s in prompt.sections)
