"""The Discord transport: a thin discord.py client over the transport-free responder.

It translates, and decides nothing the responder could decide:

* a message becomes an `IncomingMessage` (author and mentions as canonical
  `discord:<id>` keys with their names and guild nicknames; see `render_content`
  for how pings are written), and the
  reply pieces go back to the channel or thread, the first as a reply to the message;
* every send uses `AllowedMentions.none()` (which also keeps `replied_user` off),
  on the client and per message, so nothing the model writes (`@everyone`, a
  user id) can ever ping anyone;
* edits and deletions arrive through the *raw* events only: they fire for cached
  and uncached messages alike, so one handler sees every change once, even for
  messages sent before the bot started;
* the typing indicator shows while a reply is being composed;
* `/context` shows the assembled prompt sections to a server manager, ephemerally.

Its own messages are not re-recorded on arrival: the responder records each reply
piece right after sending it. Other bots' messages are recorded, never answered.
"""

from __future__ import annotations

import io
import logging
import re
from typing import Any

import discord
from discord import app_commands

from familiar_bot.responder import IncomingMessage, Person, Responder, split_message
from familiar_pipeline.storage.identity import canonical_key

log = logging.getLogger(__name__)

PLATFORM = "discord"
NO_PINGS = discord.AllowedMentions.none()
# Longer /context reports go out as a file: ten screens of ephemeral messages help nobody.
CONTEXT_MAX_MESSAGES = 4
_RECORDED_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})


def intents(*, members: bool = False) -> discord.Intents:
    """Guilds, guild and direct messages, message content; members only if asked for.

    Message content and members are privileged: each must also be switched on for
    the bot in the Discord developer portal. Without the members intent, nicknames
    are still tracked from message authors and mentions, just not on rename.
    """
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    wanted.members = members
    return wanted


def person_from(user: discord.abc.User) -> Person:
    member = isinstance(user, discord.Member)
    return Person(
        key=canonical_key(PLATFORM, user.id),
        username=user.name,
        global_name=getattr(user, "global_name", None),
        guild_nick=user.nick if isinstance(user, discord.Member) else None,
        nick_known=member,
    )


def render_content(message: discord.Message, *, self_id: int | None = None, self_name: str | None = None) -> str:
    """The message text for the turn log.

    People's pings stay as `<@id>`: an id never goes stale, and prompts resolve it
    to the person's current name when they are built. A ping of the familiar
    becomes `@<its name>` (it is no participant, so no lookup could name it);
    role and channel pings become their names, which only Discord could resolve.
    Attachments and stickers are noted, so an image-only message is not empty.
    """
    text = message.content or ""
    if self_id is not None and self_name:
        text = re.sub(rf"<@!?{self_id}>", lambda _m: f"@{self_name}", text)
    for role in message.role_mentions:
        text = text.replace(f"<@&{role.id}>", f"@{role.name}")
    for channel in message.channel_mentions:
        text = text.replace(f"<#{channel.id}>", f"#{getattr(channel, 'name', channel.id)}")
    extras = [f"[attachment: {a.filename}]" for a in message.attachments]
    extras += [f"[sticker: {s.name}]" for s in message.stickers]
    return "\n".join(part for part in (text, *extras) if part)


def _replied_to_author(message: discord.Message) -> int | None:
    reference = message.reference
    if reference is None:
        return None
    target = reference.resolved or reference.cached_message
    return target.author.id if isinstance(target, discord.Message) else None


def incoming_from(message: discord.Message, *, self_id: int | None, self_name: str | None = None) -> IncomingMessage:
    """Translate a discord.py message into the responder's terms."""
    channel = message.channel
    mentioned_self = self_id is not None and any(u.id == self_id for u in message.mentions)
    replied_to_self = self_id is not None and _replied_to_author(message) == self_id
    reference = message.reference
    return IncomingMessage(
        channel_id=channel.id,
        author=person_from(message.author),
        content=render_content(message, self_id=self_id, self_name=self_name),
        guild_id=message.guild.id if message.guild else None,
        parent_channel_id=channel.parent_id if isinstance(channel, discord.Thread) else None,
        platform_message_id=str(message.id),
        reply_to_message_id=str(reference.message_id) if reference and reference.message_id else None,
        created_at=message.created_at,
        mentions=tuple(person_from(u) for u in message.mentions if u.id != self_id),
        addressed=mentioned_self or replied_to_self,
        direct=message.guild is None,
        author_is_bot=message.author.bot or message.webhook_id is not None,
    )


def context_payload(report: str) -> tuple[list[str], str | None]:
    """The /context answer: message pieces, plus the full report as a file when it is long."""
    pieces = split_message(report)
    if len(pieces) <= CONTEXT_MAX_MESSAGES:
        return pieces, None
    headings = [line for line in report.splitlines() if line.startswith("=== ")]
    summary = "The prompt is long, so the full report is attached.\n" + "\n".join(headings)
    return split_message(summary)[:CONTEXT_MAX_MESSAGES], report


