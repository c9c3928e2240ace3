"""`familiar eval locomo`: measure retrieval on a LoCoMo-format file through the bot's own path.

Every conversation becomes a throwaway familiar under a temporary folder (or
`--workdir`), with the shipped defaults of `data/familiars/_default`; nothing
touches a real familiar. Prints the overall and per-category table and writes
results.json, results.md and a recall@k plot into `--out`. See
:mod:`familiar_bot.app.eval.evaluation` for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    loc = sub.add_parser("locomo", help="evidence recall of rag_context on LoCoMo conversations (categories 1-4)")
    loc.add_argument("--data", metavar="PATH",
                     help="a LoCoMo-format JSON file, read in place and never copied (default: $FAMILIAR_LOCOMO); "
                          "the public release is github.com/snap-research/locomo, data/locomo10.json")
    loc.add_argument("--embedder", choices=("hash", "fastembed", "off"), default="off",
                     help="off: BM25 only; hash: the dependency-free test embedder; fastembed: local all-MiniLM-L6-v2 "
                          "(default off)")
    loc.add_argument("--model-path", metavar="DIR",
                     help="local MiniLM ONNX folder for --embedder fastembed (default: $FAMILIAR_MINILM_DIR, else "
                          ".cache/models/all-MiniLM-L6-v2; built there first as `familiar models minilm` does)")
    loc.add_argument("--facts", choices=evaluation_fact_modes(), default="none",
                     help="none (default, the headline): turns and turn embeddings only; extracted: the familiar's own "
                          "facts asset run with --background-model; gold: the file's observations as facts, an ORACLE "
                          "upper bound")
    loc.add_argument("--background-model", metavar="MODEL",
                     help="litellm model string for [llm.background] with --facts extracted (its API key comes from "
                          "the provider's usual environment variable)")
    loc.add_argument("--familiar-speaker", metavar="NAME",
                     help="read this speaker's turns as the familiar's own replies (role assistant, as the bot "
                          "records a DM) and the other as the person; without it every speaker is a person "
                          "(LoCoMo); e.g. Assistant for LongMemEval-style files")
    loc.add_argument("--passage-vectors", action="store_true",
                     help="with an embedder, also embed long turns' passages (projector turn_passage_embedding, "
                          "opt-in for a familiar too) and rank a long turn by its best passage; --ablation then "
                          "measures them too")
    loc.add_argument("--out", metavar="DIR", help="write results.json, results.md and recall_at_k.png here")
    for study, does in (
        ("sweep", "sweep the [memory.retrieval] weights and the text-tier split (tune on the dev file only)"),
        ("ablation", "measure each retrieval change (people, time, replies, render) against the ranking before "
                     "it, with paired bootstrap gains"),
    ):
        loc.add_argument(f"--{study}", action="store_true",
                         help=f"also {does}; writes {study}.json and {study}.md into --out")
    loc.add_argument("--workdir", metavar="DIR", help="keep the throwaway familiars here instead of a temporary folder")
    loc.add_argument("--reuse", action="store_true",
                     help="with --workdir (and --facts none): keep a familiar an earlier run prepared there for the same "
                          "turns and config; its projections only catch up, so a stopped run resumes")
    loc.add_argument("--conversations", metavar="LIST",
                     help="only these conversations: comma-separated indices (0 is the file's first) or sample ids")
    loc.add_argument("--turns", type=int, metavar="N",
                     help="import only the first N turns of each conversation; questions keep the evidence among "
                          "them (those with none left are skipped)")
    loc.add_argument("--questions", type=int, metavar="N",
                     help="only the first N scored questions of each conversation (a quick look with a slow model)")
    loc.add_argument("--answer", action="store_true",
                     help="also answer every question through the bot (real assembler, text tier, [llm.reply]) and "
                          "score the answers: token F1 and an LLM judge's CORRECT/WRONG ([llm.judge]), per category")
    loc.add_argument("--answer-model", metavar="MODEL",
                     help="litellm model string answering with --answer (default: [llm.reply].model)")
    loc.add_argument("--judge-model", metavar="MODEL",
                     help="litellm model string judging with --answer (default: [llm.judge].model, else the "
                          "answering model)")
    loc.add_argument("--answer-cache", metavar="PATH",
                     help="response cache of the answering and judging calls, kept so a rerun is free (default: "
                          "$XDG_CACHE_HOME/familiar/eval/llm_cache.sqlite)")


def evaluation_fact_modes() -> tuple[str, ...]:
    from familiar_bot.app.eval.modes import FACT_MODES

    return FACT_MODES


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from familiar_bot.app.eval import answer, evaluation, locomo

    try:
        data = locomo.locate(args.data)
    except locomo.LocomoMissing as exc:
        raise CliError(str(exc), EXIT_CONFIG) from None
    if args.facts == "extracted" and not (args.background_model or "").strip():
        raise CliError("--facts extracted needs --background-model (a litellm model string)", EXIT_CONFIG)
    if args.answer and not (args.answer_model or os.environ.get("FAMILIAR__LLM__REPLY__MODEL", "").strip(' "')):
        raise CliError("--answer needs an answering model: --answer-model MODEL (a litellm model string) or "
                       "FAMILIAR__LLM__REPLY__MODEL", EXIT_CONFIG)
    for name in ("turns", "questions"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise CliError(f"--{name} must be at least 1, not {getattr(args, name)}", EXIT_CONFIG)
    model_path = None
    if args.embedder == "fastembed":
        from familiar_pipeline.models.minilm import MinilmUnavailable, ensure_local_minilm

        try:
            model_path = ensure_local_minilm(args.model_path, progress=lambda line: print(line, file=sys.stderr))
        except MinilmUnavailable as exc:
            raise CliError(str(exc), EXIT_CONFIG) from None
    if args.passage_vectors and args.embedder == "off":
        raise CliError("--passage-vectors needs an embedder (--embedder fastembed or hash)", EXIT_CONFIG)
    if args.reuse and not args.workdir:
        raise CliError("--reuse needs --workdir (the folder an earlier run prepared its familiars in)", EXIT_CONFIG)
    if args.reuse and args.facts != "none":
        raise CliError("--reuse works with --facts none only (facts are loaded or extracted anew each run)",
                       EXIT_CONFIG)
    only = [part.strip() for part in (args.conversations or "").split(",") if part.strip()] or None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="familiar-eval-") as scratch:
        workdir = Path(args.workdir).expanduser() if args.workdir else Path(scratch)
        try:
            prepared = evaluation.prepare_all(
                data, workdir, embedder=args.embedder, model_path=model_path,
                facts=args.facts, background_model=args.background_model, only=only,
                max_turns=args.turns, familiar_speaker=args.familiar_speaker, reuse=args.reuse,
                passage_vectors=args.passage_vectors,
                progress=lambda message: print(message, file=sys.stderr),
            )
        except (ValueError, KeyError) as exc:
            raise CliError(f"{data}: not a usable LoCoMo file ({exc})", EXIT_CONFIG) from None
        if args.questions is not None:
            for conv in prepared:
                del conv.questions[args.questions:]
        total = sum(len(p.questions) for p in prepared)
        cache: dict = {}
        with tqdm(total=total, unit="q", file=sys.stderr, desc="questions") as bar:
            records = evaluation.evaluate(prepared, progress=bar.update, embedder_cache=cache)
        sweep = None
        if args.sweep:
            sweep = evaluation.run_sweep(prepared, embedder_cache=cache,
                                         progress=lambda message: print(message, file=sys.stderr))
        ablation = None
        if args.ablation:
            from familiar_bot.app.eval.ablation import run_ablation

            ablation = run_ablation(prepared, embedder_cache=cache, passage_vectors=args.passage_vectors,
                                    progress=lambda message: print(message, file=sys.stderr))
        try:
            answers = run_answers(args, prepared, total) if args.answer else None
        except ValueError as exc:
            raise CliError(str(exc), EXIT_CONFIG) from None
    results = evaluation.summarize(records)
    results["setup"] = {
        "data": str(data), "embedder": args.embedder, "conversations": len(prepared),
        **evaluation.facts_setup(prepared, args.facts, args.background_model),
        "evidence_ids_skipped": sum(p.evidence_skipped for p in prepared),
        "questions_skipped": sum(p.questions_skipped for p in prepared),
        "familiar_speaker": args.familiar_speaker, "passage_vectors": args.passage_vectors,
        "turns_per_conversation": args.turns, "questions_per_conversation": args.questions,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(evaluation.mode_line(results))
    print(evaluation.markdown_table(results))
    setup = results["setup"]
    print(f"\n{setup['conversations']} conversations, {results['overall']['n']} questions (categories 1-4), "
          f"{setup['facts_loaded']} facts; skipped {setup['evidence_ids_skipped']} unusable evidence ids and "
          f"{setup['questions_skipped']} questions without usable evidence; {setup['seconds']} s")
    if sweep is not None:
        print("\nsweep (overall figures per configuration):\n" + evaluation.sweep_table(sweep))
    if ablation is not None:
        from familiar_bot.app.eval.ablation import ablation_table

        print("\nablation (paired bootstrap gains over the ranking before these changes):\n" + ablation_table(ablation))
    if answers is not None:
        results["answer"] = answers
        print("\n" + answer.answer_table(answers))
    if args.out:
        out = Path(args.out).expanduser()
        for note in evaluation.write_outputs(results, out):
            print(f"note: {note}", file=sys.stderr)
        if answers is not None:
            with (out / "results.md").open("a") as md:
                md.write("\n" + answer.answer_table(answers) + "\n")
        if ablation is not None:
            from familiar_bot.app.eval.ablation import ablation_table

            (out / "ablation.json").write_text(json.dumps(ablation, indent=2) + "\n")
            (out / "ablation.md").write_text(ablation_table(ablation) + "\n")
        if sweep is not None:
            (out / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
            (out / "sweep.md").write_text(evaluation.sweep_table(sweep) + "\n")
        print(f"wrote {args.out}/results.json and results.md")
    return 0


def default_answer_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "familiar" / "eval" / "llm_cache.sqlite"


def run_answers(args: argparse.Namespace, prepared: list, total: int) -> dict:
    """``--answer``: every prepared question answered and judged; the results' ``answer`` section."""
    from tqdm import tqdm

    from familiar_bot.app.eval import answer

    cache_path = Path(args.answer_cache).expanduser() if args.answer_cache else default_answer_cache()
    records: list[dict] = []
    with tqdm(total=total, unit="q", file=sys.stderr, desc="answers") as bar:
        for conv in prepared:
            records += answer.answer_conversation(conv, cache_path=cache_path, answer_model=args.answer_model,
                                                  judge_model=args.judge_model, progress=bar.update)
    answer_model, judge_model = answer.resolved_models(prepared, args.answer_model, args.judge_model)
    section = answer.summarize_answers(records, answer_model=answer_model, judge_model=judge_model)
    section["cache"] = str(cache_path)
    return section


COMMAND = Command("eval", "measure retrieval quality on a benchmark file (LoCoMo)", configure, run)
