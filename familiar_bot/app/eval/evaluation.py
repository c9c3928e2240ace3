"""Retrieval evaluation on LoCoMo-format conversations, through the bot's own retrieval path.

Each conversation becomes a throwaway familiar: its turns are imported with
their session times and speakers and the projections are materialized through
Dagster (full-text index, and turn/fact embeddings when an embedder is on).
What the familiar knows besides its turns depends on the facts mode:

* ``none`` (the default and the headline): turns and turn embeddings only, what a
  familiar has before any extraction;
* ``extracted``: the familiar's own ``facts`` asset is run through Dagster with
  the ``[llm.background]`` model given to the evaluation (the scripted model in
  tests), and the model, calls, tokens and cost are part of the results;
* ``gold``: the file's ``observation`` lists are loaded through the store API
  as facts (speaker as subject, the dia id's turn as source). They are the
  dataset's own annotations, each already pointing at its evidence turn: an
  **oracle upper bound**, not something a familiar could have.

Every question of categories 1-4 is then put to ``rag_context``'s retrieval as
the cue, at the text-tier budget, with no recent-window exclusion (the whole
conversation counts as the past, so what is measured is retrieval alone).

Two kinds of figures:

* **ranking**: evidence recall any@k / all@k over the ranked retrieved units,
  where a unit is a turn hit or a fact (a fact counts as its source turns) and
  turns and facts alternate, best of each first. The ranking is read at depth
  50 (the same scoring with ``max_rag_turns``/``max_rag_facts`` raised to 50);
  session any@k asks whether a top-k unit lies in a gold session.
* **rendered**: whether a gold evidence turn is in what the section actually
  shows at the real text-tier budget (turn hits with their neighbours, and the
  shown facts' source turns), the tokens the section used, and its latency.

The LoCoMo file is licensed (CC BY-NC 4.0): it is read where it lies and never
copied; only scores leave this module.

One module (~680 lines) because it is one pipeline, prepare, query, score, report, whose
stages share the per-conversation state; the data loading (`locomo.py`), the modes
(`modes.py`) and answer quality (`answer.py`) live apart.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from dagster import DagsterInstance

from familiar_pipeline.defs.jobs import materializations, materialize_in_process
from familiar_pipeline.config import load_config
from familiar_pipeline.defs import assets
from familiar_pipeline.models.embedders import create_embedder
from familiar_pipeline.engine import registry
from familiar_pipeline.storage.fts import FtsIndex
from familiar_pipeline.storage.paths import SHIPPED_DEFAULT_DIR, FamiliarPaths, default_dir
from familiar_pipeline.projectors.facts.store import FactDraft, append_facts
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.engine.runtime import publish_store
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.turns import Turn, TurnLog

from familiar_bot.app.eval import locomo
from familiar_bot.app.eval.modes import EMBEDDER_MODES, FACT_MODES
from familiar_bot.prompt.assembly import AssemblyContext
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.prompt.retrieval.facts import retrieve_facts
from familiar_bot.prompt.retrieval.hub import retrieve
from familiar_bot.prompt.retrieval.turns import retrieve_turns
from familiar_bot.prompt.scoping import visible_scopes
from familiar_bot.prompt.tokens import estimate_tokens

CATEGORIES: Mapping[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (1, 5, 10, 20, 50)
RANK_DEPTH = 50
EVAL_CHANNEL = 1
# The one scope a conversation is imported into and asked in (a channel outside any server):
# every row it produces and every reply's visible scopes are this, so scoping changes no figure.
EVAL_SCOPE = f"channel:{EVAL_CHANNEL}"
FACT_MODE_LABELS = {
    "none": "turns only (no facts)",
    "extracted": "facts extracted by the familiar's own facts asset",
    "gold": "gold observations as facts: ORACLE UPPER BOUND, not a familiar's memory",
}
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
_DIA_ID = re.compile(r"^D(\d+):(\d+)$")


# --------------------------------------------------------------------------- parsing


def parse_evidence(raw: Iterable[Any]) -> tuple[list[str], int]:
    """Clean dia ids from a ``qa`` item's evidence, and how many pieces were unparseable.

    Annotators sometimes packed several ids in one string (``"D8:6; D9:17"``) or
    wrote ``"D:11:26"``-style typos; the first are split, the second skipped.
    """
    ids: list[str] = []
    bad = 0
    for item in raw or []:
        if not isinstance(item, str):
            bad += 1
            continue
        for piece in re.split(r"[;,\s]+", item.strip()):
            if not piece:
                continue
            if _DIA_ID.match(piece):
                if piece not in ids:
                    ids.append(piece)
            else:
                bad += 1
    return ids, bad


def session_of(dia_id: str) -> int:
    match = _DIA_ID.match(dia_id)
    assert match is not None, f"not a LoCoMo dialogue id: {dia_id!r}"
    return int(match.group(1))


def observations_of(sample: dict) -> Iterable[tuple[str, str, list[str]]]:
    """``(speaker, text, dia ids)`` of every atomic observation in the file's ``observation`` lists."""
    for _, by_speaker in sorted((sample.get("observation") or {}).items()):
        if not isinstance(by_speaker, dict):
            continue
        for speaker, items in by_speaker.items():
            for item in items or []:
                if not isinstance(item, list) or not item or not isinstance(item[0], str):
                    continue
                refs: list[Any] = []
                for ref in item[1:]:
                    refs.extend(ref if isinstance(ref, list) else [ref])
                ids, _ = parse_evidence(refs)
                yield speaker, item[0], ids


