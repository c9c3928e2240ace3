"""`/memory` and `/forget` on Discord (issue 27): people see and erase what is remembered about them.

dpytest fakes Discord's gateway and REST API but knows nothing of interactions, so `Slash` adds
that: a slash command or a button press reaches the bot as a real gateway payload
(`ConnectionState.parse_interaction_create`, as discord.py receives it), the command tree and the
views run unchanged, and what the bot answers (interaction callbacks, follow-ups, edits of the
original response) is recorded instead of sent: no test reaches the network.

The memory read is a real published snapshot: facts about Ana in the server and in her DM, one
about Ben, her dossier, and turns said through dpytest (so they carry real message ids).
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import asyncio
import contextvars
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import discord
import discord.ext.test as dpytest
import discord.interactions
import discord.webhook.async_
import pytest
import pytest_asyncio
from discord.ext.test import backend, factories

from familiar_bot.prompt.assembly import Assembler
from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.responder.flow import Responder
from familiar_bot.transports.discord_adapter import FamiliarClient
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.projectors import builtin  # noqa: F401 - every built-in table declared before a store opens
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.storage.turns import TurnLogUnavailable
from tests.test_assembly import World

MANAGE_GUILD = 1 << 5
DM_CHANNEL = 9001
_ids = itertools.count(1_300_000_000_000_000_000)


@dataclass
class Answer:
    """One thing the bot sent back for an interaction."""

    kind: str  # "defer", "message" (a callback's message), "update" (a button's message edited), "followup", "edit"
    content: str | None
    ephemeral: bool
    files: list[tuple[str, bytes]] = field(default_factory=list)
    buttons: dict[str, str] = field(default_factory=dict)  # label -> custom id
    message_id: int | None = None


class Slash:
    """Interactions as Discord delivers them (gateway payloads), answers recorded instead of sent."""

    def __init__(self, client: FamiliarClient, monkeypatch: pytest.MonkeyPatch):
        self.client = client
        # dpytest.configure swapped in its own connection state after the tree registered with the first.
        client._connection._command_tree = client.tree
        self.answers: list[Answer] = []
        self.channel_id = 0
        adapter = _Recorder(self)
        var: contextvars.ContextVar = contextvars.ContextVar("recorded_webhook_adapter", default=adapter)
        monkeypatch.setattr(discord.webhook.async_, "async_context", var)
        monkeypatch.setattr(discord.interactions, "async_context", var)

    def _base(self, user: discord.abc.User, channel: Any, permissions: int) -> dict:
        interaction_id = next(_ids)
        self.channel_id = channel.id
        payload: dict[str, Any] = {
            "id": str(interaction_id), "application_id": str(self.client.user.id), "token": f"token-{interaction_id}",
            "version": 1, "channel_id": str(channel.id), "app_permissions": "0", "locale": "en-US",
            "entitlements": [], "attachment_size_limit": 10 * 1024 * 1024, "authorizing_integration_owners": {},
        }
        if isinstance(channel, discord.DMChannel) or getattr(channel, "guild", None) is None:
            payload.update(channel={"id": str(channel.id), "type": 1, "recipients": [factories.dict_from_user(user)]},
                           user=factories.dict_from_user(user), context=1)
        else:
            payload.update(guild_id=str(channel.guild.id), channel={"id": str(channel.id), "type": 0},
                           member={**member_dict(user), "permissions": str(permissions)}, context=0)
        return payload

    async def command(self, name: str, *options: dict, user, channel, permissions: int = 0,
                      resolved: dict | None = None, wait: bool = True) -> None:
        """Use `/name` (options as Discord sends them: a subcommand is an option of type 1)."""
        payload = self._base(user, channel, permissions)
        payload.update(type=2, data={"id": str(next(_ids)), "name": name, "type": 1, "options": list(options),
                                     "resolved": resolved or {}})
        before = len(self.answers)
        self.client._connection.parse_interaction_create(payload)
        if wait:
            await self.settle()
        else:
            await until(lambda: len(self.answers) > before)

    async def press(self, label: str, *, user, channel, question: Answer) -> None:
        """Press a button under an ephemeral question the bot asked."""
        payload = self._base(user, channel, 0)
        message = factories.make_message_dict(channel, self.client.user, id_num=question.message_id,
                                              content=question.content)
        message.update(flags=64, components=[])
        payload.update(type=3, message=message,
                       data={"custom_id": question.buttons[label], "component_type": 2})
        self.client._connection.parse_interaction_create(payload)
        await self.settle()

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until every command and button handler started so far has finished."""
        deadline = time.monotonic() + timeout
        while True:
            busy = [t for t in asyncio.all_tasks() if not t.done() and (
                t.get_name() == "CommandTree-invoker" or t.get_name().startswith("discord-ui-view-dispatch"))]
            if not busy:
                return
            assert time.monotonic() < deadline, f"still running: {busy}"
            await asyncio.wait(busy, timeout=0.05)

    def last(self, kind: str | None = None) -> Answer:
        return [a for a in self.answers if kind is None or a.kind == kind][-1]


