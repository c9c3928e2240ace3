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
(:mod:`~familiar_bot.responder.writes`) and the channel a notice saying so; the spool
drains by itself once the disk has room. Notices and apologies are not the familiar
speaking, so they are not recorded as its turns, and they never name a server path.

It also answers people about themselves (`/memory`, `/forget`: `familiar_bot.self_service`):
reads run like an assembly's, off the event loop; an erasure is a turn-log write that is never
spooled (it is refused while earlier writes still wait, so it cannot miss them).

:class:`Responder` stays one class because every path through it shares the same state: the
per-channel locks (one reply at a time per channel, so each prompt sees the previous reply),
the assembly lock (assemblies and self-service reads run one at a time off the event loop),
the write order the spool keeps, and the session's counters. What needs none of that lives
beside it: the messages and the rule for answering (:mod:`messages`), the reply's text
(:mod:`reply_text`), the notices (:mod:`notices`), the writes (:mod:`writes`), ``/context``'s
report (:mod:`inspection`) and the wiring of a real one (:mod:`opening`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.models.llm import LlmError, LlmNotConfigured, llm_sources
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import Erasure, TurnLog, TurnLogError
from familiar_pipeline.storage.words import redact, words_of

from familiar_bot import self_service
from familiar_bot.prompt.assembly import AssemblyContext
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.responder.inspection import context_report
from familiar_bot.responder.messages import Composing, IncomingMessage, Person, Send, reply_reason, storable_text
from familiar_bot.responder.notices import APOLOGY, not_configured_notice, public_text
from familiar_bot.responder.reply_text import build_messages, split_message, strip_speaker_prefix
from familiar_bot.responder.spool import Spool, import_line
from familiar_bot.responder.writes import Deferred, TurnWrites

log = logging.getLogger(__name__)

TIER = "text"


class AssemblerLike(Protocol):
    def assemble(self, ctx: Any) -> Any: ...


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
        self.writes = TurnWrites(paths, self.stats)

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
            turn_id = self.writes.write(f"message in channel {message.channel_id}", lambda: self.record_incoming(message),
                                        size=len(message.content), export=self._import_line(message))
        except Deferred as exc:
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
            self.writes.write(f"profile of {person.key}", lambda: self.observe_person(person, guild_id, seen_at=seen_at),
                              size=len(person.label))
        except Deferred:
            return False
        except TurnLogError as exc:
            log.error("familiar %s: profile of %s not recorded: %s", self.familiar_id, person.key, exc)
            return False
        return True

    # -- writes the turn log may refuse for now (familiar_bot.responder.writes)

    @property
    def spool(self) -> Spool:
        """The writes waiting for the turn log, in order."""
        return self.writes.spool

    @spool.setter
    def spool(self, spool: Spool) -> None:
        self.writes.spool = spool

    def flush_spool(self) -> bool:
        """Store what the spool holds, in order; True when nothing is left waiting."""
        return self.writes.flush()

    def close_spool(self) -> None:
        """At exit: a last flush, then what still waits is written out for `familiar import`, loudly."""
        self.writes.close()

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
            turn = self.writes.write(f"edit of message {platform_message_id}", lambda: self.turn_log.record_edit(
                platform_message_id=str(platform_message_id), new_content=storable_text(new_content),
                edited_at=edited_at,
            ), size=len(new_content))
        except Deferred:
            return False
        except TurnLogError as exc:
            log.error("familiar %s: edit of message %s not recorded: %s", self.familiar_id, platform_message_id, exc)
            return False
        return turn is not None

    async def handle_delete(self, platform_message_id: str | int, *, deleted_at: datetime | None = None) -> bool:
        """Tombstone a logged message (its text stays for audit); False when we never saw it."""
        deleted_at = deleted_at or datetime.now(timezone.utc)
        try:
            turn = self.writes.write(f"deletion of message {platform_message_id}", lambda: self.turn_log.record_deletion(
                platform_message_id=str(platform_message_id), deleted_at=deleted_at), size=0)
        except Deferred:
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
        return context_report(prompt, getattr(self.assembler, "memory", None))

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
            self.writes.write(f"reply in channel {message.channel_id}", lambda: self.turn_log.append_turn(
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
        except Deferred:
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