@dataclass(frozen=True)
class Question:
    conversation: str
    category: int
    text: str
    evidence: tuple[str, ...]
    answer: str = ""  # the gold answer (scored only by the answer harness)
    index: int = 0  # position in the conversation's qa list
    question_type: str = ""  # the file's own type when it has one (LongMemEval's), reported apart
    asked_at: datetime | None = None  # when it was asked, when the file says (``question_date``); None: now


@dataclass
class PreparedConversation:
    """One imported conversation: where it lives and how its dia ids map to turn ids."""

    sample_id: str
    familiar_id: str
    root: Path
    turn_of: dict[str, int]
    session_of_turn: dict[int, int]
    questions: list[Question]
    facts_loaded: int = 0
    evidence_skipped: int = 0  # unparseable pieces, or ids naming no turn
    questions_skipped: int = 0  # categories 1-4 with no usable evidence
    timings: dict[str, float] = field(default_factory=dict)
    extraction: dict[str, Any] = field(default_factory=dict)  # LLM usage of the facts asset (mode extracted)


# --------------------------------------------------------------------------- preparation


def familiar_toml(embedder: str, model_path: Path | None, facts: str = "none",
                  background_model: str | None = None, extra_projectors: Iterable[str] = (),
                  familiar_name: str | None = None, passage_vectors: bool = False) -> str:
    """The throwaway familiar's own config: the embedding switches, the projectors the facts mode
    needs and (``extracted``) the background model; everything else is the shipped default.
    ``familiar_name`` (``--familiar-speaker``) becomes its display name, the name its replies are
    recorded under, as a live familiar's are under its own.

    With an embedder the turn and window vectors are on, as docs/measuring.md tells a user to turn
    them on; passage vectors (``turn_passage_embedding``) only with ``passage_vectors``: they are
    opt-in for a familiar too, not shown to earn their extra embeddings on dev (docs/benchmarks.md,
    "The whole file with passage vectors"), so the headline does not lean on them."""
    # One run drains each projection's whole backlog (the cap only paces a live familiar).
    lines = ([f"aliases = [{json.dumps(familiar_name)}]"] if familiar_name else []) + [
        "[pipeline]", "max_batches_per_run = 100000"]
    if embedder == "off":
        # The shipped weights may ask for vectors; with no embedder they must be off or config refuses.
        lines += ["[memory.retrieval]", "embedding_weight = 0.0", "turn_embedding_weight = 0.0"]
    else:
        lines += ["[providers.embedding]", f'backend = "{embedder}"']
        if embedder == "hash":
            lines.append("dim = 256")
        else:
            lines.append(f'fastembed_model = "{MINILM_NAME}"')
            if model_path is not None:
                lines.append(f"fastembed_model_path = {json.dumps(str(model_path))}")
    wanted = (["turn_embedding", "turn_window_embedding"] + (["turn_passage_embedding"] if passage_vectors else [])
              + (["fact_embedding"] if facts != "none" else []) if embedder != "off" else [])
    if facts == "extracted":
        wanted.insert(0, "rich_note")
    projectors = [p for p in [*wanted, *extra_projectors] if p in registry.known_projectors()]
    lines += ["[providers.memory]", f"projectors = {json.dumps(projectors)}"]
    if facts == "extracted":
        lines += ["[llm.background]", f"model = {json.dumps(background_model or '')}"]
    return "\n".join(lines) + "\n"


def _familiar_id(sample_id: str, index: int) -> str:
    slug = re.sub(r"[^a-z0-9_-]+", "-", str(sample_id).lower()).strip("-")
    return f"eval-{index}-{slug}"[:60] or f"eval-{index}"


def turn_rows(turns: list, familiar_id: str, familiar_speaker: str | None, first_id: int) -> list[dict]:
    """The TurnLog rows of a conversation's turns, given the ids they will get (``first_id`` on).

    Without ``familiar_speaker`` every speaker is a person (role ``user``, their own key): people
    talking among themselves, LoCoMo's genre. With it, that speaker's turns are written as the
    responder writes the familiar's replies in a DM (role ``assistant``, its ego key, its display
    name, ``reply_to_turn_id`` the person's turn just before), and the other speakers stay people:
    a person talking with the familiar, LongMemEval's genre.
    """
    rows: list[dict] = []
    last_person: int | None = None
    for offset, t in enumerate(turns):
        if t.speaker == familiar_speaker:
            rows.append({"channel_id": EVAL_CHANNEL, "role": "assistant", "content": t.text,
                         "author_key": ego_key(familiar_id), "author_display": t.speaker, "created_at": t.timestamp,
                         "reply_to_turn_id": last_person})
        else:
            rows.append({"channel_id": EVAL_CHANNEL, "role": "user", "content": t.text,
                         "author_key": locomo.speaker_key(t.speaker), "author_display": t.speaker,
                         "created_at": t.timestamp})
            last_person = first_id + offset
    return rows


def reusable_turns(paths: FamiliarPaths, toml: str, rows: list[dict]) -> list[Turn] | None:
    """The turns of a familiar an earlier run prepared with config ``toml`` and exactly ``rows``
    (numbered from 1, as a fresh familiar numbers them), else None: anything else is imported anew."""
    if not paths.turns_db.is_file() or not paths.character_toml.is_file() or paths.character_toml.read_text() != toml:
        return None
    with TurnLog(paths.turns_db) as log:
        stored = log.turns_in_range(0, log.latest_id())
    keys = ("role", "content", "author_key", "author_display", "created_at", "reply_to_turn_id")
    same = [(t.role, t.content, t.author_key, t.author_display, t.created_at, t.reply_to_turn_id) for t in stored] \
        == [tuple(row.get(k) for k in keys) for row in rows]
    return stored if same and [t.id for t in stored] == list(range(1, len(rows) + 1)) else None


