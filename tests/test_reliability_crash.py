"""Crash safety: SIGKILL pipeline runs at chosen and random points, then converge.

A child process (this module run with `python -m tests.test_reliability_crash`)
materializes every turn-driven projection with the careful model and kills itself
with SIGKILL at one point: inside an LLM call, after the store commit but before the
snapshot publish, half-way through a publish (tables written, manifest not), during
a full-text commit, or the parent kills it after a random delay. After the kills a
normal run catches up, and its store (table by table), snapshot and full-text
indexes must equal a clean run over the same turns: no turn lost, none processed
twice. The bot is killed mid-reply too: the user turn is in the log, the next start
carries on.

Default: one kill per point (CI). `FAMILIAR_RELIABILITY_FULL=1` runs 50 kills.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from familiar_pipeline.defs.jobs import materializations
from familiar_pipeline.testing.scripted import FAKE_MODELS_TOML

REPO = Path(__file__).resolve().parents[1]
POINTS = ["llm_call", "before_publish", "mid_publish", "fts_commit", "random_time"]
FULL = os.environ.get("FAMILIAR_RELIABILITY_FULL") == "1"
KILLS = 50 if FULL else len(POINTS)
TOML = """
aliases = ["Fam"]

[pipeline]
max_batches_per_run = 2

