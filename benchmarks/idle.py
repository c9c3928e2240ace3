"""The idle floor: what `familiar up` costs while nobody talks (issue 51, item 1).

N familiars, each with a few turns, under a real `familiar up --no-bot` (the supervisor,
`dagster dev`: webserver, daemon, code server; the scripted offline model). The script
waits until memory has caught up (no run queued or running for two ticks of the sensor),
then samples the whole group for `--window` seconds: CPU-seconds spent (utime + stime of
every process, and of the children they reaped, from /proc) divided by the window gives
the cores it keeps busy, and resident memory (summed RSS) its footprint. It also counts
the sensor ticks in the window and how many of them requested a run (0 when idle), and
times, in this process, the CPU of one tick's plan over the settled familiars
(`schedule.plan_tick`, the part of a tick that grows with the number of familiars).

    uv run python benchmarks/idle.py [--familiars 100] [--window 60] [--repeat 3] [--no-ui] [--quick]

CPU-seconds are the process tree's own, so another load on the machine inflates them
less than it inflates wall time; the load average is printed with each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.freshness import stop_up, wait_ready  # noqa: E402
from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402
from familiar_bot.app.supervisor import free_port, group_pids, tree_rss_bytes  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402
from tests.helpers import LINES, PEOPLE  # noqa: E402

CHARACTER = '[llm.background]\nmodel = "fake/careful"\n[pipeline]\nsensor_interval_s = {interval}\n'
TICKS = 1.0 / os.sysconf("SC_CLK_TCK")


def prepare(tmp: Path, familiars: int, turns: int, interval: int) -> list[str]:
    """The data root: `familiars` familiars, each `turns` turns old enough that their batches have closed."""
    home = tmp / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    names = [f"f{i:03d}" for i in range(familiars)]
    start = datetime.now(timezone.utc) - timedelta(hours=1)
    for name in names:
        paths = FamiliarPaths.for_id(name, tmp / "familiars")
        paths.dir.mkdir(parents=True)
        paths.character_toml.write_text(CHARACTER.format(interval=interval))
        with TurnLog(paths.turns_db) as log:
            for i in range(turns):
                key, person = PEOPLE[i % len(PEOPLE)]
                log.upsert_participant(key, global_name=person)
                log.append_turn(channel_id=10, guild_id=1, role="user", author_key=key, author_display=person,
                                content=LINES[i % len(LINES)], created_at=start + timedelta(seconds=i))
        TurnLog(paths.turns_db, readonly=True).close()  # its WAL file is made now, as by the bot's first open
        for written in paths.dir.glob("turns.db*"):  # written an hour ago: the short batches have closed for quiet
            os.utime(written, (start.timestamp(), start.timestamp()))
    return names


def start_up(tmp: Path, familiar: str, no_ui: bool) -> subprocess.Popen:
    env = dict(os.environ, DAGSTER_HOME=str(tmp / "dagster_home"), FAMILIAR_DATA_ROOT=str(tmp / "familiars"),
               FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model", PYTHONUNBUFFERED="1")
    env.pop("DISCORD_TOKEN", None)
    argv = [sys.executable, "-m", "familiar_bot.app.cli.main", "up", "--no-bot", "--familiar", familiar,
            "--port", str(free_port())] + (["--no-ui"] if no_ui else [])
    return subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=(tmp / "up.err").open("wb"), start_new_session=True)


def cpu_seconds(pids: set[int]) -> float:
    """utime + stime + cutime + cstime of each process (a reaped child's time is in its parent's c-times)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime (fields 14-17)
    return total * TICKS