def load_gold_facts(sample: dict, paths, turn_of: Mapping[str, int], turns: list) -> int:
    """The file's observations written as facts through the store API (mode ``gold``, the oracle)."""
    drafts = []
    at_turn = {t.dia_id: t.timestamp for t in turns}
    for speaker, text, ids in observations_of(sample):
        sources = [turn_of[i] for i in ids if i in turn_of]
        if not text.strip() or not sources:
            continue
        drafts.append(FactDraft(text=text, source_turn_ids=tuple(sources), channel_id=EVAL_CHANNEL, scope=EVAL_SCOPE,
                                subjects=(Subject(locomo.speaker_key(speaker), speaker),),
                                valid_from=min(at_turn[i] for i in ids if i in at_turn)))
    with ProjectionStore(paths.memory_db, tables=registry.tables()) as store:
        facts = [f for f, inserted in append_facts(store, drafts) if inserted]
        with FtsIndex(paths.fts_facts, writable=True) as index:
            index.upsert_many((f.id, f.text) for f in facts)
            index.commit()
        publish_store(store, paths.serving_dir, load_config(paths.familiar_id, root=paths.dir.parent))
    return len(facts)


EXTRACTION_COUNTS = ("calls", "cached_calls", "prompt_tokens", "completion_tokens", "cost_usd", "errors")


def new_familiar(familiar_id: str, root: Path, *, embedder: str, model_path: Path | None, facts: str = "none",
                 background_model: str | None = None, extra_projectors: Iterable[str] = (),
                 familiar_name: str | None = None, passage_vectors: bool = False) -> FamiliarPaths:
    """A fresh, empty familiar under ``root`` (any earlier one of that id removed) with the eval's config
    (``extra_projectors`` turned on besides the ones the embedder and facts mode need)."""
    paths = FamiliarPaths.for_id(familiar_id, root)
    if paths.dir.exists():
        shutil.rmtree(paths.dir)
    paths.dir.mkdir(parents=True)
    paths.character_toml.write_text(familiar_toml(embedder, model_path, facts, background_model, extra_projectors,
                                                  familiar_name, passage_vectors))
    return paths


def materialize_projections(familiar_id: str, root: Path, instance, *, embedder: str, facts: str = "none",
                            extra_assets: Iterable[str] = (), passage_vectors: bool = False,
                            ) -> tuple[dict[str, float], dict[str, Any], int]:
    """Materialize through Dagster, in process, what the familiar's imported turns need for retrieval
    (the full-text index, turn and window vectors with an embedder, the facts the mode asks for).

    Returns ``(seconds per asset and in all, the facts asset's LLM usage, facts it wrote)``;
    an asset that reports skipped or disabled is an error, so nothing is measured on a half-built familiar.
    """
    timings: dict[str, float] = {}
    extraction: dict[str, Any] = {}
    loaded = 0
    # The facts asset runs before fact_embeddings in the same run (it is upstream of it).
    selected = ["turns_fts"] + (["facts"] if facts == "extracted" else [])
    if embedder != "off":
        selected += ["fact_embeddings"] if facts != "none" else []
        selected += [key.path[-1] for key in assets.TURN_EMBEDDING
                     if passage_vectors or key.path[-1] != "turn_passage_embeddings"]
    selected += [name for name in extra_assets if name not in selected]
    started = time.perf_counter()
    instance.add_dynamic_partitions("familiars", [familiar_id])
    result = materialize_in_process(selected, instance=instance, data_root=root, partition_key=familiar_id,
                                    log_level="WARNING")
    for name in selected:
        # What the asset recorded (numbers, strings, a dict of drop reasons), read back as written.
        meta: dict[str, Any] = {k: v.value for m in materializations(result, name) for k, v in m.metadata.items()}
        status = str(meta.get("status", ""))
        if status.startswith(("skipped", "disabled")):
            raise RuntimeError(f"{name} did not run for {familiar_id}: {status}")
        timings[f"{name}_s"] = float(meta.get("duration_s", 0.0))
        if name == "facts":
            extraction = {k: meta.get(f"llm_{k}", 0) for k in EXTRACTION_COUNTS}
            # What a real model's replies cost in rows: drops by reason, batches and model time.
            extraction.update(batches=int(meta.get("batches", 0)), llm_seconds=float(meta.get("llm_seconds", 0.0)),
                              dropped_reasons=dict(meta.get("dropped_reasons") or {}))
            loaded = int(meta.get("rows_written", 0))
    timings["materialize_s"] = time.perf_counter() - started
    return timings, extraction, loaded


