"""End to end: `familiar up` with the console transport, the real `dagster dev`, the fake model.

Messages typed on stdin become turns; the turn-watermark sensor and the run queue
project them (turns index, facts); the UI's GraphQL endpoint reports the runs and
the facts materialization; an offline familiar's LLM projections say "skipped"
with the setting to change; SIGTERM stops every child.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from familiar_pipeline import webserver
from familiar_bot.app.supervisor import child_sessions, free_port, group_alive
from familiar_pipeline.storage.snapshots import SnapshotReader, read_manifest
from familiar_pipeline.projectors.facts import reads as fact_reads
from familiar_pipeline.storage.paths import FamiliarPaths
from tests.helpers import append_chat, make_familiar

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [
    "I just moved to Lisbon and I love the tiled old houses",
    "My sister Carla visits me every spring from Porto",
    "I am learning to play the cello on weekday evenings",
    "Our cat Miso refuses to eat anything except fresh tuna",
    "I work as a nurse on night shifts at the city hospital",
    "We are planning a hiking trip to Madeira next June",
    "I am allergic to peanuts so I avoid most satay dishes",
    "My favourite book this year was a long novel about whales",
    "I started a small vegetable garden on the balcony last week",
    "The tram to my work is always crowded after seven",
    "I keep a journal about every mountain walk I take",
]

# Every run of this instance: the turn sensor's runs cover a range of familiars (range tags,
# no `dagster/partition`), so filtering on one familiar's partition tag would miss them.
RUNS_QUERY = """
{
  runsOrError {
    ... on Runs { results { runId status assetSelection { path } tags { key value } } }
  }
}"""

SENSORS_QUERY = """
{ repositoriesOrError { ... on RepositoryConnection { nodes { sensors { name description } } } } }"""

LATEST_MATERIALIZATION = """
query Latest($asset: [String!]!, $partition: String!) {
  assetOrError(assetKey: {path: $asset}) {
    ... on Asset {
      assetMaterializations(partitions: [$partition], limit: 1) {
        partition runId
        metadataEntries { label ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } }
      }
    }
  }
}"""


def graphql(port: int, query: str, **variables) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=20) as response:
        payload = json.load(response)
    assert "errors" not in payload, payload
    return payload["data"]


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"familiar up exited ({process.returncode}) while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{log.read_text()[-3000:]}")


def latest(port: int, asset: str, partition: str) -> dict | None:
    found = graphql(port, LATEST_MATERIALIZATION, asset=[asset], partition=partition)["assetOrError"]
    records = (found or {}).get("assetMaterializations") or []
    if not records:
        return None
    entries = {e["label"]: e.get("text", e.get("intValue")) for e in records[0]["metadataEntries"]}
    return {"run_id": records[0]["runId"], "partition": records[0]["partition"], **entries}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_familiar_up_console_pipeline_graphql_and_clean_stop(tmp_path):
    root, home = tmp_path / "familiars", tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    online = make_familiar(root, "e2e")  # fake/careful background model
    offline = make_familiar(root, "offline", extra_toml="")  # no model at all
    append_chat(offline, 12)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DISCORD_TOKEN", "FAMILIAR_ID")
           and not k.startswith("FAMILIAR__")}
    env.update(
        FAMILIAR_DATA_ROOT=str(root), DAGSTER_HOME=str(home),
        FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model",
        FAMILIAR__PIPELINE__SENSOR_INTERVAL_S="5", PYTHONUNBUFFERED="1",
    )
    out_log, err_log = tmp_path / "up.out", tmp_path / "up.err"
    with out_log.open("wb") as out, err_log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "familiar_bot.app.cli.main", "up", "--familiar", "e2e", "--port", str(port), "--as", "Ana"],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
        )
    try:
        wait_for(lambda: "ready in" in err_log.read_text(), 180, "the UI to be ready", process, err_log)
        assert f"Dagster UI: http://127.0.0.1:{port}" in err_log.read_text()
        # It names itself in DAGSTER_HOME, so `familiar backfill` submits to it (and only to it);
        # a rebuild always indexes every turn, whichever of it and the sensor's run ends last.
        marker = webserver.read_marker(home)
        assert marker and marker.url == f"http://127.0.0.1:{port}" and marker.data_root == str(root.resolve())
        assert marker.pid == process.pid and webserver.verified_webserver(home, root) == marker
        backfill = subprocess.run([sys.executable, "-m", "familiar_bot.app.cli.main", "backfill", "--familiar", "offline",
                                   "--projection", "turns_fts", "--rebuild", "--no-wait"],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        queued = f"queued: queued turns_fts for offline: {marker.url}/runs/"
        assert backfill.returncode == 0 and backfill.stdout.startswith(queued), backfill
        assert graphql(port, "{ shouldShowNux }")["shouldShowNux"] is False  # no community pop-up

        for message in MESSAGES:
            process.stdin.write((message + "\n").encode())
            process.stdin.flush()
        # Console replies (no reply model: it says so) prove the turns went through the responder.
        wait_for(lambda: "no reply model is configured" in out_log.read_text(), 60, "a console reply", process, err_log)

        reader = SnapshotReader(online.serving_dir)

        def facts_in_snapshot():
            reader.refresh()
            return fact_reads.current_facts(reader.current())

        facts = wait_for(facts_in_snapshot, 150, "facts in the serving snapshot", process, err_log)
        assert any("Lisbon" in f.text for f in facts)

        fts = wait_for(lambda: latest(port, "turns_fts", "e2e"), 60, "turns_fts materialization", process, err_log)
        assert fts["partition"] == "e2e" and fts["status"].startswith("ok")
        fact_run = wait_for(lambda: latest(port, "facts", "e2e"), 60, "facts materialization", process, err_log)
        assert fact_run["status"].startswith("ok") and fact_run["rows_written"] >= 10

        def run_status(run_id: str) -> str | None:
            runs = graphql(port, RUNS_QUERY)["runsOrError"]["results"]
            status = {r["runId"]: r["status"] for r in runs}[run_id]
            return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

        # The asset is materialized before the run's asset checks finish: wait for the run.
        assert wait_for(lambda: run_status(fact_run["run_id"]), 60, "the facts run to end", process, err_log) == "SUCCESS"
        # Every familiar's cadence is shown in the UI, with the sensor's tick (the smallest of them).
        sensors = graphql(port, SENSORS_QUERY)["repositoriesOrError"]["nodes"][0]["sensors"]
        described = {s["name"]: s["description"] for s in sensors}
        assert described["turn_watermark_sensor"].startswith("Ticks every 5s")
        assert "(every 5s: e2e, offline)" in described["turn_watermark_sensor"]
        runs = graphql(port, RUNS_QUERY)["runsOrError"]["results"]
        triggers = {t["value"] for r in runs for t in r["tags"] if t["key"] == "trigger"}
        assert "turn_watermark_sensor" in triggers
        assert not [r for r in runs if r["status"] == "FAILURE"], runs

        skipped = wait_for(lambda: latest(port, "facts", "offline"), 90, "the offline familiar's facts", process, err_log)
        assert skipped["status"].startswith("skipped") and "[llm.background]" in skipped["status"], skipped
        # Its turns are indexed all the same (by the rebuild, or the sensor's run, whichever came first:
        # a run queued before the other ended finds nothing left and says "no-op").
        offline_fts = latest(port, "turns_fts", "offline")
        assert offline_fts and offline_fts["status"].startswith(("ok", "no-op")), offline_fts
        published = read_manifest(offline.serving_dir)
        assert published and published.store_watermark["projectors"]["turns_fts"]["turn_id"] == 12

        sessions = child_sessions(process.pid)
        assert sessions, "familiar up has no children in sessions of their own"
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        process.wait(timeout=15)
        assert time.monotonic() - started < 10.5
        assert process.returncode == 128 + signal.SIGTERM
        assert "stopped every child" in err_log.read_text()
        assert webserver.read_marker(home) is None
        deadline = time.monotonic() + 5  # orphans are reaped by init a moment later
        while any(group_alive(s) for s in sessions) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [s for s in sessions if group_alive(s)], "processes of familiar up outlived it"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for session in child_sessions(process.pid):
            try:
                os.killpg(session, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_demo_sets_the_scripted_models_for_the_demo_familiar_only(tmp_path, monkeypatch, capsys):
    """`--demo` used to set process-wide FAMILIAR__ variables: every familiar the Dagster processes
    saw got the scripted model and the demo's batch sizes. Now only the demo familiar does."""
    import argparse

    import dagster as dg

    from familiar_bot.app.cli.commands.up import enter_demo
    from familiar_pipeline.config import load_config
    from familiar_pipeline.config.demo import DEMO_FAMILIAR, DEMO_FAMILIAR_ENV
    from familiar_pipeline.defs.jobs import materialize_in_process
    from tests.helpers import sensor_tick
    from familiar_pipeline.testing.fake_llm import FAKE_LLM_ENV
    from familiar_pipeline.storage.store import ProjectionStore

    for name in (FAKE_LLM_ENV, DEMO_FAMILIAR_ENV):
        monkeypatch.setenv(name, "")  # so monkeypatch restores (removes) what enter_demo sets
        monkeypatch.delenv(name)
    args = argparse.Namespace(familiar=None)
    enter_demo(args)
    assert args.familiar == DEMO_FAMILIAR
    assert capsys.readouterr().err.count("scripted offline model") == 1
    demo = load_config(DEMO_FAMILIAR, root=tmp_path)
    assert (demo.llm.slot("reply").model, demo.llm.slot("background").model) == ("fake/demo-reply", "fake/careful")
    assert demo.memory.rich_note.batch_size == 4
    assert not list(tmp_path.iterdir()), "no file names the scripted model"

    other = load_config("demo", root=tmp_path)
    assert not other.llm.slot("reply").configured and not other.llm.slot("background").configured
    assert other.memory.rich_note.batch_size != 4

    # The sensor: four turns are a batch for the demo familiar only.
    for familiar_id in (DEMO_FAMILIAR, "demo"):
        append_chat(make_familiar(tmp_path, familiar_id, extra_toml=""), 4)
    requests, *_ = sensor_tick({}, [DEMO_FAMILIAR, "demo"], [DEMO_FAMILIAR, "demo"], root=tmp_path,
                                 in_flight={}, max_requests=10)
    due_for = requests[0].run_config["ops"]["memory"]["config"]["familiars"]
    assert due_for["facts"] == [DEMO_FAMILIAR] and "demo" not in due_for.get("rolling_summary", [])

    # A rebuild of another familiar under the demo's environment (the reported `familiar backfill
    # --familiar demo --projection facts --rebuild`) finds no model: no scripted facts in it.
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["demo"])
        result = materialize_in_process(["facts"], instance=instance, data_root=tmp_path, partition_key="demo",
                                        rebuild=True)
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path[-1] == "facts"]
    assert event.materialization.metadata["status"].value.startswith("skipped: no model configured")
    store_file = FamiliarPaths.for_id("demo", tmp_path).memory_db
    if store_file.exists():
        with ProjectionStore(store_file, read_only=True) as store:
            assert store.latest_fact_id() == 0


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_forgetting_through_familiar_up_leaves_no_copy_of_the_familiars_echoes(tmp_path):
    """Issue 47 as a new user found it: the demo's scripted replies quote each message; the person is
    forgotten with `familiar forget` while `familiar up` runs; no file under the data root or
    DAGSTER_HOME holds the marker afterwards (it was in five before: the turn log in the person's
    turns and the familiar's echoes, the store, two summary snapshots, the model cache)."""
    import re

    root, home = tmp_path / "familiars", tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DISCORD_TOKEN", "FAMILIAR_ID", "FAMILIAR_FAKE_LLM")
           and not k.startswith("FAMILIAR__")}
    env.update(FAMILIAR_DATA_ROOT=str(root), DAGSTER_HOME=str(home), FAMILIAR__PIPELINE__SENSOR_INTERVAL_S="5",
               PYTHONUNBUFFERED="1")
    marker = re.compile(rb"(?i)zqxechoconsole")

    def holding() -> list[str]:
        return sorted(str(p.relative_to(tmp_path)).removesuffix("-wal") for base in (root, home)
                      for p in base.rglob("*") if p.is_file() and marker.search(p.read_bytes()))

    out_log, err_log = tmp_path / "up.out", tmp_path / "up.err"
    with out_log.open("wb") as out, err_log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "familiar_bot.app.cli.main", "up", "--demo", "--port", str(port), "--as", "Sam"],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err)
    try:
        wait_for(lambda: "ready in" in err_log.read_text(), 180, "the UI to be ready", process, err_log)
        # One line at a time, each after the previous reply, as a person types: the log then alternates
        # line and reply, so the first summary window (4 turns) ends with the reply quoting the marker.
        # (All four at once, on a loaded machine, recorded the lines before any reply: the windows then
        # ended with the soup line and its reply, and no summary held the marker.)
        lines = ("my secret codeword is ZQXECHOCONSOLE", "I named my boat ZQXECHOCONSOLE",
                 "the tram was late again this morning", "I had soup for lunch today")
        for n, line in enumerate(lines, 1):
            process.stdin.write((line + "\n").encode())
            process.stdin.flush()
            wait_for(lambda n=n: out_log.read_text().count('Noted: "') >= n, 90, f"the demo's reply {n}", process,
                     err_log)
        assert "zqxechoconsole" in out_log.read_text().lower(), "the scripted replies quote the message"
        summaries = wait_for(lambda: [p for p in holding() if "summaries" in p], 150, "a summary holding the marker",
                             process, err_log)
        assert summaries and any(p.endswith("turns.db") for p in holding())

        demo = next(p.name for p in root.iterdir() if (p / "turns.db").exists())
        forget = subprocess.run([sys.executable, "-m", "familiar_bot.app.cli.main", "forget", "--familiar", demo,
                                 "--person", "console:sam", "--wait", "180"],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert forget.returncode == 0, forget.stdout + forget.stderr
        assert "my replies to them erased" in forget.stdout
        assert re.search(r"checked: 0 files hold any of the \d+ distinctive words", forget.stdout), forget.stdout
        assert holding() == []
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for session in child_sessions(process.pid):
            try:
                os.killpg(session, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_one_default_familiar_name_in_every_command_the_notebook_env_example_and_docs():
    """Issue 50 item 2: `familiar up`, `--demo`, `chat`, the notebook, .env.example and every documented
    command name the same familiar, so what the demo built is what the next command opens."""
    import json
    import re

    from familiar_pipeline.config.demo import DEMO_FAMILIAR
    from familiar_pipeline.config.schema import DEFAULT_FAMILIAR_ID

    assert DEMO_FAMILIAR == DEFAULT_FAMILIAR_ID == "familiar"
    assert re.search(r"^FAMILIAR_ID=(\S+)$", (REPO / ".env.example").read_text(), re.M).group(1) == DEFAULT_FAMILIAR_ID
    notebook = "".join("".join(c["source"]) for c in json.loads((REPO / "notebooks" / "facts.ipynb").read_text())["cells"])
    assert f'"data/familiars/{DEFAULT_FAMILIAR_ID}"' in notebook
    # docs/scaling.md's shards hold several familiars on purpose (a01, b03, ...): not a default.
    docs = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "scaling.md")]
    named = {(p.name, m) for p in docs for m in re.findall(r"--familiar[ =]([a-z0-9][a-z0-9_-]*)", p.read_text())}
    assert {m for _, m in named} <= {DEFAULT_FAMILIAR_ID}, sorted(named)
    paths = {(p.name, m) for p in docs for m in re.findall(r"data/familiars/([a-z0-9][a-z0-9_-]*)", p.read_text())}
    assert {m for _, m in paths} <= {DEFAULT_FAMILIAR_ID}, sorted(paths)


