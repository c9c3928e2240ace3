"""Forgotten means forgotten, the familiar's own words included (issue 47).

A scripted reply model quotes the message it answers and paraphrases it ("that boat of yours,
Zqx… sounds lovely"), as real models do; the scripted background model's summaries keep the
latest line, so the replies are folded into memory too. People confide unique marker words in a
server channel, a DM and the console; memory is built through Dagster as the daemon builds it
(the turn sensor's runs), then they are forgotten through the code paths people use: Discord's
slash commands (dpytest), the console's commands, and what "opt_out" does with their later
messages. A scan of every byte under the data root and DAGSTER_HOME then finds the markers in no
file, the erasure's own check says so, and everyone else's memory is what it was. An edited
message's earlier text goes the same way, and an erasure whose check still finds a word is not
called done: `familiar forget` names the file and exits non-zero.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import asyncio
import io
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import discord.ext.test as dpytest
import pytest
import pytest_asyncio
from discord.ext.test import backend

from familiar_bot import self_service
from familiar_bot.prompt.assembly import Assembler
from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.responder.flow import Responder
from familiar_bot.responder.messages import IncomingMessage, Person
from familiar_bot.transports.console import console_person, run_console
from familiar_bot.transports.discord_adapter import FamiliarClient
from familiar_pipeline.config import load_config
from familiar_pipeline.defs.jobs import execute_request
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog
from familiar_pipeline.testing.scripted import careful_model

from .fact_helpers import GRAPH_TOML
from .helpers import make_familiar, sensor_tick
from .test_discord_self_service import Slash, sub

ECHO_TOML = 'aliases = ["Fam"]\n' + GRAPH_TOML + '\n[llm.reply]\nmodel = "fake/reply"\nmax_retries = 0\n'
BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
GUILD, CHANNEL, DM, CONSOLE = 1, 10, 77, 1
CASS = Person(key="discord:111", username="cass", global_name="Cass")
BO = Person(key="discord:222", username="bo", global_name="Bo")
PLANTED = re.compile(rb"(?i)zqx[a-z]+")
MARKER = re.compile(r"zqx[a-z]+", re.IGNORECASE)


def echo_model(messages: list[dict]) -> str:
    """Replies quote the message they answer and paraphrase its marker in another case; every
    projector prompt gets the careful model's answer (its summaries keep the latest line)."""
    system = messages[0]["content"] if messages else ""
    if "## Replying" not in system:
        return careful_model(messages)
    said = re.sub(r"^\[[^\]]*\]\s*", "", [m["content"] for m in messages if m["role"] == "user"][-1].strip())
    found = MARKER.findall(said)
    if not found:
        return "Good to hear from you; tell me more about your week."
    return f'Noted: "{said}". That boat of yours, {found[-1].capitalize()}… sounds lovely; I will keep it in mind.'


def scan(*roots: Path, marker: bytes | None = None) -> dict[str, int]:
    """Marker counts per file over every byte under `roots` (all markers, or the one named); a SQLite
    file's WAL counts as the file."""
    found = {}
    pattern = PLANTED if marker is None else re.compile(re.escape(marker), re.IGNORECASE)
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                n = len(pattern.findall(path.read_bytes()))
                if n:
                    name = str(path.relative_to(root)).removesuffix("-wal")
                    found[name] = found.get(name, 0) + n
    return found


@dataclass
class Fam:
    root: Path
    home: Path
    responder: Responder
    log: TurnLog
    memory: MemoryView
    instance: dg.DagsterInstance
    clock: list

    @property
    def paths(self):
        return self.responder.paths

    async def say(self, text: str, who: Person = CASS, *, channel: int = CHANNEL, guild: int | None = GUILD,
                  console: bool = False) -> list[str]:
        n = self.log.count()
        return await self.responder.handle(IncomingMessage(
            channel_id=channel, author=who, content=text, guild_id=guild, direct=guild is None and not console,
            console=console, platform_message_id=None if console else str(900_000 + n),
            created_at=BASE + timedelta(minutes=n)))

    def tick(self, *, raise_on_error: bool = True) -> list:
        """One turn-sensor tick and its runs, as the daemon does them (tests.helpers.sensor_driver)."""
        self.clock[0] += 60
        requests, _, self.clock[1], _ = sensor_tick(self.clock[1], ["fam"], ["fam"], root=self.root, in_flight={},
                                                    max_requests=5, now=self.clock[0])
        done = []
        for request in requests:
            result = execute_request(request, instance=self.instance, data_root=self.root,
                                     raise_on_error=raise_on_error)
            done += [e.asset_key.path[-1] for e in result.get_asset_materialization_events()]
        return done

    def settle(self, limit: int = 8) -> None:
        for _ in range(limit):
            if not self.tick():
                return
        raise AssertionError("the sensor kept asking for runs")

    # From a running event loop, the runs go to a thread (Dagster runs an event loop of its own).
    async def atick(self, **kwargs) -> list:
        return await asyncio.to_thread(self.tick, **kwargs)

    async def asettle(self) -> None:
        await asyncio.to_thread(self.settle)

    def facts_of(self, key: str) -> list[str]:
        with ProjectionStore(self.paths.memory_db, read_only=True) as store:
            return [r[0] for r in store.sql("SELECT f.text FROM facts f JOIN fact_subjects s ON s.fact_id = f.id "
                                            "WHERE s.canonical_key = ? ORDER BY f.id", [key]).fetchall()]


