"""Many familiars on one host: freshness, backlog, runs and CPU at a steady total message rate.

Starts the real `familiar up --no-bot` (as `benchmarks/freshness.py` does: its own
DAGSTER_HOME and data root, the scripted model) with `--familiars` familiars, then
appends `--rate` messages per second in total, spread round-robin over them, for
`--duration` seconds, waits up to `--drain` seconds for the last facts, then up to
`--settle` seconds for the runs still queued or running (the followers). Prints:

* freshness p50/p95: a message appended -> a fact citing it in that familiar's
  serving snapshot (the bot's view), over the messages that got there;
* batch lag p50/p95: a batch's last message appended -> its facts visible (the
  messages of one familiar whose facts appeared in the same look at its snapshot
  count as one batch): what is left once the wait for the batch to fill is taken out;
* backlog: messages without a citing fact when the drain ended;
* runs: launched, and by status when the group stopped (queued ones are backlog too);
* busy CPU-s per 1,000 turns: user+system CPU of `familiar up` and every process in
  its children's sessions (webserver, daemon, code servers, run workers), sampled
  from /proc every `SAMPLE_S` (a process's last fraction of a sample is missed);
  it includes the idle cost of the webserver and daemon;
* peak RSS of that group;
* familiars whose snapshot still lists pending assets at the end (a run that yielded its
  second pass to a waiting run leaves them to the turn sensor): 0 once every follower ran;
* familiars per run (the turn sensor's runs cover every due familiar) and the
  per-run time breakdown from the event log (medians): queued (requested -> launched),
  start (launched -> the worker's RUN_START: process spawn, imports, code location load),
  each step (STEP_START -> its end), finish (last step -> run end).

A quiet familiar's last batch closes `quiet_s` after its last message (set with
`--quiet-s`, default 20), so the drain should be longer than that.

`--order`: `round-robin` sends message n to familiar n mod N, so every familiar fills
its batch in the same few seconds (the worst case: N batches close at once); `random`
sends each message to a familiar drawn at random (seeded), as independent users would.

    uv run python benchmarks/scale.py --familiars 3 --rate 1 --duration 30
    uv run python benchmarks/scale.py --sweep 1,10,100,1000 --out docs/bench   # the curve: scale.json, scale.png
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402
sys.path.insert(0, str(REPO / "benchmarks"))

from familiar_bot.app.supervisor import child_sessions, free_port, processes_in_sessions, rss_bytes  # noqa: E402
from familiar_pipeline.config import load_config  # noqa: E402
from familiar_pipeline.projectors.facts.reads import current_facts  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.storage.snapshots import SnapshotReader, read_manifest  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402
from freshness import percentile, start_up, stop_up, wait_ready  # noqa: E402

SAMPLE_S = 0.5
TICKS = os.sysconf("SC_CLK_TCK")


class GroupSampler(threading.Thread):
    """Samples CPU ticks per process and summed RSS of `familiar up`'s process group."""

    def __init__(self, root_pid: int):
        super().__init__(daemon=True)
        self.root_pid = root_pid
        self.ticks: dict[tuple[int, float], int] = {}  # (pid, start time) -> last seen utime+stime
        self.peak_rss = 0
        self.stopped = threading.Event()

    def pids(self) -> set[int]:
        return {self.root_pid, *processes_in_sessions(child_sessions(self.root_pid))}

    def sample(self) -> None:
        rss = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # fields[0] is the state (field 3 of stat): utime 14, stime 15, starttime 22
            self.ticks[(pid, float(fields[19]))] = int(fields[11]) + int(fields[12])
            rss += rss_bytes(pid)
        self.peak_rss = max(self.peak_rss, rss)

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            time.sleep(SAMPLE_S)

    def cpu_seconds(self) -> float:
        return sum(self.ticks.values()) / TICKS


