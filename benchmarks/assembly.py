"""How long does a full, warm prompt assembly take on a big familiar?

Builds one familiar with 100k turns (4 channels, 12 people, chat-shaped text)
and 20k facts (subjects, importance, sources, a share retired), 12 dossiers,
reflections and a summary, all filled directly into the real stores: turn log,
projection store, published Parquet snapshot, and both tantivy indexes. Every
fact and every turn also gets a real all-MiniLM-L6-v2 vector in the snapshot,
and every turn a context-window vector too.

Then, per mode, it plays the responder: append the user's message to the turn
log (not timed), assemble the prompt for it (timed), with a new message every
time, so window-dependent layers and retrieval really rebuild. Modes:

* ``embedding weight 0``: BM25 + importance fusion, no model call;
* ``embedding weight > 0``: the cue is embedded with the real local MiniLM
  (``FastEmbedEmbedder`` over ``ensure_local_minilm()``) for every message, and
  turns are ranked by BM25 and cosine with context windows (``turn_embedding`` and
  ``turn_window_embedding`` on).

    uv run python benchmarks/assembly.py                 # 100k turns, 20k facts
    uv run python benchmarks/assembly.py --turns 20000 --facts 4000 --iterations 100

Target on the 2-core dev machines: p95 ≤ 25 ms, with and without the cue
embedding (docs/benchmarks.md has the measured figures and the load they ran at).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from familiar_pipeline.config import load_config  # noqa: E402
from familiar_pipeline.models.embedders import FastEmbedEmbedder  # noqa: E402
from familiar_pipeline.storage.fts import FtsIndex  # noqa: E402
from familiar_pipeline.models.minilm import MINILM_MODEL_NAME, ensure_local_minilm  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.projectors.turns_index.run import search_text  # noqa: E402
from familiar_pipeline.storage.snapshots import publish_snapshot  # noqa: E402
from familiar_pipeline.storage.store import ProjectionStore  # noqa: E402
from familiar_pipeline.projectors.facts.store import normalize_fact_text, subject_set_key  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.summary import tables as summary_db
from familiar_pipeline.projectors.supersede import tables as supersede_db
# The built-ins register their tables, so the store this builds creates them (nothing else here
# touches the registry before the store is opened).
import familiar_pipeline.projectors.builtin  # noqa: E402,F401

from familiar_bot.prompt.assembly import Assembler, AssemblyContext, MemoryView  # noqa: E402
from familiar_bot.prompt.layers.stack import default_layers  # noqa: E402

FAMILIAR = "bench"
GUILD = 900000000000000001
SCOPE = f"guild:{GUILD}"  # the scope of every turn, so of every derived row
CHANNELS = [1100000000000000001, 1100000000000000002, 1100000000000000003, 1100000000000000004]
PEOPLE = [(f"discord:{100000000000000000 + i}", name) for i, name in enumerate(
    ["Ada", "Bo", "Cass", "Dee", "Eli", "Fen", "Gus", "Hal", "Ivy", "Jo", "Kit", "Lu"])]
TOPICS = ["the cat", "my sister", "the bakery", "work", "the exam", "the garden", "that album", "the raid",
          "my bike", "the hike", "dinner", "the new job", "the move", "the concert", "my cello", "coffee",
          "the weekend", "the dentist", "the rain", "my plants", "the game", "the book club", "the trip to Lisbon",
          "the dog", "my flat", "the stream", "the boss fight", "tea", "my knee", "the wedding"]
OPENERS = ["honestly", "so", "ok but", "lol", "ugh", "wait", "yeah", "hmm", "oh", "btw"]
VERBS = ["can't stop thinking about", "finally sorted out", "am so done with", "just found out about",
         "really miss", "keep forgetting", "want to talk about", "had a weird dream about", "fixed", "broke"]
TAILS = ["again", "this morning", "last night", "for the third time", "and it was great", "no idea why",
         "any advice?", "send help", "it's fine", "which is wild", "", "", "",
         # words of change, so threads (issue 33) find updates among the candidates as in a real log
         "but now it's different", "so we moved it to Friday", "and switched to the other one instead"]
FACT_VERBS = ["likes", "is allergic to", "is learning", "is worried about", "recently started", "dislikes",
              "talks a lot about", "plans to visit", "owns", "is proud of", "gave up on", "wants to try"]
FACT_OBJECTS = ["cello", "peanuts", "climbing", "sourdough", "Lisbon", "Berlin", "jazz", "chess", "pottery",
                "the night shift", "a grey cat named Pixel", "marathons", "tea over coffee", "horror films",
                "a 1998 racing bike", "Portuguese", "their garden", "the book club", "painting", "dungeon raids"]
FACT_QUALIFIERS = ["since spring", "after the move", "because of work", "with their sister", "every weekend",
                   "despite the cost", "for years", "as of last month", "on weekdays", "with friends", ""]


def chat_line(rng: random.Random) -> str:
    parts = [rng.choice(OPENERS), "I", rng.choice(VERBS), rng.choice(TOPICS), rng.choice(TAILS)]
    line = " ".join(p for p in parts if p)
    if rng.random() < 0.25:
        line += ". " + " ".join(rng.choice(TOPICS + VERBS) for _ in range(rng.randint(3, 12)))
    return line


def cue_line(rng: random.Random, now: datetime) -> str:
    """A new message: 15 % ask how something stands now (threads run), 10 % ask for an order
    (spread runs); the rest are a chat line ending in a question, and often a person and a time
    to resolve (a third name someone, a quarter a date in the log's span, a quarter a relative
    time), so the benchmark pays for retrieval's people and time signals as a real server would."""
    kind = rng.random()
    if kind < 0.15:  # a question about how things stand now: threads follow the hits to later updates
        return f"what's the latest with {rng.choice(TOPICS)}, is it still {rng.choice(FACT_OBJECTS)}?"
    if kind < 0.25:  # an order question: candidates are spread over days
        a, b, c = rng.sample(TOPICS, 3)
        return f"in what order did I bring up {a}, {b} and {c}?"
    cue = chat_line(rng) + f" {rng.choice(FACT_OBJECTS)}?"
    if rng.random() < 1 / 3:
        cue = f"what did {rng.choice(PEOPLE)[1]} say, {cue}"
    roll = rng.random()
    if roll < 0.25:
        day = now - timedelta(days=rng.randint(1, 300))
        cue += f" on {day.day} {day:%B %Y}" if rng.random() < 0.5 else f" in {day:%B %Y}"
    elif roll < 0.5:
        cue += " " + rng.choice(["yesterday", "last week", "last weekend", "three days ago", "last month",
                                 "this morning"])
    return cue


