"""Familiars sharded over two "hosts" on one real PostgreSQL instance, through Dagster's own daemon.

Two `familiar shard serve` (each a real `dagster api grpc` code server with its own data
root and ten familiars) and one `familiar control-plane` (the real `dagster-webserver` and
`dagster-daemon`) over a PostgreSQL server started by the `postgres_server` fixture. New
turns become facts on the shard that owns them, in runs launched through that shard's code
server; with one shard's code server stopped the other's familiars keep being projected,
and once it is back its familiars catch up while `familiar backfill` reaches the right shard.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from familiar_bot.app.supervisor import free_port
from familiar_pipeline.storage.paths import FamiliarPaths
from tests.helpers import append_chat, make_familiar
from tests.conftest import host_free

REPO = Path(__file__).resolve().parents[1]
FAMILIARS = {"a": [f"a{i:02d}" for i in range(10)], "b": [f"b{i:02d}" for i in range(10)]}
CLI = [sys.executable, "-m", "familiar_bot.app.cli.main"]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not host_free(k) and k != "DAGSTER_HOME"}
    env.update(FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model", LITELLM_LOCAL_MODEL_COST_MAP="True",
               PYTHONUNBUFFERED="1", **extra)
    return env


class Proc:
    """A `familiar` command in its own session; its stderr in a file."""

    def __init__(self, name: str, argv: list[str], tmp: Path, env: dict[str, str]):
        self.name, self.err = name, tmp / f"{name}.err"
        self.process = subprocess.Popen([*CLI, *argv], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=self.err.open("ab"), start_new_session=True)

    def wait_for(self, text: str, timeout: float = 150) -> None:
        started = time.monotonic()
        while text not in self.err.read_text(errors="replace"):
            assert self.process.poll() is None, f"{self.name} exited:\n{self.err.read_text()[-3000:]}"
            assert time.monotonic() - started < timeout, f"{self.name}: no {text!r}:\n{self.err.read_text()[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # it stops its own children (their own sessions)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def cited(paths: FamiliarPaths) -> set[int]:
    from familiar_pipeline.projectors.facts.reads import current_facts
    from familiar_pipeline.storage.snapshots import SnapshotReader

    if not paths.serving_dir.exists():
        return set()
    reader = SnapshotReader(paths.serving_dir)
    reader.refresh()
    return {t for fact in current_facts(reader) for t in fact.source_turn_ids}


def wait_for_facts(paths: list[FamiliarPaths], since: dict[str, int], timeout: float, procs=()) -> float:
    """Wait until every familiar has a fact citing a turn newer than `since[id]`; seconds waited."""
    started = time.monotonic()
    while True:
        for proc in procs:
            assert proc.process.poll() is None, f"{proc.name} exited:\n{proc.err.read_text()[-3000:]}"
        late = [p.familiar_id for p in paths if not any(t > since[p.familiar_id] for t in cited(p))]
        if not late:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"no new facts after {timeout:.0f}s for {late}"
        time.sleep(1)


LINEAGE_QUERY = """
query { assetNodes { assetKey { path } dependencyKeys { path } partitionKeys repository { location { name } } } }
"""


def ui_shows_every_shard(ui_port: int) -> None:
    """The control plane's UI (its GraphQL, what the asset graph page reads) lists each shard's assets in
    that shard's location, with their lineage inside the shard and the shard's familiars as partitions."""
    from familiar_pipeline.backfill import graphql_client

    nodes = graphql_client(f"http://127.0.0.1:{ui_port}")._execute(LINEAGE_QUERY)["assetNodes"]
    for shard, familiars in FAMILIARS.items():
        mine = {tuple(n["assetKey"]["path"]): n for n in nodes if n["assetKey"]["path"][0] == f"shard_{shard}"}
        assert (f"shard_{shard}", "facts") in mine and (f"shard_{shard}", "turns_fts") in mine, sorted(mine)
        assert {n["repository"]["location"]["name"] for n in mine.values()} == {f"familiar_shard_{shard}"}
        facts = mine[(f"shard_{shard}", "facts")]
        assert sorted(facts["partitionKeys"]) == familiars
        upstream = {tuple(d["path"]) for n in mine.values() for d in n["dependencyKeys"]}
        assert upstream and all(key[0] == f"shard_{shard}" for key in upstream), "lineage stays inside the shard"
        assert (f"shard_{shard}", "facts") in upstream, "what is built on the facts shows as downstream of them"


def location_of(run) -> str:
    return run.remote_job_origin.repository_origin.code_location_origin.location_name


def test_unreachable_instance_and_bad_shard_are_one_line_errors(tmp_path, postgres_url):
    env = cli_env()
    dead = f"postgresql://someone:hunter2@127.0.0.1:{free_port()}/db"
    for argv in (["control-plane", "--instance", dead, "--shard", "a=127.0.0.1:4000", "--home", str(tmp_path / "cp")],
                 ["shard", "serve", "--shard", "a", "--data-root", str(tmp_path / "a"), "--instance", dead],
                 ["up", "--no-bot", "--instance", dead]):
        result = subprocess.run([*CLI, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: cannot reach the Dagster instance's PostgreSQL"), lines
        assert "hunter2" not in result.stderr
    result = subprocess.run([*CLI, "shard", "serve", "--shard", "A!", "--data-root", str(tmp_path / "a"),
                             "--instance", postgres_url], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.startswith("error: invalid shard name 'A!'"), result.stderr
    result = subprocess.run([*CLI, "control-plane", "--instance", postgres_url, "--shard", "a=nowhere"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "expected NAME=HOST:PORT" in result.stderr, result.stderr
    result = subprocess.run([*CLI, "control-plane", "--instance", postgres_url, "--shard", "a=127.0.0.1:4000",
                             "--max-run-seconds", "-1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--max-run-seconds must be 0" in result.stderr, result.stderr
    # `familiar backfill --shard` names the shards of the control plane its DAGSTER_HOME's marker points to
    from familiar_pipeline.webserver import write_control_plane_marker

    home = tmp_path / "cp"
    home.mkdir()
    write_control_plane_marker(home, "http://127.0.0.1:1", {"a": "127.0.0.1:2", "b": "127.0.0.1:3"})
    bad = subprocess.run([*CLI, "backfill", "--familiar", "b03", "--projection", "facts", "--shard", "c"],
                         cwd=REPO, env=cli_env(DAGSTER_HOME=str(home)), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.strip() == (
        "error: unknown shard 'c': the control plane at http://127.0.0.1:1 serves a, b"), bad.stderr


def test_the_control_plane_instance_bounds_a_run_and_gives_each_shard_its_lanes():
    from familiar_pipeline.instance import DEFAULT_MAX_RUNTIME_S, postgres_config

    config = postgres_config(shards=True)
    assert "run_launcher" not in config and "event_log_storage" not in config  # Dagster's DefaultRunLauncher, Postgres log
    assert config["run_monitoring"]["enabled"] and config["run_monitoring"]["max_runtime_seconds"] == DEFAULT_MAX_RUNTIME_S
    lanes = next(lim for lim in config["run_queue"]["tag_concurrency_limits"] if lim["key"] == "familiar/queue")
    assert lanes["value"] == {"applyLimitPerUniqueValue": True}
    assert "max_runtime_seconds" not in postgres_config(shards=True, max_runtime_s=0)["run_monitoring"]
    single = postgres_config(shards=False)  # one host: the preloaded launcher, no run bound
    assert single["run_launcher"]["class"] == "PreloadedRunLauncher"
    assert "max_runtime_seconds" not in single.get("run_monitoring", {})


def runs_of(instance, shard: str, statuses=None) -> list:
    import dagster as dg

    return [r for r in instance.get_runs(filters=dg.RunsFilter(statuses=statuses) if statuses else None)
            if location_of(r) == f"familiar_shard_{shard}"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_shards_project_their_own_familiars_and_survive_each_other(tmp_path, postgres_url, monkeypatch):
    import json

    import dagster as dg

    from familiar_pipeline.instance import DEFAULT_MAX_RUNTIME_S, validate_url

    roots = {s: tmp_path / f"host_{s}" / "familiars" for s in FAMILIARS}
    paths = {f: make_familiar(roots[s], f) for s, ids in FAMILIARS.items() for f in ids}
    ports = {s: free_port() for s in FAMILIARS}
    ui_port = free_port()
    home = tmp_path / "control-plane"
    env = cli_env()

    def serve(shard: str) -> Proc:
        return Proc(f"shard-{shard}", ["shard", "serve", "--shard", shard, "--data-root", str(roots[shard]),
                                       "--familiars", ",".join(FAMILIARS[shard]), "--instance", postgres_url,
                                       "--port", str(ports[shard])], tmp_path, env)

    procs: dict[str, Proc] = {}
    monkeypatch.setenv("FAMILIAR_INSTANCE_URL", validate_url(postgres_url))
    try:
        # The control plane starts with the code servers: its daemon and webserver find the
        # locations unreachable at first and load each one as soon as its server answers.
        procs["a"], procs["b"] = serve("a"), serve("b")
        procs["cp"] = Proc("control-plane", ["control-plane", "--instance", postgres_url, "--home", str(home),
                                             "--port", str(ui_port), *(x for s in FAMILIARS for x in
                                                                       ("--shard", f"{s}=127.0.0.1:{ports[s]}"))],
                           tmp_path, env)
        for p in paths.values():  # ten turns (one full batch) in each of the 20 familiars, before anything is up
            append_chat(p, 10)
        for proc in procs.values():
            proc.wait_for("ready")
        started = time.monotonic()

        # 1. The turns become facts on their own shard.
        took = wait_for_facts(list(paths.values()), {f: 0 for f in paths}, timeout=150, procs=procs.values())
        print(f"20 familiars' first facts {took:.1f}s after everything was ready")
        for shard, root in roots.items():  # no shard's runs made a folder for another shard's familiar
            assert sorted(p.name for p in root.iterdir() if not p.name.startswith("_")) == FAMILIARS[shard]

        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
            assert instance.run_monitoring_enabled
            assert instance.run_monitoring_max_runtime_seconds == DEFAULT_MAX_RUNTIME_S
            assert sorted(instance.get_dynamic_partitions("familiars_a")) == FAMILIARS["a"]
            assert sorted(instance.get_dynamic_partitions("familiars_b")) == FAMILIARS["b"]
            ui_shows_every_shard(ui_port)
            sensor_runs = [r for r in instance.get_runs() if "familiar/turn_ids" in r.tags]
            assert {location_of(r) for r in sensor_runs} == {"familiar_shard_a", "familiar_shard_b"}
            for run in sensor_runs:  # each run launched through the code server of the shard owning its familiars
                shard = location_of(run).removeprefix("familiar_shard_")
                assert set(json.loads(run.tags["familiar/turn_ids"])) <= set(FAMILIARS[shard]), run.tags
                assert all(key.path[0] == f"shard_{shard}" for key in run.asset_selection or ())
                assert run.tags["familiar/queue"] == f"projections_{shard}"

            # 2. Shard b's code server goes down between runs (its facts are written; the rest of
            # its run finishes first: a run in flight on a dead host is run monitoring's, see
            # docs/scaling.md); shard a's familiars keep getting facts.
            deadline = time.monotonic() + 120
            in_flight = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                         dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
            while runs_of(instance, "b", in_flight):
                assert time.monotonic() < deadline, "shard b's runs did not finish"
                time.sleep(0.5)
            procs["b"].stop()
            marks = {f: max(cited(p)) for f, p in paths.items()}
            b_runs = len(runs_of(instance, "b"))
            for p in paths.values():
                append_chat(p, 10, start=10)
            took = wait_for_facts([paths[f] for f in FAMILIARS["a"]], marks, timeout=120)
            print(f"shard a's new facts with shard b down after {took:.1f}s")
            assert all(max(cited(paths[f])) == marks[f] for f in FAMILIARS["b"])  # nothing ran for b meanwhile
            assert len(runs_of(instance, "b")) == b_runs

            # 3. Shard b comes back on its address and its familiars catch up from their watermarks;
            # meanwhile `familiar backfill` (the control plane's DAGSTER_HOME, no --shard) finds a03
            # among the shards' partitions, queues its run in shard a's location and waits for it to end.
            procs["b"] = serve("b")
            backfill = subprocess.Popen([*CLI, "backfill", "--familiar", "a03", "--projection", "rolling_summary"],
                                        cwd=REPO, env=cli_env(DAGSTER_HOME=str(home)), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
            procs["b"].wait_for("ready")
            took = wait_for_facts([paths[f] for f in FAMILIARS["b"]], marks, timeout=150)
            print(f"shard b caught up {took:.1f}s after it was back")
            out, err = backfill.communicate(timeout=120)
            assert backfill.returncode == 0, err
            assert out.startswith("succeeded: rolling_summary for a03: ") and "on shard a: " in out, out
            run_id = out.strip().rsplit("/", 1)[-1].rstrip(")")
            deadline = time.monotonic() + 90
            while not (run := instance.get_run_by_id(run_id)).is_finished:
                assert time.monotonic() < deadline, run.status
                time.sleep(0.5)
            assert run.status == dg.DagsterRunStatus.SUCCESS
            assert location_of(run) == "familiar_shard_a" and run.tags["dagster/partition"] == "a03"
            assert [key.path for key in run.asset_selection] == [["shard_a", "rolling_summary"]]
        print(f"whole test body {time.monotonic() - started:.0f}s after everything was ready")
        assert procs["cp"].process.poll() is None and procs["a"].process.poll() is None
    finally:
        for proc in procs.values():
            proc.stop()
    for proc in procs.values():
        assert proc.process.poll() is not None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_familiar_up_on_a_postgres_instance_keeps_the_preloaded_launcher(tmp_path, postgres_url, monkeypatch):
    """One host, `familiar up --instance`: Dagster's Postgres storage, runs still forked from the preloaded process."""
    import dagster as dg

    from familiar_pipeline.instance import validate_url
    from familiar_pipeline.run_launcher import PID_TAG

    root, home = tmp_path / "familiars", tmp_path / "home"
    fam = make_familiar(root, "solo")
    up = Proc("up", ["up", "--no-bot", "--familiar", "solo", "--port", str(free_port()), "--instance", postgres_url],
              tmp_path, cli_env(FAMILIAR_DATA_ROOT=str(root), DAGSTER_HOME=str(home)))
    try:
        up.wait_for("ready in")
        assert "# Written by familiar up --instance" in (home / "dagster.yaml").read_text()
        assert postgres_url.split("@")[0] not in (home / "dagster.yaml").read_text()
        append_chat(fam, 10)
        wait_for_facts([fam], {"solo": 0}, timeout=120, procs=[up])
    finally:
        up.stop()
    monkeypatch.setenv("FAMILIAR_INSTANCE_URL", validate_url(postgres_url))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.run_launcher).__name__ == "PreloadedRunLauncher"
        runs = [r for r in instance.get_runs() if "familiar/turn_ids" in r.tags]
        assert runs and all(PID_TAG in r.tags for r in runs)  # forked, not started the stock way
