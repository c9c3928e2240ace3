"""Updates, standing wishes and order (issue 33): the scripted chats of :mod:`updates_chats` through the product.

Each chat becomes a throwaway familiar under a scratch data root with the shipped defaults
(the person's turns as ``user`` turns, the familiar's as ``assistant`` turns under its ego
key, as the responder records them); its projections are materialized through Dagster in
process the way the LoCoMo evaluation does it (:func:`evaluation.materialize_projections`:
the full-text index, and turn and window vectors with an embedder; no facts, no model).
Every question is then asked at the chat's end:

* through ``rag_context``'s retrieval with no recent-window exclusion, scored by the LoCoMo
  evaluation's own scorer (:func:`evaluation.ask`: any@k over the ranking read at depth 50,
  rendered recall at the text-tier budget);
* and as the whole assembled prompt (every default layer, as the responder assembles it),
  to see whether the wish turn is anywhere in it: the rag section's shown turns, the recent
  history's turns, or the turns a standing-wishes section cites in
  ``prompt.debug["wishes"]["turn_ids"]`` (when such a section exists).

Per kind: n, any@k, rendered recall (for wishes and preferences, a wish turn cited by the
whole prompt's ``debug["wishes"]`` counts too), and for updates ``newest_above_older``: the
share of questions whose newest statement ranks above every older statement (a turn missing
from the ranking has rank infinity; both missing is not above).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from dagster import DagsterInstance

from familiar_pipeline.config import load_config
from familiar_pipeline.engine import registry
from familiar_pipeline.engine.spec import ProjectorSpec
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.paths import SHIPPED_DEFAULT_DIR, FamiliarPaths, default_dir
from familiar_pipeline.storage.turns import Turn, TurnLog

from familiar_bot.app.eval import evaluation
from familiar_bot.app.eval.evaluation import EVAL_CHANNEL, KS, PreparedConversation, session_of
from familiar_bot.app.eval.updates_chats import KINDS, Chat
from familiar_bot.prompt.assembly import Assembler, AssemblyContext
from familiar_bot.prompt.layers.recent_history import history_view
from familiar_bot.prompt.layers.stack import default_layers
from familiar_bot.prompt.retrieval.hub import retrieve

STANDING = ("wish", "preference")


@dataclass
class PreparedChat:
    chat: Chat
    prepared: PreparedConversation  # what the LoCoMo evaluation's helpers take (ids, root, dia id -> turn id)
    reused: bool = False  # its turns and vectors came from an earlier run (--reuse)


def turn_only_projectors(root: Path) -> list[ProjectorSpec]:
    """Projectors the shipped defaults run (or that always run) that read the turns alone and need neither a
    model nor an embedder, besides the full-text index the evaluation always builds: none on main today. One
    added later (a heuristic standing-wishes table) is turned on and materialized too, so the whole prompt
    is the one a familiar with the shipped defaults would assemble before any model has run."""
    shipped = set(load_config("shipped-defaults", root=root).memory.projectors)
    return [s for s in registry.specs()
            if not s.needs_llm and not s.needs_embedder and set(s.inputs) <= {"turns"} and s.asset != "turns_fts"
            and (s.always_on or s.name in shipped)]


def chat_rows(chat: Chat, display: str) -> list[dict]:
    """The TurnLog rows of a chat: the person's as ``user`` turns, the familiar's as ``assistant`` turns
    under its ego key and display name, as the responder records them."""
    return [{"channel_id": EVAL_CHANNEL, "role": t.role, "content": t.text, "created_at": t.at,
             "author_key": chat.person_key if t.role == "user" else ego_key(chat.id),
             "author_display": chat.person_name if t.role == "user" else display}
            for t in chat.turns]


def _reusable(chat: Chat, root: Path, toml: str) -> list[Turn] | None:
    """The turns of a familiar an earlier run prepared for this very chat and config, else None."""
    paths = FamiliarPaths.for_id(chat.id, root)
    if not paths.character_toml.is_file() or paths.character_toml.read_text() != toml:
        return None
    return evaluation.reusable_turns(paths, toml, chat_rows(chat, load_config(chat.id, root=root).display_name))


def import_chat(chat: Chat, root: Path, *, embedder: str, model_path: Path | None,
                extra_projectors: list[str]) -> list[Turn]:
    """A fresh familiar holding the chat's turns (:func:`chat_rows`)."""
    paths = evaluation.new_familiar(chat.id, root, embedder=embedder, model_path=model_path,
                                    extra_projectors=extra_projectors)
    display = load_config(chat.id, root=root).display_name
    with TurnLog(paths.turns_db) as log:
        log.upsert_participant(chat.person_key, global_name=chat.person_name, seen_at=chat.turns[0].at)
        return log.append_turns(chat_rows(chat, display))


