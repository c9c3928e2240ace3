"""Conversation scopes: where a turn was said, and so where what it taught may be used.

A scope is a string with a kind and an id:

* ``guild:<guild id>``: a Discord server (its channels and threads alike);
* ``channel:<channel id>``: a conversation outside any server: a Discord DM or group
  DM, a console channel, an imported transcript;
* ``familiar``: the whole familiar. Rows built from turns of several scopes carry it,
  and so did every row written before scopes existed (it is what a store written by
  older code is migrated to): they were built and read across scopes.

A reply may also read ``person:<canonical key>``: the turns that one person said, in any
scope. It is never a row's scope; it joins a DM to what the person of the DM said elsewhere
when the operator allows it (``[memory.scopes] dm_sees_person``).

Every derived row carries the scope of its sources (``tables.SCOPE``): the scope the
source turns share, else ``familiar`` (:func:`common_scope`). The scope of a turn
follows from the turn alone (:func:`turn_scope`), so a rebuild assigns the same scopes.
"""

from __future__ import annotations

import re
from typing import Iterable, Protocol

FAMILIAR_WIDE = "familiar"
PERSON = "person:"  # + a canonical key: what one person said, in any scope (read side only)
TURN_SCOPE = re.compile(r"^(?:guild|channel):[1-9][0-9]{0,19}$")  # a scope turns are said in


def check_turn_scope(value: object) -> str:
    """``value`` if it names a scope turns are said in (``guild:<id>`` or ``channel:<id>``); else a
    one-line ValueError."""
    if not isinstance(value, str) or not TURN_SCOPE.fullmatch(value):
        raise ValueError(f"invalid scope {value!r}: use guild:<server id> or channel:<channel id>")
    return value


class Located(Protocol):
    """Where a turn was said (read-only: a `Turn` is a frozen dataclass)."""

    @property
    def guild_id(self) -> int | None: ...
    @property
    def channel_id(self) -> int: ...


def turn_scope(turn: Located) -> str:
    """The scope a turn was said in: its server, else its channel."""
    if turn.guild_id is not None:
        return f"guild:{int(turn.guild_id)}"
    return f"channel:{int(turn.channel_id)}"


def common_scope(scopes: Iterable[str]) -> str:
    """The one scope all of ``scopes`` share; ``familiar`` when they differ or there are none."""
    found = set(scopes)
    return found.pop() if len(found) == 1 else FAMILIAR_WIDE


def scope_of_turns(turns: Iterable[Located]) -> str:
    """The scope of a row built from these turns."""
    return common_scope(turn_scope(t) for t in turns)


def turn_visible(turn: Located, visible: Iterable[str]) -> bool:
    """Whether a reply reading ``visible`` may quote ``turn``: said in one of those scopes, or
    said by a person ``visible`` joins (``person:<key>``, a user's turn anywhere)."""
    wanted = tuple(visible)
    if turn_scope(turn) in wanted:
        return True
    author, role = getattr(turn, "author_key", None), getattr(turn, "role", None)
    return bool(author) and role == "user" and PERSON + str(author) in wanted


def turn_scope_sql(scopes: Iterable[str]) -> tuple[str, list[int | str]] | None:
    """A WHERE clause over the turn log's ``turns`` matching the turns said in ``scopes``, by
    the rule of :func:`turn_scope` (None when no turn can match, e.g. only ``familiar``);
    a ``person:<key>`` entry matches that person's own turns in any scope (:func:`turn_visible`)."""
    wanted = list(scopes)
    guilds = [int(s.partition(":")[2]) for s in wanted if s.startswith("guild:")]
    channels = [int(s.partition(":")[2]) for s in wanted if s.startswith("channel:")]
    people = [s[len(PERSON):] for s in wanted if s.startswith(PERSON)]
    parts: list[str] = []
    params: list[int | str] = []
    if guilds:
        parts.append(f"guild_id IN ({', '.join('?' * len(guilds))})")
        params += guilds
    if channels:
        parts.append(f"(guild_id IS NULL AND channel_id IN ({', '.join('?' * len(channels))}))")
        params += channels
    if people:
        parts.append(f"(role = 'user' AND author_key IN ({', '.join('?' * len(people))}))")
        params += people
    return ("(" + " OR ".join(parts) + ")", params) if parts else None