def fact_text(rng: random.Random, name: str) -> str:
    return f"{name} {rng.choice(FACT_VERBS)} {rng.choice(FACT_OBJECTS)} {rng.choice(FACT_QUALIFIERS)}".strip()


def build(root: Path, n_turns: int, n_facts: int, base_facts: int, embedder: FastEmbedEmbedder,
          seed: int) -> FamiliarPaths:
    rng = random.Random(seed)
    paths = FamiliarPaths.for_id(FAMILIAR, root)
    paths.dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    start = datetime(2025, 6, 1, tzinfo=timezone.utc)
    with TurnLog(paths.turns_db) as log:
        for key, name in PEOPLE:
            log.upsert_participant(key, username=name.lower(), global_name=name, pronouns="they/them")
        rows, at = [], start
        for i in range(n_turns):
            at += timedelta(seconds=rng.randint(5, 600))
            channel = CHANNELS[min(int(rng.expovariate(1.2)), 3)]
            if rng.random() < 0.2:
                rows.append(dict(channel_id=channel, guild_id=GUILD, role="assistant",
                                 content=chat_line(rng), created_at=at))
            else:
                key, name = rng.choice(PEOPLE)
                rows.append(dict(channel_id=channel, guild_id=GUILD, role="user", author_key=key,
                                 author_display=name, content=chat_line(rng), created_at=at,
                                 platform_message_id=10**17 + i))
            if len(rows) == 5000:
                log.append_turns(rows)
                rows = []
        log.append_turns(rows)
        all_turns = [(t.id, search_text(t)) for t in log.turns_after(0)]
    print(f"  turn log: {n_turns} turns in {time.perf_counter() - t0:.1f}s")

    t0 = time.perf_counter()
    with FtsIndex(paths.fts_turns, writable=True) as ix:
        ix.rebuild(all_turns)
    print(f"  fts/turns: {time.perf_counter() - t0:.1f}s")

    t0 = time.perf_counter()
    # Facts repeat a pool of base statements with a per-fact note, so only the pool
    # needs the (slow, CPU-bound) model; a fact's vector is its base statement's.
    pool = list(dict.fromkeys(fact_text(rng, rng.choice(PEOPLE)[1]) for _ in range(base_facts * 2)))[:base_facts]
    pool_vectors = embedder.embed(pool).astype(np.float32)
    print(f"  {len(pool)} base fact vectors ({embedder.name}): {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    now = datetime.now(timezone.utc)
    ids, texts, subjects, base_of = [], [], [], []
    for n in range(n_facts):
        j = rng.randrange(len(pool))
        name = pool[j].split(" ", 1)[0]
        first = next(p for p in PEOPLE if p[1] == name)
        who = [first] + ([rng.choice([p for p in PEOPLE if p != first])] if rng.random() < 0.25 else [])
        ids.append(n + 1)
        texts.append(f"{pool[j]} (note {n})")
        subjects.append(who)
        base_of.append(j)
    facts = pa.table({
        "id": pa.array(ids, pa.int64()),
        "channel_id": pa.array([rng.choice(CHANNELS) for _ in ids], pa.int64()),
        "text": pa.array(texts),
        "norm_text": pa.array([normalize_fact_text(t) for t in texts]),
        "subject_set": pa.array([subject_set_key(k for k, _ in who) for who in subjects]),
        "source_turn_ids": pa.array([[rng.randint(1, n_turns)] for _ in ids], pa.list_(pa.int64())),
        "importance": pa.array([None if rng.random() < 0.2 else rng.randint(1, 10) for _ in ids], pa.int8()),
        "created_at": pa.array([now] * len(ids), pa.timestamp("us", tz="UTC")),
        "scope": pa.array([SCOPE] * len(ids)),
    })
    subject_rows = pa.table({
        "fact_id": pa.array([i for i, who in zip(ids, subjects) for _ in who], pa.int64()),
        "canonical_key": pa.array([k for who in subjects for k, _ in who]),
        "display_at_write": pa.array([n for who in subjects for _, n in who]),
        "position": pa.array([p for who in subjects for p in range(len(who))], pa.int32()),
        "scope": pa.array([SCOPE] * sum(len(who) for who in subjects)),
    })
    vectors = pa.table({
        "fact_id": pa.array(ids, pa.int64()),
        "model": pa.array([embedder.name] * len(ids)),
        "dim": pa.array([pool_vectors.shape[1]] * len(ids), pa.int32()),
        "vector": pa.array(list(pool_vectors[base_of]), pa.list_(pa.float32())),
        "created_at": pa.array([now] * len(ids), pa.timestamp("us", tz="UTC")),
        "scope": pa.array([SCOPE] * len(ids)),
    })
    retired = rng.sample(ids, n_facts // 10)
    with ProjectionStore(paths.memory_db) as store:
        # Bulk SQL instead of 20k append_fact calls (minutes): same rows, same columns.
        conn = store.conn
        for name, table in (("b_facts", facts), ("b_subjects", subject_rows), ("b_vectors", vectors)):
            conn.register(name, table)
        conn.execute("""INSERT INTO facts (id, channel_id, text, norm_text, subject_set, dedup_key,
                            source_turn_ids, importance, created_at, valid_from, scope, kind)
                        SELECT id, channel_id, text, norm_text, subject_set, norm_text || chr(10) || subject_set,
                               source_turn_ids, importance, created_at, created_at, scope, 'fact' FROM b_facts""")
        conn.execute("INSERT INTO fact_subjects BY NAME SELECT * FROM b_subjects")
        conn.execute("INSERT INTO fact_embeddings BY NAME SELECT * FROM b_vectors")
        # Every turn gets a vector too (a real MiniLM vector of a base statement: the dense turn
        # search's cost is one matrix product over all of them, whatever they say).
        turn_vectors = pa.table({
            "turn_id": pa.array(range(1, n_turns + 1), pa.int64()),
            "model": pa.array([embedder.name] * n_turns),
            "dim": pa.array([pool_vectors.shape[1]] * n_turns, pa.int32()),
            "vector": pa.array(list(pool_vectors[[rng.randrange(len(pool)) for _ in range(n_turns)]]),
                               pa.list_(pa.float32())),
            "created_at": pa.array([now] * n_turns, pa.timestamp("us", tz="UTC")),
            "scope": pa.array([SCOPE] * n_turns),
        })
        conn.register("b_turn_vectors", turn_vectors)
        conn.execute("INSERT INTO turn_embeddings BY NAME SELECT * FROM b_turn_vectors")
        # And a context-window vector per turn (projector turn_window_embedding), which the
        # snapshot precombines with the turn's own vector into the one matrix a reply searches.
        window_vectors = turn_vectors.set_column(
            3, "vector", pa.array(list(pool_vectors[[rng.randrange(len(pool)) for _ in range(n_turns)]]),
                                  pa.list_(pa.float32())))
        conn.register("b_window_vectors", window_vectors)
        conn.execute("INSERT INTO turn_window_embeddings BY NAME SELECT * FROM b_window_vectors")
        conn.execute(f"SELECT max(nextval('facts_id_seq')) FROM range({n_facts})")
        supersede_db.supersede(store, retired, None)
        print(f"  facts: {n_facts} in {time.perf_counter() - t0:.1f}s ({len(retired)} retired)")
        texts = list(zip(ids, texts))
        summary_db.put_summary(store, "The group has been planning a hike in June, Cass started at the bakery, "
                          "and everyone is arguing about the new album. " * 8, n_turns)
        dossier_db.put_dossier(store, f"ego:{FAMILIAR}", "I am Bench, the familiar of this server. " * 20, n_facts)
        for key, name in PEOPLE:
            dossier_db.put_dossier(store, key, f"{name} is a regular here. " + "They mentioned many things. " * 25, n_facts)
        for r in range(40):
            reflection_db.append_reflection(store, channel_id=rng.choice(CHANNELS + [None]), text=f"Reflection {r}: " + chat_line(rng),
                                    cited_turn_ids=[rng.randint(1, n_turns)], cited_fact_ids=[rng.choice(texts)[0]],
                                    last_turn_id=n_turns, last_fact_id=n_facts)
        # Every turn is said in the one server, so every derived row carries its scope: replies
        # read by scope (familiar_bot/prompt/scoping.py), and a row scoped "familiar" is read by none.
        for table in ("people_dossiers", "reflections", "summaries"):
            store.conn.execute(f"UPDATE {table} SET scope = ?", [SCOPE])
        t0 = time.perf_counter()
        publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, durable=False)
        print(f"  snapshot publish: {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    with FtsIndex(paths.fts_facts, writable=True) as ix:
        ix.rebuild(texts)
    print(f"  fts/facts: {time.perf_counter() - t0:.1f}s")
    paths.lorebook_toml.write_text("".join(
        f'[[entries]]\nkeys = ["{obj}"]\ncontent = "Canon about {obj}: ' + "lore " * 40 + '"\npriority = ' + f"{i}\n"
        for i, obj in enumerate(["Lisbon", "Pixel", "bakery", "raid", "cello"])))
    return paths


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def run_mode(label: str, paths: FamiliarPaths, env: dict, embedder, iterations: int, warmup: int,
             seed: int) -> dict:
    config = load_config(FAMILIAR, root=paths.root, env=env)
    memory = MemoryView(paths, config, embedder=embedder)
    assembler = Assembler(memory, default_layers())
    rng = random.Random(seed)
    timings: list[float] = []
    layer_ms: dict[str, list[float]] = {}
    embedded = threaded = 0
    at = memory.turn_log.turns_by_ids([memory.turn_log.latest_id()])[0].created_at
    for n in range(warmup + iterations):
        channel = CHANNELS[n % 2]
        key, name = PEOPLE[n % len(PEOPLE)]
        cue = cue_line(rng, at)
        at += timedelta(seconds=rng.randint(5, 600))
        memory.turn_log.append_turn(channel_id=channel, guild_id=GUILD, role="user", author_key=key,
                                    author_display=name, content=cue, platform_message_id=10**18 + n,
                                    created_at=at)
        ctx = AssemblyContext(FAMILIAR, channel, GUILD, "text", cue, now=at)
        t0 = time.perf_counter()
        prompt = assembler.assemble(ctx)
        elapsed = (time.perf_counter() - t0) * 1000
        if prompt.debug["errors"]:
            raise SystemExit(f"layer errors: {prompt.debug['errors']}")
        if n >= warmup:
            timings.append(elapsed)
            embedded += bool(prompt.debug.get("rag", {}).get("embedded_cue"))
            threaded += bool(prompt.debug.get("rag", {}).get("threads"))
            for name_, ms in prompt.debug["timings_ms"].items():
                layer_ms.setdefault(name_, []).append(ms)
    memory.close()
    result = {"label": label, "p50": percentile(timings, 50), "p95": percentile(timings, 95),
              "p99": percentile(timings, 99), "mean": statistics.fmean(timings), "embedded": embedded,
              "threaded": threaded,
              "layers": {k: statistics.fmean(v) for k, v in layer_ms.items()},
              "tokens": sum(s.tokens for s in prompt.sections), "history": len(prompt.history)}
    print(f"\n{label}: p50 {result['p50']:.1f} ms  p95 {result['p95']:.1f} ms  p99 {result['p99']:.1f} ms  "
          f"mean {result['mean']:.1f} ms  ({iterations} assemblies, cue embedded {embedded}x, "
          f"a followed thread shown {threaded}x; "
          f"last prompt {result['tokens']} tokens, {result['history']} history messages)")
    print("  mean per layer (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in result["layers"].items()))
    return result


SEMANTIC_ENV = {"FAMILIAR__PROVIDERS__EMBEDDING__BACKEND": '"fastembed"',
                "FAMILIAR__PROVIDERS__EMBEDDING__FASTEMBED_MODEL": f'"{MINILM_MODEL_NAME}"',
                "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS":
                    '["rich_note", "fact_embedding", "turn_embedding", "turn_window_embedding"]',
                "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "0.5"}


def local_embedder() -> FastEmbedEmbedder:
    embedder = FastEmbedEmbedder(MINILM_MODEL_NAME, model_path=ensure_local_minilm())
    embedder.embed(["warm up the model"])
    return embedder


def measure(root: Path, turns: int, facts: int, *, embedder: FastEmbedEmbedder, base_facts: int = 1500,
            iterations: int = 300, warmup: int = 30, seed: int = 7) -> dict:
    """Build (or reuse) a familiar of this size under `root` and time both modes."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / f"built-v3-{turns}-{facts}-{seed}"  # v3: with window vectors and words of change
    if marker.exists():  # reuse an earlier build in --dir (it only grows by the benchmark's own turns)
        print(f"reusing the familiar built under {root}")
        paths = FamiliarPaths.for_id(FAMILIAR, root)
    else:
        print(f"building {turns} turns and {facts} facts under {root}")
        paths = build(root, turns, facts, base_facts, embedder, seed)
        marker.touch()
    plain = run_mode("embedding weight 0", paths, {}, None, iterations, warmup, seed)
    embed = run_mode("embedding weight 0.5 (MiniLM cue embedding)", paths, SEMANTIC_ENV, embedder,
                     iterations, warmup, seed + 1)
    return {"turns": turns, "facts": facts, "plain": plain, "embedded": embed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--facts", type=int, default=20_000)
    parser.add_argument("--base-facts", type=int, default=1500, help="distinct statements embedded")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="build here (default: a temp dir)")
    args = parse_with_quick(parser, turns=2000, facts=400, base_facts=200, iterations=20, warmup=3)

    with tempfile.TemporaryDirectory(prefix="familiar-assembly-bench-") as tmp:  # removed unless --dir
        result = measure(args.dir or Path(tmp), args.turns, args.facts, embedder=local_embedder(),
                         base_facts=args.base_facts, iterations=args.iterations, warmup=args.warmup, seed=args.seed)
    plain, embed = result["plain"], result["embedded"]
    if not args.quick:
        print(f"\ntarget p95 ≤ 25 ms: without embedding {'met' if plain['p95'] <= 25 else 'MISSED'}, "
              f"with it {'met' if embed['p95'] <= 25 else 'MISSED'}")


if __name__ == "__main__":
    main()
