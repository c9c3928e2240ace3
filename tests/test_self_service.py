"""What the familiar holds about a person, as they see it (issue 27): `familiar_bot.self_service`.

Scoping is the prompt's own (`prompt/scoping.py`): what is listed in a place is what a reply there
may read about the person, no more. The rows are written through the store API and published, as
the pipeline writes them; the turn log is the bot's own.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from familiar_bot import self_service as ss
from familiar_bot.prompt.assembly import Assembler
from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer
from familiar_bot.prompt.layers import people_dossier
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.responder.flow import Responder
from familiar_bot.responder.spool import SpooledWrite
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.projectors import builtin  # noqa: F401 - every built-in table declared before a store opens
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.supersede import tables as supersede_db
from familiar_pipeline.storage.turns import Turn, TurnLogUnavailable
from tests.test_assembly import BO, CASS, World

SERVER_A, SERVER_B, DM = (10, 111), (20, 222), (30, None)


def build(tmp_path, toml: str = ""):
    """Cass in two servers and a DM, Bo in server A; a fact about Cass in each place."""
    w = World(tmp_path, toml)
    said = {
        "a": w.say("I play the oboe", CASS, channel=10, guild=111, platform_message_id=5001),
        "a-bo": w.say("Cass bakes bread on Sundays", BO, channel=10, guild=111, platform_message_id=5002),
        "b": w.say("I collect stamps", CASS, channel=20, guild=222, platform_message_id=5003),
        "dm": w.say("I'm scared of heights", CASS, channel=30, guild=None, platform_message_id=5004),
        "console": w.say("I grow tomatoes", CASS, channel=1, guild=None),
    }
    w.fact("Cass plays the oboe.", [CASS], [said["a"].id], channel=10, scope="guild:111")
    w.fact("Cass bakes bread on Sundays.", [CASS], [said["a-bo"].id], channel=10, scope="guild:111")
    w.fact("Bo is a baker.", [BO], [said["a-bo"].id], channel=10, scope="guild:111")
    w.fact("Cass collects stamps.", [CASS], [said["b"].id], channel=20, scope="guild:222")
    w.fact("Cass is scared of heights.", [CASS], [said["dm"].id], channel=30, scope="channel:30")
    w.fact("Cass grows tomatoes.", [CASS], [said["console"].id], channel=1, scope="channel:1")
    dossier_db.put_dossier(w.store, CASS[0], "Cass, oboist.", 1, scope="guild:111")
    dossier_db.put_dossier(w.store, CASS[0], "Cass, philatelist.", 4, scope="guild:222")
    w.publish()
    return w, said


@pytest.fixture
def world(tmp_path):
    w, said = build(tmp_path)
    memory = MemoryView(w.paths, w.config(), turn_log=w.log)
    yield w, memory, said
    memory.close()
    w.close()


def texts(held: ss.Held) -> list[str]:
    return [f.fact.text for f in held.facts]


def test_a_server_lists_its_own_facts_dossier_and_messages_only(world):
    w, memory, said = world
    held = ss.held_about(memory, CASS[0], *SERVER_A)
    assert held.scopes == ("guild:111",)
    assert texts(held) == ["Cass plays the oboe.", "Cass bakes bread on Sundays."]  # not B's, not the DM's
    assert held.dossier == "Cass, oboist." and held.own_messages == 1
    oboe, bread = held.facts
    assert [s.link for s in oboe.sources] == ["https://discord.com/channels/111/10/5001"]
    assert [s.link for s in bread.sources] == ["https://discord.com/channels/111/10/5002"]  # Bo said it
    other = ss.held_about(memory, CASS[0], *SERVER_B)
    assert texts(other) == ["Cass collects stamps."] and other.dossier == "Cass, philatelist."


def test_a_dm_does_not_list_server_facts_and_console_turns_have_no_link(world):
    w, memory, said = world
    held = ss.held_about(memory, CASS[0], *DM)
    assert held.scopes == ("channel:30",) and texts(held) == ["Cass is scared of heights."]
    assert held.dossier == "" and held.own_messages == 1
    assert held.facts[0].sources[0].link == "https://discord.com/channels/@me/30/5004"
    console = ss.held_about(memory, CASS[0], 1, None)
    source, = console.facts[0].sources
    assert source.link is None and source.render() == f"turn #{said['console'].id}"
    assert f"[turn #{said['console'].id}]" in ss.render_held(console)


def test_a_dm_with_dm_sees_person_lists_facts_resting_on_their_own_turns_alone(tmp_path):
    w, said = build(tmp_path, "[memory.scopes]\ndm_sees_person = true\n")
    memory = MemoryView(w.paths, w.config(), turn_log=w.log)
    try:
        held = ss.held_about(memory, CASS[0], *DM)
        assert held.scopes == ("channel:30", f"person:{CASS[0]}")
        # Facts resting on Cass's turns alone, from anywhere; not the fact resting on Bo's words.
        assert texts(held) == ["Cass plays the oboe.", "Cass collects stamps.", "Cass is scared of heights.",
                               "Cass grows tomatoes."]
        assert held.own_messages == 4 and held.dossier == ""  # dossiers stay strict
        # A server is not joined to the DM by it.
        assert texts(ss.held_about(memory, CASS[0], *SERVER_A)) == ["Cass plays the oboe.",
                                                                     "Cass bakes bread on Sundays."]
    finally:
        memory.close()
        w.close()


def test_joined_scopes_are_listed_together(tmp_path):
    w, said = build(tmp_path, '[memory.scopes]\ngroups = { team = ["guild:111", "guild:222"] }\n')
    memory = MemoryView(w.paths, w.config(), turn_log=w.log)
    try:
        held = ss.held_about(memory, CASS[0], *SERVER_B)
        assert held.scopes == ("guild:222", "guild:111")
        assert set(texts(held)) == {"Cass plays the oboe.", "Cass bakes bread on Sundays.", "Cass collects stamps."}
        assert held.dossier == "Cass, philatelist.\n\nCass, oboist." and held.own_messages == 2
    finally:
        memory.close()
        w.close()


def test_the_export_holds_their_own_live_turns_and_every_fact_about_them_held_here(world):
    w, memory, said = world
    newer = w.fact("Cass plays the bassoon now.", [CASS], [said["a"].id], channel=10, scope="guild:111")
    supersede_db.supersede(w.store, [1], newer.id)  # the oboe fact is retired (and the dossier folding it dropped)
    dossier_db.put_dossier(w.store, CASS[0], "Cass, bassoonist.", newer.id, scope="guild:111")
    w.fact("Cass is on holiday.", [CASS], [said["a"].id], channel=10, scope="guild:111")
    gone = w.say("delete me later", CASS, channel=10, guild=111, platform_message_id=5005)
    w.log.record_deletion(turn_id=gone.id)
    w.publish()
    shown = ss.held_about(memory, CASS[0], *SERVER_A)
    assert "Cass plays the oboe." not in texts(shown)  # retired: no reply uses it
    at = datetime(2026, 6, 1, tzinfo=timezone.utc)
    data = json.loads(ss.export_json(ss.export_about(memory, CASS[0], *SERVER_A, now=at)))
    assert (data["person"], data["scopes"], data["exported_at"]) == (CASS[0], ["guild:111"], at.isoformat())
    assert [t["content"] for t in data["turns"]] == ["I play the oboe"]  # not Bo's, not deleted, not elsewhere
    facts = {f["text"]: f for f in data["facts"]}
    assert set(facts) == {"Cass plays the oboe.", "Cass bakes bread on Sundays.", "Cass plays the bassoon now.",
                          "Cass is on holiday."}
    assert facts["Cass plays the oboe."]["superseded"] is True and facts["Cass plays the oboe."]["current"] is False
    assert facts["Cass bakes bread on Sundays."]["source_message_ids"] == ["5002"]
    assert facts["Cass plays the bassoon now."]["superseded"] is False
    assert data["dossier"] == "Cass, bassoonist."


def test_a_person_with_nothing_held_sees_nothing(world):
    w, memory, said = world
    held = ss.held_about(memory, "discord:999", *SERVER_A)
    assert (held.facts, held.dossier, held.own_messages) == ((), "", 0)
    assert ss.render_held(held).endswith("Facts about you: none.")
    assert ss.export_about(memory, "discord:999", *SERVER_A)["turns"] == []


def fact_of(text: str, n_sources: int = 1) -> ss.HeldFact:
    from familiar_pipeline.projectors.facts.tables import Fact

    fact = Fact(id=1, channel_id=1, text=text, source_turn_ids=tuple(range(n_sources)), subjects=(),
                importance=None, created_at=datetime.now(timezone.utc), superseded_at=None, superseded_by=None,
                valid_from=None, valid_to=None)
    sources = tuple(ss.Source(i, str(900 + i), f"https://discord.com/channels/1/2/{900 + i}") for i in range(n_sources))
    return ss.HeldFact(fact, sources, True)


def test_the_list_is_cut_at_the_limit_with_the_rest_counted():
    held = ss.Held("discord:1", ("guild:1",), tuple(fact_of(f"Fact number {i} " + "x" * 80) for i in range(50)),
                   3, {"dossier": "d" * 5000})  # the people_dossier layer's part
    text = ss.render_held(held, limit=2000)
    assert len(text) <= 2000 and "Facts about you (50):" in text
    shown = sum(line.startswith("- Fact number") for line in text.splitlines())
    assert text.splitlines()[-1] == f"… and {50 - shown} more: /memory export has them all." and 0 < shown < 50
    assert f"My notes on you: {'d' * (people_dossier.DOSSIER_CHARS - 1)}…" in text
    assert len(ss.render_held(held)) > 2000  # no limit: everything


def test_message_refs_and_links():
    assert ss.message_ref("123") == "123"
    assert ss.message_ref(" https://discord.com/channels/1/2/345 ") == "345"
    assert ss.message_ref("<https://ptb.discordapp.com/channels/@me/2/345>") == "345"
    with pytest.raises(ValueError, match="neither a message id nor a message link"):
        ss.message_ref("https://example.com/channels/1/2/3")
    turn = Turn(1, 2, None, "user", "discord:1", "A", "hi", None, "345", None, datetime.now(timezone.utc), 0, None, None)
    assert ss.message_link(turn) == "https://discord.com/channels/@me/2/345"


def test_who_may_forget_which_message():
    now = datetime.now(timezone.utc)

    def turn(role, author, guild, channel=7):
        return Turn(1, channel, guild, role, author, None, "x", None, "9", None, now, 0, None, None)

    ana = ss.Requester("discord:1")
    assert ss.may_forget(turn("user", "discord:1", 5), ana)
    assert not ss.may_forget(turn("user", "discord:2", 5), ana)
    assert not ss.may_forget(turn("assistant", "ego:fam", 5), ana)
    assert ss.may_forget(turn("user", "discord:2", 5), ss.Requester("discord:1", manages_guild=5))
    assert not ss.may_forget(turn("user", "discord:2", 6), ss.Requester("discord:1", manages_guild=5))
    # In her DM, the familiar's replies to her; not another DM's.
    assert ss.may_forget(turn("assistant", "ego:fam", None), ss.Requester("discord:1", dm_channel=7))
    assert not ss.may_forget(turn("assistant", "ego:fam", None, channel=8), ss.Requester("discord:1", dm_channel=7))
    assert ss.may_forget(turn("user", "discord:2", 5), ss.Requester("console:me", operator=True))


def test_refusals_never_name_other_people(world):
    w, memory, said = world
    with pytest.raises(ss.ForgetRefused) as refused:
        ss.forget_person(w.log, "discord:112", scope=None, requested_by="discord:112")
    assert "discord:111" not in str(refused.value) and str(refused.value).startswith("I hold no record of anything")
    with pytest.raises(ss.ForgetRefused, match="no message 5009 on record"):
        ss.forget_message(w.log, "5009", ss.Requester("discord:111"))
    assert w.log.erasures() == []


def test_a_console_turn_is_forgotten_by_its_turn_id(world):
    w, memory, said = world
    console = said["console"]
    erasure = ss.forget_message(w.log, f"#{console.id}", ss.Requester("console:me", operator=True))
    assert erasure.turn_ids == (console.id,) and erasure.target == f"turn:{console.id}"
    # A bare number is a message id first, then a turn id; a Discord user never names turn ids.
    erasure = ss.forget_message(w.log, str(said["a"].id), ss.Requester("console:me", operator=True))
    assert erasure.turn_ids == (said["a"].id,)
    with pytest.raises(ss.ForgetRefused, match="no message"):
        ss.forget_message(w.log, str(said["b"].id), ss.Requester(CASS[0]))


@pytest.mark.asyncio
async def test_an_erasure_waits_for_no_spooled_write_and_is_refused_while_they_cannot_be_stored(world):
    w, memory, said = world
    config = w.config()
    responder = Responder(w.paths, config, assembler=Assembler(memory, [RecentHistoryLayer()]),
                          llm=client_for(config.llm, "reply"), turn_log=w.log)
    blocked = {"on": True}

    def waiting_write():
        if blocked["on"]:
            raise TurnLogUnavailable("disk full")
        return w.say("said while the disk was full", CASS, channel=10, guild=111)

    responder.spool.add(SpooledWrite("message in channel 10", waiting_write, 10))
    with pytest.raises(ss.ForgetRefused, match="can't forget anything right now"):
        await responder.forget_person(CASS[0], scope=None, requested_by=CASS[0])
    assert w.log.erasures() == [] and len(responder.spool) == 1
    blocked["on"] = False  # the disk has room: the waiting message is stored first, then erased with the rest
    erasure = await responder.forget_person(CASS[0], scope="guild:111", requested_by=CASS[0])
    assert len(responder.spool) == 0 and len(erasure.turn_ids) == 2
    assert all(t.deleted for t in w.log.turns_by_ids(erasure.turn_ids))
    report = await responder.memory_report(CASS[0], 10, guild_id=111)
    assert "Messages of yours I remember here: 0." in report


def test_held_facts_use_the_facts_current_view(world):
    w, memory, said = world
    w.fact("Cass was in Rome.", [CASS], [said["a"].id], channel=10, scope="guild:111")
    w.store.conn.execute("UPDATE facts SET valid_to = ? WHERE text = 'Cass was in Rome.'",
                         [datetime.now(timezone.utc) - timedelta(days=1)])
    w.publish()
    assert "Cass was in Rome." not in texts(ss.held_about(memory, CASS[0], *SERVER_A))
