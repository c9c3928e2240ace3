"""What a transport hands the responder, and whether it calls for a reply.

Discord and the console both turn what they saw into an :class:`IncomingMessage` (its
author and mentions as :class:`Person`), and give the responder a :data:`Send` for the reply's
pieces and a :data:`Composing` indicator; nothing else of either transport reaches it.
:func:`reply_reason` is the rule for answering at all; :func:`storable_text` keeps a message
the turn log could not encode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, Sequence

from familiar_pipeline.config import FamiliarConfig

# Sends one piece of a reply; returns the platform's id for the sent message, if any.
Send = Callable[[str], Awaitable["str | int | None"]]
# Returns an async context manager shown while composing (Discord: the typing indicator).
Composing = Callable[[], Any]


@dataclass(frozen=True)
class Person:
    """An account as a transport saw it on one message.

    `nick_known` says the transport resolved the account as a guild member, so
    `guild_nick` is authoritative (None then means "no nickname", and clears an
    old one); otherwise the nickname is unknown and left as recorded.
    """

    key: str  # canonical key, e.g. "discord:1234" or "console:ana"
    username: str | None = None
    global_name: str | None = None
    guild_nick: str | None = None
    nick_known: bool = False

    @property
    def label(self) -> str:
        return self.guild_nick or self.global_name or self.username or self.key.partition(":")[2]


@dataclass(frozen=True)
class IncomingMessage:
    """One message from a person, in transport-neutral terms.

    `addressed` is the transport's judgement that the familiar itself was pinged
    (an @-mention of its account, or a reply to one of its messages); `direct`
    marks a private conversation; `console` a local terminal chat, which always
    gets a reply. A thread's `parent_channel_id` lets it inherit the parent's
    `[channels.<id>]` settings.
    """

    channel_id: int
    author: Person
    content: str
    guild_id: int | None = None
    parent_channel_id: int | None = None
    platform_message_id: str | None = None
    reply_to_message_id: str | None = None
    created_at: datetime | None = None
    mentions: tuple[Person, ...] = ()
    addressed: bool = False
    direct: bool = False
    console: bool = False
    author_is_bot: bool = False


def storable_text(text: str) -> str:
    """`text` with lone UTF-16 surrogates replaced by U+FFFD, and split pairs rejoined.

    A client (or a JSON payload with a stray `\\ud800` escape) can hand us a string
    UTF-8 cannot encode; the turn log rightly refuses it, which would lose the whole
    message. Keeping the message with one replacement character loses only what no
    one could have read anyway.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _name_pattern(names: Sequence[str]) -> re.Pattern[str] | None:
    words = sorted({n.strip() for n in names if n and n.strip()}, key=len, reverse=True)
    if not words:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in words) + r")(?!\w)", re.IGNORECASE)


def reply_reason(message: IncomingMessage, config: FamiliarConfig) -> str | None:
    """Why the familiar should answer this message, or None to stay quiet.

    In order: the console always answers; never answer another bot (two bots
    answering each other never stop); a direct message; an @-mention or reply;
    one of the familiar's configured `aliases` as a word ("morning, Sapphire");
    a channel (or a thread's parent channel) with `respond_to_all = true`.
    Only explicit aliases count as names: the derived display name of a familiar
    called "familiar" would otherwise fire on "that looks familiar".
    """
    if message.console:
        return "console"
    if message.author_is_bot:
        return None
    if message.direct:
        return "direct"
    if message.addressed:
        return "mentioned"
    pattern = _name_pattern(config.aliases)
    if pattern is not None and pattern.search(message.content):
        return "named"
    for channel_id in (message.channel_id, message.parent_channel_id):
        if channel_id is not None and channel_id in config.channels and config.channels[channel_id].respond_to_all:
            return "respond_to_all"
    return None