@pytest.fixture
def fam(tmp_path, fake_llm):
    fake_llm.script(echo_model)
    root = tmp_path / "data"
    paths = make_familiar(root, extra_toml=ECHO_TOML)
    config = load_config("fam", root=root, env={})
    log = TurnLog(paths.turns_db)
    memory = MemoryView(paths, config, turn_log=log)
    responder = Responder(paths, config, assembler=Assembler(memory, [RecentHistoryLayer()]),
                          llm=client_for(config.llm, "reply"), turn_log=log)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["fam"])
        yield Fam(root, Path(instance.root_directory), responder, log, memory, instance, [time.time() + 10_000, {}])
    memory.close()
    log.close()


async def confide(fam: Fam) -> None:
    """Cass tells the familiar two secrets in the server and two in a DM; Bo chats; memory is built."""
    await fam.say("Fam, my secret codeword is ZQXCODESRV", CASS)
    await fam.say("Fam, I named my boat ZQXBOATSRV", CASS)
    await fam.say("my secret codeword is ZQXCODEDM", CASS, channel=DM, guild=None)
    await fam.say("I named my boat ZQXBOATDM", CASS, channel=DM, guild=None)
    for i in range(8):
        await fam.say(f"Fam, the garden and the weather are lovely today, note {i}", BO)
    await fam.asettle()


def echoes(fam: Fam, marker: str) -> list[str]:
    return [t.content for t in fam.log.recent_cross_channel(200) if t.role == "assistant" and marker.lower()
            in t.content.lower()]


# --------------------------------------------------------------------------- a whole person, every scope


@pytest.mark.asyncio
async def test_forgetting_a_person_takes_the_familiars_echoes_everywhere(fam):
    await confide(fam)
    assert echoes(fam, "ZQXBOATSRV") and echoes(fam, "ZQXBOATDM"), "the replies quote and paraphrase her"
    before = scan(fam.root, fam.home)
    assert {"fam/turns.db", "fam/memory.duckdb", "fam/cache/llm_cache.sqlite"} <= set(before), before
    assert any(p.startswith("fam/serving/summaries") for p in before), "the summary folded the echoes"
    bo_facts = fam.facts_of(BO.key)

    erasure = await fam.responder.forget_person(CASS.key, scope=None, requested_by=CASS.key)
    assert len(erasure.turn_ids) == 4 and len(erasure.replies_erased) == 4
    assert await fam.atick(), "the turn sensor asks for the purging run at once"

    assert scan(fam.root, fam.home) == {}
    record, = fam.log.erasures()
    assert record.status == "done" and record.check is not None and record.check.left == ()
    assert record.check.words >= 4 and record.check.files > 10
    assert fam.facts_of(BO.key) == bo_facts, "Bo's memory is what it was"
    assert not fam.facts_of(CASS.key)


# --------------------------------------------------------------------------- Discord's slash commands


@pytest_asyncio.fixture
async def discord_fam(fam, monkeypatch):
    client = FamiliarClient(fam.responder, members_intent=True, sync_commands=False, confirm_timeout_s=5.0)
    await client._async_setup_hook()
    dpytest.configure(client, members=["cass", "bo"])
    backend.get_state().loop = asyncio.get_running_loop()
    config = dpytest.get_config()
    yield fam, client, Slash(client, monkeypatch), config.channels[0], config.members[0], config.members[1]
    await dpytest.empty_queue()


