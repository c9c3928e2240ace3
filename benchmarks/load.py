"""A burst of chat under load: nothing lost, projected batch by batch, assembly stays fast.

Three things run at once on one familiar, as they would on a busy host:

* the **burst**: N messages (default 10,000) across C channels (default 50) from 40
  people, recorded through the real responder (`Responder.handle`, unaddressed, so
  every message takes the production path: participants, mentions, the turn log);
* the **pipeline**: the real Dagster assets (`turns_fts`, `facts`, `rolling_summary`)
  materialized over and over with the careful scripted model while the burst lands,
  each run taking at most `max_batches_per_run` batches, so the backlog is worked off
  batch by batch;
* the **bot**: the real assembler building prompts for random channels, timed.

Afterwards the pipeline runs until idle and the script checks that every message is
in the log exactly once, in per-channel order, that the facts watermark reached the
last turn, and that the turn index holds every turn. It prints append throughput,
assembly p50/p95/p99 under write load, and the pipeline's runs and batches.

    uv run python benchmarks/load.py                         # 10k messages, 50 channels
    uv run python benchmarks/load.py --messages 1000 --channels 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

from familiar_pipeline.defs.jobs import materializations
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.testing.scripted import FAKE_MODELS_TOML  # noqa: E402

TOML = """
aliases = ["Fam"]

[pipeline]
max_batches_per_run = {max_batches}

