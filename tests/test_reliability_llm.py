"""LLM faults, for every projection at once: transport errors, empty, truncated, wrong-shape,
made-up ids and 1 MB replies, scripted through the fake provider (the real litellm path).

For each fault: the pipeline runs over fresh turns with every projector's calls
failing that way; then the model recovers and the pipeline runs until idle. Promised
(docs/architecture.md §8): no invalid row is ever written (checked table by table against the turn
log), content faults are recorded in the metadata and the watermark rules hold, and
transport faults fail the step visibly, leaving nothing half-done, so the recovered
state equals a run that never saw a fault.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import shutil

import dagster as dg
import pytest

from familiar_pipeline.defs.jobs import materializations, materialize_in_process
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.testing.fake_llm import NO_CHOICES, FakeLLM, fake_llm

from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.testing.scripted import careful_model
from familiar_pipeline.storage.turns import TurnLog

from .helpers import append_chat, make_familiar
from .test_pipeline import projection_tables


TOML = """
[llm.background]
model = "fake/careful"
max_retries = 0

[providers.memory.reflection]
turns_threshold = 20
"""
ASSETS = ["turns_fts", "facts", "rolling_summary", "fact_supersessions", "people_dossiers", "reflections"]
PROJECTOR_PROMPTS = ("atomic facts", "running summary", "superseded_ids", "dossier", "self-record", "reflections")
MEGABYTE = "All work and no play makes the familiar a dull fox. " * 20_000  # ~1 MB


def made_up_ids(messages):
    """Well-formed replies that cite turns, facts and people that do not exist."""
    system = messages[0]["content"]
    if "atomic facts" in system:
        return [{"text": "Ghost likes tea", "source_turn_ids": [10**9], "subject_keys": ["discord:404"]}]
    if "superseded_ids" in system:
        return {"superseded_ids": [10**9, -5]}
    if "reflections" in system:
        return [{"text": "A pattern", "cited_turn_ids": [10**9], "cited_fact_ids": [10**9]}]
    return careful_model(messages)


FAULTS = {
    "timeout": lambda m: FakeLLM.error("timeout"),
    "rate_limit_429": lambda m: FakeLLM.error("rate_limit"),
    "server_500": lambda m: FakeLLM.error("server"),
    "empty": lambda m: "",
    "no_choices": lambda m: NO_CHOICES,
    "truncated_json": lambda m: careful_model(m)[: max(1, len(careful_model(m)) // 2)],
    "wrong_shape": lambda m: {"facts": {"oops": True}, "superseded_ids": "all of them", "items": 7},
    "made_up_ids": made_up_ids,
    "one_megabyte": lambda m: MEGABYTE,
}
TRANSPORT = {"timeout", "rate_limit_429", "server_500"}


def faulty(kind: str):
    def responder(messages):
        system = messages[0]["content"] if messages else ""
        if any(p in system for p in PROJECTOR_PROMPTS):
            return FAULTS[kind](messages)
        return careful_model(messages)
    return responder


def materialize(root, instance):
    instance.add_dynamic_partitions("familiars", ["fam"])
    return materialize_in_process(ASSETS, instance=instance, data_root=root, partition_key="fam", raise_on_error=False)


def until_idle(root, instance, rounds: int = 6):
    for _ in range(rounds):
        result = materialize(root, instance)
        assert result.success
        statuses = [str(m.metadata["status"].value) for a in ASSETS
                    for m in materializations(result, a)]
        if all(s.startswith(("no-op", "disabled")) for s in statuses):
            return


def assert_rows_valid(paths) -> None:
    """Every projection row points at things that exist and has the shape readers rely on."""
    with TurnLog(paths.turns_db) as log:
        turn_ids = {t.id for t in log.recent_cross_channel(100_000, include_deleted=True)}
        people = {t.author_key for t in log.recent_cross_channel(100_000, include_deleted=True)} | {"ego:fam"}
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        q = store.conn.execute
        fact_ids = {r[0] for r in q("SELECT id FROM facts").fetchall()}
        for text, sources, importance in q("SELECT text, source_turn_ids, importance FROM facts").fetchall():
            assert text.strip() and set(sources) <= turn_ids and sources, (text[:80], sources)
            assert importance is None or 1 <= importance <= 10
        assert {r[0] for r in q("SELECT canonical_key FROM fact_subjects").fetchall()} <= people
        for (by,) in q("SELECT superseded_by FROM facts WHERE superseded_by IS NOT NULL").fetchall():
            assert by in fact_ids
        for text, turns, cited in q("SELECT text, cited_turn_ids, cited_fact_ids FROM reflections").fetchall():
            assert text.strip() and set(turns) <= turn_ids and set(cited) <= fact_ids
        for key, text in q("SELECT canonical_key, dossier_text FROM people_dossiers").fetchall():
            assert key in people and text.strip()
        for (text,) in q("SELECT summary_text FROM summaries").fetchall():
            assert text.strip()
        for projector, turn_id in q("SELECT projector, turn_id FROM watermarks").fetchall():
            assert turn_id <= max(turn_ids), projector


MAX_STORED_CHARS = 20_000


def longest_text(paths) -> int:
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return store.conn.execute(
            "SELECT coalesce(max(len(t)), 0) FROM (SELECT summary_text t FROM summaries UNION ALL "
            "SELECT dossier_text FROM people_dossiers UNION ALL SELECT text FROM facts "
            "UNION ALL SELECT text FROM reflections)").fetchone()[0]


def world(root):
    paths = make_familiar(root, "fam", TOML)
    append_chat(paths, 30)
    return paths


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A familiar whose first 30 turns are fully projected, with 30 fresh turns waiting."""
    root = tmp_path_factory.mktemp("prepared")
    paths = world(root)
    with fake_llm() as fake, dg.instance_for_test() as instance:
        fake.script(careful_model)
        until_idle(root, instance)
    append_chat(paths, 30, start=30)
    return root