async def settled_replies(client) -> None:
    deadline = time.monotonic() + 10
    while any(not t.done() for t in asyncio.all_tasks() if "on_message" in repr(t.get_coro())):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_forget_message_on_discord_takes_the_reply_that_quoted_it(discord_fam):
    fam, client, slash, channel, cass, bo = discord_fam
    boat = await dpytest.message("Fam, I named my boat ZQXBOATMSG", channel=channel, member=cass)
    await dpytest.message("Fam, my secret codeword is ZQXCODEKEPT", channel=channel, member=cass)
    for i in range(8):
        await dpytest.message(f"Fam, the garden is lovely, note {i}", channel=channel, member=bo)
    await settled_replies(client)
    assert echoes(fam, "ZQXBOATMSG") and echoes(fam, "ZQXCODEKEPT")
    await fam.asettle()
    assert scan(fam.root, fam.home, marker=b"zqxboatmsg")

    await slash.command("forget", sub("message", message=str(boat.id)), user=cass, channel=channel)
    assert slash.last().content.startswith("Done (erasure #1): 1 message forgotten.")
    await fam.atick()
    assert scan(fam.root, fam.home, marker=b"zqxboatmsg") == {}
    assert echoes(fam, "ZQXCODEKEPT"), "her other message and its reply stay"


@pytest.mark.asyncio
async def test_forget_everything_on_discord_in_a_server_and_a_dm(discord_fam):
    fam, client, slash, channel, cass, bo = discord_fam
    await dpytest.message("Fam, my secret codeword is ZQXCODEDISC", channel=channel, member=cass)
    await dpytest.message("Fam, I named my boat ZQXBOATDISC", channel=channel, member=cass)
    for i in range(8):
        await dpytest.message(f"Fam, the garden is lovely, note {i}", channel=channel, member=bo)
    await settled_replies(client)
    cass_key = f"discord:{cass.id}"
    await fam.say("I named my boat ZQXBOATDMDISC", Person(key=cass_key, username="cass"), channel=DM, guild=None)
    await fam.asettle()
    assert len(scan(fam.root, fam.home)) >= 4

    await slash.command("forget", sub("everything"), user=cass, channel=channel, wait=False)
    await slash.press("Confirm", user=cass, channel=channel, question=slash.last())
    assert slash.last().content.startswith("Done (erasure #1): 3 messages forgotten.")
    await fam.atick()
    assert scan(fam.root, fam.home) == {}


# --------------------------------------------------------------------------- the console


@pytest.mark.asyncio
async def test_the_console_forgets_me_and_one_message_with_their_echoes(fam):
    sam = console_person("Sam")

    async def console(typed: str) -> str:
        out = io.StringIO()
        assert await run_console(fam.responder, speaker=sam, channel_id=CONSOLE, stdin=io.StringIO(typed),
                                 stdout=out, interactive=False) == 0
        return out.getvalue()

    await console("my secret codeword is ZQXCODECON\nI named my boat ZQXBOATCON\nthe weather is nice today\n"
                  "my locker is ZQXLOCKCON\n")
    assert echoes(fam, "ZQXBOATCON") and echoes(fam, "ZQXLOCKCON")
    await fam.asettle()
    assert scan(fam.root, fam.home, marker=b"zqxlockcon")
    locker = [t for t in fam.log.recent(CONSOLE, 20) if t.role == "user" and "ZQXLOCKCON" in t.content][0]
    assert "Done (erasure #1): 1 message forgotten." in await console(f"/forget #{locker.id}\n")
    await fam.atick()
    assert scan(fam.root, fam.home, marker=b"zqxlockcon") == {}
    assert scan(fam.root, fam.home, marker=b"zqxboatcon"), "only that message"

    fam.paths.console_speaker.write_text("Sam\n")  # as `familiar chat` remembers the name it asked for
    assert "Done (erasure #2)" in await console("/forget me\nyes\n")
    await fam.atick()
    assert scan(fam.root, fam.home) == {}
    assert not fam.paths.console_speaker.exists(), "the name goes with the person"


# --------------------------------------------------------------------------- opt-out


@pytest.mark.asyncio
async def test_opt_out_replies_are_stored_without_their_words_and_memory_keeps_nothing(fam):
    await confide(fam)
    await fam.responder.forget_person(CASS.key, scope=None, requested_by=CASS.key)
    await fam.atick()
    assert scan(fam.root, fam.home) == {}

    answered = await fam.say("Fam, my new boat is ZQXNEWSRV", CASS)
    assert "zqxnewsrv" in answered[0].lower(), "she is answered as before"
    await fam.say("my new codeword is ZQXNEWDM", CASS, channel=DM, guild=None)
    stored = [t for t in fam.log.recent_cross_channel(10) if t.role == "assistant"][-2:]
    assert stored and all("zqxnew" not in t.content.lower() for t in stored), "stored without her words"
    held = await fam.responder.held_about(CASS.key, CHANNEL, guild_id=GUILD)
    assert held.own_messages == 0 and "Messages of yours I remember here: 0." in self_service.render_held(held)
    for i in range(6):
        await fam.say(f"Fam, the garden is lovely again, note {i}", BO)
    await fam.asettle()
    assert scan(fam.root, fam.home) == {}
    assert not fam.facts_of(CASS.key)
    assert all(t.content == "" and t.deleted for t in fam.log.turns_by_ids([t.id for t in stored])), \
        "the replies to her are purged with her messages"