def prepare(tmp: Path, familiars: int) -> list[FamiliarPaths]:
    home = tmp / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    out = []
    for i in range(familiars):
        paths = FamiliarPaths.for_id(f"f{i:04d}", tmp / "familiars")
        paths.dir.mkdir(parents=True)
        paths.character_toml.write_text('[llm.background]\nmodel = "fake/careful"\n')
        with TurnLog(paths.turns_db) as log:
            log.upsert_participant("discord:1", global_name="Ana")
        out.append(paths)
    return out


def drive(familiars: list[FamiliarPaths], rate: float, duration: float, drain: float,
          order: str = "round-robin") -> tuple[dict, dict]:
    """Append the messages, watch the snapshots; (appended, visible): (familiar, turn id) -> monotonic time."""
    pick = random.Random(0)
    logs = [TurnLog(p.turns_db) for p in familiars]
    readers = [SnapshotReader(p.serving_dir) for p in familiars]
    appended: dict[tuple[int, int], float] = {}
    visible: dict[tuple[int, int], float] = {}
    pending: dict[int, set[int]] = defaultdict(set)
    total = int(rate * duration)
    started = time.monotonic()
    next_check = started
    try:
        while True:
            now = time.monotonic()
            while len(appended) < total and started + len(appended) / rate <= now:
                n = len(appended)
                f = n % len(familiars) if order == "round-robin" else pick.randrange(len(familiars))
                turn = logs[f].append_turn(channel_id=1, role="user", author_key="discord:1", author_display="Ana",
                                           content=f"Message {n}: I keep a journal about mountain walk number {n}")
                appended[(f, turn.id)] = time.monotonic()
                pending[f].add(turn.id)
            if now >= next_check:
                for f in [f for f, ids in pending.items() if ids]:
                    readers[f].refresh()
                    cited = {t for fact in current_facts(readers[f]) for t in fact.source_turn_ids}
                    seen = time.monotonic()  # one look: the messages it finds cited form one batch
                    for turn_id in pending[f] & cited:
                        visible[(f, turn_id)] = seen
                    pending[f] -= cited
                next_check = time.monotonic() + SAMPLE_S
            if len(appended) == total and (not any(pending.values()) or now > started + duration + drain):
                break
            time.sleep(0.02)
    finally:
        for log in logs:
            log.close()
    return appended, visible


def batch_lags(appended: dict, visible: dict) -> list[tuple[float, int]]:
    """Per batch (one familiar's messages that became visible together): (visible - its last message appended, size)."""
    batches: dict[tuple[int, float], list] = {}
    for (f, turn_id), seen in visible.items():
        batch = batches.setdefault((f, seen), [0.0, 0])
        batch[0], batch[1] = max(batch[0], appended[(f, turn_id)]), batch[1] + 1
    return sorted((seen - last, size) for (f, seen), (last, size) in batches.items())


def lag_figures(lags: list[tuple[float, int]], batch_size: int, quiet_s: int) -> dict:
    """Batch lag p50/p95: all batches; full ones (closed at `batch_size`); quiet ones after their close.

    A batch short of `batch_size` closes only once `quiet_s` has passed since its last
    message, so its lag includes that wait by design (the shipped `quiet_s` is 120 s; the
    issue bounds a lone message by `quiet_s` + 15 s): it is reported from its close.
    """
    def pct(values: list[float]) -> dict:
        return {"p50_s": round(percentile(values, 0.5), 1), "p95_s": round(percentile(values, 0.95), 1),
                "n": len(values)} if values else {"p50_s": None, "p95_s": None, "n": 0}

    every = sorted(lag for lag, _ in lags)
    full = sorted(lag for lag, size in lags if size >= batch_size)
    quiet = sorted(lag - quiet_s for lag, size in lags if size < batch_size)
    return {"batch_lag_p50_s": pct(every)["p50_s"], "batch_lag_p95_s": pct(every)["p95_s"],
            "full_batch_lag": pct(full), "quiet_batch_after_close": pct(quiet)}


def wait_for_runs(dagster_home: Path, timeout: float) -> float:
    """Wait until no run is queued or running (the followers of the last facts), at most `timeout` s."""
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    import dagster as dg

    in_flight = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                 dg.DagsterRunStatus.STARTED]
    started = time.monotonic()
    with dg.DagsterInstance.get() as instance:
        while time.monotonic() - started < timeout:
            if not instance.get_runs_count(filters=dg.RunsFilter(statuses=in_flight)):
                break
            time.sleep(1)
    return time.monotonic() - started


