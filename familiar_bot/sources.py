"""Where a remembered row came from, as the person it is about may follow it: its turns' messages.

Shared by `familiar_bot.self_service` (``/memory``) and the prompt layers whose rows ``/memory``
lists (their ``LayerSpec.held``): each source turn, the Discord message that carried it and its
link (None for a console turn), or that it was deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from familiar_pipeline.storage.turns import Turn, TurnLog

DISCORD_CHANNELS = "https://discord.com/channels"


def message_link(turn: Turn) -> str | None:
    """The Discord link of a turn's message; None for a turn no Discord message carries (the console's)."""
    message = turn.platform_message_id
    if not message or not message.isdigit():
        return None
    place = "@me" if turn.guild_id is None else str(turn.guild_id)
    return f"{DISCORD_CHANNELS}/{place}/{turn.channel_id}/{message}"


@dataclass(frozen=True)
class Source:
    """One message a row came from: its turn, and where to see it (None: a console turn, or gone)."""

    turn_id: int
    message_id: str | None
    link: str | None
    deleted: bool = False

    def render(self) -> str:
        if self.deleted:
            return f"turn #{self.turn_id} (deleted)"
        return self.link or f"turn #{self.turn_id}"


def source_of(turn_id: int, turn: Turn | None) -> Source:
    """The turn's message, as a person may follow it (a deleted or missing one says so)."""
    if turn is None:
        return Source(turn_id, None, None, deleted=True)
    return Source(turn_id, turn.platform_message_id, None if turn.deleted else message_link(turn), deleted=turn.deleted)


def turn_sources(turn_log: TurnLog, turn_ids: Iterable[int]) -> dict[int, Source]:
    """Each turn's `Source`, by turn id."""
    wanted = list(turn_ids)
    turns = {t.id: t for t in turn_log.turns_by_ids(wanted)}
    return {turn_id: source_of(turn_id, turns.get(turn_id)) for turn_id in wanted}


def iso(value: datetime | None) -> str | None:
    """A time as the export writes it (ISO 8601), None for none."""
    return None if value is None else value.isoformat()
