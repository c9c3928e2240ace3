"""The Discord adapter under dpytest: real discord.py state and events, a fake Discord backend."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import asyncio
from datetime import datetime, timezone

import discord
import discord.ext.test as dpytest
import pytest
import pytest_asyncio
from discord.ext.test import backend, callbacks, factories

from familiar_bot.prompt.assembly import Assembler
from familiar_bot.transports.discord_adapter import (
    CONTEXT_MAX_MESSAGES,
    FamiliarClient,
    context_payload,
    incoming_from,
    intents,
)
from familiar_bot.prompt.layers.character_card import CharacterCardLayer
from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.responder.flow import Responder
from familiar_pipeline.config import load_config
from familiar_pipeline.testing.fake_llm import fake_llm
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLog

TOML = """
aliases = ["Fam"]

[llm.reply]
model = "fake/discord"
max_retries = 0
"""


@pytest.fixture
def fake():
    with fake_llm() as f:
        yield f


@pytest_asyncio.fixture
async def bot(tmp_path, fake):
    paths = FamiliarPaths.for_id("fam", tmp_path)
    paths.dir.mkdir(parents=True)
    paths.character_toml.write_text(TOML)
    paths.character_md.write_text("You are Fam, a fox spirit.")
    config = load_config("fam", root=tmp_path, env={})
    turn_log = TurnLog(paths.turns_db)
    memory = MemoryView(paths, config, turn_log=turn_log)
    assembler = Assembler(memory, [CharacterCardLayer(), RecentHistoryLayer()])
    responder = Responder(paths, config, assembler=assembler, llm=client_for(config.llm, "reply"),
                          turn_log=turn_log)
    # dpytest resolves pings through the member cache, which needs the members intent.
    client = FamiliarClient(responder, members_intent=True, sync_commands=False)
    await client._async_setup_hook()
    dpytest.configure(client, members=["ana"])
    backend.get_state().loop = asyncio.get_running_loop()  # set at login by real discord.py
    payloads: list[dict] = []
    original_send = client.http.send_message

    async def spy_send(channel_id, *, params):  # keep what discord.py put on the wire
        payloads.append(dict(params.payload or {}))
        channel = client.get_channel(channel_id)  # noqa: F841 - dpytest reads its caller's `channel`
        return await original_send(channel_id, params=params)

    client.http.send_message = spy_send
    typing_in: list[int] = []

    async def on_typing(channel):
        typing_in.append(channel.id)

    callbacks.set_callback(on_typing, "send_typing")
    client.test = type("T", (), {"payloads": payloads, "typing": typing_in, "log": turn_log})
    yield client
    await dpytest.empty_queue()
    callbacks.remove_callback("send_typing")
    memory.close()
    turn_log.close()


def channel_and_member():
    config = dpytest.get_config()
    return config.channels[0], config.members[0]


def all_turns(log: TurnLog):
    return log.recent_cross_channel(100, include_deleted=True)


@pytest.mark.asyncio
async def test_a_mention_gets_a_reply_and_both_turns_are_recorded(bot, fake):
    fake.script(lambda messages: "Hi Ana! What's up?")
    channel, member = channel_and_member()
    sent = await dpytest.message(f"<@{bot.user.id}> hello there", channel=channel, member=member)

    reply = dpytest.get_message()
    assert reply.content == "Hi Ana! What's up?" and reply.channel.id == channel.id
    assert bot.test.typing == [channel.id]  # typing shown while composing
    user, assistant = all_turns(bot.test.log)
    assert (user.role, user.author_key, user.platform_message_id) == ("user", f"discord:{member.id}", str(sent.id))
    assert user.content == "@Fam hello there"  # the familiar's own ping reads as its name
    assert user.guild_id == channel.guild.id and user.channel_id == channel.id
    assert (assistant.role, assistant.content, assistant.platform_message_id) == (
        "assistant", "Hi Ana! What's up?", str(reply.id))
    assert bot.test.log.participant(f"discord:{member.id}").username == member.name
    # The model saw the message in its history, addressed by the familiar's name.
    assert "@Fam hello there" in fake.calls[0].messages[-1]["content"]


@pytest.mark.asyncio
async def test_unaddressed_chatter_is_recorded_without_a_reply(bot, fake):
    channel, member = channel_and_member()
    await dpytest.message("just chatting with friends", channel=channel, member=member)
    assert dpytest.verify().message().nothing()
    assert fake.calls == [] and bot.test.typing == []
    assert [t.content for t in all_turns(bot.test.log)] == ["just chatting with friends"]


@pytest.mark.asyncio
async def test_everyone_in_a_reply_never_pings(bot, fake):
    channel, member = channel_and_member()
    fake.script(lambda messages: f"@everyone look at this, and <@{member.id}> too")
    await dpytest.message(f"<@{bot.user.id}> say hi to everyone", channel=channel, member=member)
    reply = dpytest.get_message()
    assert reply.content.startswith("@everyone look")  # the text is sent as written...
    payload, = bot.test.payloads
    # ...but with every kind of ping switched off, replied-to author included.
    assert payload["allowed_mentions"] == {"parse": [], "replied_user": False}
    assert payload["message_reference"]["message_id"] is not None  # a reply to the message


def test_the_client_default_also_pings_nobody():
    """Belt and braces: even a send that forgot allowed_mentions would ping no one."""
    client = FamiliarClient(responder=None, sync_commands=False)  # type: ignore[arg-type]
    assert client.allowed_mentions.to_dict() == {"parse": []}
    assert not client.allowed_mentions.replied_user


@pytest.mark.asyncio
async def test_edit_and_delete_are_recorded_for_cached_and_uncached_messages(bot, fake):
    channel, member = channel_and_member()
    first = await dpytest.message("I has a cat", channel=channel, member=member)
    second = await dpytest.message("temporary note", channel=channel, member=member)
    state = backend.get_state()

    edited = factories.dict_from_message(first)
    edited.update(content="I have a cat", channel_id=channel.id, guild_id=channel.guild.id,
                  edited_timestamp=datetime(2026, 5, 1, 12, 5, tzinfo=timezone.utc).isoformat())
    state.parse_message_update(edited)
    await dpytest.run_all_events()

    state._messages.clear()  # the bot restarted or the cache rolled over: only raw events fire
    state.parse_message_delete({"id": second.id, "channel_id": channel.id, "guild_id": channel.guild.id})
    await dpytest.run_all_events()

    by_id = {t.platform_message_id: t for t in all_turns(bot.test.log)}
    cat, note = by_id[str(first.id)], by_id[str(second.id)]
    assert (cat.content, cat.revision, cat.deleted) == ("I have a cat", 1, False)
    assert cat.edited_at == datetime(2026, 5, 1, 12, 5, tzinfo=timezone.utc)
    assert bot.test.log.changes_after(0)[0].prior_content == "I has a cat"
    assert note.deleted and note.content == "temporary note"  # tombstone keeps the text
    assert fake.calls == []


@pytest.mark.asyncio
async def test_bulk_delete_and_unknown_ids_are_harmless(bot):
    channel, member = channel_and_member()
    kept = await dpytest.message("one", channel=channel, member=member)
    gone = await dpytest.message("two", channel=channel, member=member)
    backend.get_state().parse_message_delete_bulk(
        {"ids": [gone.id, 424242424242424242], "channel_id": channel.id, "guild_id": channel.guild.id})
    await dpytest.run_all_events()
    assert [t.content for t in bot.test.log.recent(channel.id, 10)] == ["one"]
    assert kept.id != gone.id


@pytest.mark.asyncio
async def test_own_messages_are_not_recorded_twice(bot, fake):
    fake.script(lambda messages: "only once")
    channel, member = channel_and_member()
    await dpytest.message(f"<@{bot.user.id}> ping", channel=channel, member=member)
    await dpytest.run_all_events()
    assert [t.role for t in all_turns(bot.test.log)] == ["user", "assistant"]


@pytest.mark.asyncio
async def test_incoming_translation_of_mentions_and_nicks(bot):
    channel, member = channel_and_member()
    other = await dpytest.member_join(name="bo")
    backend.update_member(other, nick="Bobby")
    message = await dpytest.message(f"hey <@{other.id}>, meet <@{bot.user.id}>", channel=channel, member=member)
    incoming = incoming_from(message, self_id=bot.user.id, self_name="Fam")
    assert incoming.addressed and not incoming.direct and not incoming.author_is_bot
    assert [p.key for p in incoming.mentions] == [f"discord:{other.id}"]  # the familiar is not a participant
    assert incoming.content == f"hey <@{other.id}>, meet @Fam"
    assert bot.test.log.mentions_for_turn(all_turns(bot.test.log)[0].id) == [f"discord:{other.id}"]
    assert bot.test.log.guild_nick(f"discord:{other.id}", channel.guild.id) == "Bobby"


def test_intents_ask_for_message_content_and_members_only_on_request():
    plain = intents()
    assert plain.message_content and plain.guild_messages and plain.guilds and plain.dm_messages
    assert not plain.members and not plain.presences
    assert intents(members=True).members


def test_context_payload_splits_short_reports_and_attaches_long_ones():
    short = "=== character_card: 12 tokens ===\nYou are Fam."
    assert context_payload(short) == ([short], None)
    long = "\n".join(f"=== layer_{i}: 100 tokens ===\n" + "x" * 1900 for i in range(6))
    pieces, attachment = context_payload(long)
    assert attachment == long and len(pieces) <= CONTEXT_MAX_MESSAGES
    assert "=== layer_5: 100 tokens ===" in pieces[0] and "x" * 100 not in pieces[0]


@pytest.mark.asyncio
async def test_context_command_answers_ephemerally_without_recording(bot, fake):
    channel, member = channel_and_member()
    await dpytest.message("we talked about foxes", channel=channel, member=member)

    class Followup:
        def __init__(self):
            self.sent = []

        async def send(self, content, **kwargs):
            self.sent.append((content, kwargs))

    class Response:
        deferred = None

        async def defer(self, **kwargs):
            self.deferred = kwargs

    class Interaction:  # the two surfaces answer_context uses
        channel_id, guild_id = channel.id, channel.guild.id
        response, followup = Response(), Followup()

    interaction = Interaction()
    await bot.answer_context(interaction, "foxes")
    assert interaction.response.deferred == {"ephemeral": True, "thinking": True}
    (text, kwargs), = interaction.followup.sent
    assert kwargs["ephemeral"] is True
    assert kwargs["allowed_mentions"].to_dict() == {"parse": []}  # Discord's replied_user default is off
    assert "=== character_card:" in text and "You are Fam, a fox spirit." in text
    assert "=== recent_history:" in text and "we talked about foxes" in text
    # Which memory the reply read: the server's scope, nothing joined, and how many rows were left out.
    assert f"=== scopes: this reply reads guild:{channel.guild.id} only ===" in text
    assert "rows of other scopes left out: 0" in text
    assert len(all_turns(bot.test.log)) == 1 and fake.calls == []
    command = bot.tree.get_command("context")
    assert command is not None and command.guild_only
    assert command.default_permissions == discord.Permissions(manage_guild=True)


# --------------------------------------------------------------------------- familiar bot


def test_bot_refuses_without_a_token_in_one_line(clean_env, capsys):
    from familiar_bot.app.cli import main as cli

    assert cli.main(["bot", "--familiar", "fam"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: DISCORD_TOKEN is not set")
    assert "familiar chat" in err


def test_bot_never_echoes_the_token(clean_env, capsys, monkeypatch):
    from familiar_bot.app.cli import main as cli

    monkeypatch.setenv("DISCORD_TOKEN", "planted.token-value.xyz")
    assert cli.main(["bot", "--familiar", "ghost"]) == 1  # no such familiar: refused before connecting
    out, err = capsys.readouterr()
    assert "no familiar 'ghost'" in err and "planted.token-value" not in out + err