def run_breakdown(dagster_home: Path) -> dict:
    """Runs by status and the median time of each phase of a finished run, from the event log."""
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    import dagster as dg

    kinds = dg.DagsterEventType
    enqueued, starting, start = kinds.RUN_ENQUEUED.value, kinds.RUN_STARTING.value, kinds.RUN_START.value
    success, failure = kinds.RUN_SUCCESS.value, kinds.RUN_FAILURE.value
    phases: dict[str, list[float]] = defaultdict(list)
    failures: list[str] = []
    served: list[int] = []
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs()
        statuses = Counter(r.status.value for r in runs)
        for run in runs:
            if "familiar/turn_ids" in run.tags:
                served.append(len(json.loads(run.tags["familiar/turn_ids"])))
            times: dict[str, float] = {}
            step_start: dict[str, float] = {}
            for record in instance.get_records_for_run(run.run_id).records:
                entry = record.event_log_entry
                event = entry.dagster_event
                if event is None:
                    if entry.level >= 40 and len(failures) < 3:  # one familiar's failure inside a run over many
                        failures.append(f"{run.run_id[:8]}: {entry.user_message[:400]}")
                    continue
                kind = event.event_type_value
                if kind in (enqueued, starting, start, success, failure):
                    times.setdefault(kind, entry.timestamp)
                elif kind == "STEP_START":
                    step_start[event.step_key] = entry.timestamp
                if kind in (failure, "STEP_FAILURE") and len(failures) < 3:
                    error = getattr(event.event_specific_data, "error", None)
                    message = (getattr(error, "message", None) or entry.message)[:400]
                    failures.append(f"{run.tags.get('dagster/partition', '?')}: {kind} {event.step_key or ''} {message}")
                if kind in ("STEP_SUCCESS", "STEP_FAILURE") and event.step_key in step_start:
                    phases[f"step {event.step_key}"].append(entry.timestamp - step_start[event.step_key])
                    times["last_step_end"] = max(times.get("last_step_end", 0), entry.timestamp)
            end = times.get(success) or times.get(failure)
            if enqueued in times and starting in times:
                phases["queued"].append(times[starting] - times[enqueued])
            if starting in times and start in times:
                phases["start (spawn, imports, load)"].append(times[start] - times[starting])
            if end and "last_step_end" in times:
                phases["finish"].append(end - times["last_step_end"])
            if end and starting in times:
                phases["launched -> end"].append(end - times[starting])
    median = {k: {"median_s": round(statistics.median(v), 2), "n": len(v)} for k, v in sorted(phases.items())}
    per_run = {"median": statistics.median(served), "max": max(served), "sensor_runs": len(served)} if served else {}
    return {"runs": len(runs), "by_status": dict(statuses), "familiars_per_sensor_run": per_run, "phases": median,
            "first_failures": failures}


