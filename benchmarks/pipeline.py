"""Pipeline throughput on real conversation text: the three LoCoMo dev conversations as one familiar.

Imports every turn, then materializes every asset of the graph in order (the
turn-driven ones, then supersessions, dossiers, reflections and embeddings)
through Dagster (in-process, a throwaway instance) with the scripted model, and
prints per asset: wall time, model time, rows, LLM calls and prompt tokens, and
LLM calls and prompt tokens per 100 turns (prompt sizes are real even though
replies are scripted); then the full-rebuild time of the whole graph.

    uv run python benchmarks/pipeline.py [--data LOCOMO.json] [--embedding hash|fastembed]

The LoCoMo file comes from --data or $FAMILIAR_LOCOMO (missing: says where to get it, exit 2).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quick import parse_args as parse_with_quick  # noqa: E402

import dagster as dg  # noqa: E402

from familiar_bot.app.eval import locomo  # noqa: E402
from familiar_pipeline.defs.assets import FACT_DRIVEN  # noqa: E402
from familiar_pipeline.defs.jobs import materialize_in_process  # noqa: E402
from familiar_pipeline.testing.fake_llm import install_fake_llm  # noqa: E402
from familiar_pipeline.storage.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.testing.scripted import careful_model  # noqa: E402
from familiar_pipeline.storage.turns import TurnLog  # noqa: E402

# Model calls per 100 turns the whole graph may make on LoCoMo (issue 51; docs/benchmarks.md).
CALLS_TARGET = 25.0
ALL_ASSETS = ["turns_fts", "rolling_summary", "facts", *(k.path[-1] for k in FACT_DRIVEN)]
GRAPH_TOML = """
[llm.background]
model = "fake/careful"

[providers.embedding]
backend = "hash"

[providers.memory]
projectors = ["rolling_summary", "rich_note", "fact_supersede", "people_dossier", "reflection", "fact_embedding"]
"""


def graph_toml(embedding: str) -> str:
    """The whole graph; `embedding="fastembed"` adds turn vectors and uses the local MiniLM folder."""
    if embedding == "hash":
        return GRAPH_TOML
    from familiar_pipeline.models.minilm import MINILM_MODEL_NAME, ensure_local_minilm

    return (GRAPH_TOML.replace('backend = "hash"', f'backend = "fastembed"\nfastembed_model = "{MINILM_MODEL_NAME}"\n'
                               f'fastembed_model_path = "{ensure_local_minilm()}"')
            .replace('"fact_embedding"]', '"fact_embedding", "turn_embedding"]'))


# One run works off the whole conversation (the defaults cap a run at 20 batches).
BIG_RUNS = {"FAMILIAR__PIPELINE__MAX_BATCHES_PER_RUN": "100000",
            "FAMILIAR__PROVIDERS__MEMORY__ROLLING_SUMMARY__BACKFILL_CAP": "100000"}


def import_locomo(paths: FamiliarPaths, data: Path, conversations: int | None = None) -> int:
    """Every turn of the file's first ``conversations`` (all by default) into the familiar, one channel each."""
    rows = []
    with TurnLog(paths.turns_db) as log:
        for channel, sample in enumerate(locomo.load(data)[:conversations], start=1):
            for turn in locomo.turns_of(sample):
                key = locomo.speaker_key(turn.speaker)
                log.upsert_participant(key, username=turn.speaker, global_name=turn.speaker)
                rows.append(
                    dict(channel_id=channel, role="user", author_key=key, author_display=turn.speaker,
                         content=turn.text, created_at=turn.timestamp)
                )
        log.append_turns(rows)
    return len(rows)


def materialize(root: Path, instance, assets, *, rebuild=False):
    result = materialize_in_process(assets, instance=instance, data_root=root, partition_key="bench", rebuild=rebuild)
    out = {}
    for event in result.get_asset_materialization_events():
        out[event.asset_key.path[-1]] = {k: v.value for k, v in event.materialization.metadata.items()}
    return out


