"""What each retrieval change is worth: the shipped defaults against the ranking before them, one change at a time.

``familiar eval locomo --ablation`` measures, on the same prepared familiars,
the ranking as it was before the cue's people, time and reply signals, the
substance re-order, the genre's steps, passages and passage vectors ("before": those weights 0, every
hit with its neighbours, 24 hits in the text tier, the people genre, turns whole), each
change added alone to it, the shipped defaults, and the shipped defaults with
each change taken out. Every row's gain over "before" is a **paired bootstrap**
over the questions (the same questions resampled for both rankings, so a gain
is judged against the spread of its own questions, not two independent means).
Run it on both genres: LoCoMo as it is, and a person-assistant file with
``--familiar-speaker`` (docs/benchmarks.md, "Both genres").
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from familiar_bot.app.eval.evaluation import evaluate, summarize

RESAMPLES = 2000
SEED = 29
GAIN_METRICS = ("any@10", "session_any@10", "rendered_recall")

# The knobs each change owns, and the values that turn it off (the ranking before it).
CHANGES: Mapping[str, tuple[dict, dict]] = {
    "people": ({"turn_speaker_weight": 0.0}, {}),
    "time": ({"turn_time_weight": 0.0}, {}),
    "replies": ({"turn_reply_credit": 0.0}, {}),
    "render": ({"turn_neighbour_hits": 0}, {"max_rag_turns": 24}),
    "substance": ({"turn_substance_depth": 0}, {}),
    # issue 48: the genre read from the scope (in the familiar genre: its replies weigh less, the
    # person's taste answers a request for advice, substance is off), and long turns shown in part
    "genre": ({"turn_genre": "people"}, {}),
    "passages": ({"turn_passage_chars": 0}, {}),
    # long turns found by the passage of them that matches (projector turn_passage_embedding)
    "passage vectors": ({"turn_passage_weight": 0.0}, {}),
}
# Parts of a change taken out of the shipped defaults alone (they do nothing without it).
PARTS: Mapping[str, tuple[dict, dict]] = {
    "genre's familiar weight": ({"turn_familiar_weight": 1.0}, {}),
    "genre's taste": ({"turn_taste_weight": 0.0}, {}),
}


def before() -> tuple[dict, dict]:
    """Retrieval and text-budget overrides that give the ranking before these changes."""
    retrieval: dict = {}
    budget: dict = {}
    for knobs, caps in CHANGES.values():
        retrieval.update(knobs)
        budget.update(caps)
    return retrieval, budget


def variants(passage_vectors: bool = True) -> list[tuple[str, dict, dict]]:
    """``(label, retrieval overrides, text budget overrides)`` of every row measured.

    Without ``passage_vectors`` (familiars prepared with no passage rows) the "passage vectors" rows
    are left out: their weight has nothing to act on, so they would only repeat their neighbours."""
    off_retrieval, off_budget = before()
    rows = [("before (all off)", off_retrieval, off_budget)]
    changes = {name: change for name, change in CHANGES.items() if passage_vectors or name != "passage vectors"}
    for name, (knobs, caps) in changes.items():
        retrieval = {k: v for k, v in off_retrieval.items() if k not in knobs}
        budget = {k: v for k, v in off_budget.items() if k not in caps}
        rows.append((f"before + {name}", retrieval, budget))
    rows.append(("shipped defaults", {}, {}))
    for name, (knobs, caps) in {**changes, **PARTS}.items():
        rows.append((f"shipped - {name}", dict(knobs), dict(caps)))
    return rows


def paired_bootstrap(base: list[dict], new: list[dict], metric: str = "any@10", *,
                     resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, float]:
    """Mean gain of ``new`` over ``base`` in points (0-100) on the same questions, with the 95%
    percentile interval of ``resamples`` paired resamples. Records must be in the same order."""
    if len(base) != len(new):
        raise ValueError(f"paired records differ in number: {len(base)} and {len(new)}")
    for a, b in zip(base, new):
        if (a.get("conversation"), a.get("question")) != (b.get("conversation"), b.get("question")):
            raise ValueError("paired records are not the same questions in the same order")
    if not base:
        return {"gain": 0.0, "low": 0.0, "high": 0.0}
    diff = np.array([b[metric] - a[metric] for a, b in zip(base, new)], dtype=float) * 100
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"gain": round(float(diff.mean()), 2), "low": round(float(low), 2), "high": round(float(high), 2)}


def run_ablation(prepared: list, *, embedder_cache: dict | None = None, passage_vectors: bool = True,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every :func:`variants` row on ``prepared``: overall figures and paired gains over "before"
    (``passage_vectors``: whether the familiars were prepared with them, see :func:`variants`)."""
    cache = embedder_cache if embedder_cache is not None else {}
    records: dict[str, list[dict]] = {}
    rows = []
    measured = variants(passage_vectors)
    for label, retrieval, budget in measured:
        records[label] = evaluate(prepared, retrieval=retrieval or None, text_budget=budget or None,
                                  embedder_cache=cache)
        summary = summarize(records[label])
        row = {"label": label, "retrieval": retrieval, "text_budget": budget, **summary["overall"],
               "by_category": {k: v["any@10"] for k, v in summary["by_category"].items()}}
        base = records[measured[0][0]]
        row["gain"] = {m: paired_bootstrap(base, records[label], m) for m in GAIN_METRICS}
        rows.append(row)
        if progress is not None:
            progress(f"{label}: any@10 {row['any@10']:.1f}, session any@10 {row['session_any@10']:.1f}, "
                     f"rendered {row['rendered_recall']:.1f}")
    return {"rows": rows, "resamples": RESAMPLES, "seed": SEED}


def ablation_table(result: Mapping[str, Any]) -> str:
    """Markdown: one row per variant, figures and each gain over "before" with its 95% interval."""
    head = ("| ranking | any@10 | session any@10 | rendered | tokens | any@10 gain vs before | "
            "session gain | rendered gain |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        gains = [row["gain"][m] for m in GAIN_METRICS]
        cells = [f"{g['gain']:+.1f} [{g['low']:.1f}, {g['high']:.1f}]" for g in gains]
        lines.append(f"| {row['label']} | {row['any@10']:.1f} | {row['session_any@10']:.1f} | "
                     f"{row['rendered_recall']:.1f} | {row['rendered_tokens_mean']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