def measure(familiars: int, rate: float, duration: float, drain: float, quiet_s: int, sensor_interval: int | None,
            settle: float = 120, order: str = "round-robin", batch_size: int | None = None) -> dict:
    load_at_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        paths = prepare(tmp, familiars)
        os.environ["FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__QUIET_S"] = str(quiet_s)  # start_up copies os.environ
        if batch_size is not None:
            os.environ["FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE"] = str(batch_size)
        else:
            os.environ.pop("FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE", None)
        os.environ["FAMILIAR_DATA_ROOT"] = str(tmp / "familiars")
        process, err = start_up(tmp, free_port(), sensor_interval, familiar=paths[0].familiar_id)
        sampler = GroupSampler(process.pid)
        try:
            ready = wait_ready(process, err)
            print(f"ready after {ready:.1f}s; {familiars} familiars, {rate} messages/s for {duration}s", flush=True)
            sampler.start()
            cpu_before = sampler.cpu_seconds()
            appended, visible = drive(paths, rate, duration, drain, order)
            settled = wait_for_runs(tmp / "dagster_home", settle)
            pending = left_pending(paths, tmp / "dagster_home", settle)
            sampler.stopped.set()
            sampler.join()
            sampler.sample()
            cpu = sampler.cpu_seconds() - cpu_before
        finally:
            if process.poll() is None:
                stop_up(process)
        fresh = sorted(visible[k] - appended[k] for k in visible)
        lags = batch_lags(appended, visible)
        shipped = load_config(paths[0].familiar_id, root=tmp / "familiars").memory.rich_note.batch_size
        result = {
            "familiars": familiars, "messages_per_s": rate, "duration_s": duration, "quiet_s": quiet_s, "order": order,
            "batch_size": batch_size or "default",
            "messages": len(appended), "with_facts": len(visible), "backlog_messages": len(appended) - len(visible),
            "freshness_p50_s": round(percentile(fresh, 0.5), 1) if fresh else None,
            "freshness_p95_s": round(percentile(fresh, 0.95), 1) if fresh else None,
            "batches": len(lags),
            **lag_figures(lags, shipped, quiet_s),
            "settle_s": round(settled, 1),  # after the drain, until no run was queued or running
            # Familiars whose snapshot still lists assets a run left for later (a run that yielded
            # its second pass): 0 once the followers caught up.
            "familiars_with_pending_assets": pending,
            "busy_cpu_s": round(cpu, 1),
            "busy_cpu_s_per_1000_turns": round(cpu / max(1, len(appended)) * 1000),
            "peak_rss_mib": round(sampler.peak_rss / 2**20),
            "load_average_1m_at_start": load_at_start,
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        }
        result.update(run_breakdown(tmp / "dagster_home"))
        return result


def left_pending(paths: list[FamiliarPaths], dagster_home: Path, timeout: float, ticks: int = 3) -> int:
    """How many familiars' manifests still list pending assets (planned by a run, not run yet).

    A run that yielded its second pass leaves them to the turn sensor's next tick: looked at
    again after a few sensor intervals and the runs they bring, until none is left.
    """
    def count() -> int:
        return sum(1 for p in paths if (m := read_manifest(p.serving_dir)) is not None and m.pending_assets)

    for _ in range(ticks):
        if not count():
            break
        time.sleep(8)  # a sensor interval, its tick over every familiar, the dequeue
        wait_for_runs(dagster_home, timeout)
    return count()


class ShardedSampler(GroupSampler):
    """CPU and RSS of every `familiar` command started (each with its children's sessions) plus the PostgreSQL server."""

    def __init__(self, root_pids: list[int], postgres_folder: Path):
        super().__init__(root_pids[0])
        self.root_pids, self.postgres_folder = root_pids, str(postgres_folder)

    def pids(self) -> set[int]:
        pids = set(self.root_pids)
        for root in self.root_pids:
            pids |= set(processes_in_sessions(child_sessions(root)))
        for entry in Path("/proc").iterdir():  # the postmaster and its backends: their data folder is in the command line
            if entry.name.isdigit():
                try:
                    if self.postgres_folder in (entry / "cmdline").read_text(errors="replace") or \
                            (entry / "comm").read_text().startswith("postgres"):
                        pids.add(int(entry.name))
                except OSError:
                    continue
        return pids