def copy_of(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path, dirs_exist_ok=True)
    return FamiliarPaths.for_id("fam", tmp_path)


@pytest.fixture(scope="module")
def clean_reference(prepared, tmp_path_factory):
    """The tables of a run that never saw a fault (same turns, same phases)."""
    root = tmp_path_factory.mktemp("clean")
    paths = copy_of(prepared, root)
    with fake_llm() as fake, dg.instance_for_test() as instance:
        fake.script(careful_model)
        until_idle(root, instance)
    return projection_tables(paths.memory_db)


@pytest.mark.parametrize("kind", list(FAULTS))
def test_every_projection_survives_the_fault(tmp_path, kind, prepared, clean_reference):
    paths = copy_of(prepared, tmp_path)
    with fake_llm() as fake, dg.instance_for_test() as instance:
        fake.script(faulty(kind))
        result = materialize(tmp_path, instance)
        assert_rows_valid(paths)
        if kind in TRANSPORT:
            assert not result.success, "a provider outage fails the step where the UI shows it"
            failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
            assert failures and all("LlmError" in e.event_specific_data.error.to_string() for e in failures)
        else:
            assert result.success, f"a bad reply ({kind}) never fails a step"
            meta = {a: {k: v.value for k, v in m.metadata.items()}
                    for a in ("facts", "fact_supersessions", "rolling_summary")
                    for m in materializations(result, a)}
            if kind in ("wrong_shape", "made_up_ids", "empty", "no_choices", "one_megabyte"):
                assert meta["facts"]["dropped_reasons"], (kind, meta["facts"])
            if kind == "truncated_json":  # complete leading items are kept; the cut-off one is recorded
                assert "malformed_items" in meta["facts"]["dropped_reasons"], meta["facts"]
            if kind in ("empty", "no_choices", "one_megabyte"):
                assert meta["rolling_summary"]["dropped_reasons"], "an unusable summary reply is recorded"
            assert meta["facts"]["watermark_after"]["turn_id"] == 60, "bad output never stalls extraction"
        if kind == "one_megabyte":
            assert longest_text(paths) < MAX_STORED_CHARS, "a runaway reply never becomes a megabyte of memory"
        fake.script(careful_model)
        until_idle(tmp_path, instance)
        assert_rows_valid(paths)
    if kind in TRANSPORT:
        assert projection_tables(paths.memory_db) == clean_reference, "the outage left no trace once healed"