def prepare_chat(chat: Chat, root: Path, instance, *, embedder: str, model_path: Path | None,
                 reuse: bool = False) -> PreparedChat:
    """Import one chat into a fresh familiar and materialize its turn projections through Dagster.

    ``reuse``: a familiar an earlier run left in ``root`` for the same chat and config keeps its turns
    and projections (the materialization then only catches up), so retrieval can be tuned without
    embedding every turn again."""
    extra = turn_only_projectors(root)
    extra_names = [s.name for s in extra if not s.always_on]
    started = time.perf_counter()
    toml = evaluation.familiar_toml(embedder, model_path, extra_projectors=extra_names)
    written = _reusable(chat, root, toml) if reuse else None
    reused = written is not None
    if written is None:
        written = import_chat(chat, root, embedder=embedder, model_path=model_path, extra_projectors=extra_names)
    timings = {"import_s": time.perf_counter() - started}
    materialized, _, _ = evaluation.materialize_projections(chat.id, root, instance, embedder=embedder,
                                                            extra_assets=[s.asset for s in extra])
    timings.update(materialized)
    turn_of = {t.dia_id: w.id for t, w in zip(chat.turns, written)}
    session_of_turn = {w.id: t.session for t, w in zip(chat.turns, written)}
    return PreparedChat(chat, PreparedConversation(chat.id, chat.id, root, turn_of, session_of_turn, [],
                                                   timings=timings), reused=reused)


def prepare_all(chats: list[Chat], workdir: Path, *, embedder: str, model_path: Path | None = None,
                reuse: bool = False, progress: Callable[[str], None] | None = None) -> list[PreparedChat]:
    workdir.mkdir(parents=True, exist_ok=True)
    if default_dir(workdir) != SHIPPED_DEFAULT_DIR:
        raise ValueError(f"{workdir} has its own _default/character.toml; the benchmark measures the shipped defaults")
    out = []
    with DagsterInstance.ephemeral() as instance:
        for chat in chats:
            if progress is not None:
                progress(f"preparing {chat.id} ({len(chat.turns)} turns, {chat.sessions} sessions)")
            out.append(prepare_chat(chat, workdir, instance, embedder=embedder, model_path=model_path, reuse=reuse))
            if progress is not None and out[-1].reused:
                progress(f"  {chat.id}: reused the familiar an earlier run prepared")
    return out


# --------------------------------------------------------------------------- scoring


def rank_of(units: list[frozenset[int]], turn_id: int) -> float:
    """1-based rank of the first unit holding ``turn_id``; infinity when the ranking does not hold it."""
    return next((float(rank) for rank, unit in enumerate(units, start=1) if turn_id in unit), math.inf)


def newest_above_older(newest: float, older: Iterable[float]) -> bool:
    """The newest statement ranks above every older one (missing = infinity; both missing is not above)."""
    return all(newest < rank for rank in older)


def wish_turns(debug: Mapping[str, Any]) -> set[int]:
    """The turns a standing-wishes section says it renders (``debug["wishes"]["turn_ids"]``), if there is one."""
    wishes = debug.get("wishes")
    if not isinstance(wishes, Mapping):
        return set()
    return {int(t) for t in wishes.get("turn_ids") or () if isinstance(t, int)}