def prepare_conversation(sample: dict, index: int, root: Path, *, embedder: str, model_path: Path | None,
                         instance, facts: str = "none", background_model: str | None = None,
                         max_turns: int | None = None, familiar_speaker: str | None = None,
                         reuse: bool = False, passage_vectors: bool = False) -> PreparedConversation:
    """Import one conversation, give it the facts its mode asks for, and materialize the projections.

    ``max_turns`` keeps only the conversation's first turns (a quick run with a slow model);
    questions then keep the evidence among them, and those with none left are skipped.
    ``familiar_speaker``: that speaker's turns are the familiar's own replies (see :func:`turn_rows`).
    ``reuse`` (facts mode ``none`` only): a familiar an earlier run left under ``root`` with this very
    config and these very turns keeps them, and the materialization only catches up, so a run that
    was stopped halfway (a long history takes minutes to embed) loses nothing it had finished.
    ``passage_vectors``: also embed long turns' passages (see :func:`familiar_toml`).
    """
    if facts not in FACT_MODES:
        raise ValueError(f"unknown facts mode {facts!r}; valid: {', '.join(FACT_MODES)}")
    if facts == "extracted" and not (background_model or "").strip():
        raise ValueError("--facts extracted needs a background model (--background-model, a litellm model string)")
    sample_id = str(sample.get("sample_id") or f"conv-{index}")
    familiar_id = _familiar_id(sample_id, index)
    turns = list(locomo.turns_of(sample))[:max_turns]
    if familiar_speaker is not None and familiar_speaker not in {t.speaker for t in turns}:
        raise ValueError(f"{sample_id}: no speaker {familiar_speaker!r} to read as the familiar "
                         f"(speakers: {', '.join(sorted({t.speaker for t in turns}))})")
    timings: dict[str, float] = {}
    started = time.perf_counter()
    toml = familiar_toml(embedder, model_path, facts, background_model, familiar_name=familiar_speaker,
                         passage_vectors=passage_vectors)
    paths = FamiliarPaths.for_id(familiar_id, root)
    written = reusable_turns(paths, toml, turn_rows(turns, familiar_id, familiar_speaker, 1)) \
        if reuse and facts == "none" else None
    if written is None:
        paths = new_familiar(familiar_id, root, embedder=embedder, model_path=model_path, facts=facts,
                             background_model=background_model, familiar_name=familiar_speaker,
                             passage_vectors=passage_vectors)
        with TurnLog(paths.turns_db) as log:
            for speaker in sorted({t.speaker for t in turns if t.speaker != familiar_speaker}):
                first = min(t.timestamp for t in turns if t.speaker == speaker)
                log.upsert_participant(locomo.speaker_key(speaker), global_name=speaker, seen_at=first)
            first_id = log.latest_id() + 1
            rows = turn_rows(turns, familiar_id, familiar_speaker, first_id)
            written = log.append_turns(rows)
            if [w.id for w in written] != list(range(first_id, first_id + len(rows))):
                raise RuntimeError(f"{familiar_id}: turn ids were not assigned in order; replies would answer "
                                   "the wrong turns")
    else:
        timings["reused"] = 1.0
    turn_of = {t.dia_id: w.id for t, w in zip(turns, written)}
    session_of_turn = {w.id: t.session for t, w in zip(turns, written)}
    timings["import_s"] = time.perf_counter() - started

    started = time.perf_counter()
    loaded = load_gold_facts(sample, paths, turn_of, turns) if facts == "gold" else 0
    timings["facts_s"] = time.perf_counter() - started

    materialized, extraction, extracted = materialize_projections(familiar_id, root, instance, embedder=embedder,
                                                                   facts=facts, passage_vectors=passage_vectors)
    timings.update(materialized)
    if facts == "extracted":
        loaded = extracted

    questions, evidence_skipped, questions_skipped = questions_of(sample, sample_id, turn_of)
    return PreparedConversation(sample_id, familiar_id, root, turn_of, session_of_turn, questions,
                                facts_loaded=loaded, evidence_skipped=evidence_skipped,
                                questions_skipped=questions_skipped, timings=timings, extraction=extraction)


def parse_question_date(value: Any) -> datetime | None:
    """LongMemEval's ``question_date`` ("2023/05/30 (Tue) 15:40") as an aware UTC datetime; None when
    absent or unreadable. A question is asked at that moment, so "a week ago" and "last month" in it
    mean what they meant to the asker (LoCoMo has no such date: its questions are asked now)."""
    if not isinstance(value, str) or not value.strip():
        return None
    cleaned = re.sub(r"\s*\([A-Za-z]{3}\)\s*", " ", value.strip())
    for fmt in ("%Y/%m/%d %H:%M", "%Y-%m-%d %H:%M", "%Y/%m/%d", "%Y-%m-%d"):
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def questions_of(sample: dict, sample_id: str, turn_of: Mapping[str, int]) -> tuple[list[Question], int, int]:
    """The scored questions of ``sample`` (categories 1-4 with evidence among ``turn_of``), and how many
    evidence pieces and questions were skipped as unusable."""
    questions, evidence_skipped, questions_skipped = [], 0, 0
    for position, qa in enumerate(sample.get("qa") or []):
        category = qa.get("category")
        if category not in CATEGORIES:
            continue
        ids, bad = parse_evidence(qa.get("evidence"))
        known = tuple(i for i in ids if i in turn_of)
        evidence_skipped += bad + (len(ids) - len(known))
        if not known or not str(qa.get("question", "")).strip():
            questions_skipped += 1
            continue
        questions.append(Question(sample_id, category, str(qa["question"]), known,
                                  answer=str(qa.get("answer", "")), index=position,
                                  question_type=str(qa.get("question_type") or ""),
                                  asked_at=parse_question_date(qa.get("question_date"))))
    return questions, evidence_skipped, questions_skipped


# --------------------------------------------------------------------------- configuration under test


def with_overrides(config, *, retrieval: Mapping[str, Any] | None = None, text_budget: Mapping[str, Any] | None = None):
    """``config`` with some ``[memory.retrieval]`` knobs and text-tier budget caps replaced (for sweeps)."""
    if retrieval:
        unknown = set(retrieval) - {f.name for f in dataclasses.fields(config.memory.retrieval)}
        if unknown:
            raise ValueError(f"unknown [memory.retrieval] knob(s): {', '.join(sorted(unknown))}")
        memory = dataclasses.replace(config.memory, retrieval=dataclasses.replace(config.memory.retrieval, **retrieval))
        config = dataclasses.replace(config, memory=memory)
    if text_budget:
        budgets = dict(config.budgets)
        budgets["text"] = dataclasses.replace(budgets["text"], **text_budget)
        config = dataclasses.replace(config, budgets=type(config.budgets)(budgets))
    return config