class _Recorder(discord.webhook.async_.AsyncWebhookAdapter):
    """The HTTP side of interactions, recorded: what discord.py would have sent, and plausible replies."""

    def __init__(self, slash: Slash):
        super().__init__()
        self.slash = slash

    async def request(self, route, session, *, payload=None, multipart=None, files=None, **_: Any) -> Any:
        if multipart:
            payload = json.loads(next(p["value"] for p in multipart if p["name"] == "payload_json"))
        files_read = []
        for file in files or []:
            file.reset()
            files_read.append((file.filename, file.fp.read()))
        message_id = next(_ids)
        if route.path.endswith("/callback"):
            kind = {4: "message", 5: "defer", 7: "update"}[payload["type"]]
            data = payload.get("data") or {}
        else:
            kind = "edit" if route.method == "PATCH" else "followup"
            data = payload or {}
        buttons = {c["label"]: c["custom_id"] for row in data.get("components") or [] for c in row["components"]}
        self.slash.answers.append(Answer(kind, data.get("content"), bool((data.get("flags") or 0) & 64), files_read,
                                         buttons, message_id))
        if route.path.endswith("/callback"):
            return {"interaction": {"id": str(route.webhook_id), "type": 2, "response_message_id": str(message_id),
                                    "response_message_loading": kind == "defer",
                                    "response_message_ephemeral": bool((data.get("flags") or 0) & 64)}}
        return {"id": str(message_id), "channel_id": str(self.slash.channel_id),
                "author": factories.dict_from_user(self.slash.client.user), "content": data.get("content") or "",
                "timestamp": "2026-05-01T12:00:00+00:00", "edited_timestamp": None, "tts": False,
                "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [], "embeds": [],
                "pinned": False, "type": 0, "flags": data.get("flags") or 0}


def member_dict(user) -> dict:
    return {"user": factories.dict_from_user(getattr(user, "_user", user)), "roles": [],
            "joined_at": "2026-01-01T00:00:00+00:00", "deaf": False, "mute": False, "flags": 0}


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def sub(name: str, **values: Any) -> dict:
    """A subcommand option with its (string, boolean or user) values."""
    types = {bool: 5, str: 3}
    options = [{"type": types.get(type(v), 6), "name": k, "value": v if not isinstance(v, int) or isinstance(v, bool)
                else str(v)} for k, v in values.items()]
    return {"type": 1, "name": name, "options": options}


# --------------------------------------------------------------------------- the familiar on Discord


@dataclass
class Place:
    world: World
    client: FamiliarClient
    slash: Slash
    channel: Any
    ana: Any
    ben: Any
    dm: Any
    said: dict[str, Any]  # name -> the turn (or discord.Message) said

    @property
    def log(self):
        return self.world.log

    def key(self, member) -> str:
        return f"discord:{member.id}"


