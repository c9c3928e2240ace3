"""Storage faults: the bot keeps answering from the last good snapshot, the pipeline repairs.

Faults are injected on a real familiar (turn log, store, snapshot, both full-text
indexes) that the careful model has projected: a corrupt or deleted snapshot file,
a deleted full-text folder, a tantivy writer killed with SIGKILL while holding its
lock, and a disk-full OSError while a snapshot is being published.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import errno
import shutil
import signal
import subprocess
import sys
import textwrap

import dagster as dg
import pytest

from familiar_bot.responder.messages import IncomingMessage, Person
from familiar_bot.responder.opening import open_responder
from familiar_pipeline.storage import snapshots
from familiar_pipeline.storage.snapshot_lag import snapshot_lag
from familiar_pipeline.config import load_config
from familiar_pipeline.testing.fake_llm import fake_llm
from familiar_pipeline.storage.fts import FtsIndex
from familiar_pipeline.defs.jobs import materialize_in_process
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.testing.scripted import FAKE_MODELS_TOML, careful_model
from familiar_pipeline.projectors.facts import store as facts_db

from .helpers import append_chat, make_familiar

# The projection assets these tests run, by name.
facts, rolling_summary, turns_fts = "facts", "rolling_summary", "turns_fts"

TOML = """
aliases = ["Fam"]

""" + FAKE_MODELS_TOML
ASSETS = [turns_fts, facts, rolling_summary]
ANA = Person(key="discord:111", username="ana", global_name="Ana")
FACT_WORD = "bakery"  # append_chat's lines talk about the bakery


def materialize(root, instance, *, rebuild=False):
    instance.add_dynamic_partitions("familiars", ["fam"])
    return materialize_in_process(ASSETS, instance=instance, data_root=root, partition_key="fam", rebuild=rebuild,
                                  raise_on_error=False)


@pytest.fixture
def world(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    paths.character_md.write_text("You are Fam.")
    append_chat(paths, 20)
    with fake_llm() as fake, dg.instance_for_test() as instance:
        fake.script(lambda m: careful_model(m) if "atomic facts" in m[0]["content"] or "running summary" in m[0]["content"]
                    else "Still here!")
        assert materialize(tmp_path, instance).success
        yield paths, fake, instance


def ask(paths, fake, responder=None) -> tuple[list[str], str]:
    """One addressed message; the reply and the system prompt the model saw."""
    async def go(r):
        return await r.handle(IncomingMessage(10, ANA, f"Fam, what about the {FACT_WORD}?", guild_id=1, addressed=True))

    if responder is not None:
        reply = asyncio.run(go(responder))
    else:
        handle = open_responder(paths, load_config("fam", root=paths.root, env={}))
        try:
            reply = asyncio.run(go(handle.responder))
        finally:
            handle.close()
    return reply, fake.calls[-1].messages[0]["content"]


def newest_parquet(paths, table="facts"):
    manifest = snapshots.read_manifest(paths.serving_dir)
    return paths.serving_dir / manifest.tables[table].file


def facts_in_store(paths) -> int:
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return len(facts_db.current_facts(store))


@pytest.mark.parametrize("damage", ["corrupt", "delete"])
def test_damaged_snapshot_file_keeps_the_bot_answering_and_the_next_run_repairs(world, damage):
    paths, fake, instance = world
    handle = open_responder(paths, load_config("fam", root=paths.root, env={}))
    try:
        reply, prompt = ask(paths, fake, handle.responder)
        assert reply == ["Still here!"] and FACT_WORD in prompt.lower()
        target = newest_parquet(paths)
        if damage == "corrupt":
            target.write_bytes(b"PAR1 this is not parquet" * 10)
        else:
            target.unlink()
        reply, prompt = ask(paths, fake, handle.responder)
        assert reply == ["Still here!"], "a running bot keeps the last good snapshot"
        assert FACT_WORD in prompt.lower()
    finally:
        handle.close()
    assert ask(paths, fake)[0] == ["Still here!"], "a restarted bot answers even with the snapshot damaged"
    append_chat(paths, 10, start=20)
    assert materialize(paths.root, instance).success
    reply, prompt = ask(paths, fake)
    assert reply == ["Still here!"] and FACT_WORD in prompt.lower(), "the next publish repaired it"


def test_deleted_serving_folder_is_republished_by_the_next_run(world):
    paths, fake, instance = world
    shutil.rmtree(paths.serving_dir)
    assert ask(paths, fake)[0] == ["Still here!"]
    assert materialize(paths.root, instance).success, "nothing new to project, but the run still repairs"
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert snapshot_lag(store, paths.serving_dir) is None


def test_missing_fts_folders_are_rebuilt_from_the_store(world):
    paths, fake, instance = world
    expected_facts = facts_in_store(paths)
    shutil.rmtree(paths.fts_facts)
    shutil.rmtree(paths.fts_turns)
    assert ask(paths, fake)[0] == ["Still here!"], "the bot answers without its indexes"
    assert materialize(paths.root, instance).success
    assert FtsIndex(paths.fts_facts).doc_count() == expected_facts
    assert FtsIndex(paths.fts_turns).search(FACT_WORD, 5), "turns are searchable again"


def test_a_writer_killed_while_holding_the_lock_does_not_block_the_next_run(world):
    paths, fake, instance = world
    script = textwrap.dedent(f"""
        import sys, time
        from familiar_pipeline.storage.fts import FtsIndex
        index = FtsIndex(__import__("pathlib").Path({str(paths.fts_facts)!r}), writable=True)
        index.upsert(10**6, "half written by a writer that will die")
        print("holding", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        assert child.stdout.readline().strip() == "holding"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
    append_chat(paths, 10, start=20)
    assert materialize(paths.root, instance).success
    assert FtsIndex(paths.fts_facts).doc_count() == facts_in_store(paths)
    assert not FtsIndex(paths.fts_facts).search("half written writer die", 5)


def test_disk_full_during_publish_keeps_the_old_snapshot_and_the_next_run_republishes(world, monkeypatch):
    paths, fake, instance = world
    before = snapshots.read_manifest(paths.serving_dir).version
    real_write = snapshots.publish._write_manifest

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshots.publish, "_write_manifest", disk_full)
    append_chat(paths, 10, start=20)
    result = materialize(paths.root, instance)
    assert not result.success, "the fault is reported as a failed step in the UI"
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "No space left" in failure.event_specific_data.error.to_string()
    assert snapshots.read_manifest(paths.serving_dir).version == before
    assert ask(paths, fake)[0] == ["Still here!"], "the bot answers from the last good snapshot"
    assert not [p for p in paths.serving_dir.iterdir() if p.suffix == ".tmp"], "no half-written files left"

    monkeypatch.setattr(snapshots.publish, "_write_manifest", real_write)
    assert materialize(paths.root, instance).success
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert snapshot_lag(store, paths.serving_dir) is None, "the next run republished"
