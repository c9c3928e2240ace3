"""Forgetting on request (issue 27): a planted marker is found 0 times afterwards, anywhere.

A familiar runs the whole graph with the scripted model, driven by the turn sensor as the
daemon drives it, so every file is written for real: the turn log, the store, both full-text
indexes, the serving snapshots, the LLM response cache, Dagster's run and event storage and a
log file. Cass said unique marker words in a DM and in the server; then Cass is forgotten and
only the next sensor tick runs. A scan of every byte under the data root and DAGSTER_HOME finds
no marker, the indexes hold no marker term, and everyone else's memory is what it was.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest

from familiar_pipeline.config import load_config
from familiar_pipeline.erasure.due import due_turns
from familiar_pipeline.erasure.words import Scrubber, distinctive_words
from familiar_pipeline.projectors.facts.store import FactDraft
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.storage.fts import CONTENT, FtsIndex
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .fact_helpers import GRAPH_TOML
from .helpers import PEOPLE, make_familiar, sensor_driver

BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
GUILD, CHANNEL, DM = 1, 10, 77
CASS, BO = PEOPLE[0], PEOPLE[1]
MARK = "zqx"  # every marker starts with it: "zqxdm3", "zqxsrv12"
# What `scan` counts: a planted marker whole ("zqx" and the kind of marker after it). The bare
# 3-byte prefix turns up by chance in compressed bytes (Dagster's zlib job snapshots in runs.db):
# one clean-clone CI run found a lone "zqx" there after a purge that had left no marker.
PLANTED = re.compile(rb"zqx(?:srv|dm|new|wishname)")


def line(i: int, who: tuple[str, str]) -> str:
    if who == CASS:
        return f"Between us, my zqxsrv{i} appointment and the zqxsrv{i}clinic are on my mind"
    return f"Talking about the weather and the garden again today, item {i} from {who[1]}"


def scan(*roots: Path) -> dict[str, int]:
    """Planted-marker counts per file, over every byte under `roots` (files of any kind)."""
    found = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                n = len(PLANTED.findall(path.read_bytes()))
                if n:
                    found[str(path)] = n
    return found


@pytest.fixture
def familiar(tmp_path, fake_llm):
    root = tmp_path / "data"
    paths = make_familiar(root, extra_toml=GRAPH_TOML)
    with TurnLog(paths.turns_db) as log:
        for key, name in PEOPLE:
            log.upsert_participant(key, username=name.lower(), global_name=name)
        for i in range(1, 41):
            who = CASS if i % 4 == 0 else PEOPLE[1 + i % 2]
            log.append_turn(channel_id=CHANNEL, guild_id=GUILD, role="user", author_key=who[0], author_display=who[1],
                            content=line(i, who), created_at=BASE + timedelta(minutes=i), platform_message_id=1000 + i)
        for i in range(41, 61):  # a DM with Cass, answered by the familiar
            speaker = CASS if i % 2 else None
            log.append_turn(channel_id=DM, role="user" if speaker else "assistant", author_key=speaker and CASS[0],
                            author_display=speaker and CASS[1],
                            content=(f"Only telling you: the zqxdm{i} plan for my zqxdm{i}house move is secret"
                                     if speaker else f"I will keep it to myself, reply {i} about the weather"),
                            created_at=BASE + timedelta(minutes=i), platform_message_id=1000 + i)
    with dg.instance_for_test() as instance:
        home = Path(instance.root_directory)
        tick = sensor_driver(instance, root, start=BASE.timestamp() + 10_000)
        yield root, paths, home, instance, tick


def other_memory(paths) -> dict:
    """What the familiar remembers of everyone but Cass: facts, their subjects and vectors, full-text hits."""
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        facts = store.sql("SELECT f.id, f.text, f.source_turn_ids FROM facts f WHERE NOT EXISTS (SELECT 1 FROM "
                          "fact_subjects s WHERE s.fact_id = f.id AND s.canonical_key = ?) ORDER BY f.id",
                          [CASS[0]]).fetchall()
        vectors = store.sql("SELECT count(*) FROM fact_embeddings WHERE fact_id IN (SELECT unnest(?::BIGINT[]))",
                            [[f[0] for f in facts]]).fetchone()[0]
    # The same hits in the same order (their BM25 scores move: the corpus lost Cass's documents).
    return {"facts": facts, "vectors": vectors,
            "turn_hits": [i for i, _ in FtsIndex(paths.fts_turns).search("weather garden", 10)],
            "fact_hits": [i for i, _ in FtsIndex(paths.fts_facts).search("weather garden", 10)]}


def plant_old_traces(paths, home: Path, instance) -> None:
    """Copies the pipeline cannot rebuild: a run record whose metadata quotes a fact (as before previews
    carried ids only), a log file quoting a message, a moved-aside corrupt store, and a fact about
    Cass that Bo's words taught (the scripted model only writes facts about speakers)."""
    instance.report_runless_asset_event(dg.AssetMaterialization(
        "facts", partition="fam", metadata={"preview": dg.MetadataValue.md("| Cass said: my zqxsrv4 appointment |"),
                                            "facts": dg.MetadataValue.json([{"text": "zqxdm41 plan"}])}))
    (home / "familiar-up.log").write_text("INFO started\nWARNING reply to: Only telling you: the zqxdm43 plan\n")
    # a store once found corrupt and moved aside (`storage.corrupt`), still holding her words
    (paths.dir / "memory.duckdb.corrupt-20260101T000000.000000Z").write_bytes(b"\0zqxsrv8 appointment\0")
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_fact(store, FactDraft("Cass's sister is a nurse in Leeds.", source_turn_ids=(1,),
                                              subjects=(Subject(CASS[0], "Cass"),), scope=f"guild:{GUILD}"))