def open_memory(prepared: PreparedConversation, *, retrieval=None, text_budget=None, embedder_cache: dict | None = None):
    """A MemoryView of the prepared familiar under the (possibly overridden) config."""
    config = load_config(prepared.familiar_id, root=prepared.root)
    config = with_overrides(config, retrieval=retrieval, text_budget=text_budget)
    cache = embedder_cache if embedder_cache is not None else {}
    key = (config.embedding.backend, config.embedding.fastembed_model, config.embedding.dim)
    if key not in cache:
        cache[key] = create_embedder(config.embedding)  # one model load for every conversation
    paths = FamiliarPaths.for_id(prepared.familiar_id, prepared.root)
    return MemoryView(paths, config, embedder=cache[key])


# --------------------------------------------------------------------------- scoring


def ranked_units(debug: dict, fact_sources: Mapping[int, Iterable[int]]) -> list[frozenset[int]]:
    """Turn hits and facts, alternating (best of each first), each as the set of turns it stands for."""
    turns = [frozenset([t["turn_id"]]) for t in debug.get("turns", [])]
    facts = [frozenset(fact_sources.get(f["fact_id"], ())) for f in debug.get("facts", [])]
    units: list[frozenset[int]] = []
    for i in range(max(len(turns), len(facts))):
        if i < len(turns):
            units.append(turns[i])
        if i < len(facts):
            units.append(facts[i])
    return units


def score_question(units: list[frozenset[int]], gold: set[int], gold_sessions: set[int],
                   session_of_turn: Mapping[int, int], shown: set[int]) -> dict[str, float]:
    """0/1 per metric for one question."""
    out: dict[str, float] = {}
    seen: set[int] = set()
    for k in KS:
        seen = set().union(*units[:k]) if units else set()
        out[f"any@{k}"] = float(bool(seen & gold))
        out[f"all@{k}"] = float(gold <= seen)
    for k in (5, 10):
        top = set().union(*units[:k]) if units else set()
        out[f"session_any@{k}"] = float(bool({session_of_turn.get(t) for t in top} & gold_sessions))
    out["rendered_recall"] = float(bool(shown & gold))
    out["rendered_all"] = float(gold <= shown)
    return out


def first_gold_rank(units: list[frozenset[int]], gold: set[int]) -> int | None:
    """The 1-based rank of the first unit holding a gold turn (None: not in the ranking): near misses show."""
    return next((rank for rank, unit in enumerate(units, start=1) if unit & gold), None)


@dataclass
class Asked:
    """One cue put to retrieval and scored: the 0/1 scores, the ranking read at depth, what the section showed."""

    gold: set[int]
    scores: dict[str, float]
    units: list[frozenset[int]]  # the ranked units at RANK_DEPTH (turn hits and facts alternating)
    shown: set[int]  # turns the rendered section shows (hits, neighbours, shown facts' sources)
    text: str
    debug: dict
    latency_ms: float


def ask(ctx: AssemblyContext, memory: MemoryView, gold: set[int], gold_sessions: set[int],
        session_of_turn: Mapping[int, int], fact_sources: Mapping[int, Iterable[int]], deep) -> Asked:
    """Put ``ctx.cue`` to ``rag_context``'s retrieval (no recent-window exclusion) and score it against ``gold``:
    the rendered section at the real budget, the ranking at the ``deep`` budget."""
    started = time.perf_counter()
    text, debug = retrieve(ctx, memory, frozenset())
    latency_ms = (time.perf_counter() - started) * 1000
    _, deep_debug = retrieve_facts(ctx.cue, memory, deep, visible_scopes(ctx, memory))
    _, deep_turns = retrieve_turns(ctx.cue, memory, ctx, deep, frozenset())
    deep_debug["turns"] = deep_turns
    shown = set(debug.get("shown_turn_ids", []))
    for fid in debug.get("shown_fact_ids", []):
        shown.update(fact_sources.get(fid, ()))
    units = ranked_units(deep_debug, fact_sources)
    scores = score_question(units, gold, gold_sessions, session_of_turn, shown)
    # Each source alone at depth 10, to see which side carries the recall.
    turn_top = {t["turn_id"] for t in deep_turns[:10]}
    fact_top = {t for f in deep_debug["facts"][:10] for t in fact_sources.get(f["fact_id"], ())}
    scores["turns_any@10"] = float(bool(turn_top & gold))
    scores["facts_any@10"] = float(bool(fact_top & gold))
    return Asked(gold, scores, units, shown, text, debug, latency_ms)


def fact_sources_of(memory: MemoryView) -> dict[int, tuple[int, ...]]:
    """``{fact id: source turn ids}`` of the memory's snapshot: what a ranked fact stands for."""
    facts = memory.snapshot.table("facts").select(["id", "source_turn_ids"]).to_pylist()
    return {r["id"]: tuple(r["source_turn_ids"] or ()) for r in facts}


def depth_budget(memory: MemoryView):
    """The text-tier budget with the turn and fact caps raised to RANK_DEPTH: the ranking read deep."""
    return replace(memory.config.budget_for("text"), max_rag_turns=RANK_DEPTH, max_rag_facts=RANK_DEPTH)


