"""What the familiar holds about a person, as they may see it, and their requests to forget it.

Issue 27: people can see and erase what is remembered about them themselves, without asking
the operator. Transport-free, so Discord's `/memory` and `/forget` and the console's commands
say the same thing; the responder runs these functions (it owns the turn log handle and its
spool), the transports only render.

**What "here" means.** A person asks from somewhere: a server channel, a DM, the console. They
are shown exactly what a reply said there may read about them, no more: the scopes are
:func:`familiar_bot.prompt.scoping.visible_scopes` of that place (its own scope, the scopes
``[memory.scopes]`` joins to it and, in a DM with ``dm_sees_person``, what its person said
anywhere), and each part is read with the code the prompt layers read it with:

* facts: the current facts (``FactView``, through ``facts.reads``) whose subjects include the
  person, kept when :func:`~familiar_bot.prompt.scoping.visible_fact_ids` keeps them, each with
  links to the messages it came from;
* how many of their own messages are remembered: their live user turns that
  :func:`~familiar_pipeline.storage.scopes.turn_visible` admits here;
* each prompt layer's part, as its ``LayerSpec.held`` declares it (read with the layer's own
  code), in stack order: their standing wishes ("call me Sam", "keep answers short"; the
  ``standing_wishes`` layer's, each with a link to the message that said it) and their dossier
  (``people_dossier``'s). A new layer with rows about people adds its part in its own module.

So a server never shows what was said in a DM, and a DM shows a server's facts only when the
operator joined them. Memory is read from the published snapshot the bot already reads, never
``memory.duckdb``.

**The export** holds the person's own live turns in those scopes (never anyone else's words),
every fact about them held there (retired ones too: they are still held), and each layer's part
under its key (``wishes``: every wish of theirs held there, retired ones too; ``dossier``).

**Forgetting** goes through ``TurnLog.request_erasure``: the turns are tombstoned at once, the
familiar's replies to them with them and its other replies that repeat their words redacted, and
the pipeline follows the changes through every projection, then purges the text. A person may
erase their own messages; a server manager any message of their server, and the familiar's own
replies in a DM may be erased by the person of that DM (they can quote the person). What the
person is told never names another person's keys or message ids (``NothingToErase`` names near
matches, which is fine for an operator, not for anyone who asks).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.projectors.facts.reads import current_facts, facts_by_ids
from familiar_pipeline.projectors.facts.tables import Fact, FactView
from familiar_pipeline.storage.scopes import PERSON, turn_visible
from familiar_pipeline.storage.snapshots import where
from familiar_pipeline.storage.turns import (
    TURN_TARGET,
    Erasure,
    NothingToErase,
    Turn,
    TurnLog,
    TurnLogError,
    TurnLogUnavailable,
)

from familiar_bot.prompt.layers import registry as layers
from familiar_bot.prompt.layers.common import one_line
from familiar_bot.prompt.scoping import keep_ids, visible_fact_ids, visible_scopes
from familiar_bot.prompt.types import AssemblyContext
# Where held rows came from (Source, message_link) lives below the layers, which list rows too; named here as before.
from familiar_bot.sources import DISCORD_CHANNELS, Source, iso, message_link, source_of  # noqa: F401

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView

# A message link as Discord's "Copy Message Link" gives it (any of its hosts).
MESSAGE_LINK = re.compile(
    r"^<?https?://(?:(?:ptb|canary)\.)?discord(?:app)?\.com/channels/(?:@me|\d+)/(\d+)/(\d+)>?$")
CLEANED = "what was learnt from them leaves memory within a minute or so"
UNAVAILABLE = ("I can't forget anything right now: my memory can't be written (the disk is full or failing). "
               "Nothing was erased; please try again later.")


class ForgetRefused(Exception):
    """Nothing was erased; the message is one line for the person who asked."""


# --------------------------------------------------------------------------- links


def message_ref(text: str) -> str:
    """The message id a person typed: an id, or a message link (its last number). ValueError otherwise."""
    typed = text.strip()
    link = MESSAGE_LINK.match(typed)
    if link is not None:
        return link.group(2)
    if typed.isdigit():
        return typed
    raise ValueError(f"{typed[:80]!r} is neither a message id nor a message link "
                     "(right-click a message: Copy Message Link, or Copy Message ID)")


# --------------------------------------------------------------------------- what is held


@dataclass(frozen=True)
class HeldFact:
    fact: Fact
    sources: tuple[Source, ...]
    current: bool

    def as_json(self) -> dict[str, Any]:
        f = self.fact
        return {"id": f.id, "text": f.text, "scope": f.scope, "valid_from": iso(f.valid_from),
                "valid_to": iso(f.valid_to), "superseded": f.superseded_at is not None, "current": self.current,
                "source_message_ids": [s.message_id for s in self.sources if s.message_id],
                "source_turn_ids": list(f.source_turn_ids)}


@dataclass(frozen=True)
class Held:
    """What a reply said in one place may read about one person.

    `parts` holds each layer's part (`LayerSpec.held`) by its key, in stack order, also read
    as an attribute: ``held.wishes`` (their current standing wishes here, newest first, each
    with its messages), ``held.dossier`` (their dossier of these scopes, "" when none).
    """

    person: str
    scopes: tuple[str, ...]
    facts: tuple[HeldFact, ...]  # current, oldest first
    own_messages: int  # their own messages remembered here (not deleted)
    parts: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        parts = self.__dict__.get("parts")
        if parts is not None and name in parts:
            return parts[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def scopes_here(memory: MemoryView, channel_id: int, guild_id: int | None) -> tuple[str, ...]:
    """The scopes a reply said in this channel reads (the scoping module's one definition)."""
    ctx = AssemblyContext(familiar_id=memory.config.familiar_id, channel_id=channel_id, guild_id=guild_id)
    return visible_scopes(ctx, memory)


def own_turns(turn_log: TurnLog, person: str, visible: tuple[str, ...], *, opt_out: bool = True) -> list[Turn]:
    """The person's own live turns a reply reading ``visible`` may quote, oldest first; nobody else's.

    ``opt_out`` (`[memory.privacy] after_forget = "opt_out"`): what a forgotten person said since is
    answered, never remembered, and purged at the next run: it is not counted as kept."""
    said = turn_log.ids_in_scopes([PERSON + person], after_id=0, upto_id=turn_log.latest_id())
    unkept = set(turn_log.said_after_forgotten()) if opt_out else set()
    return [t for t in turn_log.turns_by_ids(said)
            if not t.deleted and t.author_key == person and t.role == "user" and turn_visible(t, visible)
            and t.id not in unkept]


def _fact_ids_about(snapshot: Any, person: str) -> list[int]:
    try:
        subjects = snapshot.current().table("fact_subjects")
    except KeyError:  # no fact projector in this snapshot
        return []
    hit = where(subjects, pc.equal(subjects["canonical_key"], pa.scalar(person, pa.string())))
    return sorted({int(i) for i in hit["fact_id"].to_pylist()})


def facts_about(memory: MemoryView, person: str, visible: tuple[str, ...], *, current_only: bool = True,
                now: datetime | None = None) -> list[HeldFact]:
    """Facts naming ``person`` as a subject that a reply reading ``visible`` may use, with their sources.

    ``current_only``: the current ones (what replies use); else every row held, retired and expired ones too.
    """
    ids = _fact_ids_about(memory.snapshot, person)
    if not ids:
        return []
    ids = [i for i, keep in zip(ids, keep_ids(ids, visible_fact_ids(memory, visible))) if keep]
    now = now or datetime.now(timezone.utc)
    rows = current_facts(memory.snapshot, now, ids=ids) if current_only else facts_by_ids(memory.snapshot, ids)
    view = FactView.of(now=now)
    turns = {t.id: t for t in memory.turn_log.turns_by_ids({i for f in rows for i in f.source_turn_ids})}
    return [HeldFact(fact, tuple(source_of(i, turns.get(i)) for i in fact.source_turn_ids), view.admits(fact))
            for fact in rows]


def _opt_out(memory: MemoryView) -> bool:
    return memory.config.memory.privacy.after_forget == "opt_out"


def _pinned(memory: MemoryView) -> MemoryView:
    """The newest published memory, one snapshot for every read of one answer."""
    memory.refresh()
    return memory.pinned()


def held_about(memory: MemoryView, person: str, channel_id: int, guild_id: int | None) -> Held:
    """What a reply in this channel may read about ``person`` (module doc)."""
    view = _pinned(memory)
    visible = scopes_here(view, channel_id, guild_id)
    parts = {spec.held.key: spec.held.held(view, person, visible) for spec in layers.held_parts() if spec.held}
    return Held(person=person, scopes=visible, facts=tuple(facts_about(view, person, visible)),
                own_messages=len(own_turns(view.turn_log, person, visible, opt_out=_opt_out(view))), parts=parts)


def export_about(memory: MemoryView, person: str, channel_id: int, guild_id: int | None,
                 *, now: datetime | None = None) -> dict[str, Any]:
    """The person's data here as JSON-ready values: their own live turns, the facts about them, and each
    layer's part (`LayerSpec.held`: their wishes, their dossiers) under its key."""
    view = _pinned(memory)
    visible = scopes_here(view, channel_id, guild_id)
    now = now or datetime.now(timezone.utc)
    turns = [{"id": t.id, "platform_message_id": t.platform_message_id, "channel_id": t.channel_id,
              "guild_id": t.guild_id, "created_at": iso(t.created_at), "edited_at": iso(t.edited_at),
              "content": t.content} for t in own_turns(view.turn_log, person, visible, opt_out=_opt_out(view))]
    facts = [f.as_json() for f in facts_about(view, person, visible, current_only=False, now=now)]
    export = {"familiar": view.config.familiar_id, "person": person, "scopes": list(visible),
              "exported_at": iso(now), "turns": turns, "facts": facts}
    for spec in layers.held_parts():
        if spec.held is not None:
            export[spec.held.key] = spec.held.export(view, person, visible)
    return export


def export_json(export: dict[str, Any]) -> str:
    return json.dumps(export, ensure_ascii=False, indent=2) + "\n"


def render_held(held: Held, *, limit: int | None = None, export_hint: str = "/memory export") -> str:
    """The list a person is shown, at most ``limit`` characters: the facts that do not fit are
    counted ("… and N more") and the export named, which holds them all."""
    where = ", ".join(held.scopes) or "nowhere"
    head = [f"What I remember about you here ({where}):",
            f"Messages of yours I remember here: {held.own_messages}."]
    for spec in layers.held_parts():  # each layer's part, in stack order
        if spec.held is not None and spec.held.key in held.parts:
            head += spec.held.lines(held.parts[spec.held.key])
    if not held.facts:
        head.append("Facts about you: none.")
        return "\n".join(head)
    head.append(f"Facts about you ({len(held.facts)}):")
    lines = [f"- {one_line(f.fact.text)} [{' '.join(s.render() for s in f.sources)}]" for f in held.facts]
    if limit is None:
        return "\n".join(head + lines)

    def more(n: int) -> str:
        return f"\n… and {n} more: {export_hint} has them all."

    text = "\n".join(head)
    for shown, line in enumerate(lines):
        rest = len(lines) - shown - 1
        if len(text) + 1 + len(line) + (len(more(rest)) if rest else 0) > limit:
            return (text + more(len(lines) - shown))[:limit]
        text += "\n" + line
    return text


# --------------------------------------------------------------------------- forgetting


@dataclass(frozen=True)
class Requester:
    """Who asks to forget, and what they may erase besides their own messages.

    ``manages_guild``: a server they manage (Manage Server): any message said there.
    ``dm_channel``: the DM they ask from: the familiar's replies there. ``operator``: the console,
    whose person runs the familiar and can read its files anyway: any turn, by turn id too.
    """

    key: str
    manages_guild: int | None = None
    dm_channel: int | None = None
    operator: bool = False


def may_forget(turn: Turn, requester: Requester) -> bool:
    if requester.operator or (turn.role == "user" and turn.author_key == requester.key):
        return True
    if requester.manages_guild is not None and turn.guild_id == requester.manages_guild:
        return True
    return (requester.dm_channel is not None and turn.guild_id is None and turn.role == "assistant"
            and turn.channel_id == requester.dm_channel)


def find_message(turn_log: TurnLog, typed: str, *, by_turn_id: bool = False) -> Turn | None:
    """The turn a person named: a message id or link; with ``by_turn_id``, a bare number no message
    carries is a turn id (``#12`` too). Raises ForgetRefused for text that names neither."""
    typed = typed.strip()
    if by_turn_id and typed.startswith("#") and typed[1:].isdigit():
        found = turn_log.turns_by_ids([int(typed[1:])])
        return found[0] if found else None
    try:
        message = message_ref(typed)
    except ValueError as exc:
        raise ForgetRefused(str(exc)) from None
    turn = turn_log.turn_by_message(message)
    if turn is None and by_turn_id and len(message) <= 18:
        found = turn_log.turns_by_ids([int(message)])
        turn = found[0] if found else None
    return turn


def forget_message(turn_log: TurnLog, typed: str, requester: Requester) -> Erasure:
    """Erase one message (every copy the log holds) if ``requester`` may; ForgetRefused in one line if not."""
    turn = find_message(turn_log, typed, by_turn_id=requester.operator)
    if turn is None:
        raise ForgetRefused(f"I have no message {typed.strip()[:100]} on record, so there is nothing to forget.")
    if not may_forget(turn, requester):
        raise ForgetRefused("That message is someone else's: only its author, or a manager of its server "
                            "(from that server), can have it forgotten. Nothing was erased.")
    target = turn.platform_message_id or f"{TURN_TARGET}{turn.id}"
    return _erase(turn_log, "message", target, None, requester.key, nothing="that message")


def forget_person(turn_log: TurnLog, person: str, *, scope: str | None, requested_by: str,
                  who: str = "you") -> Erasure:
    """Erase everything ``person`` said (in ``scope``, or everywhere); ForgetRefused in one line if nothing
    of theirs is known."""
    return _erase(turn_log, "person", person, scope, requested_by, nothing=f"anything {who} said")


def _erase(turn_log: TurnLog, kind: str, target: str, scope: str | None, requested_by: str, *,
           nothing: str) -> Erasure:
    try:
        return turn_log.request_erasure(kind=kind, target=target, scope=scope, requested_by=requested_by)
    except NothingToErase:  # its message names near matches: other people's keys and messages
        where = f" in {scope}" if scope else ""
        raise ForgetRefused(f"I hold no record of {nothing}{where}, so there is nothing to forget.") from None
    except TurnLogUnavailable:
        raise ForgetRefused(UNAVAILABLE) from None
    except TurnLogError as exc:
        raise ForgetRefused(f"Nothing was erased: {one_line(str(exc))}") from None


def erased_line(erasure: Erasure) -> str:
    """The answer to a request carried out: its erasure id, and when memory is clean."""
    n = len(erasure.turn_ids)
    messages = f"{n} message{'s' if n != 1 else ''}"
    return (f"Done (erasure #{erasure.id}): {messages} forgotten. I no longer quote them, and {CLEANED}."
            if n else f"Done (erasure #{erasure.id}): no messages of that were held; the request is recorded.")

