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
* `/context` shows the assembled prompt sections to a server manager, ephemerally;
* `/memory show|export`, `/forget message|everything` and (server managers) `/forget-member`
  let people see and erase what is remembered about them (`familiar_bot.self_service` decides
  what; here only the answers and the Confirm/Cancel step), every answer ephemeral.

Its own messages are not re-recorded on arrival: the responder records each reply
piece right after sending it. Other bots' messages are recorded, never answered.
"""

from __future__ import annotations

import gzip
import io
import logging
import re
from typing import Any, Awaitable, Callable

import discord
from discord import app_commands

from familiar_bot.responder.flow import Responder
from familiar_bot.responder.messages import IncomingMessage, Person
from familiar_bot.responder.reply_text import DISCORD_MESSAGE_LIMIT, split_message
from familiar_bot.self_service import CLEANED, ForgetRefused, Requester, erased_line, export_json
from familiar_pipeline.storage.identity import canonical_key
from familiar_pipeline.storage.turns import Erasure

log = logging.getLogger(__name__)

PLATFORM = "discord"
NO_PINGS = discord.AllowedMentions.none()
# Longer /context reports go out as a file: ten screens of ephemeral messages help nobody.
CONTEXT_MAX_MESSAGES = 4
_RECORDED_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})
# How long a Confirm/Cancel question waits before it counts as Cancel.
CONFIRM_TIMEOUT_S = 120.0
READ_FAILED = "I couldn't read my memory just now; please try again in a moment."
ERASE_FAILED = "Something went wrong and nothing was erased; please try again in a moment."


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


def requester_of(interaction: discord.Interaction) -> Requester:
    """Who asks to forget: Manage Server counts in the server asked from; a DM's replies in that DM."""
    guild_id = interaction.guild_id
    return Requester(
        key=canonical_key(PLATFORM, interaction.user.id),
        manages_guild=guild_id if guild_id is not None and interaction.permissions.manage_guild else None,
        dm_channel=interaction.channel_id if isinstance(interaction.channel, discord.DMChannel) else None,
    )


def scope_here(interaction: discord.Interaction) -> str:
    """The scope of where a command is used (`storage.scopes.turn_scope` of a turn said there)."""
    if interaction.guild_id is not None:
        return f"guild:{interaction.guild_id}"
    return f"channel:{interaction.channel_id}"