def evaluate(prepared: list[PreparedConversation], *, retrieval=None, text_budget=None,
             progress: Callable[[int], None] | None = None, embedder_cache: dict | None = None) -> list[dict]:
    """One record per question: its category, 0/1 scores, rendered tokens and latency."""
    records: list[dict] = []
    cache = embedder_cache if embedder_cache is not None else {}
    for conv in prepared:
        memory = open_memory(conv, retrieval=retrieval, text_budget=text_budget, embedder_cache=cache)
        try:
            fact_sources = fact_sources_of(memory)
            deep = depth_budget(memory)
            warm = AssemblyContext(conv.familiar_id, EVAL_CHANNEL, None, "text", "warm up")
            retrieve(warm, memory, frozenset())  # the first call loads the model; keep it out of the latency
            for q in conv.questions:
                ctx = AssemblyContext(conv.familiar_id, EVAL_CHANNEL, None, "text", q.text, now=q.asked_at)
                asked = ask(ctx, memory, {conv.turn_of[d] for d in q.evidence}, {session_of(d) for d in q.evidence},
                            conv.session_of_turn, fact_sources, deep)
                records.append({"conversation": conv.sample_id, "question": q.index, "category": q.category,
                                "type": q.question_type,
                                **asked.scores, "gold_rank": first_gold_rank(asked.units, asked.gold),
                                "rendered_tokens": estimate_tokens(asked.text), "latency_ms": asked.latency_ms})
                if progress is not None:
                    progress(1)
        finally:
            memory.close()
    return records


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


METRICS = (tuple(f"any@{k}" for k in KS) + tuple(f"all@{k}" for k in KS)
           + ("session_any@5", "session_any@10", "rendered_recall", "rendered_all", "turns_any@10", "facts_any@10"))


def aggregate(records: list[dict]) -> dict[str, float]:
    """Means as percentages (0-100), token mean, latency p50/p95."""
    n = len(records)
    out: dict[str, float] = {"n": n}
    for metric in METRICS:
        out[metric] = round(100 * sum(r[metric] for r in records) / n, 2) if n else 0.0
    out["rendered_tokens_mean"] = round(statistics.fmean(r["rendered_tokens"] for r in records), 1) if n else 0.0
    latencies = [r["latency_ms"] for r in records]
    out["latency_ms_p50"] = round(_percentile(latencies, 0.50), 2)
    out["latency_ms_p95"] = round(_percentile(latencies, 0.95), 2)
    return out


def summarize(records: list[dict]) -> dict[str, Any]:
    """Overall, per LoCoMo category, and (when the file gives each question a ``question_type``,
    as LongMemEval's does) per type: a genre's weak kind of question shows apart."""
    by_category = {name: aggregate([r for r in records if r["category"] == c]) for c, name in CATEGORIES.items()}
    out: dict[str, Any] = {"overall": aggregate(records), "by_category": {k: v for k, v in by_category.items() if v["n"]}}
    types = sorted({r.get("type") or "" for r in records} - {""})
    if types:
        out["by_type"] = {t: aggregate([r for r in records if r.get("type") == t]) for t in types}
    return out


TABLE_COLUMNS = ("n", "any@1", "any@5", "any@10", "any@20", "any@50", "all@10", "session_any@5", "session_any@10",
                 "rendered_recall", "rendered_tokens_mean", "latency_ms_p50", "latency_ms_p95")


def facts_setup(prepared: list[PreparedConversation], mode: str, background_model: str | None) -> dict[str, Any]:
    """The facts mode and what it cost, for ``results.json``'s setup."""
    out: dict[str, Any] = {"facts": mode, "facts_label": FACT_MODE_LABELS[mode],
                           "facts_loaded": sum(p.facts_loaded for p in prepared)}
    if mode == "gold":
        out["oracle_upper_bound"] = True
    if mode == "extracted":
        totals = {k: sum(p.extraction.get(k, 0) for p in prepared) for k in EXTRACTION_COUNTS}
        totals["cost_usd"] = round(totals["cost_usd"], 6)
        totals["batches"] = sum(p.extraction.get("batches", 0) for p in prepared)
        totals["llm_seconds"] = round(sum(p.extraction.get("llm_seconds", 0.0) for p in prepared), 1)
        dropped: dict[str, int] = {}
        for p in prepared:
            for reason, count in p.extraction.get("dropped_reasons", {}).items():
                dropped[reason] = dropped.get(reason, 0) + int(count)
        totals["dropped_reasons"] = dropped
        out["extraction"] = {"model": background_model, **totals}
    return out


def mode_line(results: Mapping[str, Any]) -> str:
    """One line naming the facts mode (and, for ``extracted``, the model and its cost)."""
    setup = results.get("setup", {})
    mode = setup.get("facts", "none")
    line = f"facts mode: {mode}: {FACT_MODE_LABELS.get(mode, mode)}"
    extraction = setup.get("extraction")
    if extraction:
        line += (f"; model {extraction['model']}, {extraction['calls']} calls ({extraction['cached_calls']} cached), "
                 f"{extraction['prompt_tokens']}+{extraction['completion_tokens']} tokens, "
                 f"${extraction['cost_usd']:.4f}")
    return line