def _up(argv: list[str], env: dict, log_dir: Path, name: str, stdin=subprocess.DEVNULL) -> tuple[subprocess.Popen, Path, Path]:
    out_log, err_log = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with out_log.open("wb") as out, err_log.open("wb") as err:
        process = subprocess.Popen([sys.executable, "-m", "familiar_bot.app.cli.main", "up", *argv],
                                   cwd=REPO, env=env, stdin=stdin, stdout=out, stderr=err)
    return process, out_log, err_log


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for session in child_sessions(process.pid):
        try:
            os.killpg(session, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_second_familiar_up_is_refused_attaches_or_takes_over_from_a_killed_one(tmp_path):
    """Issue 50: a second `familiar up` on another port started a second daemon on the same
    DAGSTER_HOME and, on exit, deleted the first one's familiar-up.json. Now it is refused in one
    line naming the first (pid, address) and leaves the marker alone; `--attach` runs only a chat
    whose turns the first one's sensor projects; a first one killed with SIGKILL (whose dagster dev
    lives on) is taken over: its leftovers stopped, its lock and marker the new one's. And
    `familiar backfill` through it waits for its run: success, or the failed step and why."""
    from familiar_pipeline.storage.turns import TurnLog

    root, home = tmp_path / "familiars", tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    familiar = make_familiar(root, "e2e")
    broken = make_familiar(root, "broken", extra_toml="")
    broken.turns_db.write_bytes(b"this is not a database, it was overwritten " * 100)
    env = {k: v for k, v in os.environ.items() if k not in ("DISCORD_TOKEN", "FAMILIAR_ID")
           and not k.startswith("FAMILIAR__")}
    env.update(FAMILIAR_DATA_ROOT=str(root), DAGSTER_HOME=str(home), PYTHONUNBUFFERED="1",
               FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model")
    first_port, second_port, third_port = free_port(), free_port(), free_port()
    first, _, first_err = _up(["--familiar", "e2e", "--no-bot", "--port", str(first_port)], env, tmp_path, "first")
    started = [first]
    try:
        wait_for(lambda: "ready in" in first_err.read_text(), 180, "the first UI", first, first_err)
        marker = webserver.read_marker(home)
        assert marker is not None and marker.pid == first.pid

        # 1. A second one on another port: refused at once, in one line naming the first; nothing started.
        second, _, second_err = _up(["--familiar", "e2e", "--no-bot", "--port", str(second_port)], env, tmp_path,
                                    "second")
        started.append(second)
        assert second.wait(timeout=60) == 1
        refused = second_err.read_text()
        assert refused.count("\n") == 1 and refused.startswith("error: familiar up (pid "), refused
        assert f"pid {first.pid}, http://127.0.0.1:{first_port}, familiar 'e2e'" in refused
        assert "already running" in refused and "--attach" in refused
        assert not webserver.answers(f"http://127.0.0.1:{second_port}")
        assert webserver.read_marker(home) == marker, "the refused one left the marker alone"

        # 2. --attach: only a chat; the first one's sensor indexes what is said there.
        attached = subprocess.run([sys.executable, "-m", "familiar_bot.app.cli.main", "up", "--attach", "--as", "Ana"],
                                  cwd=REPO, env=env, input="hello from the attached chat\n", capture_output=True,
                                  text=True, timeout=120)
        assert attached.returncode == 0, attached.stderr
        assert f"attached to familiar up (pid {first.pid}, http://127.0.0.1:{first_port}, familiar 'e2e')" in attached.stderr
        assert "Dagster UI" not in attached.stderr
        with TurnLog(familiar.turns_db, readonly=True) as log:
            assert any(t.content == "hello from the attached chat" for t in log.turns_after(0))
        assert webserver.read_marker(home) == marker

        # 3. The first one killed outright: its dagster dev lives on, the lock does not.
        sessions = child_sessions(first.pid)
        assert sessions
        first.kill()
        first.wait()
        assert any(group_alive(s) for s in sessions), "SIGKILL leaves the children running"
        third, _, third_err = _up(["--familiar", "e2e", "--no-bot", "--port", str(third_port)], env, tmp_path, "third")
        started.append(third)
        wait_for(lambda: "ready in" in third_err.read_text(), 180, "the third UI", third, third_err)
        said = third_err.read_text()
        assert f"took over from familiar up pid {first.pid}, which is gone; stopped" in said, said
        assert not [s for s in sessions if group_alive(s)], "the killed one's dagster dev was stopped"
        assert not webserver.answers(f"http://127.0.0.1:{first_port}")
        marker = webserver.read_marker(home)
        assert marker is not None and marker.pid == third.pid and marker.url == f"http://127.0.0.1:{third_port}"
        assert webserver.running_instance(home, root)["pid"] == third.pid

        # 4. `familiar backfill` through it waits for the run and says how it ended (item 6).
        def backfill(familiar_id: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "familiar_bot.app.cli.main", "backfill", "--familiar", familiar_id,
                                   "--projection", "turns_fts", "--rebuild", "--wait", "150"],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=240)

        ok = backfill("e2e")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith("succeeded: turns_fts for e2e: ok"), ok.stdout
        assert f"http://127.0.0.1:{third_port}/runs/" in ok.stdout
        failed = backfill("broken")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert failed.stderr.startswith("error: the turns_fts run for broken failed at step memory: TurnLogError: "), \
            failed.stderr
        assert "not a usable SQLite turn log" in failed.stderr
        assert f"http://127.0.0.1:{third_port}/runs/" in failed.stderr
        _stop(third)
        assert third.returncode == 128 + signal.SIGTERM
        assert webserver.read_marker(home) is None and webserver.running_instance(home, root) is None
    finally:
        for process in started:
            _stop(process)


def test_up_refuses_while_another_holds_the_home_and_attach_needs_one_running(tmp_path, monkeypatch, capsys):
    """The quick half of the above, in this process: a held lock refuses `familiar up` before it starts
    anything (no dagster dev, no marker); --attach with nothing running is one line; a lock on the data
    root alone (another DAGSTER_HOME) refuses too."""
    from familiar_bot.app.cli.main import main

    root, home, other_home = tmp_path / "familiars", tmp_path / "home", tmp_path / "other-home"
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("FAMILIAR_ID", raising=False)
    make_familiar(root, "e2e")
    assert main(["up", "--attach", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --attach: no familiar up runs on DAGSTER_HOME"), err

    for held_home in (home, other_home):
        lock = webserver.InstanceLock.acquire(held_home, root, {"address": "http://127.0.0.1:3999", "familiar": "e2e",
                                                                  "dagster_home": str(held_home), "data_root": str(root)})
        try:
            assert main(["up", "--no-bot", "--port", str(free_port())]) == 1
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            assert f"familiar up (pid {os.getpid()}, http://127.0.0.1:3999, familiar 'e2e') on DAGSTER_HOME {held_home}" in err
            assert "is already running" in err
            assert webserver.read_marker(home) is None and not (home / "familiar-up.log").exists()
        finally:
            lock.release()
    assert webserver.running_instance(home, root) is None


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_no_ui_runs_the_daemon_and_memory_without_a_webserver(tmp_path):
    """Issue 51: a small host's group. `--no-ui` starts the Dagster daemon alone: ready once the turn
    sensor is evaluated, no port answers, no webserver marker (so `familiar backfill` runs in its own
    process), the turns of a familiar reach its published snapshot, SIGTERM stops every child;
    a second `familiar up` is refused naming it."""
    root, home = tmp_path / "familiars", tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    familiar = make_familiar(root, "small")
    env = {k: v for k, v in os.environ.items() if k not in ("DISCORD_TOKEN", "FAMILIAR_ID")
           and not k.startswith("FAMILIAR__")}
    env.update(FAMILIAR_DATA_ROOT=str(root), DAGSTER_HOME=str(home), PYTHONUNBUFFERED="1",
               FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model")
    port = free_port()
    up, _, err = _up(["--familiar", "small", "--no-bot", "--no-ui", "--port", str(port)], env, tmp_path, "small")
    try:
        wait_for(lambda: "ready in" in err.read_text(), 180, "the daemon", up, err)
        said = err.read_text()
        assert "no UI (--no-ui)" in said and "starting the daemon..." in said and "webserver" not in said
        assert not webserver.answers(f"http://127.0.0.1:{port}") and webserver.read_marker(home) is None
        processes = {Path(f"/proc/{pid}/cmdline").read_bytes() for s in child_sessions(up.pid)
                     for pid in [s] if Path(f"/proc/{pid}").exists()}
        assert any(b"dagster._daemon" in c for c in processes) and not any(b"dagster\x00dev" in c for c in processes)

        append_chat(familiar, 10)  # a whole batch: the sensor requests the run, the daemon's queue starts it
        wait_for(lambda: (read_manifest(familiar.serving_dir) or None) and
                 read_manifest(familiar.serving_dir).store_watermark["projectors"].get("turns_fts", {}).get("turn_id")
                 == 10, 240, "the turns to reach the snapshot", up, err)

        second, _, second_err = _up(["--familiar", "small", "--no-bot", "--port", str(free_port())], env, tmp_path,
                                    "second")
        assert second.wait(timeout=60) == 1
        assert f"familiar up (pid {up.pid}, no UI, familiar 'small')" in second_err.read_text()
    finally:
        sessions = child_sessions(up.pid)
        _stop(up)
    assert up.returncode == 128 + signal.SIGTERM or up.returncode == 0, err.read_text()[-2000:]
    assert "stopped every child" in err.read_text()
    assert not any(group_alive(s) for s in sessions)
