"""Rendering helpers shared by the layers: safe text, clocks, speaker labels.

Prompt-injection rule for the system prompt: sections are marked by Markdown
headers (``## Lorebook``, ``### Cass``), so untrusted text (turns, facts, names,
and LLM projections derived from them) must never *start a line* with ``#``.
``neutralise_headers`` prefixes such a line's first ``#`` with a backslash
(``\\## fake`` reads as literal text in Markdown and to a model), and
``one_line`` collapses names and fact texts onto a single line. Every line
break style (``\\r``, U+2028, ...) is normalised first, so none slips through.
Authored canon (character card, lorebook) is trusted and left as written.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING

from familiar_pipeline.storage.identity import is_ego_key

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_pipeline.storage.turns import Turn

_WS = re.compile(r"\s+")
_MENTION = re.compile(r"<@!?([0-9]{1,25})>")
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_-]")


def neutralise_headers(text: str) -> str:
    """Escape lines that would read as Markdown headers; normalise line breaks."""
    lines = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("#"):
            indent = line[: len(line) - len(stripped)]
            line = f"{indent}\\{stripped}"
        lines.append(line)
    return "\n".join(lines)


def one_line(text: str | None) -> str:
    """All whitespace runs (line breaks included) become one space; stripped."""
    return _WS.sub(" ", text or "").strip()


def content_hash(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def sanitize_name(value: str | None) -> str | None:
    """An OpenAI-style message name (``[a-zA-Z0-9_-]{1,64}``) or None."""
    if not value:
        return None
    name = _NAME_BAD.sub("_", value)[:64].strip("_")
    return name or None


def clock_24h(moment: datetime, tz: tzinfo) -> str:
    local = moment.astimezone(tz)
    return f"{local.hour:02d}:{local.minute:02d}"


def clock_12h(moment: datetime, tz: tzinfo) -> str:
    """``2:29PM``: 12-hour clock without a leading zero."""
    local = moment.astimezone(tz)
    hour = local.hour % 12 or 12
    return f"{hour}:{local.minute:02d}{'AM' if local.hour < 12 else 'PM'}"


def local_date(moment: datetime, tz: tzinfo) -> str:
    local = moment.astimezone(tz)
    return f"{local.year:04d}-{local.month:02d}-{local.day:02d}"


class Labels:
    """Speaker names for one assembly, resolved once per key.

    Names are user-controlled, so every label is collapsed to one line.
    """

    def __init__(self, memory: MemoryView, guild_id: int | None) -> None:
        self._log = memory.turn_log
        self._guild = guild_id
        self._ego = memory.config.display_name
        self._seen: dict[str, str] = {}

    @property
    def ego(self) -> str:
        return one_line(self._ego) or "familiar"

    def __call__(self, key: str | None) -> str:
        if not key:
            return self.ego
        if key not in self._seen:
            if is_ego_key(key):
                label = self._ego
            else:
                label = self._log.resolve_label(key, self._guild, ego_label=self._ego)
            self._seen[key] = one_line(label) or key
        return self._seen[key]

    def for_turn(self, turn: Turn) -> str:
        if turn.author_key:
            return self(turn.author_key)
        if turn.role == "assistant":
            return self.ego
        return one_line(turn.author_display) or turn.role

    def rewrite_mentions(self, text: str) -> str:
        """Discord pings (``<@123>``) become ``[@Name]``, so the model reads names, not ids."""
        if "<@" not in text:
            return text
        return _MENTION.sub(lambda m: f"[@{self('discord:' + m.group(1))}]", text)