class Confirm(discord.ui.View):
    """Confirm / Cancel under an ephemeral question; no answer within the timeout counts as Cancel.

    Forgetting cannot be undone, so a whole-person erasure is asked twice. The buttons answer
    only the person who asked (the message is ephemeral: nobody else sees them anyway).
    """

    def __init__(self, requester_id: int, *, timeout: float) -> None:
        super().__init__(timeout=timeout)
        self.requester_id = requester_id
        self.confirmed = False
        self.answer: discord.Interaction | None = None  # the button press, answered by the command

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return interaction.user.id == self.requester_id

    @discord.ui.button(label="Confirm", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.confirmed, self.answer = True, interaction
        self.stop()

    @discord.ui.button(label="Cancel", style=discord.ButtonStyle.secondary)
    async def cancel(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.answer = interaction
        self.stop()


class FamiliarClient(discord.Client):
    """The familiar on Discord. `sync_commands` registers its slash commands with Discord at startup."""

    def __init__(self, responder: Responder, *, members_intent: bool = False, sync_commands: bool = True,
                 confirm_timeout_s: float = CONFIRM_TIMEOUT_S, **options: Any) -> None:
        options.setdefault("allowed_mentions", NO_PINGS)
        super().__init__(intents=intents(members=members_intent), **options)
        self.responder = responder
        self.sync_commands = sync_commands
        self.confirm_timeout_s = confirm_timeout_s
        self.tree = app_commands.CommandTree(self)
        self.tree.add_command(self._context_command())
        self.tree.add_command(self._memory_commands())
        self.tree.add_command(self._forget_commands())
        self.tree.add_command(self._forget_member_command())
        self._synced = False

    # -- lifecycle

    async def on_ready(self) -> None:
        log.info("connected to Discord as %s (%s) for familiar %s in %d guild(s)",
                 self.user, getattr(self.user, "id", "?"), self.responder.familiar_id, len(self.guilds))
        if self.sync_commands and not self._synced:
            self._synced = True
            try:
                await self.tree.sync()
            except discord.HTTPException as exc:  # the commands are a convenience; chat works without them
                log.warning("could not register the slash commands with Discord: %s", exc)

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

    # -- /memory and /forget: seeing and forgetting what is remembered (familiar_bot.self_service)

    def _memory_commands(self) -> app_commands.Group:
        group = app_commands.Group(name="memory", description="What the familiar remembers about you")

        @group.command(name="show", description="What I remember about you here (only you see it)")
        async def show(interaction: discord.Interaction) -> None:
            await self.answer_memory_show(interaction)

        @group.command(name="export", description="Everything of yours I hold here, as a file only you get")
        async def export(interaction: discord.Interaction) -> None:
            await self.answer_memory_export(interaction)

        return group

    def _forget_commands(self) -> app_commands.Group:
        group = app_commands.Group(name="forget", description="Have the familiar forget what you said")

        @group.command(name="message", description="Forget one of your messages")
        @app_commands.describe(message="the message's link or id (right-click it: Copy Message Link)")
        async def message(interaction: discord.Interaction, message: str) -> None:
            await self.answer_forget_message(interaction, message)

        @group.command(name="everything", description="Forget everything you have said to me (asks first)")
        @app_commands.describe(only_here="only what you said in this server, or in this DM")
        async def everything(interaction: discord.Interaction, only_here: bool = False) -> None:
            await self.answer_forget_everything(interaction, only_here)

        return group

    def _forget_member_command(self) -> app_commands.Command:
        # Its own command: Discord sets default permissions per top-level command, not per subcommand.
        @app_commands.command(name="forget-member", description="Forget everything a member said in this server")
        @app_commands.describe(member="the member whose messages in this server I should forget")
        @app_commands.guild_only()
        @app_commands.default_permissions(manage_guild=True)
        async def forget_member(interaction: discord.Interaction, member: discord.Member) -> None:
            await self.answer_forget_member(interaction, member)

        return forget_member

    async def answer_memory_show(self, interaction: discord.Interaction) -> None:
        """What a reply here may read about the caller, cut to one message (the export has it all)."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        try:
            text = await self.responder.memory_report(
                canonical_key(PLATFORM, interaction.user.id), self._channel_id(interaction),
                guild_id=interaction.guild_id, limit=DISCORD_MESSAGE_LIMIT, export_hint="/memory export")
        except Exception:  # noqa: BLE001 - one line to the person, the details to the log
            log.exception("/memory show failed in channel %s", interaction.channel_id)
            text = READ_FAILED
        await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_PINGS)

    async def answer_memory_export(self, interaction: discord.Interaction) -> None:
        """The caller's data here as a JSON file in an ephemeral message: nobody else receives it."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        try:
            data = await self.responder.memory_export(
                canonical_key(PLATFORM, interaction.user.id), self._channel_id(interaction),
                guild_id=interaction.guild_id)
        except Exception:  # noqa: BLE001
            log.exception("/memory export failed in channel %s", interaction.channel_id)
            await interaction.followup.send(READ_FAILED, ephemeral=True, allowed_mentions=NO_PINGS)
            return
        body, name = export_json(data).encode("utf-8"), f"memory-{self.responder.familiar_id}-{interaction.user.id}.json"
        if len(body) > interaction.filesize_limit:  # text compresses well; Discord's limit is per file
            body, name = gzip.compress(body), name + ".gz"
        if len(body) > interaction.filesize_limit:
            await interaction.followup.send("Your export is larger than Discord lets me attach; the familiar's "
                                            "operator can export it for you.", ephemeral=True,
                                            allowed_mentions=NO_PINGS)
            return
        text = (f"Everything of yours I hold here: {len(data['turns'])} messages, {len(data['facts'])} facts "
                "about you. Only you received this file.")
        await interaction.followup.send(text, file=discord.File(io.BytesIO(body), filename=name), ephemeral=True,
                                        allowed_mentions=NO_PINGS)

    async def answer_forget_message(self, interaction: discord.Interaction, typed: str) -> None:
        try:
            line = erased_line(await self.responder.forget_message(typed, requester_of(interaction)))
        except ForgetRefused as exc:
            line = str(exc)
        except Exception:  # noqa: BLE001
            log.exception("/forget message failed in channel %s", interaction.channel_id)
            line = ERASE_FAILED
        await interaction.response.send_message(line, ephemeral=True, allowed_mentions=NO_PINGS)

    async def answer_forget_everything(self, interaction: discord.Interaction, only_here: bool) -> None:
        key = canonical_key(PLATFORM, interaction.user.id)
        scope = scope_here(interaction) if only_here else None
        where = ("anywhere" if not only_here else "in this server" if interaction.guild_id is not None
                 else "in this conversation")
        question = (f"Forget everything you have said to me {where}? I stop quoting your messages at once, and "
                    f"{CLEANED}. This cannot be undone.")
        await self._confirm_then(interaction, question,
                                 lambda: self.responder.forget_person(key, scope=scope, requested_by=key))

    async def answer_forget_member(self, interaction: discord.Interaction, member: discord.Member) -> None:
        """A server manager has a member forgotten in this server (only here: elsewhere is not theirs)."""
        if interaction.guild_id is None or not interaction.permissions.manage_guild:
            await interaction.response.send_message("Only a server manager (Manage Server) can do that, in their "
                                                    "server.", ephemeral=True, allowed_mentions=NO_PINGS)
            return
        manager = canonical_key(PLATFORM, interaction.user.id)
        question = (f"Forget everything {member.mention} said in this server? I stop quoting their messages at "
                    f"once, and {CLEANED}. This cannot be undone.")
        await self._confirm_then(interaction, question, lambda: self.responder.forget_person(
            canonical_key(PLATFORM, member.id), scope=f"guild:{interaction.guild_id}", requested_by=manager,
            who=member.display_name))

    async def _confirm_then(self, interaction: discord.Interaction, question: str,
                            erase: Callable[[], Awaitable[Erasure]]) -> None:
        """Ask with Confirm/Cancel (ephemeral), erase only on Confirm, answer in the same message."""
        view = Confirm(interaction.user.id, timeout=self.confirm_timeout_s)
        await interaction.response.send_message(question, view=view, ephemeral=True, allowed_mentions=NO_PINGS)
        await view.wait()
        if view.answer is None:
            await interaction.edit_original_response(content="No answer in time, so I cancelled: nothing was erased.",
                                                      view=None, allowed_mentions=NO_PINGS)
            return
        if not view.confirmed:
            line = "Cancelled: nothing was erased."
        else:
            try:
                line = erased_line(await erase())
            except ForgetRefused as exc:
                line = str(exc)
            except Exception:  # noqa: BLE001
                log.exception("an erasure failed in channel %s", interaction.channel_id)
                line = ERASE_FAILED
        await view.answer.response.edit_message(content=line, view=None, allowed_mentions=NO_PINGS)

    @staticmethod
    def _channel_id(interaction: discord.Interaction) -> int:
        channel_id = interaction.channel_id
        assert channel_id is not None  # a slash command is always used in a channel
        return channel_id


async def serve(responder: Responder, token: str, *, members_intent: bool = False) -> None:
    """Run the bot until it is stopped. The token is passed straight to discord.py, never logged."""
    async with FamiliarClient(responder, members_intent=members_intent) as client:
        await client.start(token, reconnect=True)