@pytest_asyncio.fixture
async def place(tmp_path, monkeypatch):
    world = World(tmp_path)
    config = world.config()
    memory = MemoryView(world.paths, config, turn_log=world.log)
    responder = Responder(world.paths, config, assembler=Assembler(memory, [RecentHistoryLayer()]),
                          llm=client_for(config.llm, "reply"), turn_log=world.log)
    client = FamiliarClient(responder, members_intent=True, sync_commands=False, confirm_timeout_s=5.0)
    await client._async_setup_hook()
    dpytest.configure(client, members=["ana", "ben"])
    backend.get_state().loop = asyncio.get_running_loop()
    config_ = dpytest.get_config()
    channel, (ana, ben) = config_.channels[0], config_.members[:2]
    said: dict[str, Any] = {}
    said["cat"] = await dpytest.message("I have a cat named Pixel", channel=channel, member=ana)
    said["hiking"] = await dpytest.message("Ana goes hiking every weekend", channel=channel, member=ben)
    said["jazz"] = await dpytest.message("I like jazz", channel=channel, member=ben)
    turns = {t.platform_message_id: t for t in world.log.recent(channel.id, 10)}
    cat, hiking, jazz = (turns[str(said[k].id)] for k in ("cat", "hiking", "jazz"))
    said["lisbon"] = world.log.append_turn(channel_id=DM_CHANNEL, role="user", content="I'm moving to Lisbon",
                                           author_key=f"discord:{ana.id}", author_display="ana",
                                           platform_message_id=next(_ids))
    guild = f"guild:{channel.guild.id}"
    a, b = (f"discord:{ana.id}", "ana"), (f"discord:{ben.id}", "ben")
    world.fact("Ana has a cat named Pixel.", [a], [cat.id], channel=channel.id, scope=guild)
    world.fact("Ana goes hiking every weekend.", [a], [hiking.id], channel=channel.id, scope=guild)
    world.fact("Ben likes jazz.", [b], [jazz.id], channel=channel.id, scope=guild)
    world.fact("Ana is moving to Lisbon.", [a], [said["lisbon"].id], channel=DM_CHANNEL, scope=f"channel:{DM_CHANNEL}")
    dossier_db.put_dossier(world.store, a[0], "Ana keeps a cat and hikes.", 2, scope=guild)
    world.publish()
    dm = discord.DMChannel(me=client.user, state=client._connection,
                           data={"id": str(DM_CHANNEL), "type": 1, "recipients": [factories.dict_from_user(ana._user)]})
    yield Place(world, client, Slash(client, monkeypatch), channel, ana, ben, dm, said)
    await dpytest.empty_queue()
    memory.close()
    world.close()


def link(place: Place, message) -> str:
    return f"https://discord.com/channels/{place.channel.guild.id}/{place.channel.id}/{message.id}"


# --------------------------------------------------------------------------- /memory


@pytest.mark.asyncio
async def test_memory_show_lists_what_a_reply_here_reads_about_the_caller_only_to_them(place):
    turns_before = place.log.count()
    await place.slash.command("memory", sub("show"), user=place.ana, channel=place.channel)
    defer, shown = place.slash.answers
    assert defer.kind == "defer" and defer.ephemeral
    assert shown.kind == "followup" and shown.ephemeral and len(shown.content) <= 2000
    text = shown.content
    assert "Ana has a cat named Pixel." in text and link(place, place.said["cat"]) in text
    assert "Ana goes hiking every weekend." in text and link(place, place.said["hiking"]) in text
    assert "Ana keeps a cat and hikes." in text and "Messages of yours I remember here: 1." in text
    assert "Lisbon" not in text and "jazz" not in text  # her DM's fact; Ben's fact
    assert place.log.count() == turns_before  # asking is not a message


@pytest.mark.asyncio
async def test_memory_show_in_a_dm_reads_the_dm_not_the_server(place):
    await place.slash.command("memory", sub("show"), user=place.ana, channel=place.dm)
    text = place.slash.last("followup").content
    dm_link = f"https://discord.com/channels/@me/{DM_CHANNEL}/{place.said['lisbon'].platform_message_id}"
    assert "Ana is moving to Lisbon." in text and dm_link in text
    assert "Pixel" not in text and "hiking" not in text and "Ana keeps a cat" not in text
    assert f"(channel:{DM_CHANNEL})" in text


@pytest.mark.asyncio
async def test_memory_show_is_cut_to_one_discord_message(place):
    a = (f"discord:{place.ana.id}", "ana")
    cat = place.log.turn_by_message(place.said["cat"].id)
    for i in range(60):
        place.world.fact(f"Ana said something memorable, number {i}, at some length to fill the list.", [a],
                         [cat.id], channel=place.channel.id, scope=f"guild:{place.channel.guild.id}")
    place.world.publish()
    await place.slash.command("memory", sub("show"), user=place.ana, channel=place.channel)
    text = place.slash.last("followup").content
    assert len(text) <= 2000 and "Facts about you (62):" in text
    assert text.splitlines()[-1].startswith("… and ") and text.endswith("more: /memory export has them all.")