def label(pid: int) -> str:
    """What a process of the group is, from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = " ".join(a.decode(errors="replace") for a in argv)
    for needle, name in (("familiar_bot.app.cli.main up", "supervisor"), ("dagster._daemon", "daemon"),
                         ("dagster-daemon", "daemon"), ("dagster_webserver", "webserver"),
                         ("dagster-webserver", "webserver"), ("code-server start", "code server proxy"),
                         ("api grpc", "code server"), ("run_worker", "run worker"), ("dagster dev", "dagster dev")):
        if needle in text:
            return name
    return text[:40]


def cpu_by_process(pids: set[int]) -> dict[str, float]:
    """CPU-seconds so far of each process of the group, summed by what it is (`label`)."""
    out: dict[str, float] = {}
    for pid in pids:
        spent = cpu_seconds({pid})
        if spent:
            out[label(pid)] = out.get(label(pid), 0.0) + spent
    return out


def sensor_ticks(instance, since: float) -> tuple[int, int]:
    """(ticks of the turn sensor since `since` (epoch s), of which requested at least one run)."""
    sensors = [s for s in instance.all_instigator_state() if s.instigator_name == "turn_watermark_sensor"]
    ticks = requested = 0
    for state in sensors:
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, after=since, limit=10_000):
            ticks += 1
            requested += bool(tick.run_ids)
    return ticks, requested


def tick_cpu_ms(root: Path, names: list[str], interval: int, ticks: int = 10) -> tuple[float, int, int]:
    """Median CPU ms of one turn-sensor tick's plan over the settled data root (`schedule.plan_tick`, in
    this process, a tick every `interval` s of simulated time, each starting from the last one's cursor),
    how many familiars the ticks found settled (skipped on their files' fingerprint), and how many a
    fresh cursor finds due (a caught-up root: 0)."""
    from familiar_pipeline.engine import schedule
    from familiar_pipeline.engine.schedule import plan_tick

    cursor: dict = {}
    now, spent, due = time.time(), [], 0
    for i in range(ticks + 1):
        started = time.process_time()
        plan = plan_tick(cursor, names, names, root=root, in_flight={}, max_requests=1000, now=now + i * interval,
                         tick_s=interval)
        spent.append((time.process_time() - started) * 1000)
        cursor = plan.cursor
        due = due or sum(len(run) for run in plan.runs)
    # The first tick reads every familiar (an empty cursor).
    return statistics.median(spent[1:]), len(cursor.get(getattr(schedule, "QUIET", ""), {})), due


def settle(instance, interval: int, timeout: float) -> float:
    """Wait until no run is queued or running for two sensor intervals in a row (memory has caught up)."""
    import dagster as dg

    in_flight = dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
                                        dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED])
    started = quiet_since = time.monotonic()
    while time.monotonic() - started < timeout:
        if instance.get_runs_count(filters=in_flight) or not instance.get_runs_count():
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= 2 * interval + 5:
            return time.monotonic() - started
        time.sleep(1)
    raise RuntimeError(f"memory did not catch up within {timeout:.0f} s")


def measure(familiars: int, turns: int, window: float, interval: int, no_ui: bool, timeout: float) -> dict:
    import dagster as dg

    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        names = prepare(tmp, familiars, turns, interval)
        process = start_up(tmp, names[0], no_ui)
        try:
            ready = wait_ready(process, tmp / "up.err", timeout=300)
            os.environ["DAGSTER_HOME"] = str(tmp / "dagster_home")
            with dg.DagsterInstance.get() as instance:
                caught_up = settle(instance, interval, timeout)
                runs = instance.get_runs_count()
                pids = group_pids(process.pid)
                cpu0, since, t0 = cpu_seconds(pids), time.time(), time.monotonic()
                parts0 = cpu_by_process(pids)
                rss = []
                while time.monotonic() - t0 < window:
                    time.sleep(min(5.0, window / 4))
                    pids |= group_pids(process.pid)
                    rss.append(tree_rss_bytes(process.pid))
                elapsed = time.monotonic() - t0
                cpu = cpu_seconds(group_pids(process.pid)) - cpu0
                parts = {name: round(spent - parts0.get(name, 0.0), 2)
                         for name, spent in cpu_by_process(group_pids(process.pid)).items()}
                ticks, requested = sensor_ticks(instance, since)
                runs_in_window = instance.get_runs_count() - runs
            tick_ms, settled, due = tick_cpu_ms(tmp / "familiars", names, interval)
        finally:
            stop_up(process)  # and whatever of its group outlived it
    resident, processes = max(rss)
    return {"familiars": familiars, "no_ui": no_ui, "ready_s": round(ready, 1), "caught_up_s": round(caught_up, 1),
            "window_s": round(elapsed, 1), "cpu_s": round(cpu, 2), "cores": round(cpu / elapsed, 4),
            "rss_mib": round(resident / 2**20), "processes": processes, "cpu_s_by_process": parts, "sensor_ticks": ticks,
            "ticks_with_runs": requested, "runs_in_window": runs_in_window, "tick_cpu_ms": round(tick_ms, 1), "settled": settled,
            "due_on_a_fresh_cursor": due, "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--familiars", type=int, default=100)
    parser.add_argument("--turns", type=int, default=12, help="turns per familiar (fewer than a batch: it closes for quiet)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds sampled once memory has caught up")
    parser.add_argument("--repeat", type=int, default=3, help="windows measured, each on a fresh `familiar up` (median)")
    parser.add_argument("--interval", type=int, default=5, help="every familiar's [pipeline].sensor_interval_s")
    parser.add_argument("--no-ui", action="store_true", help="measure `familiar up --no-ui` (daemon, no webserver)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed for memory to catch up")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parse_with_quick(parser, argv, familiars=2, window=6, repeat=1)
    results = []
    for _ in range(args.repeat):
        result = measure(args.familiars, args.turns, args.window, args.interval, args.no_ui, args.timeout)
        results.append(result)
        if not args.json:
            print(f"{result['familiars']} familiars{' (--no-ui)' if args.no_ui else ''}: {result['cores']:.3f} cores "
                  f"({result['cpu_s']} CPU-s in {result['window_s']} s), {result['rss_mib']} MiB in "
                  f"{result['processes']} processes; {result['sensor_ticks']} sensor ticks, "
                  f"{result['ticks_with_runs']} with runs, {result['runs_in_window']} runs; a tick's plan "
                  f"{result['tick_cpu_ms']} CPU ms ({result['settled']} settled, {result['due_on_a_fresh_cursor']} "
                  f"due on a fresh cursor); load {result['load']:.2f}", flush=True)
    summary = {"median_cores": statistics.median(r["cores"] for r in results),
               "median_rss_mib": statistics.median(r["rss_mib"] for r in results), "runs": results}
    print(json.dumps(summary, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
