"""Freshness through the real `dagster dev`: turn appended -> its facts visible in the serving snapshot.

Starts `dagster dev` from Python (its own process group, bound to 127.0.0.1, a
throwaway DAGSTER_HOME and data root), lets the turn-watermark sensor and the
run queue do their work with the scripted model, appends batches of turns the
way the bot does, and times how long each batch takes to show up as facts in the
Parquet snapshot the bot reads. Stops everything cleanly at the end.

    uv run python benchmarks/freshness.py [--rounds 5] [--port 3333]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from familiar_pipeline.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.snapshots import SnapshotReader  # noqa: E402
from familiar_pipeline.turns import TurnLog  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def start_dagster_dev(home: Path, root: Path, port: int, sensor_interval: int) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        FAMILIAR_DATA_ROOT=str(root),
        FAMILIAR_FAKE_LLM="familiar_pipeline.testing:careful_model",
        FAMILIAR__PIPELINE__SENSOR_INTERVAL_S=str(sensor_interval),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so SIGTERM reaches every child
    )


def stop(process: subprocess.Popen, timeout: float = 15) -> float:
    started = time.monotonic()
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    try:
        os.killpg(process.pid, 0)
        os.killpg(process.pid, signal.SIGKILL)  # stragglers (code servers) in the group
    except ProcessLookupError:
        pass
    return time.monotonic() - started


def facts_visible(reader: SnapshotReader, upto_turn: int) -> bool:
    reader.refresh()
    return any(max(f["source_turn_ids"] or [0]) >= upto_turn for f in reader.current_facts())


def run(rounds: int = 5, port: int | None = None, sensor_interval: int = 5, timeout: float = 120) -> dict:
    port = port or free_port()
    with tempfile.TemporaryDirectory() as tmp:
        home, root = Path(tmp) / "dagster_home", Path(tmp) / "familiars"
        home.mkdir()
        shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
        paths = FamiliarPaths.for_id("fresh", root)
        paths.dir.mkdir(parents=True)
        paths.character_toml.write_text('[llm.background]\nmodel = "fake/careful"\n')
        log = TurnLog(paths.turns_db)
        process = start_dagster_dev(home, root, port, sensor_interval)
        try:
            ready_s = wait_http(f"http://127.0.0.1:{port}/server_info", 90)
            reader = SnapshotReader(paths.serving_dir)
            freshness = []
            for r in range(rounds):
                last = None
                for i in range(10):
                    last = log.append_turn(
                        channel_id=1, role="user", author_key="discord:1", author_display="Ana",
                        content=f"Round {r}: I keep a journal about my {i} favourite mountain walks",
                    )
                appended = time.monotonic()
                while not facts_visible(reader, last.id):
                    if process.poll() is not None:
                        raise RuntimeError("dagster dev exited: " + process.stderr.read().decode()[-2000:])
                    if time.monotonic() - appended > timeout:
                        raise TimeoutError(f"facts of turn {last.id} not visible after {timeout}s")
                    time.sleep(0.2)
                freshness.append(time.monotonic() - appended)
                print(f"round {r + 1}: facts of turns {last.id - 9}-{last.id} visible after {freshness[-1]:.1f}s", flush=True)
            return {"ready_s": ready_s, "freshness_s": freshness, "port": port, "pgid": process.pid}
        finally:
            log.close()
            stop_s = stop(process)
            print(f"dagster dev stopped in {stop_s:.1f}s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--sensor-interval", type=int, default=5)
    args = parser.parse_args()
    result = run(args.rounds, args.port, args.sensor_interval)
    values = result["freshness_s"]
    print(json.dumps({
        "ui_ready_s": round(result["ready_s"], 1),
        "freshness_median_s": round(statistics.median(values), 1),
        "freshness_max_s": round(max(values), 1),
    }))


if __name__ == "__main__":
    main()