def test_forgetting_a_person_leaves_no_marker_anywhere_and_everyone_else_intact(familiar):
    root, paths, home, instance, tick = familiar
    plant_old_traces(paths, home, instance)
    before = scan(root, home)
    places = {Path(p).name.removesuffix("-wal") for p in before}
    assert {"turns.db", "memory.duckdb", "llm_cache.sqlite", "familiar-up.log",
            "memory.duckdb.corrupt-20260101T000000.000000Z"} <= places, places
    assert any(p.endswith(".parquet") for p in before) and any(p.endswith(".db") and "history" in p for p in before)
    assert FtsIndex(paths.fts_turns)._index.searcher().terms_with_prefix(CONTENT, MARK)
    kept = other_memory(paths)

    with TurnLog(paths.turns_db) as log:
        erasure = log.request_erasure(kind="person", target=CASS[0], requested_by="discord:111")
    done = tick()
    assert "turns_fts" in done

    assert scan(root, home) == {}
    for index in (paths.fts_turns, paths.fts_facts):
        assert FtsIndex(index)._index.searcher().terms_with_prefix(CONTENT, MARK) == []
    with TurnLog(paths.turns_db, readonly=True) as log:
        [record] = log.erasures()
        assert record.id == erasure.id and record.status == "done" and len(record.turn_ids) == 20
        assert log.participant(CASS[0]) is None
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        about = store.sql("SELECT count(*) FROM fact_subjects WHERE canonical_key = ?", [CASS[0]]).fetchone()[0]
        dossiers = store.sql("SELECT count(*) FROM people_dossiers WHERE canonical_key = ?", [CASS[0]]).fetchone()[0]
    assert about == 0 and dossiers == 0, "no fact or dossier about Cass, whoever's words taught it"
    assert other_memory(paths) == kept, "Bo's and Mia's memory is what it was"
    assert not tick(), "done once: nothing is due afterwards"


def test_later_messages_of_a_forgotten_person_are_answered_never_remembered(familiar):
    root, paths, home, instance, tick = familiar
    with TurnLog(paths.turns_db) as log:
        log.request_erasure(kind="person", target=CASS[0], requested_by="operator:test")
    tick()
    with TurnLog(paths.turns_db) as log:
        for i in range(61, 86):
            who = CASS if i % 2 else BO
            log.append_turn(channel_id=CHANNEL, guild_id=GUILD, role="user", author_key=who[0], author_display=who[1],
                            content=(f"New here: my zqxnew{i} hobby is something I love doing" if who == CASS
                                     else f"Bo talks about the garden and weather again, item {i}"),
                            created_at=BASE + timedelta(minutes=i))
    for _ in range(6):
        if not tick():
            break
    assert scan(root, home) == {}, "opt_out (the default): their new words are purged, never projected"
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        subjects = {r[0] for r in store.sql("SELECT DISTINCT canonical_key FROM fact_subjects").fetchall()}
        newest = store.sql("SELECT max(t) FROM (SELECT unnest(source_turn_ids) AS t FROM facts)").fetchone()[0]
    assert CASS[0] not in subjects and newest > 60, "Bo's new turns are remembered, Cass's are not"


