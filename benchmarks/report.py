"""One speed report: assembly latency by size, embedding throughput, pipeline per asset, rebuild, freshness.

Runs the other benchmarks' measuring functions in sequence on this machine and
writes, under `--out` (default `docs/bench`):

* `speed.json`: every figure, with the machine it was measured on;
* `speed.md`: the tables `docs/benchmarks.md` quotes;
* `assembly.png`, `pipeline.png`, `freshness.png`, `scale.png`: the plots.

    uv run python benchmarks/report.py              # everything, ~8 min on 2 idle cores
    uv run python benchmarks/report.py --quick      # small sizes, for a smoke run
    uv run python benchmarks/report.py --from-json docs/bench/speed.json   # re-render only

Parts: `assembly` (p50/p95/p99 at 10k/100k turns x 2k/20k facts, with and without
the MiniLM cue embedding), `pipeline` (the LoCoMo dev file through every asset with
real MiniLM vectors for facts and turns, then a full rebuild), `embedding` (raw
MiniLM texts/s), `freshness` (`familiar up` ready time, idle RSS, message to facts
visible), `scale` (`benchmarks/scale.py` at 1 and 10 familiars, `scale.png`; `scale.py --sweep` runs the longer curve).
`--parts` picks a subset. Quote medians and ratios: the machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

PARTS = ("assembly", "embedding", "pipeline", "freshness", "scale")
SIZES = [(10_000, 2_000), (10_000, 20_000), (100_000, 2_000), (100_000, 20_000)]
QUICK_SIZES = [(2_000, 400), (10_000, 2_000)]


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
            "python": platform.python_version(), "os": f"{platform.system()} {platform.release()}",
            "load_avg_at_start": [round(v, 2) for v in os.getloadavg()], "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def bench_assembly(sizes, iterations: int) -> list[dict]:
    import assembly

    embedder = assembly.local_embedder()
    rows = []
    for turns, facts in sizes:
        with tempfile.TemporaryDirectory(prefix="familiar-report-") as tmp:
            started = time.perf_counter()
            result = assembly.measure(Path(tmp), turns, facts, embedder=embedder, iterations=iterations,
                                      warmup=max(10, iterations // 10))
            for mode in ("plain", "embedded"):
                r = result[mode]
                rows.append({"turns": turns, "facts": facts, "mode": mode, "p50_ms": round(r["p50"], 1),
                             "p95_ms": round(r["p95"], 1), "p99_ms": round(r["p99"], 1), "tokens": r["tokens"]})
            print(f"  {turns} turns / {facts} facts: built and measured in {time.perf_counter() - started:.0f}s", flush=True)
    return rows


def bench_embedding(n_texts: int) -> dict:
    """Raw MiniLM throughput on chat-length texts, at the two batch sizes the projectors use."""
    import random

    import assembly

    embedder = assembly.local_embedder()
    rng = random.Random(3)
    texts = [assembly.chat_line(rng) for _ in range(n_texts)]
    out = {}
    for batch in (32, 64):
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            for i in range(0, n_texts, batch):
                embedder.embed(texts[i:i + batch])
            runs.append(n_texts / (time.perf_counter() - started))
        out[f"texts_per_s_batch_{batch}"] = round(statistics.median(runs), 1)
    out["texts"] = n_texts
    return out


def bench_pipeline(data: Path, conversations: int | None = None) -> dict:
    import pipeline

    return pipeline.run(data, embedding="fastembed", conversations=conversations)


def bench_freshness(messages: int, starts: int) -> dict:
    import freshness

    return freshness.run(messages=messages, starts=starts)


# ----------------------------------------------------------------------------- output


def bench_scale(quick: bool) -> list[dict]:
    """`benchmarks/scale.py` at N familiars, each sending one message every 2 s."""
    import scale

    sizes, duration = ((1, 3), 20) if quick else ((1, 10), 60)
    return [scale.measure(n, n / 2, duration, drain=90, quiet_s=20, sensor_interval=None) for n in sizes]


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['os']}, Python {m['python']}; "
             f"load average at start {m['load_avg_at_start']}; commit {m['commit']}, {m['date']}.", ""]
    if "assembly" in report:
        lines += ["### Assembly latency (warm, a new message each time)", "",
                  "| turns | facts | cue embedding | p50 ms | p95 ms | p99 ms | prompt tokens |", "|---|---|---|---|---|---|---|"]
        for r in report["assembly"]:
            mode = "MiniLM" if r["mode"] == "embedded" else "none"
            lines.append(f"| {r['turns']:,} | {r['facts']:,} | {mode} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['tokens']} |")
        lines.append("")
    if "embedding" in report:
        e = report["embedding"]
        lines += ["### Embedding throughput (all-MiniLM-L6-v2, ONNX, CPU)", "",
                  f"Raw model: {e['texts_per_s_batch_32']} texts/s at batch 32, {e['texts_per_s_batch_64']} at batch 64 "
                  f"({e['texts']} chat lines, median of 3).", ""]
    if "pipeline" in report:
        p = report["pipeline"]
        lines += [f"### Pipeline per asset ({p['turns']:,} LoCoMo turns, scripted model, MiniLM vectors)", "",
                  "| asset | wall s | model s | rows | turns/s | turns/s excl. model | LLM calls |", "|---|---|---|---|---|---|---|"]
        for a in p["assets"]:
            lines.append(f"| {a['asset']} | {a['wall_s']} | {a['llm_s']} | {a['rows']} | {a['turns_per_s']} | "
                         f"{a['turns_per_s_excl_llm']} | {a['llm_calls']} |")
        lines += ["", f"Full rebuild of the whole graph (cached replies, vectors recomputed): **{p['rebuild_s']} s**, "
                      f"{p['rebuild_new_calls']} new model calls.", ""]
    if "freshness" in report:
        f = report["freshness"]
        lines += ["### `familiar up` and freshness (default cadence)", "",
                  f"Ready (UI answers and the code location is loaded): {f['ready_s']} s, median **{f['ready_median_s']} s**. "
                  f"Idle RSS of the whole group: {f['idle_rss_mib']} MiB in {f['idle_processes']} processes"
                  + (f" (median **{f['idle_rss_median_mib']} MiB**)" if "idle_rss_median_mib" in f else "") + ". "
                  + (f"Load average before / after: {f['load_before']} / {f['load_after']}. " if "load_before" in f else "")
                  + f"Stop after SIGTERM: {f['stop_s']} s.", "",
                  f"Freshness (message appended -> its facts in the bot's snapshot), {len(f['freshness_s'])} messages "
                  f"1 s apart: p50 **{f['freshness_p50_s']} s**, p95 **{f['freshness_p95_s']} s**.", ""]
    if "scale" in report:
        lines += ["### Many familiars (`benchmarks/scale.py`, one message every 2 s per familiar)", "",
                  "| familiars | messages/s | freshness p50 / p95 s | backlog | runs | busy CPU-s per 1,000 turns | peak RSS MiB "
                  "| run start s (median) | load at end |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in report["scale"]:
            start = r["phases"].get("start (spawn, imports, load)", {}).get("median_s", "-")
            lines.append(f"| {r['familiars']} | {r['messages_per_s']} | {r['freshness_p50_s']} / {r['freshness_p95_s']} | "
                         f"{r['backlog_messages']} | {r['runs']} | {r['busy_cpu_s_per_1000_turns']:,} | {r['peak_rss_mib']} | "
                         f"{start} | {r['load_average_1m_at_end']} |")
        lines.append("")
    return "\n".join(lines)


def thousands(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def plots(report: dict, out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (uv sync installs it with the dev group): no plots", file=sys.stderr)
        return []
    written = []
    if "assembly" in report:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        for ax, mode, title in zip(axes, ("plain", "embedded"), ("no cue embedding", "MiniLM cue embedding")):
            rows = [r for r in report["assembly"] if r["mode"] == mode]
            labels = [f"{thousands(r['turns'])} turns\n{thousands(r['facts'])} facts" for r in rows]
            xs = range(len(rows))
            for offset, key in ((-0.25, "p50_ms"), (0, "p95_ms"), (0.25, "p99_ms")):
                ax.bar([x + offset for x in xs], [r[key] for r in rows], width=0.25, label=key.split("_")[0])
            ax.set_xticks(list(xs), labels)
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_ylabel("assembly latency (ms)")
        axes[0].legend()
        fig.suptitle("Prompt assembly latency by familiar size")
        fig.tight_layout()
        written.append(out / "assembly.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if "pipeline" in report:
        assets = report["pipeline"]["assets"]
        fig, ax = plt.subplots(figsize=(8, 4))
        names = [a["asset"] for a in assets]
        ax.barh(names, [a["turns_per_s_excl_llm"] for a in assets], label="excluding model time")
        ax.barh(names, [a["turns_per_s"] for a in assets], label="wall (scripted model)")
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_xlabel("conversation turns processed per second (log)")
        ax.set_title(f"Pipeline throughput per asset, {report['pipeline']['turns']} LoCoMo turns")
        ax.legend()
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        written.append(out / "pipeline.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if "freshness" in report and report["freshness"].get("freshness_s"):
        values = report["freshness"]["freshness_s"]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.bar(range(1, len(values) + 1), values)
        ax.set_xticks(range(1, len(values) + 1))
        ax.set_ylim(0, max(24, max(values) * 1.15))
        ax.axhline(20, color="red", linestyle="--", label="target p95 20 s")
        ax.axhline(report["freshness"]["freshness_p95_s"], color="black", linestyle=":", label="measured p95")
        ax.set_xlabel("message (1 s apart; facts are extracted per batch of 10)")
        ax.set_ylabel("seconds until its facts are visible")
        ax.set_title("Freshness at the default sensor cadence")
        ax.legend(loc="upper right", ncols=2)
        fig.tight_layout()
        written.append(out / "freshness.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if report.get("scale"):
        import scale

        if scale.plot(report["scale"], out / "scale.png"):
            written.append(out / "scale.png")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and counts, one conversation (a smoke run: its figures are not measurements)")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="re-render speed.md and the plots from an earlier speed.json (measures nothing)")
    parser.add_argument("--data", type=Path, help="LoCoMo-format file for the pipeline part (default: $FAMILIAR_LOCOMO)")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        sys.exit(f"error: unknown part(s) {unknown}; choose from {list(PARTS)}")
    if "pipeline" in parts and not args.from_json:  # check before the slow parts run
        from familiar_bot.app.eval import locomo

        data = locomo.locate_or_exit(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        report = json.loads(args.from_json.read_text())
        (args.out / "speed.md").write_text(markdown(report) + "\n")
        print("\n".join(str(p) for p in plots(report, args.out)))
        return
    report: dict = {"machine": machine()}
    if "assembly" in parts:
        print("assembly latency ...", flush=True)
        report["assembly"] = bench_assembly(QUICK_SIZES if args.quick else SIZES, 60 if args.quick else 200)
    if "embedding" in parts:
        print("embedding throughput ...", flush=True)
        report["embedding"] = bench_embedding(256 if args.quick else 2048)
    if "pipeline" in parts:
        print("pipeline per asset ...", flush=True)
        report["pipeline"] = bench_pipeline(data, 1 if args.quick else None)
    if "freshness" in parts:
        print("familiar up and freshness ...", flush=True)
        report["freshness"] = bench_freshness(10 if args.quick else 20, 1 if args.quick else 3)
    if "scale" in parts:
        print("many familiars ...", flush=True)
        report["scale"] = bench_scale(args.quick)
    (args.out / "speed.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (args.out / "speed.md").write_text(text + "\n")
    written = plots(report, args.out)
    print("\n" + text)
    print(f"wrote {args.out / 'speed.json'}, {args.out / 'speed.md'}" + "".join(f", {p}" for p in written))


if __name__ == "__main__":
    main()