def markdown_table(results: Mapping[str, Any]) -> str:
    header = "| scope | " + " | ".join(TABLE_COLUMNS) + " |"
    rows = [header, "|" + "---|" * (len(TABLE_COLUMNS) + 1)]
    scopes = ([("overall", results["overall"])] + list(results["by_category"].items())
              + [(f"type {name}", values) for name, values in (results.get("by_type") or {}).items()])
    for name, values in scopes:
        cells = [str(values[c]) if c == "n" else f"{values[c]:.1f}" for c in TABLE_COLUMNS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_plot(results: Mapping[str, Any], path: Path) -> str | None:
    """A recall@k PNG; returns why not when matplotlib is not installed (it is an optional extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed, so no recall@k plot was drawn (the tables and results.json are complete)"
    fig, ax = plt.subplots(figsize=(6, 4))
    scopes = [("overall", results["overall"])] + list(results["by_category"].items())
    for name, values in scopes:
        ax.plot(KS, [values[f"any@{k}"] for k in KS], marker="o", label=name, linewidth=2.5 if name == "overall" else 1)
    ax.set_xscale("log")
    ax.set_xticks(KS, [str(k) for k in KS])
    ax.set_xlabel("k (retrieved units)")
    ax.set_ylabel("evidence recall any@k (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_outputs(results: Mapping[str, Any], out: Path) -> list[str]:
    """results.json, results.md and recall_at_k.png into ``out``; returns notes (e.g. why no plot)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(mode_line(results) + "\n\n" + markdown_table(results) + "\n")
    note = write_plot(results, out / "recall_at_k.png")
    return [note] if note else []


def prepare_all(data: Path, workdir: Path, *, embedder: str, model_path: Path | None = None,
                facts: str = "none", background_model: str | None = None, only: Iterable[str] | None = None,
                max_turns: int | None = None, progress: Callable[[str], None] | None = None,
                familiar_speaker: str | None = None, reuse: bool = False,
                passage_vectors: bool = False) -> list[PreparedConversation]:
    """Every conversation of ``data`` (or those ``only`` names) as a throwaway familiar under ``workdir``.

    ``only`` holds indices into the file ("0" is the first) or sample ids; one that
    matches nothing is an error, so a typo never silently measures nothing.
    ``workdir`` gets the shipped defaults. ``reuse``, ``passage_vectors``: see :func:`prepare_conversation`.
    """
    if embedder not in EMBEDDER_MODES:
        raise ValueError(f"unknown embedder {embedder!r}; valid: {', '.join(EMBEDDER_MODES)}")
    if facts not in FACT_MODES:
        raise ValueError(f"unknown facts mode {facts!r}; valid: {', '.join(FACT_MODES)}")
    if facts == "extracted" and not (background_model or "").strip():
        raise ValueError("--facts extracted needs a background model (--background-model, a litellm model string)")
    samples = list(enumerate(locomo.load(data)))
    if only is not None:
        wanted = set(only)
        unknown = wanted - {str(i) for i, _ in samples} - {str(s.get("sample_id")) for _, s in samples}
        if unknown:
            raise ValueError(f"no conversation {', '.join(sorted(unknown))} (give indices from 0 to "
                             f"{len(samples) - 1} or sample ids)")
        samples = [(i, s) for i, s in samples if str(i) in wanted or str(s.get("sample_id")) in wanted]
    workdir.mkdir(parents=True, exist_ok=True)
    # With no _default of its own, a data root falls back to the shipped defaults: what is measured.
    if default_dir(workdir) != SHIPPED_DEFAULT_DIR:
        raise ValueError(f"{workdir} has its own _default/character.toml; the evaluation measures the shipped defaults")
    prepared = []
    with DagsterInstance.ephemeral() as instance:
        for index, sample in samples:
            if progress is not None:
                progress(f"preparing {sample.get('sample_id', index)}")
            prepared.append(prepare_conversation(sample, index, workdir, embedder=embedder, model_path=model_path,
                                                 max_turns=max_turns, familiar_speaker=familiar_speaker,
                                                 instance=instance, facts=facts, background_model=background_model,
                                                 reuse=reuse, passage_vectors=passage_vectors))
            if progress is not None and prepared[-1].timings.get("reused"):
                progress(f"  {prepared[-1].familiar_id}: reused the familiar an earlier run prepared")
    return prepared


# --------------------------------------------------------------------------- tuning sweep

SWEEP_TURN_WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0)
SWEEP_TURN_CONTEXT = (0.0, 0.3, 0.5)
SWEEP_COLUMNS = ("any@1", "any@5", "any@10", "any@20", "any@50", "all@10", "session_any@10", "turns_any@10",
                 "facts_any@10",
                 "rendered_recall", "rendered_tokens_mean", "latency_ms_p50")


def sweep_variations() -> list[tuple[str, dict, dict]]:
    """One-at-a-time changes tried around the best weights: ``(label, retrieval knobs, text budget caps)``."""
    return [
        ("embedding_weight=1.0", {"embedding_weight": 1.0}, {}),
        ("embedding_weight=5.0", {"embedding_weight": 5.0}, {}),
        ("turn_context_span=1", {"turn_context_span": 1}, {}),
        ("turn_context_span=3", {"turn_context_span": 3}, {}),
        ("turn_fusion=rrf", {"turn_fusion": "rrf"}, {}),
        ("turn_candidates=20", {"turn_candidates": 20}, {}),
        ("turn_candidates=100", {"turn_candidates": 100}, {}),
        ("fact_overfetch=2", {"fact_overfetch": 2}, {}),
        ("fact_overfetch=8", {"fact_overfetch": 8}, {}),
        ("recency_weight=0.2", {"recency_weight": 0.2}, {}),
        ("turn_neighbours=0", {"turn_neighbours": 0}, {}),
        ("turn_neighbours=2", {"turn_neighbours": 2}, {}),
        ("text facts/turns=6/20", {}, {"max_rag_facts": 6, "max_rag_turns": 20}),
        ("text facts/turns=16/10", {}, {"max_rag_facts": 16, "max_rag_turns": 10}),
        ("text facts/turns=20/8", {}, {"max_rag_facts": 20, "max_rag_turns": 8}),
    ]


