"""The transport-free responder: what happens when someone says something to the familiar.

Discord and the console both hand it an `IncomingMessage`; it does the memory
bookkeeping and the reply, and knows nothing about either transport. Per message:

1. upsert the author and everyone it mentions (plus guild nicknames);
2. append the user turn, with its mentions, *before* anything is assembled, so the
   prompt built for this message (and for any message racing it) already contains
   it: building the prompt first once made two people get the same reply;
3. decide whether to reply (`reply_reason`);
4. refresh the memory readers and assemble the prompt with the message as the
   retrieval cue, call the `reply` model slot, hand the reply to the transport in
   Discord-sized pieces;
5. append one assistant turn per piece actually delivered, only after it was
   delivered, so the log never claims the familiar said what nobody saw.

Failures never cost a turn and never crash the transport: without a reply model
the familiar says once per channel which setting to change; a failing model call
becomes a short apology plus a logged error. A turn log that cannot take a write
(disk full, I/O error) gets the write kept in a bounded, ordered spool
(`familiar_bot.spool`) and the channel a notice saying so; the spool drains by
itself once the disk has room. Notices and apologies are not the familiar speaking,
so they are not recorded as its turns, and they never name a server path.

It also answers people about themselves (`/memory`, `/forget`: `familiar_bot.self_service`):
reads run like an assembly's, off the event loop; an erasure is a turn-log write that is never
spooled (it is refused while earlier writes still wait, so it cannot miss them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Protocol, Sequence

import pyarrow.compute as pc

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.models.embedders import create_embedder
from familiar_pipeline.models.llm import LlmError, LlmNotConfigured, client_for, llm_sources
from familiar_pipeline.projectors.facts.reads import facts_by_ids
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import Erasure, TurnLog, TurnLogError, TurnLogUnavailable
from familiar_pipeline.storage.words import redact, words_of

from familiar_bot import self_service
from familiar_bot.prompt.assembly import AssemblyContext, build_assembler, render_sections
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.prompt.scoping import scope_mask
from familiar_bot.spool import Spool, SpooledWrite, import_line, retry_delays

log = logging.getLogger(__name__)

DISCORD_MESSAGE_LIMIT = 2000
TIER = "text"
HISTORY_LAYER = "recent_history"

APOLOGY = "Sorry, I couldn't put a reply together just now. Please try again in a moment."

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


class AssemblerLike(Protocol):
    def assemble(self, ctx: Any) -> Any: ...


# --------------------------------------------------------------------------- pure rules


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


def not_configured_notice(paths: FamiliarPaths, detail: str | None = None) -> str:
    """What to tell a channel when no reply model can be called, and how to fix it.

    It goes to the channel, so it names the file as the operator knows it (the
    familiar's character.toml), never the server's absolute path (`public_text`).
    """
    if detail:
        return public_text(f"I can't reply yet: {detail}", paths)
    return (
        "I can't reply yet: no reply model is configured. I'm still listening and remembering. "
        f"To let me answer, set [llm.reply].model in the character.toml of familiar '{paths.familiar_id}' "
        "(a litellm model string such as \"openrouter/anthropic/claude-sonnet-4\"), or the environment "
        "variable FAMILIAR__LLM__REPLY__MODEL, then restart me."
    )


def public_text(text: str, paths: FamiliarPaths) -> str:
    """`text` without the server's paths: the familiar's folder and the data root become names.

    Anything said in a channel is read by people who have no business knowing where
    the bot keeps its files on the server.
    """
    for path, shown in ((paths.dir, f"<familiar {paths.familiar_id}>"), (paths.root, "<data root>")):
        text = text.replace(str(path), shown)
    return text


def spooled_notice(waiting: int) -> str:
    return ("I couldn't take that message in: my memory can't be written right now (the disk is full or "
            f"failing). I'm holding on to it ({waiting} waiting) and will store it as soon as I can; "
            "no need to send it again.")


def refused_notice(waiting: int) -> str:
    return ("I couldn't take that message in: my memory can't be written right now (the disk is full or "
            f"failing), and I'm already holding {waiting} messages for it. This one was not kept: please "
            "send it again later.")


class _Deferred(Exception):
    """A write went to the spool (`kept`) or was refused because the spool is full."""

    def __init__(self, kept: bool, notice: str):
        super().__init__(notice)
        self.kept, self.notice = kept, notice


# --------------------------------------------------------------------------- responder


@dataclass
class ResponderStats:
    """Counters for one session: what happened, for logs and tests."""

    messages: int = 0
    replies: int = 0
    llm_errors: int = 0
    send_errors: int = 0
    not_configured: int = 0
    spooled: int = 0  # writes the turn log refused for now, kept in the spool
    refused: int = 0  # messages refused because the spool was full


class Responder:
    """One familiar's responder; share one instance per process and event loop.

    `assembler` is anything with `assemble(AssemblyContext) -> AssembledPrompt`
    (see familiar_bot.prompt.assembly), which refreshes its memory readers (snapshots,
    full-text indexes) itself on each call; `llm` is the `reply` slot's client
    (`configured`, `acomplete(messages)`); `turn_log` is the writer.
    """

    def __init__(
        self,
        paths: FamiliarPaths,
        config: FamiliarConfig,
        *,
        assembler: AssemblerLike,
        llm: Any,
        turn_log: TurnLog,
    ) -> None:
        self.paths = paths
        self.config = config
        self.assembler = assembler
        self.llm = llm
        self.turn_log = turn_log
        self.stats = ResponderStats()
        self._told_no_model: set[int] = set()
        # One reply at a time per channel, so each prompt sees the previous reply.
        # Assemblies run one at a time in a worker thread: each takes milliseconds,
        # and this keeps a burst of messages from fanning out into many threads.
        self._channel_locks: dict[int, asyncio.Lock] = {}
        self._assembly_lock: asyncio.Lock | None = None
        self.spool = Spool()
        self._drain_task: asyncio.Task | None = None

    @property
    def familiar_id(self) -> str:
        return self.paths.familiar_id

    # -- incoming messages

    async def handle(
        self, message: IncomingMessage, *, send: Send | None = None, composing: Composing | None = None
    ) -> list[str]:
        """Record the message and, if it calls for one, reply; returns the reply pieces.

        With `send`, each piece is sent through it and recorded once sent (a piece
        whose send fails ends the reply there). Without, the caller is taken to
        deliver the returned pieces and they are recorded before returning.
        """
        self.stats.messages += 1
        if message.created_at is None:  # its own time, kept even if it waits in the spool
            message = replace(message, created_at=datetime.now(timezone.utc))
        try:
            turn_id = self._write(f"message in channel {message.channel_id}", lambda: self.record_incoming(message),
                                  size=len(message.content), export=self._import_line(message))
        except _Deferred as exc:
            return await self._deliver_notice(exc.notice, send)
        except TurnLogError as exc:
            log.error("familiar %s: message in channel %s not recorded: %s",
                      self.familiar_id, message.channel_id, exc)
            return await self._deliver_notice(public_text(f"I couldn't take that message in: {exc}", self.paths), send)

        reason = reply_reason(message, self.config)
        if reason is None:
            return []
        if not self.llm.configured:
            return await self._tell_not_configured(message.channel_id, None, send)

        lock = self._channel_locks.setdefault(message.channel_id, asyncio.Lock())
        async with lock:
            try:
                async with contextlib.AsyncExitStack() as stack:
                    if composing is not None:
                        await self._enter_quietly(stack, composing)
                    text = await self._compose(message, turn_id)
            except _NotConfigured as exc:
                return await self._tell_not_configured(message.channel_id, str(exc), send)
            except _ReplyFailed:
                return await self._deliver_notice(APOLOGY, send)
            return await self._deliver_reply(message, text, send, turn_id)

    async def _enter_quietly(self, stack: contextlib.AsyncExitStack, composing: Composing) -> None:
        """Show the typing indicator if the transport can; a reply never waits on it."""
        try:
            await stack.enter_async_context(composing())
        except Exception as exc:  # noqa: BLE001 - e.g. a rate-limited typing request
            log.warning("familiar %s: typing indicator unavailable: %s", self.familiar_id, exc)

    def record_incoming(self, message: IncomingMessage) -> int:
        """Participants, guild nicknames, then the user turn with its mentions; returns the turn id."""
        for person in (message.author, *message.mentions):
            self.observe_person(person, message.guild_id, seen_at=message.created_at)
        turn = self.turn_log.append_turn(
            channel_id=message.channel_id,
            guild_id=message.guild_id,
            role="user",
            author_key=message.author.key,
            author_display=storable_text(message.author.label),
            content=storable_text(message.content),
            platform_message_id=message.platform_message_id,
            reply_to_message_id=message.reply_to_message_id,
            created_at=message.created_at,
            mentions=[p.key for p in message.mentions if p.key != message.author.key],
        )
        return turn.id

    def observe_person(self, person: Person, guild_id: int | None, *, seen_at: datetime | None = None) -> None:
        """Record what a transport learnt about an account (names, guild nickname)."""
        self.turn_log.upsert_participant(
            person.key, username=person.username, global_name=person.global_name, seen_at=seen_at
        )
        if guild_id is not None and person.nick_known:
            self.turn_log.upsert_guild_nick(person.key, guild_id, person.guild_nick, seen_at)

    async def handle_profile(self, person: Person, guild_id: int | None) -> bool:
        """A profile or nickname change seen outside a message; kept in the spool if the log cannot take it."""
        seen_at = datetime.now(timezone.utc)
        try:
            self._write(f"profile of {person.key}", lambda: self.observe_person(person, guild_id, seen_at=seen_at),
                        size=len(person.label))
        except _Deferred:
            return False
        except TurnLogError as exc:
            log.error("familiar %s: profile of %s not recorded: %s", self.familiar_id, person.key, exc)
            return False
        return True

    # -- writes the turn log may refuse for now

    def _write(self, what: str, apply, *, size: int, export: dict | None = None):
        """Apply a turn-log write now, or keep it in the spool (raises `_Deferred`) while the log cannot take it.

        While earlier writes wait, this one waits behind them, so the log gets every write in order.
        """
        if len(self.spool) and not self.spool.flush():
            return self._defer(SpooledWrite(what, apply, size, export), self.spool.last_error)
        try:
            return apply()
        except TurnLogUnavailable as exc:
            return self._defer(SpooledWrite(what, apply, size, export), str(exc))

    def _defer(self, write: SpooledWrite, why: str | None):
        if not self.spool.add(write):
            self.stats.refused += 1
            log.error("familiar %s: %s REFUSED: the turn log cannot take writes (%s) and the spool is full "
                      "(%d writes waiting)", self.familiar_id, write.what, why, len(self.spool))
            raise _Deferred(False, refused_notice(len(self.spool)))
        self.stats.spooled += 1
        log.warning("familiar %s: %s kept in the spool (%d waiting): %s", self.familiar_id, write.what,
                    len(self.spool), why)
        self._keep_draining()
        raise _Deferred(True, spooled_notice(len(self.spool)))

    def _keep_draining(self) -> None:
        """Retry the spool with backoff until it is empty (from the running event loop, if any)."""
        if self._drain_task is not None and not self._drain_task.done():
            return
        try:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())
        except RuntimeError:  # no loop (a synchronous caller): the next write flushes it
            self._drain_task = None

    async def _drain(self) -> None:
        for delay in retry_delays():
            await asyncio.sleep(delay)
            if self.flush_spool():
                return

    def flush_spool(self) -> bool:
        """Store what the spool holds, in order; True when nothing is left waiting."""
        if not len(self.spool):
            return True
        before = self.spool.stored
        done = self.spool.flush()
        if self.spool.stored > before:
            log.warning("familiar %s: the turn log takes writes again: %d kept write(s) stored, %d waiting",
                        self.familiar_id, self.spool.stored - before, len(self.spool))
        return done

    def close_spool(self) -> None:
        """At exit: a last flush, then what still waits is written out for `familiar import`, loudly."""
        if self._drain_task is not None:
            self._drain_task.cancel()
        if self.flush_spool():
            return
        waiting = len(self.spool)
        dumped = self.spool.dump(self.paths.dir)
        log.error("familiar %s: %d write(s) could not be stored before exit%s", self.familiar_id, waiting,
                  f"; their messages are in {dumped}: `familiar import --familiar {self.familiar_id} {dumped}` "
                  "stores them" if dumped else "")

    def _import_line(self, message: IncomingMessage) -> dict:
        return import_line(speaker=message.author.label, text=storable_text(message.content),
                           at=message.created_at or datetime.now(timezone.utc), channel=message.channel_id,
                           user_id=message.author.key)

    async def handle_edit(
        self, platform_message_id: str | int, new_content: str, *, edited_at: datetime | None = None
    ) -> bool:
        """Record an edit of a logged message (prior text kept); False when we never saw it.

        Edits that change nothing (Discord sends those when a link unfurls) are no-ops
        in the turn log, so replaying an event is harmless.
        """
        edited_at = edited_at or datetime.now(timezone.utc)
        try:
            turn = self._write(f"edit of message {platform_message_id}", lambda: self.turn_log.record_edit(
                platform_message_id=str(platform_message_id), new_content=storable_text(new_content),
                edited_at=edited_at,
            ), size=len(new_content))
        except _Deferred:
            return False
        except TurnLogError as exc:
            log.error("familiar %s: edit of message %s not recorded: %s", self.familiar_id, platform_message_id, exc)
            return False
        return turn is not None

    async def handle_delete(self, platform_message_id: str | int, *, deleted_at: datetime | None = None) -> bool:
        """Tombstone a logged message (its text stays for audit); False when we never saw it."""
        deleted_at = deleted_at or datetime.now(timezone.utc)
        try:
            turn = self._write(f"deletion of message {platform_message_id}", lambda: self.turn_log.record_deletion(
                platform_message_id=str(platform_message_id), deleted_at=deleted_at), size=0)
        except _Deferred:
            return False
        except TurnLogError as exc:
            log.error("familiar %s: deletion of message %s not recorded: %s",
                      self.familiar_id, platform_message_id, exc)
            return False
        return turn is not None

    # -- inspection

    async def inspect(self, channel_id: int, *, guild_id: int | None = None, cue: str = "") -> Any:
        """The prompt a message `cue` would be answered with here; nothing is recorded."""
        return await self._assemble(channel_id, guild_id, cue)

    async def context_report(self, channel_id: int, *, guild_id: int | None = None, cue: str = "") -> str:
        """The `/context` report: which layers said what, with token counts."""
        prompt = await self.inspect(channel_id, guild_id=guild_id, cue=cue)
        report = render_sections(prompt)
        snapshot = getattr(getattr(self.assembler, "memory", None), "snapshot", None)
        # The footer quotes fact text: only the scopes this reply read (another scope's, never).
        visible = tuple(prompt.debug.get("scopes", {}).get("visible", ()))
        return report + ("\n\n" + retired_facts_report(snapshot, visible=visible) if snapshot is not None else "")

    # -- what is held about a person, and forgetting it (familiar_bot.self_service)

    def _memory_view(self) -> MemoryView:
        memory = getattr(self.assembler, "memory", None)
        if not isinstance(memory, MemoryView):
            raise RuntimeError("this responder's assembler reads no memory view")
        return memory

    async def _read_memory(self, read: Callable[[MemoryView], Any]) -> Any:
        """``read(memory)`` off the event loop, one at a time with the assemblies (as they read it)."""
        memory = self._memory_view()
        if self._assembly_lock is None:
            self._assembly_lock = asyncio.Lock()
        async with self._assembly_lock:
            return await asyncio.to_thread(read, memory)

    async def held_about(self, person: str, channel_id: int, *, guild_id: int | None = None) -> self_service.Held:
        """What a reply in this channel may read about ``person``; nothing is recorded."""
        return await self._read_memory(lambda m: self_service.held_about(m, person, channel_id, guild_id))

    async def memory_report(self, person: str, channel_id: int, *, guild_id: int | None = None,
                            limit: int | None = None, export_hint: str = "/memory export") -> str:
        """`/memory`: :meth:`held_about` as the person reads it, at most ``limit`` characters."""
        held = await self.held_about(person, channel_id, guild_id=guild_id)
        return self_service.render_held(held, limit=limit, export_hint=export_hint)

    async def memory_export(self, person: str, channel_id: int, *, guild_id: int | None = None) -> dict[str, Any]:
        """`/memory export`: the person's own turns and the facts about them here, as JSON-ready values."""
        return await self._read_memory(lambda m: self_service.export_about(m, person, channel_id, guild_id))

    async def forget_message(self, typed: str, requester: self_service.Requester) -> Erasure:
        """Erase one message ``requester`` may erase (an id, a link; on the console a turn id too)."""
        return await self._erase(lambda turn_log: self_service.forget_message(turn_log, typed, requester))

    async def forget_person(self, person: str, *, scope: str | None, requested_by: str,
                            who: str = "you") -> Erasure:
        """Erase everything ``person`` said, in ``scope`` (a turn scope) or everywhere (None)."""
        return await self._erase(lambda turn_log: self_service.forget_person(
            turn_log, person, scope=scope, requested_by=requested_by, who=who))

    async def _erase(self, erase: Callable[[TurnLog], Erasure]) -> Erasure:
        """Run an erasure now, or refuse it (`ForgetRefused`, one line): never spooled.

        Writes still waiting in the spool go first: an erasure applied before them would miss the
        person's messages among them. While they cannot be stored, nothing is erased and the person
        is told to try again, rather than told it was done. The erasure itself runs off the event
        loop: the familiar's replies that repeat the erased words are looked for in the whole log.
        """
        if len(self.spool) and not self.flush_spool():
            raise self_service.ForgetRefused(self_service.UNAVAILABLE)
        try:
            erasure = await asyncio.to_thread(erase, self.turn_log)
        except self_service.ForgetRefused as exc:
            raise self_service.ForgetRefused(public_text(str(exc), self.paths)) from None
        log.info("familiar %s: erasure #%d (%s, scope %s) requested by %s: %d turn(s) tombstoned, %d repl(ies) of "
                 "the familiar erased, %d redacted", self.familiar_id, erasure.id, erasure.kind,
                 erasure.scope or "everywhere", erasure.requested_by, len(erasure.turn_ids),
                 len(erasure.replies_erased), len(erasure.replies_redacted))
        return erasure

    # -- composing

    async def _assemble(self, channel_id: int, guild_id: int | None, cue: str, answering: int | None = None) -> Any:
        ctx = AssemblyContext(
            familiar_id=self.familiar_id, channel_id=channel_id, guild_id=guild_id, tier=TIER, cue=cue,
            answering=answering,
        )
        if self._assembly_lock is None:
            self._assembly_lock = asyncio.Lock()
        async with self._assembly_lock:
            # Off the event loop: index reads must never stall Discord's heartbeat.
            return await asyncio.to_thread(self.assembler.assemble, ctx)

    async def _compose(self, message: IncomingMessage, turn_id: int) -> str:
        where = f"familiar {self.familiar_id} channel {message.channel_id} turn {turn_id}"
        try:
            prompt = await self._assemble(message.channel_id, message.guild_id, message.content, answering=turn_id)
            messages = build_messages(prompt, message, self.config.display_name)
            with llm_sources(upto=self._newest_quotable()):
                reply = await self.llm.acomplete(messages)
        except LlmNotConfigured as exc:
            raise _NotConfigured(str(exc)) from None
        except LlmError as exc:
            self.stats.llm_errors += 1
            log.error("%s: reply model call failed: %s", where, exc)
            raise _ReplyFailed from None
        except Exception:  # noqa: BLE001 - a reply must never take the transport down
            self.stats.llm_errors += 1
            log.exception("%s: composing a reply failed", where)
            raise _ReplyFailed from None
        text = strip_speaker_prefix(reply.text, (self.config.display_name, *self.config.aliases))
        if not text:
            self.stats.llm_errors += 1
            log.error("%s: reply model %s returned an empty reply", where, getattr(reply, "model", "?"))
            raise _ReplyFailed
        return text

    def _newest_quotable(self) -> int | None:
        """The newest turn an assembled prompt could quote, read after assembling it.

        A reply slot that caches stores the reply as resting on every turn up to it (the
        prompt quotes recent turns and memory built from any earlier one), so forgetting any of
        them erases it (`ResponseCache.forget_resting_on`). None when the log cannot say: the
        reply is then cached with unknown provenance, which any forget erases too.
        """
        try:
            return self.turn_log.latest_id() or None
        except TurnLogError:
            return None

    async def _deliver_reply(self, message: IncomingMessage, text: str, send: Send | None, answers: int) -> list[str]:
        delivered: list[str] = []
        unkept = self._unkept_words(message, answers)
        for piece in split_message(text):
            platform_id = None
            if send is not None:
                try:
                    platform_id = await send(piece)
                except Exception:  # noqa: BLE001 - e.g. missing permission; the rest would fail too
                    self.stats.send_errors += 1
                    log.exception("familiar %s: sending a reply to channel %s failed",
                                  self.familiar_id, message.channel_id)
                    break
            delivered.append(piece)
            self._record_reply(message, redact(piece, unkept), platform_id, answers)
        self.stats.replies += bool(delivered)
        return delivered

    def _unkept_words(self, message: IncomingMessage, answers: int) -> frozenset[str]:
        """The words a reply to this message must not be stored with: with `after_forget = "opt_out"`, a
        forgotten person's later message is answered but never remembered, so the stored reply keeps
        none of its words (every word of four letters or more: which of them others use too cannot be
        told cheaply while replying); the purge then blanks the reply with the message (docs/privacy.md)."""
        if self.config.memory.privacy.after_forget != "opt_out":
            return frozenset()
        try:
            forgotten = self.turn_log.answers_forgotten(answers)
        except TurnLogError:  # cannot tell: keep none of their words, as for a forgotten person
            forgotten = True
        return frozenset(words_of(message.content)) if forgotten else frozenset()

    def _record_reply(self, message: IncomingMessage, piece: str, platform_id: str | int | None, answers: int) -> None:
        sent_at = datetime.now(timezone.utc)
        try:
            self._write(f"reply in channel {message.channel_id}", lambda: self.turn_log.append_turn(
                channel_id=message.channel_id,
                guild_id=message.guild_id,
                role="assistant",
                author_key=ego_key(self.familiar_id),
                author_display=self.config.display_name,
                content=piece,
                platform_message_id=platform_id,
                reply_to_message_id=message.platform_message_id,
                reply_to_turn_id=answers,
                created_at=sent_at,
            ), size=len(piece))
        except _Deferred:
            pass  # kept (or refused) and logged; the reply itself was delivered
        except TurnLogError as exc:  # the reply was seen; say loudly that memory missed it
            log.error("familiar %s: reply sent to channel %s but not recorded: %s",
                      self.familiar_id, message.channel_id, exc)

    async def _tell_not_configured(self, channel_id: int, detail: str | None, send: Send | None) -> list[str]:
        self.stats.not_configured += 1
        if channel_id in self._told_no_model:
            return []
        self._told_no_model.add(channel_id)
        notice = not_configured_notice(self.paths, detail)
        log.info("familiar %s: cannot reply in channel %s: %s", self.familiar_id, channel_id, notice)
        return await self._deliver_notice(notice, send)

    async def _deliver_notice(self, notice: str, send: Send | None) -> list[str]:
        pieces = split_message(notice)
        if send is not None:
            try:
                for piece in pieces:
                    await send(piece)
            except Exception:  # noqa: BLE001
                self.stats.send_errors += 1
                log.exception("familiar %s: sending a notice failed", self.familiar_id)
                return []
        return pieces


class _NotConfigured(Exception):
    pass


class _ReplyFailed(Exception):
    pass


def retired_facts_report(snapshot, limit: int = 5, visible: tuple[str, ...] | None = None) -> str:
    """How many facts memory holds, and the newest retired ones with what replaced them.

    The prompt shows only current facts; this is where `/context` shows supersession at work.
    With ``visible`` (the reply's scopes), only those scopes' facts are counted and quoted.
    """
    try:
        facts = snapshot.table("facts")
    except (KeyError, OSError, ValueError):
        return "=== memory: no facts published yet ==="
    where = ""
    if visible is not None:
        facts = facts.filter(scope_mask(facts, visible))
        where = f" in {', '.join(visible) or 'no scope'}"
    retired = facts.filter(pc.is_valid(facts["superseded_at"]))
    lines = [f"=== memory{where}: {facts.num_rows - retired.num_rows} current facts, {retired.num_rows} retired ==="]
    rows = retired.to_pylist()[-limit:]
    by_id = {f.id: f for f in facts_by_ids(snapshot, [r["superseded_by"] for r in rows if r["superseded_by"]])
             if visible is None or f.scope in visible}
    for row in reversed(rows):
        newer = by_id.get(row["superseded_by"])
        lines.append(f"retired #{row['id']} {row['text']!r}"
                     + (f" <- replaced by #{newer.id} {newer.text!r}" if newer else ""))
    return "\n".join(lines)


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


@dataclass
class ResponderHandle:
    """A responder plus what must be closed when the transport stops."""

    responder: Responder
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - closing is best effort at exit
                log.exception("closing a resource of the responder failed")


def open_responder(paths: FamiliarPaths, config: FamiliarConfig) -> ResponderHandle:
    """The real responder for a familiar: its turn log, memory readers, assembler and reply model.

    The memory view reads through the responder's own turn-log connection, so a
    turn appended a moment ago is visible to the assembly that follows.
    """
    turn_log = TurnLog(paths.turns_db)
    handle = ResponderHandle(responder=None, closers=[turn_log.close])  # type: ignore[arg-type]
    try:
        memory = MemoryView(paths, config, embedder=create_embedder(config.embedding), turn_log=turn_log)
        handle.closers.append(memory.close)
        assembler = build_assembler(paths, config, memory=memory)
        llm = client_for(
            config.llm, "reply", cache_path=paths.llm_cache, familiar_id=paths.familiar_id
        )
    except BaseException:
        handle.close()
        raise
    llm.warm_up()  # the model client's import, in the background: the first reply need not wait for it
    handle.responder = Responder(paths, config, assembler=assembler, llm=llm, turn_log=turn_log)
    handle.closers.append(handle.responder.close_spool)  # closers run last first: before the log closes
    return handle