# --------------------------------------------------------------------------- edits


@pytest.mark.asyncio
async def test_an_edited_message_loses_its_earlier_text_everywhere_once_memory_followed(fam):
    with fam.paths.character_toml.open("a") as toml:
        toml.write("\n[memory.privacy]\nedited_retention_hours = 24\n")
    for i in range(6):
        await fam.say(f"the weather is lovely, note {i}", BO)
    said = await fam.say("my locker code is ZQXEDITOLD and the gym opens early", BO)
    assert not said, "not addressed: no reply quotes it"
    for i in range(6):
        await fam.say(f"the garden is green, note {i}", BO)
    await fam.asettle()
    assert scan(fam.root, fam.home, marker=b"zqxeditold")
    turn = [t for t in fam.log.recent(CHANNEL, 30) if "ZQXEDITOLD" in t.content][0]
    fam.log.record_edit(turn_id=turn.id, new_content="my locker code is private and the gym opens early")
    await fam.asettle()
    assert not [f for f in fam.facts_of(BO.key) if "zqxeditold" in f.lower()], "memory forgot it at once"
    assert "fam/turns.db" in scan(fam.root, fam.home, marker=b"zqxeditold"), "kept for its 24 h window"
    toml = fam.paths.character_toml
    toml.write_text(toml.read_text().replace("edited_retention_hours = 24", "edited_retention_hours = 0"))
    assert await fam.atick(), "due now: the sensor asks for the purge with no new message"
    assert scan(fam.root, fam.home, marker=b"zqxeditold") == {}
    assert [c.prior_content for c in fam.log.changes_after(0)] == [None]
    assert "private" in fam.log.turns_by_ids([turn.id])[0].content


# --------------------------------------------------------------------------- the check


@pytest.mark.asyncio
async def test_an_erasure_whose_check_finds_a_word_is_not_done_and_says_where(fam, capsys, monkeypatch):
    from familiar_bot.app.cli import main as cli

    await confide(fam)
    stray = fam.paths.dir / "notes.txt"  # a copy nothing in the purge knows about
    stray.write_text("Cass: boat ZQXBOATSRV\n")
    erasure = await fam.responder.forget_person(CASS.key, scope=None, requested_by=CASS.key)
    await fam.atick(raise_on_error=False)
    record, = fam.log.erasures()
    assert record.status == "pending" and record.check is not None and record.check.left == (str(stray),)
    assert fam.log.turns_by_ids([erasure.turn_ids[0]])[0].content, "her text stays until a check passes"

    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(fam.root))
    monkeypatch.setenv("DAGSTER_HOME", str(fam.home))
    assert cli.main(["forget", "--familiar", "fam", "--status"]) == 0
    assert f"pending; 1 file still hold some of the {record.check.words} distinctive words: {stray}" in \
        capsys.readouterr().out
    stray.unlink()
    await fam.atick()
    record, = fam.log.erasures()
    assert record.status == "done" and record.check.left == () and scan(fam.root, fam.home) == {}


def test_familiar_forget_prints_the_check_and_fails_on_a_leftover(clean_env, tmp_path, monkeypatch, capsys, fake_llm):
    from familiar_bot.app.cli import main as cli

    from .helpers import append_chat

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    paths = make_familiar(clean_env, "fam", GRAPH_TOML)
    turns = append_chat(paths, 12)
    with TurnLog(paths.turns_db) as log:
        log.append_turn(channel_id=10, guild_id=1, role="user", author_key="discord:111", author_display="Cass",
                        content="my boat is Zqxcliboat", platform_message_id=5555)
    assert turns
    (paths.dir / "copy.txt").write_text("zqxcliboat\n")
    assert cli.main(["forget", "--familiar", "fam", "--message", "5555", "--local"]) == 1
    out, err = capsys.readouterr()
    last = err.strip().splitlines()[-1]  # after Dagster's first-run telemetry notice
    assert "is not done: 1 file still hold some of the" in last and "copy.txt" in last, err
    (paths.dir / "copy.txt").unlink()
    assert cli.main(["forget", "--familiar", "fam", "--message", "5555", "--local"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"done in .*checked: 0 files hold any of the \d+ distinctive words? \(\d+ files read\)", out), out