@pytest.mark.asyncio
async def test_memory_export_is_a_json_file_of_the_callers_own_turns_and_facts_sent_only_to_them(place):
    await place.slash.command("memory", sub("export"), user=place.ana, channel=place.channel)
    defer, sent = place.slash.answers
    assert defer.kind == "defer" and defer.ephemeral and sent.kind == "followup" and sent.ephemeral
    (name, body), = sent.files
    assert name == f"memory-fam-{place.ana.id}.json"
    data = json.loads(body)
    assert data["person"] == place.key(place.ana) and data["scopes"] == [f"guild:{place.channel.guild.id}"]
    assert data["exported_at"] and data["dossier"] == "Ana keeps a cat and hikes."
    turn, = data["turns"]  # hers, in this server: not Ben's, not her DM's
    assert turn["content"] == "I have a cat named Pixel" and turn["platform_message_id"] == str(place.said["cat"].id)
    assert (turn["channel_id"], turn["guild_id"]) == (place.channel.id, place.channel.guild.id)
    assert set(turn) == {"id", "platform_message_id", "channel_id", "guild_id", "created_at", "edited_at", "content"}
    assert [f["text"] for f in data["facts"]] == ["Ana has a cat named Pixel.", "Ana goes hiking every weekend."]
    hiking = data["facts"][1]
    assert hiking["source_message_ids"] == [str(place.said["hiking"].id)] and hiking["superseded"] is False
    assert hiking["scope"] == f"guild:{place.channel.guild.id}" and "valid_from" in hiking and "valid_to" in hiking
    assert "jazz" not in body.decode() and "Lisbon" not in body.decode()
    assert "1 messages, 2 facts" in sent.content


# --------------------------------------------------------------------------- /forget message


@pytest.mark.asyncio
async def test_forget_message_erases_the_callers_own_message_by_link_or_id(place):
    await place.slash.command("forget", sub("message", message=link(place, place.said["cat"])),
                              user=place.ana, channel=place.channel)
    answer = place.slash.last()
    assert answer.kind == "message" and answer.ephemeral
    assert answer.content.startswith("Done (erasure #1): 1 message forgotten.") and "within a minute" in answer.content
    assert place.log.turn_by_message(place.said["cat"].id).deleted
    erasure, = place.log.erasures()
    assert (erasure.kind, erasure.target, erasure.requested_by) == ("message", str(place.said["cat"].id),
                                                                    place.key(place.ana))
    # In her DM, by id.
    await place.slash.command("forget", sub("message", message=place.said["lisbon"].platform_message_id),
                              user=place.ana, channel=place.dm)
    assert place.slash.last().content.startswith("Done (erasure #2)")


@pytest.mark.asyncio
async def test_forget_message_refuses_someone_elses_message_unless_a_server_manager_asks(place):
    jazz = str(place.said["jazz"].id)
    await place.slash.command("forget", sub("message", message=jazz), user=place.ana, channel=place.channel)
    answer = place.slash.last()
    assert answer.ephemeral and answer.content.startswith("That message is someone else's")
    assert place.log.erasures() == [] and not place.log.turn_by_message(jazz).deleted
    await place.slash.command("forget", sub("message", message=jazz), user=place.ana, channel=place.channel,
                              permissions=MANAGE_GUILD)
    assert place.slash.last().content.startswith("Done (erasure #1)")
    assert place.log.turn_by_message(jazz).deleted and place.log.erasures()[0].requested_by == place.key(place.ana)


@pytest.mark.asyncio
async def test_forget_message_with_an_unknown_id_is_one_line(place):
    await place.slash.command("forget", sub("message", message="1234567890"), user=place.ana, channel=place.channel)
    answer = place.slash.last()
    assert answer.ephemeral and answer.content == ("I have no message 1234567890 on record, so there is nothing "
                                                   "to forget.")
    await place.slash.command("forget", sub("message", message="the cat one"), user=place.ana, channel=place.channel)
    assert len(place.slash.last().content.splitlines()) == 1 and "neither a message id nor a message link" in \
        place.slash.last().content
    assert place.log.erasures() == []


@pytest.mark.asyncio
async def test_a_turn_log_that_cannot_be_written_is_one_line_and_nothing_is_erased(place, monkeypatch):
    def full(**_):
        raise TurnLogUnavailable(f"{place.world.paths.turns_db}: database or disk is full")

    monkeypatch.setattr(place.log, "request_erasure", full)
    await place.slash.command("forget", sub("message", message=str(place.said["cat"].id)), user=place.ana,
                              channel=place.channel)
    answer = place.slash.last()
    assert answer.ephemeral and answer.content.startswith("I can't forget anything right now")
    assert str(place.world.paths.dir) not in answer.content


# --------------------------------------------------------------------------- /forget everything


@pytest.mark.asyncio
async def test_forget_everything_asks_first_and_cancel_erases_nothing(place):
    await place.slash.command("forget", sub("everything"), user=place.ana, channel=place.channel, wait=False)
    question = place.slash.last()
    assert question.kind == "message" and question.ephemeral and set(question.buttons) == {"Confirm", "Cancel"}
    assert question.content.startswith("Forget everything you have said to me anywhere?")
    await place.slash.press("Cancel", user=place.ana, channel=place.channel, question=question)
    answer = place.slash.last()
    assert answer.kind == "update" and answer.content == "Cancelled: nothing was erased." and answer.buttons == {}
    assert place.log.erasures() == []


