"""`familiar up` figures: time to a ready UI, idle memory of the group, and freshness.

Starts the real `familiar up --no-bot` (which starts `dagster dev` through
`familiar_bot.app.supervisor`) with a throwaway DAGSTER_HOME and data root and the
scripted model, then:

* ready: seconds from launching `familiar up` to its "ready" line (the UI answers);
* idle RSS: summed resident memory of `familiar up` and every process in its
  children's sessions (webserver, daemon, code server), read from /proc after the
  group has settled, at every start (medians);
* the load average before and after: other work on a shared machine slows starts,
  so figures are written with the load they were taken at;
* freshness: messages are appended one per `--gap` seconds the way the bot does;
  a message's freshness is the time from its append to the moment facts citing its
  extraction batch (batch_size turns, 10 by default) are in the serving snapshot
  the bot reads. Facts are extracted per whole batch, so the last message of a
  batch waits least and the first waits longest.

    uv run python benchmarks/freshness.py [--messages 20] [--starts 3] [--sensor-interval 15]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

from familiar_bot.app.supervisor import child_sessions, free_port, group_alive, tree_rss_bytes  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.storage.snapshots import SnapshotReader  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402
from familiar_pipeline.projectors.facts import reads as fact_reads  # noqa: E402


def start_up(tmp: Path, port: int, sensor_interval: int | None,
             familiar: str = "fresh") -> tuple[subprocess.Popen, Path]:
    """`familiar up --no-bot` on ``tmp``'s DAGSTER_HOME and data root, for ``familiar`` (which must exist there)."""
    env = dict(os.environ, DAGSTER_HOME=str(tmp / "dagster_home"), FAMILIAR_DATA_ROOT=str(tmp / "familiars"),
               FAMILIAR_FAKE_LLM="familiar_pipeline.testing.scripted:careful_model", PYTHONUNBUFFERED="1",
               LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("DISCORD_TOKEN", None)
    if sensor_interval is not None:
        env["FAMILIAR__PIPELINE__SENSOR_INTERVAL_S"] = str(sensor_interval)
    err = tmp / f"up-{port}.err"
    process = subprocess.Popen(
        [sys.executable, "-m", "familiar_bot.app.cli.main", "up", "--no-bot", "--familiar", familiar, "--port", str(port)],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err.open("wb"),
        start_new_session=True,
    )
    return process, err


def wait_ready(process: subprocess.Popen, err: Path, timeout: float = 180) -> float:
    started = time.monotonic()
    while "ready in" not in err.read_text():
        if process.poll() is not None or time.monotonic() - started > timeout:
            raise RuntimeError("familiar up did not become ready:\n" + err.read_text()[-2000:])
        time.sleep(0.05)
    return time.monotonic() - started


def stop_up(process: subprocess.Popen) -> float:
    sessions = child_sessions(process.pid)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    took = time.monotonic() - started
    deadline = time.monotonic() + 5  # orphaned children are reaped by init a moment later
    while any(group_alive(s) for s in sessions) and time.monotonic() < deadline:
        time.sleep(0.1)
    for session in sessions:
        if group_alive(session):
            os.killpg(session, signal.SIGKILL)
            print(f"warning: session {session} outlived familiar up", flush=True)
    return took


def prepare(tmp: Path) -> FamiliarPaths:
    home = tmp / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    paths = FamiliarPaths.for_id("fresh", tmp / "familiars")
    paths.dir.mkdir(parents=True)
    paths.character_toml.write_text('[llm.background]\nmodel = "fake/careful"\n')
    TurnLog(paths.turns_db).close()
    return paths


def measure_freshness(paths: FamiliarPaths, messages: int, gap: float, timeout: float) -> list[float]:
    reader = SnapshotReader(paths.serving_dir)
    appended: dict[int, float] = {}
    visible: dict[int, float] = {}
    with TurnLog(paths.turns_db) as log:
        log.upsert_participant("discord:1", global_name="Ana")
        next_at = time.monotonic()
        deadline = None
        while len(visible) < messages:
            now = time.monotonic()
            if len(appended) < messages and now >= next_at:
                turn = log.append_turn(channel_id=1, role="user", author_key="discord:1", author_display="Ana",
                                       content=f"Message {len(appended)}: I keep a journal about mountain walk number {len(appended)}")
                appended[turn.id] = time.monotonic()
                next_at += gap
                if len(appended) == messages:
                    deadline = time.monotonic() + timeout
            reader.refresh()
            cited = {t for f in fact_reads.current_facts(reader.current()) for t in f.source_turn_ids}
            for turn_id in appended:
                if turn_id not in visible and turn_id in cited:
                    visible[turn_id] = time.monotonic()
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"only {len(visible)}/{messages} messages had facts after {timeout}s")
            time.sleep(0.1)
    return [visible[t] - appended[t] for t in sorted(appended)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(messages: int = 20, starts: int = 3, sensor_interval: int | None = None, gap: float = 1.0,
        timeout: float = 180, settle: float = 20, *, rounds: int | None = None) -> dict:
    """`rounds` (older callers): that many batches of 10 messages, one start, no settling."""
    if rounds is not None:
        messages, starts, settle, gap = rounds * 10, 1, 0, 0.05
    ready, stops, idle = [], [], []
    result: dict = {"load_before": [round(v, 2) for v in os.getloadavg()]}
    for attempt in range(starts):
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            paths = prepare(tmp)
            process, err = start_up(tmp, free_port(), sensor_interval)
            result.setdefault("pgid", process.pid)
            try:
                ready.append(wait_ready(process, err))
                print(f"start {attempt + 1}: ready after {ready[-1]:.1f}s", flush=True)
                if settle:  # the whole group's memory once it has settled, at every start (medians)
                    time.sleep(settle)
                    rss, count = tree_rss_bytes(process.pid)
                    idle.append(round(rss / 2**20))
                    result["idle_processes"] = count
                    print(f"idle: {count} processes, {rss / 2**20:.0f} MiB RSS", flush=True)
                if attempt == 0:
                    if messages:
                        fresh = measure_freshness(paths, messages, gap, timeout)
                        result["freshness_s"] = [round(v, 1) for v in fresh]
                        print("freshness per message (s): " + ", ".join(f"{v:.1f}" for v in fresh), flush=True)
            finally:
                if process.poll() is None:
                    stops.append(stop_up(process))
    result.update(ready_s=[round(v, 1) for v in ready], ready_median_s=round(statistics.median(ready), 1),
                  stop_s=[round(v, 1) for v in stops], load_after=[round(v, 2) for v in os.getloadavg()])
    if idle:
        result.update(idle_rss_mib=idle, idle_rss_median_mib=round(statistics.median(idle)))
    if rounds is not None and result.get("freshness_s"):
        # Older callers count per batch: the time from a batch's last message to its facts.
        result["freshness_s"] = result["freshness_s"][9::10]
    elif result.get("freshness_s"):
        values = result["freshness_s"]
        result.update(freshness_p50_s=round(percentile(values, 0.5), 1), freshness_p95_s=round(percentile(values, 0.95), 1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between messages (default 1)")
    parser.add_argument("--sensor-interval", type=int, default=None,
                        help="override [pipeline].sensor_interval_s (default: the configured value, 15)")
    parser.add_argument("--quiet-s", type=int, default=None,
                        help="override [providers.memory.rich_note].quiet_s (default: the configured value)")
    args = parse_with_quick(parser, messages=2, starts=1, quiet_s=3, sensor_interval=5)
    if args.quiet_s is not None:
        os.environ["FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__QUIET_S"] = str(args.quiet_s)  # start_up copies os.environ
    print(json.dumps(run(args.messages, args.starts, args.sensor_interval, args.gap)), flush=True)


if __name__ == "__main__":
    main()