""" + FAKE_MODELS_TOML
WORDS = ("bakery Berlin cello Lisbon hiking peanut album Pixel plants sister trip job weekend party "
         "coffee rain train garden novel chess").split()


@dataclass
class LoadResult:
    messages: int
    channels: int
    append_seconds: float = 0.0
    assembly_ms: list[float] = field(default_factory=list)
    assembly_errors: int = 0
    pipeline_runs: int = 0
    pipeline_batches: int = 0
    pipeline_errors: list[str] = field(default_factory=list)
    logged: int = 0
    duplicates: int = 0
    out_of_order_channels: int = 0
    facts_watermark: int = 0
    last_turn_id: int = 0
    fts_turn_docs: int = 0

    def percentile(self, q: float) -> float:
        if not self.assembly_ms:
            return float("nan")
        ordered = sorted(self.assembly_ms)
        return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]

    @property
    def lost(self) -> int:
        return self.messages - self.logged

    def lines(self) -> list[str]:
        return [
            f"burst: {self.messages} messages over {self.channels} channels appended in {self.append_seconds:.1f} s "
            f"({self.messages / max(self.append_seconds, 1e-9):.0f} msg/s) through the responder, pipeline running",
            f"log: {self.logged} logged, {self.lost} lost, {self.duplicates} duplicated, "
            f"{self.out_of_order_channels} channels out of order",
            f"pipeline: {self.pipeline_runs} runs, {self.pipeline_batches} facts batches, "
            f"facts watermark {self.facts_watermark} of {self.last_turn_id}, turn index {self.fts_turn_docs} docs, "
            f"{len(self.pipeline_errors)} failed runs",
            f"assembly during the burst and the projection of its backlog: {len(self.assembly_ms)} prompts, "
            f"p50 {self.percentile(50):.1f} ms, "
            f"p95 {self.percentile(95):.1f} ms, p99 {self.percentile(99):.1f} ms, "
            f"max {max(self.assembly_ms, default=float('nan')):.1f} ms, {self.assembly_errors} errors",
        ]


def make_familiar(root: Path, max_batches: int) -> FamiliarPaths:
    from familiar_pipeline.storage.turns import TurnLog

    paths = FamiliarPaths.for_id("fam", root)
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.character_toml.write_text(TOML.format(max_batches=max_batches))
    paths.character_md.write_text("You are Fam, a fox spirit.")
    TurnLog(paths.turns_db).close()
    return paths


def burst(paths: FamiliarPaths, n: int, channels: int, seed: int, result: LoadResult,
          started_writing: threading.Event) -> None:
    """Every message through the real responder, as unaddressed chatter (no reply model needed)."""
    from familiar_bot.responder.messages import IncomingMessage, Person
    from familiar_bot.responder.opening import open_responder
    from familiar_pipeline.config import load_config

    rng = random.Random(seed)
    people = [Person(f"discord:{1000 + i}", f"user{i}", f"User {i}") for i in range(40)]
    handle = open_responder(paths, load_config("fam", root=paths.root, env={}))

    async def go():
        for i in range(n):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
            await handle.responder.handle(IncomingMessage(
                channel_id=100 + i % channels, author=rng.choice(people), guild_id=1,
                content=f"{words} (msg {i})", platform_message_id=f"m{i}"))

    started_writing.set()
    started = time.perf_counter()
    try:
        asyncio.run(go())
    finally:
        result.append_seconds = time.perf_counter() - started
        handle.close()


def pipeline_loop(root: Path, stop_file: Path, out_file: Path) -> None:
    """The pipeline process: materialize again and again; after `stop_file` appears, until idle."""
    import dagster as dg

    from familiar_pipeline.defs.jobs import materialize_in_process

    assets = ["turns_fts", "facts", "rolling_summary"]
    stats = {"runs": 0, "batches": 0, "errors": []}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["fam"])
        idle_after_stop = False
        while not idle_after_stop and len(stats["errors"]) <= 3:
            stopping = stop_file.exists()
            run = materialize_in_process(assets, instance=instance, data_root=root, partition_key="fam",
                                         raise_on_error=False)
            stats["runs"] += 1
            if not run.success:
                stats["errors"].append(str([e.message for e in run.all_events if e.is_failure])[:500])
                continue
            statuses = []
            for mat in materializations(run, "facts"):
                stats["batches"] += int(mat.metadata["batches"].value)
            for a in assets:
                statuses += [str(m.metadata["status"].value) for m in materializations(run, a)]
            idle_after_stop = stopping and all(st.startswith("no-op") for st in statuses)
    out_file.write_text(json.dumps(stats))


def start_pipeline_process(root: Path) -> tuple[subprocess.Popen, Path, Path]:
    stop_file, out_file = root / "stop-pipeline", root / "pipeline-stats.json"
    env = {**os.environ, "FAMILIAR_FAKE_LLM": "familiar_pipeline.testing.scripted:careful_model"}
    # Dagster logs every step: to a file, since an unread pipe would fill and block the worker.
    with open(root / "pipeline-worker.log", "wb") as log_file:
        child = subprocess.Popen([sys.executable, __file__, "--pipeline-worker", str(root)], env=env,
                                 stdout=log_file, stderr=subprocess.STDOUT)
    return child, stop_file, out_file


def assembly_loop(paths: FamiliarPaths, channels: int, start: threading.Event, stop: threading.Event,
                  result: LoadResult, seed: int) -> None:
    """Assemble prompts for random channels from the moment the burst starts until the pipeline is idle."""
    from familiar_bot.prompt.assembly import AssemblyContext, build_assembler
    from familiar_pipeline.config import load_config

    rng = random.Random(seed + 1)
    config = load_config("fam", root=paths.root, env={})
    assembler = build_assembler(paths, config)
    for _ in range(5):  # warm: imports, first reads (a running bot is past this)
        assembler.assemble(AssemblyContext(familiar_id="fam", channel_id=100, guild_id=1, tier="text", cue="warm"))
    start.wait()
    while not stop.is_set():
        ctx = AssemblyContext(familiar_id="fam", channel_id=100 + rng.randrange(channels), guild_id=1,
                              tier="text", cue=" ".join(rng.sample(WORDS, 3)))
        started = time.perf_counter()
        try:
            assembler.assemble(ctx)
        except Exception:  # noqa: BLE001 - counted: the promise is zero
            result.assembly_errors += 1
        result.assembly_ms.append((time.perf_counter() - started) * 1000)
        time.sleep(0.005)  # a busy bot, not a spin loop


def verify(paths: FamiliarPaths, result: LoadResult) -> None:
    from familiar_pipeline.storage.fts import FtsIndex
    from familiar_pipeline.storage.store import ProjectionStore
    from familiar_pipeline.storage.turns import TurnLog

    with TurnLog(paths.turns_db, readonly=True) as log:
        turns = log.recent_cross_channel(10 * result.messages + 10, include_deleted=True)
    users = [t for t in turns if t.role == "user"]
    ids = [t.platform_message_id for t in users]
    result.logged = len(set(ids))
    result.duplicates = len(ids) - len(set(ids))
    by_channel: dict[int, list[int]] = {}
    for t in sorted(users, key=lambda t: t.id):
        by_channel.setdefault(t.channel_id, []).append(int(t.platform_message_id[1:]))
    result.out_of_order_channels = sum(seq != sorted(seq) for seq in by_channel.values())
    result.last_turn_id = max((t.id for t in turns), default=0)
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        result.facts_watermark = store.get_watermark("rich_note").turn_id
    result.fts_turn_docs = FtsIndex(paths.fts_turns).doc_count()


def run_load(root: Path, *, messages: int, channels: int, seed: int = 9, max_batches: int = 20) -> LoadResult:
    """The whole scenario in `root`; returns the figures (also used by the test suite).

    The pipeline runs in its own process, as under Dagster; the burst and the
    assemblies share this one, as in the bot.
    """
    paths = make_familiar(root, max_batches)
    result = LoadResult(messages, channels)
    started_writing, stop_assembly = threading.Event(), threading.Event()
    assembly = threading.Thread(target=assembly_loop, daemon=True,
                                args=(paths, channels, started_writing, stop_assembly, result, seed))
    child, stop_file, out_file = start_pipeline_process(root)
    try:
        assembly.start()
        burst(paths, messages, channels, seed, result, started_writing)
    finally:
        started_writing.set()
        stop_file.touch()
        try:
            child.wait(timeout=max(600, messages / 5))  # the bot keeps assembling while the backlog is projected
        finally:
            if child.poll() is None:
                child.kill()
            stop_assembly.set()
            assembly.join()
    if child.returncode != 0:
        tail = (root / "pipeline-worker.log").read_text(errors="replace")[-1500:]
        result.pipeline_errors.append(f"pipeline process exited {child.returncode}: {tail}")
    else:
        stats = json.loads(out_file.read_text())
        result.pipeline_runs, result.pipeline_batches = stats["runs"], stats["batches"]
        result.pipeline_errors += stats["errors"]
    verify(paths, result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--channels", type=int, default=50)
    parser.add_argument("--max-batches", type=int, default=20, help="facts batches per pipeline run")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--dir", type=Path, default=None, help="work here (default: a temp dir)")
    parser.add_argument("--pipeline-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parse_with_quick(parser, messages=200, channels=4, max_batches=5)
    if args.pipeline_worker is not None:
        pipeline_loop(args.pipeline_worker, args.pipeline_worker / "stop-pipeline",
                      args.pipeline_worker / "pipeline-stats.json")
        return
    with tempfile.TemporaryDirectory() as tmp:
        result = run_load(args.dir or Path(tmp), messages=args.messages, channels=args.channels,
                          seed=args.seed, max_batches=args.max_batches)
    for line in result.lines():
        print(line)
    ok = (result.lost == 0 and result.duplicates == 0 and not result.out_of_order_channels
          and result.last_turn_id - result.facts_watermark < 10 and result.fts_turn_docs >= result.logged
          and not result.assembly_errors and not result.pipeline_errors)
    print("OK: nothing lost, fully projected" if ok else "FAILED: see above")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
