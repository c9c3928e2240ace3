"""Pipeline throughput on real conversation text: the three LoCoMo dev conversations as one familiar.

Imports every turn, then materializes every asset of the graph in order (the
turn-driven ones, then supersessions, dossiers, reflections and embeddings)
through Dagster (in-process, a throwaway instance) with the scripted model, and
prints per asset: wall time, model time, rows, LLM calls and prompt tokens, and
LLM calls and prompt tokens per 100 turns (prompt sizes are real even though
replies are scripted); then the full-rebuild time of the whole graph.

    uv run python benchmarks/pipeline.py [--data ../shared/data/locomo-dev.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import dagster as dg  # noqa: E402

from familiar_pipeline import locomo  # noqa: E402
from familiar_pipeline.assets import FACT_DRIVEN_ASSETS, facts, rolling_summary, turns, turns_fts  # noqa: E402
from familiar_pipeline.fake_llm import install_fake_llm  # noqa: E402
from familiar_pipeline.paths import FamiliarPaths  # noqa: E402
from familiar_pipeline.resources import EmbedderResource, FamiliarData, LlmResource  # noqa: E402
from familiar_pipeline.testing import careful_model  # noqa: E402
from familiar_pipeline.turns import TurnLog  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo-dev.json"
ALL_ASSETS = [turns_fts, rolling_summary, facts, *FACT_DRIVEN_ASSETS]
GRAPH_TOML = """
[llm.background]
model = "fake/careful"

[providers.embedding]
backend = "hash"

[providers.memory]
projectors = ["rolling_summary", "rich_note", "fact_supersede", "people_dossier", "reflection", "fact_embedding"]
"""


def import_locomo(paths: FamiliarPaths, data: Path) -> int:
    rows = []
    with TurnLog(paths.turns_db) as log:
        for channel, sample in enumerate(locomo.load(data), start=1):
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
    run_config = {"ops": {a.key.path[-1]: {"config": {"rebuild": rebuild}} for a in assets}}
    result = dg.materialize(
        [turns, *assets], partition_key="bench", instance=instance, run_config=run_config,
        resources={"familiar_data": FamiliarData(data_root=str(root)), "llm": LlmResource(), "embedder": EmbedderResource()},
        selection=[a.key for a in assets],
    )
    out = {}
    for event in result.get_asset_materialization_events():
        out[event.asset_key.path[-1]] = {k: v.value for k, v in event.materialization.metadata.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(f"LoCoMo file not found: {args.data}")
    fake = install_fake_llm()
    fake.script(careful_model)
    with tempfile.TemporaryDirectory() as tmp, dg.instance_for_test() as instance:
        root = Path(tmp)
        os.environ["FAMILIAR__PIPELINE__MAX_BATCHES_PER_RUN"] = "100000"
        os.environ["FAMILIAR__PROVIDERS__MEMORY__ROLLING_SUMMARY__BACKFILL_CAP"] = "100000"
        paths = FamiliarPaths.for_id("bench", root)
        paths.dir.mkdir(parents=True)
        paths.character_toml.write_text(GRAPH_TOML)
        n_turns = import_locomo(paths, args.data)
        instance.add_dynamic_partitions("familiars", ["bench"])
        print(f"turns imported: {n_turns} (3 LoCoMo conversations)")
        per100 = 100 / n_turns
        print(f"{'asset':<20}{'wall s':>8}{'llm s':>8}{'rows':>7}{'llm calls':>11}{'prompt tok':>12}{'calls/100t':>12}{'tok/100t':>10}")
        totals = {"calls": 0, "prompt": 0}
        for asset in ALL_ASSETS:
            started = time.perf_counter()
            meta = materialize(root, instance, [asset])[asset.key.path[-1]]
            wall = time.perf_counter() - started
            llm_s = float(meta.get("llm_seconds", 0.0))
            calls, prompt_tokens = int(meta.get("llm_calls", 0)), int(meta.get("llm_prompt_tokens", 0))
            totals["calls"] += calls
            totals["prompt"] += prompt_tokens
            print(f"{asset.key.path[-1]:<20}{wall:>8.2f}{llm_s:>8.2f}{meta['rows_written']:>7}{calls:>11}{prompt_tokens:>12}"
                  f"{calls * per100:>12.1f}{prompt_tokens * per100:>10.0f}")
        print(f"LLM per 100 turns (whole graph): {totals['calls'] * per100:.1f} calls, {totals['prompt'] * per100:.0f} prompt tokens")
        calls_before = len(fake.calls)
        started = time.perf_counter()
        materialize(root, instance, ALL_ASSETS, rebuild=True)
        rebuild_s = time.perf_counter() - started
        print(f"full rebuild (whole graph, cached replies): {rebuild_s:.2f} s, new provider calls: {len(fake.calls) - calls_before}")


if __name__ == "__main__":
    main()