def _sweep_key(row: Mapping[str, Any]) -> tuple:
    # any@10 first (the headline figure); then what the prompt shows, then the rest of the curve.
    return (row["any@10"], row["rendered_recall"], row["any@5"], row["all@10"], row["any@50"])


def run_sweep(prepared: list[PreparedConversation], *, progress: Callable[[str], None] | None = None,
              embedder_cache: dict | None = None) -> dict[str, Any]:
    """Grid over the turn embedding weight and context share, then one-at-a-time variations around the best.

    Every row is the overall figures of one configuration, measured on ``prepared``
    (tune on the dev file only). The grid is also put through
    :func:`held_out_rotation`, the figure to trust when choosing a default.
    Returns ``{"rows": [...], "best": row, "rotation": {...}}``.
    """
    cache = embedder_cache if embedder_cache is not None else {}
    rows: list[dict] = []
    grid_records: dict[str, list[dict]] = {}

    def measure(label: str, retrieval: dict, text_budget: dict) -> tuple[dict, list[dict]]:
        records = evaluate(prepared, retrieval=retrieval, text_budget=text_budget or None, embedder_cache=cache)
        overall = summarize(records)["overall"]
        row = {"label": label, "retrieval": retrieval, "text_budget": text_budget,
               **{c: overall[c] for c in SWEEP_COLUMNS}}
        rows.append(row)
        if progress is not None:
            progress(f"{label}: any@10 {row['any@10']:.1f}, rendered {row['rendered_recall']:.1f}")
        return row, records

    for tw in SWEEP_TURN_WEIGHTS:
        for share in SWEEP_TURN_CONTEXT:
            label = f"turn_embedding_weight={tw} turn_context={share}"
            _, grid_records[label] = measure(label, {"turn_embedding_weight": tw, "turn_context": share}, {})
    best = max(rows, key=_sweep_key)
    for label, retrieval, text_budget in sweep_variations():
        measure(f"best + {label}", {**best["retrieval"], **retrieval}, text_budget)
    return {"rows": rows, "best": max(rows, key=_sweep_key), "rotation": held_out_rotation(grid_records)}


# What the rotation maximises on the tuning conversations: the three headline targets together
# (any@10 alone chose cells that gave up session recall and rendered recall; docs/benchmarks.md).
SELECTION_METRICS = ("any@10", "session_any@10", "rendered_recall")


def held_out_rotation(records_by_label: Mapping[str, list[dict]],
                      metrics: tuple[str, ...] = SELECTION_METRICS) -> dict[str, Any]:
    """Tune on all conversations but one, report the one left out; every rotation.

    For each held-out conversation: the configuration with the best sum of
    ``metrics`` (then any@5) on the others, its any@10 there ("tuned") and on the held-out one, and
    the best any@10 any configuration reached on the held-out one. ``pooled`` is
    the held-out questions of every rotation together: what the selection rule
    would score on conversations it never saw.
    """
    def on(label: str, convs: set[str]) -> list[dict]:
        return [r for r in records_by_label[label] if r["conversation"] in convs]

    def key(label: str, convs: set[str]) -> tuple:
        figures = aggregate(on(label, convs))
        return sum(figures[m] for m in metrics), figures["any@5"]

    labels = list(records_by_label)
    convs = sorted({r["conversation"] for records in records_by_label.values() for r in records})
    rotations, pooled = [], []
    for held in convs:
        tune = set(convs) - {held}
        if not tune:
            break
        chosen = max(labels, key=lambda label: key(label, tune))
        oracle = max(labels, key=lambda label: key(label, {held}))
        held_records = on(chosen, {held})
        pooled += held_records
        rotations.append({"held_out": held, "n": len(held_records), "chosen": chosen,
                          "tuned_any@10": aggregate(on(chosen, tune))["any@10"],
                          "held_out_any@10": aggregate(held_records)["any@10"],
                          "best_on_held_out": oracle, "best_on_held_out_any@10": aggregate(on(oracle, {held}))["any@10"]})
    return {"rotations": rotations, "pooled_held_out": aggregate(pooled) if pooled else {}}


def sweep_table(sweep: Mapping[str, Any]) -> str:
    lines = ["| configuration | " + " | ".join(SWEEP_COLUMNS) + " |", "|" + "---|" * (len(SWEEP_COLUMNS) + 1)]
    for row in sweep["rows"]:
        mark = " **(best)**" if row is sweep["best"] or row == sweep["best"] else ""
        lines.append(f"| {row['label']}{mark} | " + " | ".join(f"{row[c]:.1f}" for c in SWEEP_COLUMNS) + " |")
    rotation = sweep.get("rotation") or {}
    if rotation.get("rotations"):
        lines += ["", "| held out (n) | chosen on the others | tuned any@10 | held-out any@10 | best on held-out |",
                  "|---|---|---|---|---|"]
        for r in rotation["rotations"]:
            lines.append(f"| {r['held_out']} ({r['n']}) | {r['chosen']} | {r['tuned_any@10']:.1f} | "
                         f"{r['held_out_any@10']:.1f} | {r['best_on_held_out']}: {r['best_on_held_out_any@10']:.1f} |")
        lines.append(f"| pooled | | | {rotation['pooled_held_out']['any@10']:.1f} | |")
    return "\n".join(lines)
