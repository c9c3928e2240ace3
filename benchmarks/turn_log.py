"""How fast can the bot append to the turn log?

The bot writes each message as its own transaction (``TurnLog.append_turn``), on the
path between receiving a message and assembling the reply, so per-append latency is
what matters. This appends N realistic turns one by one into a fresh ``turns.db`` and
prints throughput, p50/p90/p99/max latency and the file size; it also times the two
hot reads (the channel tail the bot reads per reply, and the projections' batch read).

    uv run python benchmarks/turn_log.py                 # 100k turns, temp dir
    uv run python benchmarks/turn_log.py --n 20000 --runs 3 --dir /tmp/tl

Target on the 2-core dev machines: p50 append < 1 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

from familiar_pipeline.storage.turns import TurnLog  # noqa: E402

WORDS = (
    "the a i you we it is was to of and in that for on with my your so just like what "
    "do not have be this but are can about know think really yeah okay lol maybe time "
    "today tomorrow cat dragon tea coffee game stream music book remember said going "
    "want need feel good bad weird nice cool story night morning work sleep dream "
    "familiar sapphire castle spell potion quest raid boss level garden rain"
).split()
CHANNELS = [1100000000000000001, 1100000000000000002, 1100000000000000003, 1100000000000000004]
GUILD = 900000000000000001
AUTHORS = [(f"discord:{100000000000000000 + i}", name) for i, name in enumerate(
    ["Ada", "Bo", "Cass", "Dee", "Eli", "Fen", "Gus", "Hal", "Ivy", "Jo", "Kit", "Lu"]
)]


def make_content(rng: random.Random, role: str) -> str:
    """Chat-shaped text: mostly short lines, a long tail of paragraphs; replies run longer."""
    words = int(rng.lognormvariate(2.3 if role == "user" else 3.6, 0.9))
    if rng.random() < 0.01:
        words = 0  # attachment-only message
    return " ".join(rng.choice(WORDS) for _ in range(min(words, 1500)))


@dataclass
class RunResult:
    n: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    db_bytes: int
    wal_bytes: int
    tail_p50_ms: float
    batch_turns_per_s: float

    @property
    def turns_per_s(self) -> float:
        return self.n / self.seconds


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6


def make_turns(n: int, seed: int) -> list[dict]:
    """The whole workload, generated up front so the timings cover appends only."""
    rng = random.Random(seed)
    clock = datetime(2026, 6, 1, tzinfo=timezone.utc)
    message_id = 1200000000000000000
    turns = []
    for _ in range(n):
        role = "assistant" if rng.random() < 0.4 else "user"
        key, name = rng.choice(AUTHORS) if role == "user" else (None, None)
        clock += timedelta(seconds=rng.expovariate(1 / 20))
        message_id += rng.randint(1, 1000)
        turns.append(dict(
            channel_id=rng.choice(CHANNELS), guild_id=GUILD, role=role, content=make_content(rng, role),
            author_key=key, author_display=name, platform_message_id=message_id,
            reply_to_message_id=message_id - 1 if rng.random() < 0.1 else None, created_at=clock,
            mentions=[rng.choice(AUTHORS)[0]] if role == "user" and rng.random() < 0.05 else (),
        ))
    return turns


def one_run(path: Path, n: int, seed: int) -> RunResult:
    workload = make_turns(n, seed)
    latencies: list[int] = []
    with TurnLog(path) as log:
        started = time.perf_counter()
        for kwargs in workload:
            t0 = time.perf_counter_ns()
            log.append_turn(**kwargs)
            latencies.append(time.perf_counter_ns() - t0)
        seconds = time.perf_counter() - started
        wal = path.with_name(path.name + "-wal")
        wal_bytes = wal.stat().st_size if wal.exists() else 0
        db_bytes = path.stat().st_size

        tail_ns = []
        for i in range(500):
            t0 = time.perf_counter_ns()
            log.recent(CHANNELS[i % len(CHANNELS)], 50)
            tail_ns.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter()
        read, cursor = 0, 0
        while batch := log.turns_after(cursor, 1000):
            read += len(batch)
            cursor = batch[-1].id
        batch_rate = read / (time.perf_counter() - t0)
    latencies.sort()
    tail_ns.sort()
    return RunResult(
        n=n, seconds=seconds, p50_ms=percentile(latencies, 0.5), p90_ms=percentile(latencies, 0.9),
        p99_ms=percentile(latencies, 0.99), max_ms=latencies[-1] / 1e6, db_bytes=db_bytes,
        wal_bytes=wal_bytes, tail_p50_ms=percentile(tail_ns, 0.5), batch_turns_per_s=batch_rate,
    )


def report(label: str, r: RunResult) -> None:
    print(
        f"{label}: {r.n} appends in {r.seconds:.2f}s = {r.turns_per_s:,.0f} turns/s | "
        f"latency ms p50 {r.p50_ms:.3f} p90 {r.p90_ms:.3f} p99 {r.p99_ms:.3f} max {r.max_ms:.1f} | "
        f"file {r.db_bytes / 1e6:.1f} MB (+ WAL {r.wal_bytes / 1e6:.1f} MB) | "
        f"recent(50) p50 {r.tail_p50_ms:.3f} ms | turns_after batches {r.batch_turns_per_s:,.0f} turns/s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="turns to append per run (default 100000)")
    parser.add_argument("--dir", type=Path, help="folder for the run files (kept); default: a temp dir, removed")
    parser.add_argument("--runs", type=int, default=1, help="independent runs; the median is printed too")
    parser.add_argument("--seed", type=int, default=7)
    args = parse_with_quick(parser, argv, n=2000)
    if args.n <= 0 or args.runs <= 0:
        parser.error("--n and --runs must be positive")

    with tempfile.TemporaryDirectory(prefix="turn-log-bench-") as scratch:
        base = args.dir or Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        results = []
        for run in range(args.runs):
            path = base / f"run{run + 1}" / "turns.db"
            if path.exists():
                parser.error(f"{path} already exists; pick an empty --dir")
            results.append(one_run(path, args.n, args.seed + run))
            report(f"run {run + 1}", results[-1])
    if args.runs > 1:
        def med(attr: str) -> float:
            return statistics.median(getattr(r, attr) for r in results)

        print(
            f"median of {args.runs}: {med('turns_per_s'):,.0f} turns/s | p50 {med('p50_ms'):.3f} ms | "
            f"p99 {med('p99_ms'):.3f} ms | file {med('db_bytes') / 1e6:.1f} MB"
        )
    target = statistics.median(r.p50_ms for r in results)
    print(f"target p50 < 1 ms: {'met' if target < 1.0 else 'MISSED'} ({target:.3f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