""" + FAKE_MODELS_TOML + """
[providers.memory.reflection]
turns_threshold = 20
"""


# ----------------------------------------------------------------------------- the child


def slow_careful(messages):
    """The careful model, a little slow, so a kill "inside the LLM call" has a window."""
    from familiar_pipeline.testing.scripted import careful_model

    if os.environ.get("CRASH_POINT") == "llm_call" and _hit():
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
    if "Fam, take your time" in str(messages[-1].get("content")):
        print("composing", flush=True)
        time.sleep(60)  # the bot test kills us here
    return careful_model(messages)


_calls = {"n": 0}


def _hit() -> bool:
    """True on the CRASH_AFTER-th instrumented call of this process."""
    _calls["n"] += 1
    return _calls["n"] == int(os.environ.get("CRASH_AFTER", "1"))


def _die_before(module, name: str) -> None:
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        if _hit():
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(module, name, wrapper)


def child_pipeline(root: str) -> None:
    import dagster as dg

    from familiar_pipeline.storage import fts

    from familiar_pipeline.engine import runtime

    from familiar_pipeline.storage import snapshots

    point = os.environ.get("CRASH_POINT", "")
    if point == "before_publish":
        _die_before(runtime, "publish_snapshot")
    elif point == "mid_publish":
        _die_before(snapshots.publish, "_write_manifest")
    elif point == "fts_commit":
        original = fts.FtsIndex._commit_once

        def half_commit(self):
            if _hit():
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self)

        fts.FtsIndex._commit_once = half_commit
    run_pipeline(root, dg.DagsterInstance.ephemeral())


def child_bot(root: str) -> None:
    import asyncio

    from familiar_bot.responder.messages import IncomingMessage, Person
    from familiar_bot.responder.opening import open_responder
    from familiar_pipeline.config import load_config
    from familiar_pipeline.storage.paths import FamiliarPaths

    paths = FamiliarPaths.for_id("fam", Path(root))
    handle = open_responder(paths, load_config("fam", root=Path(root), env={}))
    message = IncomingMessage(10, Person("discord:111", "ana", "Ana"), "Fam, take your time", guild_id=1, addressed=True)
    asyncio.run(handle.responder.handle(message))


# ----------------------------------------------------------------------------- shared


def assets():
    return ["turns_fts", "facts", "rolling_summary", "fact_supersessions", "people_dossiers", "reflections"]


def run_pipeline(root, instance):
    from familiar_pipeline.defs.jobs import materialize_in_process

    instance.add_dynamic_partitions("familiars", ["fam"])
    return materialize_in_process(assets(), instance=instance, data_root=root, partition_key="fam", raise_on_error=False)


def run_until_idle(root) -> int:
    import dagster as dg

    from familiar_pipeline.testing.fake_llm import fake_llm

    with fake_llm() as fake, dg.instance_for_test() as instance:
        fake.script(slow_careful)
        for rounds in range(1, 200):  # each round works off at most max_batches_per_run batches
            result = run_pipeline(root, instance)
            assert result.success
            statuses = [str(m.metadata["status"].value) for a in assets()
                        for m in materializations(result, a)]
            if all(s.startswith(("no-op", "disabled")) for s in statuses):
                return rounds
    raise AssertionError("never went idle")


def state(root: Path) -> dict:
    """Everything a reader can see, without system times: store tables, snapshot lag, index counts."""
    from familiar_pipeline.storage.snapshot_lag import snapshot_lag
    from familiar_pipeline.storage.fts import FtsIndex
    from familiar_pipeline.storage.paths import FamiliarPaths
    from familiar_pipeline.storage.store import ProjectionStore

    from .test_pipeline import SYSTEM_TIME_COLUMNS

    paths = FamiliarPaths.for_id("fam", root)
    tables = {}
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        for (table,) in store.conn.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
            cols = [c[0] for c in store.conn.execute(f"DESCRIBE {table}").fetchall()
                    if c[0] not in SYSTEM_TIME_COLUMNS and not c[0].endswith("_at")]  # wall-clock times
            tables[table] = store.conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY ALL").fetchall()
        tables["snapshot_lag"] = snapshot_lag(store, paths.serving_dir)
    tables["fts_facts_docs"] = FtsIndex(paths.fts_facts).doc_count()
    tables["fts_turns_docs"] = FtsIndex(paths.fts_turns).doc_count()
    return tables


def spawn(mode: str, root: Path, **env) -> subprocess.Popen:
    child_env = {**os.environ, "FAMILIAR_FAKE_LLM": "tests.test_reliability_crash:slow_careful",
                 "PYTHONPATH": str(REPO), **{k: str(v) for k, v in env.items()}}
    return subprocess.Popen([sys.executable, "-m", "tests.test_reliability_crash", mode, str(root)],
                            cwd=REPO, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def turns_only(tmp_path_factory):
    from .helpers import append_chat, make_familiar

    root = tmp_path_factory.mktemp("turns")
    paths = make_familiar(root, "fam", TOML)
    paths.character_md.write_text("You are Fam.")
    # The full run needs work left for 50 runs (each finished run takes up to 2 fact batches).
    scale = 8 if FULL else 1
    append_chat(paths, 60 * scale)
    append_chat(paths, 20 * scale, start=60 * scale, channel_id=11)
    return root


@pytest.fixture(scope="module")
def clean(turns_only, tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    shutil.copytree(turns_only, root, dirs_exist_ok=True)
    run_until_idle(root)
    return state(root)


@pytest.mark.timeout(3600 if FULL else 300)  # 50 spawned runs take ~10 min
def test_sigkilled_runs_converge_to_a_clean_run(turns_only, clean, tmp_path):
    shutil.copytree(turns_only, tmp_path, dirs_exist_ok=True)
    rng = random.Random(50)
    outcomes = {"killed": 0, "finished_first": 0}
    for i in range(KILLS):
        point = POINTS[i % len(POINTS)]
        child = spawn("pipeline", tmp_path, CRASH_POINT=point, CRASH_AFTER=rng.randint(1, 3))
        if point == "random_time":
            time.sleep(rng.uniform(1.0, 6.0))
            child.send_signal(signal.SIGKILL)
        child.wait(240)
        if child.returncode == -signal.SIGKILL:
            outcomes["killed"] += 1
        else:
            outcomes["finished_first"] += 1
            assert child.returncode == 0, child.stderr.read()[-3000:]
    print(f"crash points: {outcomes} over {KILLS} runs")
    assert outcomes["killed"] >= KILLS // 2, outcomes
    run_until_idle(tmp_path)
    after = state(tmp_path)
    for table in clean:
        assert after[table] == clean[table], f"{table} differs from a clean run after {KILLS} kills"


def test_a_bot_killed_mid_reply_keeps_the_turn_and_starts_again(turns_only, tmp_path):
    from familiar_pipeline.storage.turns import TurnLog

    shutil.copytree(turns_only, tmp_path, dirs_exist_ok=True)
    with TurnLog(tmp_path / "fam" / "turns.db") as log:
        before = log.recent(10, 1000)[-1].id
    child = spawn("bot", tmp_path)
    try:
        assert child.stdout.readline().strip() == "composing", child.stderr.read()[-3000:] if child.poll() else ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    with TurnLog(tmp_path / "fam" / "turns.db") as log:
        last = log.recent(10, 1000)[-1]
        assert last.id > before and last.content == "Fam, take your time" and last.role == "user"
    child = spawn("bot", tmp_path)  # a new start answers (the model is asked again)
    try:
        assert child.stdout.readline().strip() == "composing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)


if __name__ == "__main__":
    {"pipeline": child_pipeline, "bot": child_bot}[sys.argv[1]](sys.argv[2])