def test_with_after_forget_new_a_forgotten_person_is_remembered_again(familiar):
    root, paths, home, instance, tick = familiar
    with paths.character_toml.open("a") as toml:
        toml.write('\n[memory.privacy]\nafter_forget = "new"\n')
    with TurnLog(paths.turns_db) as log:
        log.request_erasure(kind="person", target=CASS[0], requested_by="operator:test")
    tick()
    with TurnLog(paths.turns_db) as log:
        log.upsert_participant(CASS[0], username="cass", global_name="Cass")  # the bot sees them again
        for i in range(61, 86):
            log.append_turn(channel_id=CHANNEL, guild_id=GUILD, role="user", author_key=CASS[0], author_display="Cass",
                            content=f"Hello again, I am new here and I like painting, item {i}",
                            created_at=BASE + timedelta(minutes=i))
    for _ in range(6):
        if not tick():
            break
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        sources = [r[0] for r in store.sql("SELECT unnest(f.source_turn_ids) FROM facts f JOIN fact_subjects s "
                                           "ON s.fact_id = f.id WHERE s.canonical_key = ?", [CASS[0]]).fetchall()]
    assert sources and min(sources) > 60, "remembered from their new messages on, nothing older"


def test_a_deleted_message_loses_its_text_at_the_next_run_unless_a_retention_is_set(familiar):
    root, paths, home, instance, tick = familiar
    with TurnLog(paths.turns_db) as log:
        gone = log.record_deletion(platform_message_id=1004)  # Cass: "zqxsrv4"
    tick()
    assert _text(paths, gone.id) == "", "retention 0: purged by the run that followed it"
    with paths.character_toml.open("a") as toml:
        toml.write("\n[memory.privacy]\ndeleted_retention_hours = 24\n")
    with TurnLog(paths.turns_db) as log:
        kept = log.record_deletion(platform_message_id=1008)
    tick()
    assert "zqxsrv8 " in _text(paths, kept.id), "kept for its audit window"
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert not store.sql("SELECT count(*) FROM facts WHERE list_contains(source_turn_ids, ?)",
                             [kept.id]).fetchone()[0], "but memory forgot it at once"
    assert not tick(), "nothing is due until its window ends"
    with TurnLog(paths.turns_db) as log:
        later = datetime.now(timezone.utc) + timedelta(hours=25)
        assert due_turns(log, load_config("fam", root=root, env={}), later) == [kept.id]


def _text(paths, turn_id: int) -> str:
    with TurnLog(paths.turns_db, readonly=True) as log:
        return log.turns_by_ids([turn_id])[0].content


# --------------------------------------------------------------------------- the word scrub, directly


def test_distinctive_words_are_those_no_surviving_turn_uses():
    assert distinctive_words(["My Zqxcat Pixel sleeps", "ok"], ["pixel is a cat", "sleeps a lot"]) == {"zqxcat"}


def test_the_scrub_rewrites_free_text_only_never_structure():
    scrub = Scrubber({"facts", "zqxsecret"})
    record = {"__class__": "EventLogEntry", "user_message": "facts: zqxsecret said",
              "dagster_event": {"event_specific_data": {"asset_key": {"path": ["facts"]}},
                                "metadata": {"preview": {"__class__": "TextMetadataValue", "text": "Zqxsecret!"}}}}
    out = scrub.record(record)
    assert out["user_message"] == "[erased]: [erased] said"
    assert out["dagster_event"]["event_specific_data"]["asset_key"]["path"] == ["facts"]
    assert out["dagster_event"]["metadata"]["preview"]["text"] == "[erased]!"
    assert scrub.hits_record(json.dumps({"message": "ZQXSECRET"})) and not scrub.hits("zqxsecretive")


# --------------------------------------------------------------------------- faults


KILLED_CHILD = """
import os, signal, sys
from pathlib import Path
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource, runtime_opener
from familiar_pipeline.engine import registry
from familiar_pipeline.engine.run_loop import project_familiar
from familiar_pipeline.erasure import purge
from familiar_pipeline.storage.turns import TurnLog

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

root, home, where = sys.argv[1:4]
if where == "compact":
    TurnLog.compact = die
else:
    setattr(purge, where, die)
project_familiar(list(registry.specs()), "fam", rebuild=False,
                 open_runtime=runtime_opener(FamiliarData(data_root=root), LlmResource(), EmbedderResource()),
                 dagster_home=Path(home))
raise SystemExit("the purge was not reached")
"""