def measure_sharded(shards: int, familiars: int, rate: float, duration: float, drain: float, quiet_s: int,
                    settle: float = 120) -> dict:
    """The same load as `measure`, on `shards` code servers (`familiar shard serve`, a data root each) and one
    `familiar control-plane` over a PostgreSQL server of its own: Dagster's DefaultRunLauncher, runs started by
    each shard's code server. Familiars are dealt round-robin over the shards."""
    import signal
    import subprocess

    from familiar_pipeline.instance import INSTANCE_URL_ENV, validate_url
    from tests.postgres import start_postgres

    load_at_start = round(os.getloadavg()[0], 2)
    server = start_postgres()
    procs: list[subprocess.Popen] = []
    try:
        url = server.create_database("bench")
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            names = [chr(ord("a") + i) for i in range(shards)]
            paths: list[FamiliarPaths] = []
            owned: dict[str, list[str]] = {s: [] for s in names}
            for i in range(familiars):
                shard = names[i % shards]
                p = FamiliarPaths.for_id(f"f{i:04d}", tmp / f"host_{shard}" / "familiars")
                p.dir.mkdir(parents=True)
                p.character_toml.write_text('[llm.background]\nmodel = "fake/careful"\n')
                with TurnLog(p.turns_db) as log:
                    log.upsert_participant("discord:1", global_name="Ana")
                paths.append(p)
                owned[shard].append(p.familiar_id)
            env = dict(os.environ, FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model",
                       LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1",
                       FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__QUIET_S=str(quiet_s))
            env.pop("DISCORD_TOKEN", None)
            cli = [sys.executable, "-m", "familiar_bot.app.cli.main"]

            def start(tag: str, argv: list[str]) -> Path:
                err = tmp / f"{tag}.err"
                procs.append(subprocess.Popen([*cli, *argv], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=err.open("wb"), start_new_session=True))
                return err

            ports = {s: free_port() for s in names}
            errs = [start(f"shard-{s}", ["shard", "serve", "--shard", s, "--data-root", str(tmp / f"host_{s}" / "familiars"),
                                         "--familiars", ",".join(owned[s]), "--instance", url, "--port", str(ports[s])])
                    for s in names]
            home = tmp / "control-plane"
            errs.append(start("control-plane", ["control-plane", "--instance", url, "--home", str(home), "--port",
                                                str(free_port()), *(x for s in names for x in ("--shard", f"{s}=127.0.0.1:{ports[s]}"))]))
            started = time.monotonic()
            while not all("ready" in e.read_text() for e in errs):
                if any(p.poll() is not None for p in procs) or time.monotonic() - started > 240:
                    raise RuntimeError("not ready:\n" + "\n".join(e.read_text()[-1500:] for e in errs))
                time.sleep(0.2)
            print(f"{shards} shard(s) ready after {time.monotonic() - started:.1f}s; {familiars} familiars, "
                  f"{rate} messages/s for {duration}s", flush=True)
            os.environ[INSTANCE_URL_ENV] = validate_url(url)
            sampler = ShardedSampler([p.pid for p in procs], server.folder)
            sampler.start()
            cpu_before = sampler.cpu_seconds()
            appended, visible = drive(paths, rate, duration, drain)
            settled = wait_for_runs(home, settle)
            sampler.stopped.set()
            sampler.join()
            sampler.sample()
            cpu = sampler.cpu_seconds() - cpu_before
            fresh = sorted(visible[k] - appended[k] for k in visible)
            lags = batch_lags(appended, visible)
            shipped = load_config(paths[0].familiar_id, root=paths[0].root).memory.rich_note.batch_size
            result = {
                "shards": shards, "familiars": familiars, "messages_per_s": rate, "duration_s": duration, "quiet_s": quiet_s,
                "instance": "postgres", "run_launcher": "DefaultRunLauncher (each shard's code server)",
                "messages": len(appended), "with_facts": len(visible), "backlog_messages": len(appended) - len(visible),
                "messages_per_s_with_facts": round(len(visible) / max(1e-9, duration), 2),
                "freshness_p50_s": round(percentile(fresh, 0.5), 1) if fresh else None,
                "freshness_p95_s": round(percentile(fresh, 0.95), 1) if fresh else None,
                "batches": len(lags), **lag_figures(lags, shipped, quiet_s), "settle_s": round(settled, 1),
                "busy_cpu_s": round(cpu, 1), "busy_cpu_s_per_1000_turns": round(cpu / max(1, len(appended)) * 1000),
                "peak_rss_mib": round(sampler.peak_rss / 2**20),
                "load_average_1m_at_start": load_at_start, "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            }
            result.update(run_breakdown(home))
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
            procs.clear()
            return result
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        server.stop()


def sweep_rate(familiars: int) -> float:
    """The sweep's total message rate: one message every 2 s per familiar, at most 10 per second in all."""
    return min(familiars / 2, 10.0)


def plot(results: list[dict], path: Path) -> Path | None:
    """Batch lag and freshness p95, and busy CPU per 1,000 turns, against the number of familiars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (uv sync installs it with the dev group): no plot", file=sys.stderr)
        return None
    rows = sorted(results, key=lambda r: r["familiars"])
    xs = [r["familiars"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("batch_lag_p95_s", "batch lag p95"), ("freshness_p95_s", "freshness p95"),
                       ("batch_lag_p50_s", "batch lag p50")):
        left.plot(xs, [r[key] if r[key] is not None else float("nan") for r in rows], marker="o", label=label)
    full = [(r.get("full_batch_lag") or {}).get("p95_s") for r in rows]
    left.plot(xs, [v if v is not None else float("nan") for v in full], marker="s", label="full batches: lag p95")
    left.axhline(30, color="red", linestyle="--", label="target: batch lag p95 30 s")
    left.set_ylabel("seconds")
    left.set_title("Message to facts in the bot's snapshot")
    right.plot(xs, [r["busy_cpu_s_per_1000_turns"] for r in rows], marker="o", label="busy CPU-s per 1,000 turns")
    right.axhline(100, color="red", linestyle="--", label="target 100")
    right.set_title("Cost")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x:,}\n{r['messages_per_s']:g} msg/s" for x, r in zip(xs, rows)])
        ax.set_xlabel("familiars on one host (total message rate)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Many familiars on one 2-core host ({rows[0].get('order', 'round-robin')} messages, scripted model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--familiars", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1.0, help="messages per second over all familiars")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of appending")
    parser.add_argument("--drain", type=float, default=90.0, help="most seconds to wait for the last facts")
    parser.add_argument("--quiet-s", type=int, default=20, help="[providers.memory.rich_note].quiet_s for the run")
    parser.add_argument("--settle", type=float, default=120.0, help="most seconds to wait for in-flight runs after the drain")
    parser.add_argument("--sensor-interval", type=int, default=None)
    parser.add_argument("--order", choices=("round-robin", "random"), default="round-robin",
                        help="which familiar each message goes to")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="[providers.memory.rich_note].batch_size for the run (default: the shipped one)")
    parser.add_argument("--sweep", default="", help="comma-separated familiar counts, each at sweep_rate(N) (overrides --familiars/--rate)")
    parser.add_argument("--out", type=Path, default=None, help="with --sweep: write scale.json and scale.png here")
    parser.add_argument("--shards", default="",
                        help="comma-separated shard counts (e.g. 1,2): each a sharded deployment on one PostgreSQL "
                             "instance (familiar shard serve x N + familiar control-plane), run one after the other")
    args = parse_with_quick(parser, familiars=2, rate=1.0, duration=6.0, drain=90.0, quiet_s=3, settle=60.0,
                            sensor_interval=5)
    if args.shards:
        results = [measure_sharded(int(n), args.familiars, args.rate, args.duration, args.drain, args.quiet_s, args.settle)
                   for n in args.shards.split(",") if n.strip()]
        print(json.dumps(results, indent=1), flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "shards.json").write_text(json.dumps(results, indent=1) + "\n")
        return
    if not args.sweep:
        result = measure(args.familiars, args.rate, args.duration, args.drain, args.quiet_s, args.sensor_interval,
                         args.settle, args.order, args.batch_size)
        print(json.dumps(result, indent=1), flush=True)
        return
    results = []
    for n in (int(x) for x in args.sweep.split(",") if x.strip()):
        results.append(measure(n, sweep_rate(n), args.duration, args.drain, args.quiet_s, args.sensor_interval,
                               args.settle, args.order, args.batch_size))
        print(json.dumps(results[-1], indent=1), flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "scale.json").write_text(json.dumps(results, indent=1) + "\n")
            plot(results, args.out / "scale.png")


if __name__ == "__main__":
    main()
