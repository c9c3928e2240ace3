"""Storage-layer figures: fact appends with dedup, snapshot publish and reload, full-text index and query.

    uv run python benchmarks/store.py [--facts 20000] [--turns 100000] [--queries 1000]

Prints medians of repeated measurements; these machines are noisy, so compare
ratios, not single runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

import numpy as np  # noqa: E402

from familiar_pipeline.storage.fts import FtsIndex  # noqa: E402
from familiar_pipeline.storage.snapshots import SnapshotReader, publish_snapshot  # noqa: E402
from familiar_pipeline.projectors.facts.store import FactDraft  # noqa: E402
from familiar_pipeline.storage.store import ProjectionStore  # noqa: E402
from familiar_pipeline.projectors.facts.tables import Subject  # noqa: E402
from familiar_pipeline.projectors.fact_embeddings import tables as fact_vectors  # noqa: E402
from familiar_pipeline.projectors.facts import store as facts_db  # noqa: E402

WORDS = (
    "tea coffee hiking berlin lisbon cello bakery cat dog plants album concert job moved sister brother "
    "allergic peanuts trip june weekend journal mountain walks garden kitchen novel painting bicycle "
    "marathon exam birthday wedding apartment neighbour project deadline promotion holiday beach snow "
    "guitar recipe soup market train museum library coding game movie series podcast yoga running"
).split()
PEOPLE = [(f"discord:{1000 + i}", f"Person{i}") for i in range(60)]


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def bench_appends(store: ProjectionStore, n_facts: int, rng: random.Random) -> dict:
    """Batches of 10 drafts (an extraction batch), ~10% of them restating an existing fact."""
    texts: list[tuple[str, str, str]] = []
    per_batch: list[float] = []
    written = suppressed = 0
    turn_id = 0
    while written < n_facts:
        drafts = []
        for _ in range(10):
            turn_id += 1
            if texts and rng.random() < 0.1:
                text, key, name = rng.choice(texts)
            else:
                key, name = rng.choice(PEOPLE)
                text = f"{name} {sentence(rng, rng.randint(5, 14))}"
                texts.append((text, key, name))
            drafts.append(FactDraft(text=text, source_turn_ids=(turn_id,), subjects=(Subject(key, name),), importance=rng.randint(1, 10)))
        started = time.perf_counter()
        with store.transaction():
            results = facts_db.append_facts(store, drafts)
            store.set_watermark("rich_note", turn_id=turn_id)
        per_batch.append(time.perf_counter() - started)
        written += sum(1 for _, new in results if new)
        suppressed += sum(1 for _, new in results if not new)
    total = sum(per_batch)
    tail = per_batch[-50:]
    return {
        "facts_written": written,
        "suppressed": suppressed,
        "facts_per_s": round((written + suppressed) / total),
        "batch_ms_p50_last50": round(statistics.median(tail) * 1000, 2),
    }


def bench_snapshots(store: ProjectionStore, serving: Path, rng: random.Random, runs: int = 5) -> dict:
    ids = [r[0] for r in store.conn.execute("SELECT id FROM facts WHERE id % 2 = 0").fetchall()]
    with store.transaction():
        for fact_id in ids:
            fact_vectors.set_fact_embedding(store, fact_id, "bench-384", np.asarray([rng.random() for _ in range(384)], dtype=np.float32))
    publish, reload_, noop = [], [], []
    reader = SnapshotReader(serving)
    for _ in range(runs):
        started = time.perf_counter()
        publish_snapshot(store.conn, serving, store_watermark=store.serving_watermark())
        publish.append(time.perf_counter() - started)
        started = time.perf_counter()
        reader.refresh()
        reload_.append(time.perf_counter() - started)
        started = time.perf_counter()
        reader.refresh()
        noop.append(time.perf_counter() - started)
    return {
        "embedded_facts": len(ids),
        "publish_ms_median": round(statistics.median(publish) * 1000, 1),
        "reload_ms_median": round(statistics.median(reload_) * 1000, 1),
        "noop_refresh_us_median": round(statistics.median(noop) * 1e6, 1),
        "snapshot_mb": round(sum(f.stat().st_size for f in serving.glob("*.parquet")) / 2**20 / 2, 1),
    }


def bench_fts(path: Path, n_turns: int, n_queries: int, rng: random.Random) -> dict:
    index = FtsIndex(path, writable=True)
    rows = [(i, f"{rng.choice(PEOPLE)[1]}: {sentence(rng, rng.randint(4, 22))}") for i in range(1, n_turns + 1)]
    started = time.perf_counter()
    index.upsert_many(rows)
    index.commit()
    index_s = time.perf_counter() - started
    index.close()
    reader = FtsIndex(path)
    latencies = []
    for _ in range(n_queries):
        cue = f"hey so what about the {rng.choice(WORDS)} and {rng.choice(WORDS)}, you know? I've been thinking about {rng.choice(WORDS)}!"
        started = time.perf_counter()
        reader.search(cue, 48, max_id=n_turns - 200)
        latencies.append(time.perf_counter() - started)
    return {
        "turns": n_turns,
        "index_s": round(index_s, 2),
        "turns_per_s": round(n_turns / index_s),
        "query_ms_p50": round(pct(latencies, 0.5) * 1000, 2),
        "query_ms_p99": round(pct(latencies, 0.99) * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=20_000)
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    args = parse_with_quick(parser, facts=1000, turns=5000, queries=50)
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store = ProjectionStore(tmp / "memory.duckdb")
        appends = bench_appends(store, args.facts, rng)
        print("fact appends (dedup on, batches of 10):", appends, flush=True)
        snapshots = bench_snapshots(store, tmp / "serving", rng)
        print(f"snapshot at {appends['facts_written']} facts:", snapshots, flush=True)
        store.close()
        fts = bench_fts(tmp / "fts", args.turns, args.queries, rng)
        print("full-text index (turns):", fts, flush=True)


if __name__ == "__main__":
    main()