@pytest.mark.parametrize("where", ["rewrite_store", "scrub_tree", "compact"])
def test_a_run_killed_mid_erasure_and_the_next_run_finish_it(familiar, where):
    """SIGKILL inside the purge (the store being rewritten, the run history being scrubbed, the turn
    log purged but not vacuumed): the erasure stays pending, and the next tick's run finishes it."""
    import os
    import signal
    import subprocess
    import sys

    root, paths, home, instance, tick = familiar
    with TurnLog(paths.turns_db) as log:
        log.request_erasure(kind="person", target=CASS[0], requested_by="operator:test")
    env = {**os.environ, "FAMILIAR_FAKE_LLM": "familiar_pipeline.testing.scripted:careful_model",
           "FAMILIAR_DATA_ROOT": str(root)}
    child = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(root), str(home), where], env=env,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert log.erasures()[0].status == "pending"
    for _ in range(3):
        if not tick():
            break
    assert scan(root, home) == {}
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert log.erasures()[0].status == "done"


# --------------------------------------------------------------------------- the operator command


def test_familiar_forget_on_the_command_line(clean_env, tmp_path, monkeypatch, capsys, fake_llm):
    from familiar_bot.app.cli import main as cli

    from .helpers import append_chat

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    paths = make_familiar(clean_env, "fam", GRAPH_TOML)
    turns = append_chat(paths, 30)
    key = turns[0].author_key
    assert cli.main(["forget", "--familiar", "fam", "--person", "discord:1111"]) == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "no person 'discord:1111'" in err and "did you mean" in err

    assert cli.main(["forget", "--familiar", "fam", "--person", key, "--local"]) == 0
    out, err = capsys.readouterr()
    mine = [t for t in turns if t.author_key == key]
    assert f"erasure #1 recorded: {len(mine)} message(s) of {key} hidden from replies now" in out, out + err
    assert "erasure #1 done in" in out, out + err
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert all(t.content == "" and t.deleted for t in log.turns_by_ids([t.id for t in mine]))
        assert all(t.content for t in log.turns_by_ids([t.id for t in turns if t.author_key != key]))
    assert cli.main(["forget", "--familiar", "fam", "--status"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("#1 ") and f"person {key}, {len(mine)} message(s), done" in out
    assert cli.main(["forget", "--familiar", "fam", "--message", "nope", "--no-wait"]) == 1
    assert "no message 'nope'" in capsys.readouterr().err


def test_a_new_fact_about_a_forgotten_person_is_not_kept():
    from familiar_pipeline.projectors.facts.changes import about_forgotten

    cass = Subject(CASS[0], "Cass")
    about = FactDraft("Cass got a new job.", source_turn_ids=(90,), subjects=(cass,), scope="guild:1")
    elsewhere = FactDraft("Cass got a new job.", source_turn_ids=(90,), subjects=(cass,), scope="guild:2")
    old = FactDraft("Cass's sister is a nurse.", source_turn_ids=(12,), subjects=(cass,), scope="guild:1")
    forgotten = [(CASS[0], "guild:1", 60)]
    assert about_forgotten(about, forgotten, "opt_out") and about_forgotten(old, forgotten, "opt_out")
    assert not about_forgotten(about, forgotten, "new") and about_forgotten(old, forgotten, "new")
    assert not about_forgotten(elsewhere, forgotten, "opt_out"), "forgotten in one server only"
    assert about_forgotten(elsewhere, [(CASS[0], "*", 60)], "opt_out")


def test_rows_still_holding_an_erased_word_go_by_their_prose_only():
    from familiar_pipeline.erasure.purge import delete_holding
    from familiar_pipeline.engine import registry
    from familiar_pipeline.projectors.summary.tables import put_summary

    with ProjectionStore(None, tables=registry.tables()) as store:
        put_summary(store, "They talked about the Zqxword plan.", 10, scope="guild:1")
        put_summary(store, "Weather and gardens, mostly.", 10, scope="guild:2")
        gone = delete_holding(store, store.table("summaries"), Scrubber({"zqxword", "guild"}))
        assert gone == 1, "the scope column's 'guild' is not prose"
        assert [r[0] for r in store.sql("SELECT scope FROM summaries").fetchall()] == ["guild:2"]


def test_the_forget_benchmark_runs_and_leaves_no_marker():
    """`benchmarks/forget.py` at a small size: both erasures done in one run each, no marker left."""
    from benchmarks.forget import run

    result = run(300)
    message, person = result["erasures"]
    assert message["turns"] == 1 and message["runs"] == 1
    assert person["turns"] > 100 and person["runs"] == 1
    assert result["before"]["marker_files"] > 0 and result["after"]["marker_files"] == []


def test_a_person_who_never_spoke_loses_the_facts_others_taught_about_them(familiar):
    root, paths, home, instance, tick = familiar
    with TurnLog(paths.turns_db) as log:
        log.upsert_participant("discord:999", username="zed", global_name="Zed")
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_fact(store, FactDraft("Zed is moving to Oslo.", source_turn_ids=(1,),
                                              subjects=(Subject("discord:999", "Zed"),), scope=f"guild:{GUILD}"))
    with TurnLog(paths.turns_db) as log:
        erasure = log.request_erasure(kind="person", target="discord:999", requested_by="operator:test")
    assert erasure.turn_ids == ()
    tick()
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert store.sql("SELECT count(*) FROM facts WHERE text LIKE '%Oslo%'").fetchone()[0] == 0
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert log.erasures()[0].status == "done" and log.participant("discord:999") is None


def test_a_log_file_is_scrubbed_in_place_so_its_writer_keeps_writing_to_it(tmp_path):
    from familiar_pipeline.erasure.words import scrub_text_file

    log = tmp_path / "familiar-up.log"
    log.write_text("INFO start\nWARNING said zqxsecret here\n")
    with open(log, "ab", buffering=0) as writer:  # as `familiar up` holds it
        assert scrub_text_file(log, Scrubber({"zqxsecret"})) == (1, 0)
        writer.write(b"INFO after\n")
    assert log.read_text() == "INFO start\nWARNING said [erased] here\nINFO after\n"


def test_a_forgotten_wish_leaves_no_marker_and_the_older_wish_is_current_again(tmp_path, fake_llm):
    """A standing wish holding a marker (issue 33): forgetting its message removes the wish through its
    provenance and the purge leaves its words nowhere; the wish it had retired is current again."""
    root = tmp_path / "data"
    paths = make_familiar(root, extra_toml=GRAPH_TOML)  # its projectors include standing_wish
    with TurnLog(paths.turns_db) as log:
        for key, name in PEOPLE:
            log.upsert_participant(key, username=name.lower(), global_name=name)
        for i in range(1, 21):
            who = PEOPLE[1 + i % 2]
            log.append_turn(channel_id=CHANNEL, guild_id=GUILD, role="user", author_key=who[0], author_display=who[1],
                            content=line(i, who), created_at=BASE + timedelta(minutes=i), platform_message_id=1000 + i)
        for i, text in ((21, "From now on call me Cassie."), (22, "Actually, call me zqxwishname from now on.")):
            log.append_turn(channel_id=CHANNEL, guild_id=GUILD, role="user", author_key=CASS[0],
                            author_display=CASS[1], content=text, created_at=BASE + timedelta(minutes=i),
                            platform_message_id=1000 + i)
    with dg.instance_for_test() as instance:
        home = Path(instance.root_directory)
        tick = sensor_driver(instance, root, start=BASE.timestamp() + 10_000)
        with ProjectionStore(paths.memory_db, read_only=True) as store:
            held = store.sql("SELECT text, retired_at IS NULL FROM wishes ORDER BY id").fetchall()
        assert held == [("From now on call me Cassie.", False), ("Actually, call me zqxwishname from now on.", True)]
        assert scan(root, home), "the marker is held before"
        with TurnLog(paths.turns_db) as log:
            log.request_erasure(kind="message", target="1022", requested_by=CASS[0])
        assert "wishes" in tick()
        assert scan(root, home) == {}
        with ProjectionStore(paths.memory_db, read_only=True) as store:
            held = store.sql("SELECT text, retired_at IS NULL FROM wishes ORDER BY id").fetchall()
        assert held == [("From now on call me Cassie.", True)]