@pytest.mark.asyncio
async def test_forget_everything_confirmed_erases_what_the_caller_said_everywhere(place):
    await place.slash.command("forget", sub("everything"), user=place.ana, channel=place.channel, wait=False)
    await place.slash.press("Confirm", user=place.ana, channel=place.channel, question=place.slash.last())
    answer = place.slash.last()
    assert answer.kind == "update" and answer.content.startswith("Done (erasure #1): 2 messages forgotten.")
    erasure, = place.log.erasures()
    assert (erasure.kind, erasure.target, erasure.scope, erasure.requested_by) == (
        "person", place.key(place.ana), None, place.key(place.ana))
    assert place.log.turn_by_message(place.said["cat"].id).deleted and place.said["lisbon"].id in erasure.turn_ids
    assert not place.log.turn_by_message(place.said["jazz"].id).deleted  # Ben's words stay


@pytest.mark.asyncio
async def test_forget_everything_only_here_keeps_the_dm(place):
    await place.slash.command("forget", sub("everything", only_here=True), user=place.ana, channel=place.channel,
                              wait=False)
    assert "in this server?" in place.slash.last().content
    await place.slash.press("Confirm", user=place.ana, channel=place.channel, question=place.slash.last())
    erasure, = place.log.erasures()
    assert erasure.scope == f"guild:{place.channel.guild.id}" and place.said["lisbon"].id not in erasure.turn_ids
    # And in the DM, "here" is the DM.
    await place.slash.command("forget", sub("everything", only_here=True), user=place.ana, channel=place.dm,
                              wait=False)
    assert "in this conversation?" in place.slash.last().content
    await place.slash.press("Confirm", user=place.ana, channel=place.dm, question=place.slash.last())
    assert place.log.erasures()[-1].scope == f"channel:{DM_CHANNEL}"
    assert place.log.erasures()[-1].turn_ids == (place.said["lisbon"].id,)


@pytest.mark.asyncio
async def test_no_answer_in_time_cancels(place):
    place.client.confirm_timeout_s = 0.2
    await place.slash.command("forget", sub("everything"), user=place.ana, channel=place.channel)
    answer = place.slash.last()
    assert answer.kind == "edit" and answer.content.startswith("No answer in time") and answer.buttons == {}
    assert place.log.erasures() == []


# --------------------------------------------------------------------------- /forget-member


@pytest.mark.asyncio
async def test_a_server_manager_has_a_member_forgotten_in_this_server(place):
    command = place.client.tree.get_command("forget-member")
    assert command is not None and command.guild_only
    assert command.default_permissions == discord.Permissions(manage_guild=True)
    ben = place.ben
    resolved = {"users": {str(ben.id): factories.dict_from_user(ben._user)},
                "members": {str(ben.id): {k: v for k, v in member_dict(ben).items() if k != "user"}}}
    await place.slash.command("forget-member", {"type": 6, "name": "member", "value": str(ben.id)},
                              user=place.ana, channel=place.channel, permissions=MANAGE_GUILD, resolved=resolved,
                              wait=False)
    question = place.slash.last()
    assert question.ephemeral and question.content.startswith(f"Forget everything <@{ben.id}> said in this server?")
    await place.slash.press("Confirm", user=place.ana, channel=place.channel, question=question)
    assert place.slash.last().content.startswith("Done (erasure #1): 2 messages forgotten.")
    erasure, = place.log.erasures()
    assert (erasure.target, erasure.scope, erasure.requested_by) == (
        place.key(ben), f"guild:{place.channel.guild.id}", place.key(place.ana))
    assert not place.log.turn_by_message(place.said["cat"].id).deleted
    # Without Manage Server (an admin let everyone use the command), it is refused.
    await place.slash.command("forget-member", {"type": 6, "name": "member", "value": str(ben.id)},
                              user=place.ben, channel=place.channel, resolved=resolved)
    assert place.slash.last().content.startswith("Only a server manager") and len(place.log.erasures()) == 1


def test_the_commands_are_in_the_tree_the_bot_syncs(place):
    tree = place.client.tree
    names = {c.qualified_name for c in tree.walk_commands()}
    assert {"context", "memory", "memory show", "memory export", "forget", "forget message", "forget everything",
            "forget-member"} <= names
    assert not tree.get_command("memory").guild_only and not tree.get_command("forget").guild_only
