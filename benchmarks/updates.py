"""Updates, standing wishes and order (issue 33): scripted long chats through the product's retrieval.

Generates `--chats` long chats between one person and the familiar (deterministic from
`--seed`; `familiar_bot/app/eval/updates_chats.py`): many sessions days apart, filler on many
topics, and planted questions of four kinds: values updated in other words (the question
asks for the current one), standing wishes followed many sessions later by an unrelated
task, preferences stated once, and ordering questions whose evidence spans many sessions;
with look-alikes that are not evidence (other people's values, quoted wishes, questions).
Each chat becomes a throwaway familiar with the shipped defaults, its turn projections
materialized through Dagster in process (full-text index, MiniLM turn and window vectors;
no facts, no model), and every question is asked at the chat's end through `rag_context`'s
retrieval (the LoCoMo evaluation's scorer) and as the whole assembled prompt.

Prints a table per kind (any@k, rendered recall, whether the evidence is anywhere in the
whole prompt, and for updates whether the newest statement ranks above every older one),
then, as the last line, one JSON object with `newest_above_older`, `wishes_in_prompt` and
`ordering_any@10` (percentages), per-kind n / any@10 / rendered, the seed and the seconds.

    uv run python benchmarks/updates.py [--seed 33] [--chats 4] [--quick] [--out DIR]
    uv run python benchmarks/updates.py --workdir DIR [--reuse]   # keep the familiars; --reuse: score only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=33, help="generator seed (default 33)")
    parser.add_argument("--chats", type=int, default=None,
                        help="how many chats (default 4, ~790 turns each; 2 small ones with --quick)")
    parser.add_argument("--quick", action="store_true", help="small chats, fewer questions: a smoke run for tests")
    parser.add_argument("--embedder", choices=("fastembed", "hash", "off"), default="fastembed",
                        help="fastembed: the local MiniLM (default, what the figures use); hash: a quick stand-in")
    parser.add_argument("--model-path", default=None, help="the MiniLM folder (default: built as "
                                                            "`familiar models minilm` builds it)")
    parser.add_argument("--workdir", default=None, help="keep the familiars here instead of a temporary folder")
    parser.add_argument("--reuse", action="store_true",
                        help="with --workdir: keep the familiars an earlier run prepared there for the same chats "
                             "and config (no re-embedding; new projections still catch up): for tuning retrieval")
    parser.add_argument("--out", default=None, help="write updates.json (every record) and updates.md here")
    args = parser.parse_args(argv)
    chats = args.chats if args.chats is not None else (2 if args.quick else 4)
    if chats < 1:
        parser.error("--chats must be at least 1")
    if args.reuse and not args.workdir:
        parser.error("--reuse needs --workdir (the folder an earlier run prepared)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="familiar-updates-") as scratch:
        # A Dagster home of our own: nothing of the caller's instance is read or written.
        os.environ.setdefault("DAGSTER_HOME", str(Path(scratch) / "dagster_home"))
        Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
        return run(args, chats, Path(args.workdir).expanduser() if args.workdir else Path(scratch) / "data",
                   started)


def run(args: argparse.Namespace, chats: int, workdir: Path, started: float) -> int:
    from familiar_bot.app.eval import updates, updates_chats

    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    model_path = None
    if args.embedder == "fastembed":
        from familiar_pipeline.models.minilm import ensure_local_minilm

        model_path = ensure_local_minilm(args.model_path, progress=say)
    options = updates_chats.QUICK if args.quick else {}
    generated = updates_chats.generate(args.seed, chats, **options)
    for chat in generated:
        problems = updates_chats.problems(chat)
        if problems:
            raise SystemExit(f"generated chat {chat.id} is invalid: {'; '.join(problems)}")
    prepared = updates.prepare_all(generated, workdir, embedder=args.embedder, model_path=model_path,
                                   reuse=args.reuse, progress=say)
    prepared_s = time.perf_counter() - started
    cache: dict = {}
    records: list[dict] = []
    for item in prepared:
        records += updates.score_chat(item, embedder_cache=cache)
    elapsed = time.perf_counter() - started
    summary = updates.summarize(records)
    turns = sum(len(c.turns) for c in generated)
    setup = {"embedder": args.embedder, "quick": args.quick, "turns": turns,
             "sessions": sum(c.sessions for c in generated), "prepare_s": round(prepared_s, 1),
             "load_avg": updates.load_average()}
    line = updates.json_line(records, summary, seed=args.seed, chats=chats, elapsed_s=elapsed, **setup)
    head = line
    errors = sorted({e for r in records for e in r["prompt_errors"]})
    text = "\n".join([
        f"updates, wishes and order (issue 33): seed {args.seed}, {chats} chats, {turns} turns, "
        f"{len(records)} questions, embedder {args.embedder}, shipped defaults, turns only",
        "",
        updates.table(summary),
        "",
        f"newest_above_older {head['newest_above_older']:.1f} | wishes_in_prompt {head['wishes_in_prompt']:.1f} | "
        f"ordering_any@10 {head['ordering_any@10']:.1f} | evidence in the recent history: "
        f"{sum(r['in_history'] for r in records):.0f} questions | standing-wishes section: "
        f"{'yes' if any(r['wishes_section'] for r in records) else 'none in this tree'}"
        + (f" | prompt layers that failed: {', '.join(errors)}" if errors else ""),
        f"{elapsed:.1f} s ({prepared_s:.1f} s preparing), load average {setup['load_avg']}",
    ])
    print(text)
    if args.out:
        updates.write_outputs(Path(args.out).expanduser(), {"summary": summary, "headline": line,
                                                             "records": records}, text)
    print(json.dumps(line, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