@contextmanager
def scripted_familiar(toml: str) -> Iterator[tuple[Path, FamiliarPaths, dg.DagsterInstance, Any]]:
    """A throwaway familiar "bench" answered by the scripted model, with no cap on a run's batches:
    (its data root, its paths, a throwaway Dagster instance, the fake model recording calls)."""
    fake = install_fake_llm()
    fake.script(careful_model)
    with mock.patch.dict(os.environ, BIG_RUNS), tempfile.TemporaryDirectory() as tmp, dg.instance_for_test() as instance:
        root = Path(tmp)
        paths = FamiliarPaths.for_id("bench", root)
        paths.dir.mkdir(parents=True)
        paths.character_toml.write_text(toml)
        instance.add_dynamic_partitions("familiars", ["bench"])
        yield root, paths, instance, fake


def run(data: Path, embedding: str = "hash", conversations: int | None = None) -> dict:
    """Materialize every asset in order on the LoCoMo familiar, then rebuild the graph; figures per asset.

    `embedding`: "hash" (no model cost) or "fastembed" (real MiniLM vectors for facts and turns).
    """
    graph = ALL_ASSETS if embedding == "hash" else ["turns_fts", "turn_embeddings", *ALL_ASSETS[1:]]
    with scripted_familiar(graph_toml(embedding)) as (root, paths, instance, fake):
        n_turns = import_locomo(paths, data, conversations)
        assets = []
        for asset in graph:
            started = time.perf_counter()
            meta = materialize(root, instance, [asset])[asset]
            wall = time.perf_counter() - started
            llm_s = float(meta.get("llm_seconds", 0.0))
            assets.append({
                "asset": asset, "wall_s": round(wall, 2), "llm_s": round(llm_s, 2),
                "rows": int(meta["rows_written"]), "llm_calls": int(meta.get("llm_calls", 0)),
                "prompt_tokens": int(meta.get("llm_prompt_tokens", 0)),
                "turns_per_s": round(n_turns / wall, 1),
                "turns_per_s_excl_llm": round(n_turns / max(wall - llm_s, 1e-6), 1),
            })
        calls_before = len(fake.calls)
        started = time.perf_counter()
        materialize(root, instance, graph, rebuild=True)
        rebuild_s = time.perf_counter() - started
        return {"turns": n_turns, "embedding": embedding, "assets": assets, "rebuild_s": round(rebuild_s, 2),
                "rebuild_new_calls": len(fake.calls) - calls_before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help=f"LoCoMo-format file (default: ${locomo.DATA_ENV})")
    parser.add_argument("--embedding", choices=["hash", "fastembed"], default="hash",
                        help="fastembed: real MiniLM vectors for facts and turns (default: hash)")
    parser.add_argument("--conversations", type=int, default=None, help="the file's first N conversations (default: all)")
    args = parse_with_quick(parser, conversations=1)
    result = run(locomo.locate_or_exit(args.data), args.embedding, args.conversations)
    n_turns = result["turns"]
    per100 = 100 / n_turns
    print(f"turns imported: {n_turns} ({args.conversations or 'every'} LoCoMo conversation(s) of {args.data or 'the file'})")
    print(f"{'asset':<20}{'wall s':>8}{'llm s':>8}{'rows':>7}{'turns/s':>9}{'llm calls':>11}{'prompt tok':>12}"
          f"{'calls/100t':>12}{'tok/100t':>10}")
    for a in result["assets"]:
        print(f"{a['asset']:<20}{a['wall_s']:>8.2f}{a['llm_s']:>8.2f}{a['rows']:>7}{a['turns_per_s']:>9.0f}"
              f"{a['llm_calls']:>11}{a['prompt_tokens']:>12}{a['llm_calls'] * per100:>12.1f}{a['prompt_tokens'] * per100:>10.0f}")
    calls = sum(a["llm_calls"] for a in result["assets"])
    tokens = sum(a["prompt_tokens"] for a in result["assets"])
    print(f"LLM per 100 turns (whole graph): {calls * per100:.1f} calls, {tokens * per100:.0f} prompt tokens "
          f"(target <= {CALLS_TARGET:g} calls: {'met' if calls * per100 <= CALLS_TARGET else 'NOT met'})")
    print(f"full rebuild (whole graph, cached replies): {result['rebuild_s']:.2f} s, "
          f"new provider calls: {result['rebuild_new_calls']}")


if __name__ == "__main__":
    main()