class FamiliarClient(discord.Client):
    """The familiar on Discord. `sync_commands` registers /context with Discord at startup."""

    def __init__(self, responder: Responder, *, members_intent: bool = False, sync_commands: bool = True,
                 **options: Any) -> None:
        options.setdefault("allowed_mentions", NO_PINGS)
        super().__init__(intents=intents(members=members_intent), **options)
        self.responder = responder
        self.sync_commands = sync_commands
        self.tree = app_commands.CommandTree(self)
        self.tree.add_command(self._context_command())
        self._synced = False

    # -- lifecycle

    async def on_ready(self) -> None:
        log.info("connected to Discord as %s (%s) for familiar %s in %d guild(s)",
                 self.user, getattr(self.user, "id", "?"), self.responder.familiar_id, len(self.guilds))
        if self.sync_commands and not self._synced:
            self._synced = True
            try:
                await self.tree.sync()
            except discord.HTTPException as exc:  # /context is a convenience; chat works without it
                log.warning("could not register the /context command with Discord: %s", exc)

    async def on_thread_create(self, thread: discord.Thread) -> None:
        """Join new threads so their messages reach us even where membership is required."""
        try:
            await thread.join()
        except discord.HTTPException as exc:
            log.info("could not join thread %s: %s", thread.id, exc)

    # -- messages

    async def on_message(self, message: discord.Message) -> None:
        if self.user is not None and message.author.id == self.user.id:
            return  # our own replies were recorded as they were sent
        if message.type not in _RECORDED_TYPES:
            return  # joins, pins, boosts: not conversation
        incoming = incoming_from(message, self_id=getattr(self.user, "id", None),
                                 self_name=self.responder.config.display_name)
        first = True

        async def send(piece: str) -> str:
            nonlocal first
            reference = message.to_reference(fail_if_not_exists=False) if first and message.guild else None
            first = False
            # discord.py's send() takes reference=None (its default), but its typing overloads leave None out.
            sent = await message.channel.send(piece, allowed_mentions=NO_PINGS,
                                              reference=reference,  # type: ignore[arg-type]
                                              mention_author=False)
            return str(sent.id)

        await self.responder.handle(incoming, send=send, composing=message.channel.typing)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        edited = payload.message
        if "content" not in payload.data:
            return  # an embed-only update (link unfurl): the text did not change
        content = render_content(edited, self_id=getattr(self.user, "id", None),
                                 self_name=self.responder.config.display_name)
        await self.responder.handle_edit(payload.message_id, content, edited_at=edited.edited_at)

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self.responder.handle_delete(payload.message_id)

    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        for message_id in sorted(payload.message_ids):
            await self.responder.handle_delete(message_id)

    async def on_member_update(self, before: discord.Member, after: discord.Member) -> None:
        """Nickname changes (needs the members intent); names are otherwise seen on messages."""
        if (before.nick, before.name, before.global_name) != (after.nick, after.name, after.global_name):
            await self.responder.handle_profile(person_from(after), after.guild.id)

    # -- /context

    def _context_command(self) -> app_commands.Command:
        @app_commands.command(name="context",
                              description="Show the prompt sections the familiar would answer with here")
        @app_commands.describe(message="a message to use as the retrieval cue (default: none)")
        @app_commands.guild_only()
        @app_commands.default_permissions(manage_guild=True)
        async def context(interaction: discord.Interaction, message: str = "") -> None:
            await self.answer_context(interaction, message)

        return context

    async def answer_context(self, interaction: discord.Interaction, cue: str) -> None:
        """Assemble without recording anything and answer ephemerally (only the caller sees it)."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        try:
            channel_id = interaction.channel_id
            assert channel_id is not None  # a guild-only command is run in a channel
            report = await self.responder.context_report(channel_id, guild_id=interaction.guild_id, cue=cue)
        except Exception as exc:  # noqa: BLE001 - tell the operator instead of timing out
            log.exception("/context failed in channel %s", interaction.channel_id)
            report = f"Could not assemble the prompt: {type(exc).__name__}: {exc}"
        pieces, attachment = context_payload(report)
        for index, piece in enumerate(pieces):
            extra: dict[str, Any] = {}
            if attachment is not None and index == len(pieces) - 1:
                extra["file"] = discord.File(io.BytesIO(attachment.encode("utf-8")), filename="context.txt")
            await interaction.followup.send(piece, ephemeral=True, allowed_mentions=NO_PINGS, **extra)


async def serve(responder: Responder, token: str, *, members_intent: bool = False) -> None:
    """Run the bot until it is stopped. The token is passed straight to discord.py, never logged."""
    async with FamiliarClient(responder, members_intent=members_intent) as client:
        await client.start(token, reconnect=True)