def score_chat(item: PreparedChat, *, embedder_cache: dict, progress: Callable[[int], None] | None = None) -> list[dict]:
    """One record per planted question of the chat."""
    chat, conv = item.chat, item.prepared
    memory = evaluation.open_memory(conv, embedder_cache=embedder_cache)
    records = []
    try:
        fact_sources = evaluation.fact_sources_of(memory)
        deep = evaluation.depth_budget(memory)
        assembler = Assembler(memory, default_layers())
        warm = AssemblyContext(chat.id, EVAL_CHANNEL, None, "text", "warm up", now=chat.asked_at)
        retrieve(warm, memory, frozenset())  # the first call loads the model
        for probe in chat.probes:
            ctx = AssemblyContext(chat.id, EVAL_CHANNEL, None, "text", probe.text, now=chat.asked_at)
            gold = {conv.turn_of[d] for d in probe.evidence}
            asked = evaluation.ask(ctx, memory, gold, {session_of(d) for d in probe.evidence}, conv.session_of_turn,
                                   fact_sources, deep)
            prompt = assembler.assemble(ctx)
            wished = wish_turns(prompt.debug)
            rag_shown = set((prompt.debug.get("rag") or {}).get("shown_turn_ids") or ())
            in_history = set(history_view(ctx, memory).shown_ids)
            record: dict[str, Any] = {
                "chat": chat.id, "probe": probe.id, "kind": probe.kind, "question": probe.text,
                **{k: asked.scores[k] for k in (*(f"any@{k}" for k in KS), "all@10", "session_any@10")},
                "rendered_rag": asked.scores["rendered_recall"],
                "rendered": float(bool(asked.scores["rendered_recall"])
                                  or (probe.kind in STANDING and bool(gold & wished))),
                "in_prompt": float(bool(gold & (rag_shown | wished | in_history))),
                "in_history": float(bool(gold & in_history)),
                "wishes_section": "wishes" in prompt.debug,
                "prompt_errors": sorted(prompt.debug.get("errors", {})),
                "gold_rank": evaluation.first_gold_rank(asked.units, gold),
                "latency_ms": round(asked.latency_ms, 2),
            }
            if probe.kind == "update":
                newest = rank_of(asked.units, conv.turn_of[probe.evidence[0]])
                older = [rank_of(asked.units, conv.turn_of[d]) for d in probe.older]
                record.update(newest_rank=None if math.isinf(newest) else int(newest),
                              older_ranks=[None if math.isinf(r) else int(r) for r in older],
                              newest_above_older=float(newest_above_older(newest, older)),
                              older_in_top10=float(any(r <= 10 for r in older)))
            if probe.kind == "ordering":
                # Spread: the share of the evidence's sessions that the top 10 reaches.
                top = {conv.session_of_turn.get(t) for unit in asked.units[:10] for t in unit}
                sessions = {session_of(d) for d in probe.evidence}
                record["evidence_sessions@10"] = len(top & sessions) / len(sessions)
            records.append(record)
            if progress is not None:
                progress(1)
    finally:
        memory.close()
    return records


# --------------------------------------------------------------------------- report

COLUMNS = ("n", "any@1", "any@5", "any@10", "any@50", "all@10", "session_any@10", "rendered", "rendered_rag",
           "in_prompt", "newest_above_older", "older_in_top10", "evidence_sessions@10")


def _pct(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return round(100 * statistics.fmean(values), 1) if values else None


def summarize(records: list[dict]) -> dict[str, dict[str, Any]]:
    """Per kind and overall: n and every column as a percentage (None where it does not apply)."""
    out: dict[str, dict[str, Any]] = {}
    for scope in (*KINDS, "overall"):
        chosen = records if scope == "overall" else [r for r in records if r["kind"] == scope]
        row: dict[str, Any] = {"n": len(chosen)}
        for column in COLUMNS[1:]:
            row[column] = _pct(chosen, column)
        out[scope] = row
    return out


def headline(records: list[dict], summary: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The figures the issue's targets name, as percentages."""
    standing = [r for r in records if r["kind"] in STANDING]
    return {
        "newest_above_older": summary["update"]["newest_above_older"] or 0.0,
        "wishes_in_prompt": _pct(standing, "in_prompt") or 0.0,
        "ordering_any@10": summary["ordering"]["any@10"] or 0.0,
    }


def table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["| kind | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for scope, row in summary.items():
        cells = [str(row["n"]) if c == "n" else ("—" if row[c] is None else f"{row[c]:.1f}") for c in COLUMNS]
        lines.append(f"| {scope} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def json_line(records: list[dict], summary: Mapping[str, Mapping[str, Any]], *, seed: int, chats: int,
              elapsed_s: float, **setup: Any) -> dict[str, Any]:
    """The one line a script checks: the headline, then per kind n, any@10 and rendered recall."""
    out: dict[str, Any] = {"benchmark": "updates", **headline(records, summary)}
    for scope in (*KINDS, "overall"):
        row = summary[scope]
        out[f"{scope}_n"] = row["n"]
        out[f"{scope}_any@10"] = row["any@10"]
        out[f"{scope}_rendered"] = row["rendered"]
    out["ordering_all@10"] = summary["ordering"]["all@10"]
    out["ordering_evidence_sessions@10"] = summary["ordering"]["evidence_sessions@10"]
    out["update_older_in_top10"] = summary["update"]["older_in_top10"]
    out.update(seed=seed, chats=chats, elapsed_s=round(elapsed_s, 1), **setup)
    return out


def write_outputs(out: Path, results: Mapping[str, Any], text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "updates.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "updates.md").write_text(text + "\n")


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
