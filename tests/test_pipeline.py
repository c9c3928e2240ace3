"""The turn-driven projections as Dagster assets: watermarks, idempotency, rebuilds, checks."""

from __future__ import annotations

import json

import dagster as dg
import pytest


from familiar_pipeline.defs.assets import FACT_DRIVEN
from familiar_pipeline.defs.checks import CHECKS
from familiar_pipeline.defs.jobs import materializations, materialize_in_process
from familiar_pipeline.storage.fts import FtsIndex
from familiar_pipeline.storage.snapshots import SnapshotReader
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.facts import reads as fact_reads
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.summary import tables as summary_db

from .helpers import append_chat, make_familiar

SYSTEM_TIME_COLUMNS = {"created_at", "updated_at"}
facts, rolling_summary, turns_fts = "facts", "rolling_summary", "turns_fts"


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def run_assets(root, familiar_id, instance, assets, *, rebuild=False, raise_on_error=True):
    """The named assets, with their checks, for one familiar: one run of the projection step."""
    instance.add_dynamic_partitions("familiars", [familiar_id])
    return materialize_in_process(assets, instance=instance, data_root=root, partition_key=familiar_id,
                                  rebuild=rebuild, raise_on_error=raise_on_error)


def metadata_of(result, asset_name):
    mats = [m for m in materializations(result, asset_name)]
    assert mats, f"{asset_name} did not materialize"
    return {k: v.value for k, v in mats[-1].metadata.items()}


def projection_tables(path):
    """Every projection table without system-time columns, for incremental == rebuild comparisons."""
    store = ProjectionStore(path, read_only=True)
    try:
        tables = {}
        for table in ("facts", "fact_subjects", "summaries", "watermarks"):
            cols = [c[0] for c in store.conn.execute(f"DESCRIBE {table}").fetchall() if c[0] not in SYSTEM_TIME_COLUMNS]
            tables[table] = store.conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY ALL").fetchall()
        return tables
    finally:
        store.close()


def test_facts_batches_and_watermark(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    append_chat(paths, 25)
    result = run_assets(tmp_path, "fam", instance, [facts])
    meta = metadata_of(result, "facts")
    assert meta["batches"] == 2 and meta["turns_read"] == 20
    assert meta["watermark_after"]["turn_id"] == 20
    assert meta["rows_written"] > 0 and meta["llm_calls"] == 2
    assert "preview" in meta
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        current = facts_db.current_facts(store)
        assert current and all(f.source_turn_ids and max(f.source_turn_ids) <= 20 for f in current)
        assert all(s.canonical_key.startswith("discord:") for f in current for s in f.subjects)
    reader = SnapshotReader(paths.serving_dir)
    reader.refresh()
    assert len(fact_reads.current_facts(reader)) == len(current)
    hits = FtsIndex(paths.fts_facts).search("allergic peanuts", 5)
    assert hits, "new facts are searchable in fts/facts"


def test_rerun_with_nothing_new_is_a_noop(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    append_chat(paths, 20)
    run_assets(tmp_path, "fam", instance, [facts, rolling_summary, turns_fts])
    before = projection_tables(paths.memory_db)
    calls = len(fake_llm.calls)
    result = run_assets(tmp_path, "fam", instance, [facts, rolling_summary, turns_fts])
    for name in ("facts", "rolling_summary", "turns_fts"):
        assert metadata_of(result, name)["status"].startswith("no-op")
    assert projection_tables(paths.memory_db) == before
    assert len(fake_llm.calls) == calls


def test_malformed_reply_still_advances_watermark(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    append_chat(paths, 10)
    fake_llm.script(lambda messages: "I'm sorry, here are the facts: [{'text': broken")
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [facts]), "facts")
    assert meta["watermark_after"]["turn_id"] == 10
    assert meta["rows_written"] == 0 and meta["rows_dropped"] >= 1
    assert "malformed_items" in meta["dropped_reasons"]


def test_activity_return_batch_skips_the_model(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    append_chat(paths, 10, mode="activity_return")
    calls = len(fake_llm.calls)
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [facts]), "facts")
    assert len(fake_llm.calls) == calls
    assert meta["watermark_after"]["turn_id"] == 10 and meta["rows_written"] == 0


def test_hallucinated_ids_and_keys_are_dropped(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    append_chat(paths, 10)
    reply = [
        {"text": "Cass moved to Berlin.", "source_turn_ids": [1, 999], "subject_keys": ["discord:111", "discord:999"]},
        {"text": "Someone likes tea.", "source_turn_ids": [12345], "subject_keys": []},
        {"text": "I cannot remember names.", "source_turn_ids": [2]},
        {"text": "   ", "source_turn_ids": [3]},
    ]
    fake_llm.script(lambda messages: json.dumps(reply))
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [facts]), "facts")
    assert meta["rows_written"] == 2
    reasons = meta["dropped_reasons"]
    assert reasons["unknown_subject_keys"] == 1 and reasons["self_capability"] == 1 and reasons["empty_text"] == 1
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        by_text = {f.text: f for f in facts_db.current_facts(store)}
    assert by_text["Cass moved to Berlin."].source_turn_ids == (1,)
    assert [s.canonical_key for s in by_text["Cass moved to Berlin."].subjects] == ["discord:111"]
    assert by_text["Someone likes tea."].source_turn_ids == tuple(range(1, 11))  # fallback: the batch


def test_a_world_end_before_its_start_keeps_the_fact_open_ended(tmp_path, instance, fake_llm):
    """A weak model (SmolLM2) gave valid_to equal to the turn's time: the batch must not crash."""
    paths = make_familiar(tmp_path)
    append_chat(paths, 10)
    reply = {"facts": [{"text": "Cass moved to Berlin.", "source_turn_ids": [1], "subject_keys": ["discord:111"],
                        "valid_from": "2020-05-01", "valid_to": "2020-05-01"}]}
    fake_llm.script(lambda messages: json.dumps(reply))
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [facts]), "facts")
    assert meta["rows_written"] == 1 and meta["dropped_reasons"]["valid_to_not_after_valid_from"] == 1
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        (fact,) = facts_db.current_facts(store)
    assert fact.valid_to is None and fact.valid_from.date().isoformat() == "2020-05-01"


def test_no_model_configured_is_skipped_not_failed(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path, extra_toml="")
    append_chat(paths, 12)
    result = run_assets(tmp_path, "fam", instance, [facts, turns_fts])
    assert result.success
    status = metadata_of(result, "facts")["status"]
    assert status.startswith("skipped") and "[llm.background]" in status
    assert metadata_of(result, "turns_fts")["rows_written"] == 12


def test_disabled_projector_reports_disabled(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path, extra_toml='[providers.memory]\nprojectors = []\n[llm.background]\nmodel = "fake/careful"\n')
    append_chat(paths, 12)
    calls = len(fake_llm.calls)
    result = run_assets(tmp_path, "fam", instance, [facts, rolling_summary])
    assert metadata_of(result, "facts")["status"].startswith("disabled")
    assert metadata_of(result, "rolling_summary")["status"].startswith("disabled")
    assert len(fake_llm.calls) == calls


def test_rolling_summary_compounds_and_empty_reply_keeps_watermark(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    append_chat(paths, 25)
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [rolling_summary]), "rolling_summary")
    assert meta["watermark_after"]["turn_id"] == 20 and meta["rows_written"] == 2
    second_prompt = [c for c in fake_llm.calls if "running summary" in c["messages"][0]["content"]][-1]
    assert second_prompt["messages"][1]["content"].startswith("Previous summary:")
    append_chat(paths, 10, start=25)
    fake_llm.script(lambda messages: "   ")
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [rolling_summary]), "rolling_summary")
    assert meta["watermark_after"]["turn_id"] == 20
    assert meta["dropped_reasons"] == {"empty_reply": 1}
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert summary_db.get_summary(store, "guild:1").last_turn_id == 20


def test_turns_fts_follows_edits_and_deletions(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    append_chat(paths, 5)
    run_assets(tmp_path, "fam", instance, [turns_fts])
    with TurnLog(paths.turns_db) as log:
        log.record_edit(turn_id=1, new_content="zebra crossing on the way home")
        log.record_deletion(turn_id=2)
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [turns_fts]), "turns_fts")
    assert meta["watermark_after"]["change_seq"] == 2
    index = FtsIndex(paths.fts_turns)
    assert [i for i, _ in index.search("zebra", 5)] == [1]
    assert index.search("Berlin bakery", 10) == [] or 1 not in [i for i, _ in index.search("Berlin", 10)]
    assert 2 not in [i for i, _ in index.search("Pixel plants", 10)]


def test_turns_fts_finds_a_turn_by_its_speaker(tmp_path, instance, fake_llm):
    """The index holds "speaker: text", so a question naming a person reaches that person's turns."""
    paths = make_familiar(tmp_path)
    append_chat(paths, 6)  # Cass, Bo, Mia, Cass, Bo, Mia
    run_assets(tmp_path, "fam", instance, [turns_fts])
    with TurnLog(paths.turns_db) as log:
        log.record_edit(turn_id=2, new_content="an edited line")
    run_assets(tmp_path, "fam", instance, [turns_fts])
    index = FtsIndex(paths.fts_turns)
    assert sorted(i for i, _ in index.search("Bo", 10)) == [2, 5]  # the edit kept the speaker in the index
    assert [i for i, _ in index.search("edited", 10)] == [2]


def test_turns_fts_repairs_a_deleted_index(tmp_path, instance, fake_llm):
    import shutil

    paths = make_familiar(tmp_path)
    append_chat(paths, 6)
    run_assets(tmp_path, "fam", instance, [turns_fts])
    shutil.rmtree(paths.fts_turns)
    meta = metadata_of(run_assets(tmp_path, "fam", instance, [turns_fts]), "turns_fts")
    assert "repaired" in meta
    assert FtsIndex(paths.fts_turns).doc_count() == 6


def test_incremental_build_equals_rebuild(tmp_path, instance, fake_llm):
    """The correctness test of docs/architecture.md §4: same prompts, same cached replies, same rows."""
    paths = make_familiar(tmp_path)
    for start in (0, 7, 19, 33):
        append_chat(paths, {0: 7, 7: 12, 19: 14, 33: 9}[start], start=start)
        run_assets(tmp_path, "fam", instance, [turns_fts, rolling_summary, facts])
    incremental = projection_tables(paths.memory_db)
    calls = len(fake_llm.calls)
    result = run_assets(tmp_path, "fam", instance, [turns_fts, rolling_summary, facts], rebuild=True)
    rebuilt = metadata_of(result, "facts")
    assert rebuilt["llm_calls"] == 0 and rebuilt["llm_cached_calls"] == 4  # 42 turns = 4 full batches
    assert len(fake_llm.calls) == calls, "a rebuild of unchanged prompts makes no provider calls"
    assert projection_tables(paths.memory_db) == incremental


def test_checks_pass_and_catch_a_fact_citing_a_missing_turn(tmp_path, instance, fake_llm):
    from familiar_pipeline.projectors.facts.store import FactDraft

    paths = make_familiar(tmp_path)
    append_chat(paths, 10)
    result = run_assets(tmp_path, "fam", instance, [facts])
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations and all(evaluations.values()), evaluations
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_fact(store, FactDraft(text="Ghost fact", source_turn_ids=(4242,)))
    append_chat(paths, 10, start=10)
    result = run_assets(tmp_path, "fam", instance, [facts], raise_on_error=False)
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations["facts_cite_existing_turns"] is False


# --------------------------------------------------------------------------- the whole graph

WHOLE_GRAPH_LINES = [
    (0, "I live in Berlin now, near the old airport"),
    (1, "I work at the bakery on the corner most mornings"),
    (2, "I love hiking in the hills every single weekend"),
    (0, "My cat Pixel knocked over the plants again today"),
    (1, "We should plan the lake trip for early June"),
    (2, "Started learning the cello last month, fingers hurt"),
    (0, "Big news, I moved to Lisbon last week for good"),
    (1, "I now work at the library, the bakery closed down"),
    (2, "Honestly I now hate hiking after that awful storm"),
    (0, "Lisbon has the best custard tarts I have ever had"),
    (1, "ok"),
    (2, "My sister is visiting from Porto next Tuesday"),
]


def append_story(paths, n, start):
    from datetime import datetime, timedelta, timezone

    from .helpers import PEOPLE

    base = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    with TurnLog(paths.turns_db) as log:
        for i in range(start, start + n):
            who, line = WHOLE_GRAPH_LINES[i % len(WHOLE_GRAPH_LINES)]
            key, name = PEOPLE[who]
            log.upsert_participant(key, username=name.lower(), global_name=name)
            log.append_turn(channel_id=10 + (i // 25) % 2, guild_id=1, role="user", author_key=key, author_display=name,
                            content=f"{line} (#{i})", created_at=base + timedelta(minutes=i))


def all_tables(path):
    """Every table of memory.duckdb minus wall-clock columns; superseded_at kept as a flag."""
    wall_clock = {"created_at", "updated_at", "decided_at", "applied_at"}
    with ProjectionStore(path, read_only=True) as store:
        tables = {}
        for table in [*store.tables, "watermarks"]:
            cols = [c[0] for c in store.conn.execute(f"DESCRIBE {table}").fetchall() if c[0] not in wall_clock]
            select = ", ".join("superseded_at IS NULL" if c == "superseded_at" else c for c in cols)
            tables[table] = store.conn.execute(f"SELECT {select} FROM {table} ORDER BY ALL").fetchall()
        return tables


@pytest.mark.parametrize("per_fold", [1, 3])
def test_whole_graph_incremental_build_equals_rebuild(tmp_path, instance, fake_llm, per_fold):
    """docs/architecture.md §4 over every asset: same prompts, same cached replies, same rows, table by table."""
    from .fact_helpers import GRAPH_TOML

    # With a fold per batch the short story gives every person a dossier; 3 is the default cadence.
    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML + f"\n[providers.memory.people_dossier]\nbatches_per_fold = {per_fold}\n")
    everything = [turns_fts, rolling_summary, facts, "wishes", *(k.path[-1] for k in FACT_DRIVEN)]

    def run_all(rebuild):
        return run_assets(tmp_path, "fam", instance, everything, rebuild=rebuild)

    start = 0
    for size in (9, 14, 17, 12):
        append_story(paths, size, start)
        start += size
        run_all(False)
    incremental = all_tables(paths.memory_db)
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        retired = store.conn.execute("SELECT count(*) FROM facts WHERE superseded_at IS NOT NULL").fetchone()[0]
        assert retired >= 3, "the story has moves, a job change and a flipped preference"
        assert len(dossier_db.dossiers(store)) == (3 if per_fold == 1 else 2) and reflection_db.recent_reflections(store, limit=50)
        assert store.conn.execute("SELECT count(*) FROM fact_embeddings").fetchone()[0] > 0
    calls = len(fake_llm.calls)
    result = run_all(True)
    assert len(fake_llm.calls) == calls, "a rebuild of unchanged prompts makes no provider calls"
    for asset in everything:
        assert metadata_of(result, asset).get("llm_calls", 0) == 0
    assert all_tables(paths.memory_db) == incremental
    evaluations = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert len(evaluations) == len(CHECKS) and all(evaluations.values()), evaluations
    assert_provenance_in_the_log(paths)


def assert_provenance_in_the_log(paths):
    """Every registered table: each row says which turns it came from, and those turns are in the log
    (a summary's "every turn of its scope up to" is a negative id: its bound must be a turn too)."""
    from familiar_pipeline.engine import registry
    from familiar_pipeline.storage.tables import provenance_sql

    with TurnLog(paths.turns_db, readonly=True) as log:
        turn_ids = {t.id for t in log.turns_after(0)}
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        for table in registry.tables():
            count = store.count(table)
            cited = store.sql(f"SELECT row_key, turn_id FROM ({provenance_sql(table)})").fetchall()
            assert {abs(t) for _, t in cited} <= turn_ids, table.name
            assert len({k if not isinstance(k, dict) else tuple(k.values()) for k, _ in cited}) == count, table.name


def test_no_materialization_or_check_metadata_quotes_what_was_said(tmp_path, instance, fake_llm):
    """The UI and GraphQL have no login: metadata carries counts and ids, never a message, a fact,
    a dossier, a summary or a reflection. A marker word said in every turn appears in no metadata
    of any asset or check of the whole graph (it is in the store: the facts quote it)."""
    from .fact_helpers import ALL_ASSETS, GRAPH_TOML, materialize

    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML)
    marker = "quetzalcoatl"
    with TurnLog(paths.turns_db) as log:
        for i in range(40):
            key, name = ("discord:111", "Cass") if i % 2 else ("discord:222", "Bo")
            log.upsert_participant(key, username=name.lower(), global_name=name)
            log.append_turn(channel_id=10, guild_id=1, role="user", author_key=key, author_display=name,
                            content=f"I saw a {marker} at the museum on visit number {i}")
    result = materialize(tmp_path, instance, ALL_ASSETS)
    assert result.success
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert marker in str(store.table_rows("facts")), "the facts do quote it"
    seen = 0
    for record in instance.get_records_for_run(result.run_id).records:
        event = record.event_log_entry
        text = (event.user_message or "") + json.dumps(
            dg.serialize_value(event.dagster_event.event_specific_data) if event.dagster_event else "")
        assert marker not in text, (event.dagster_event_type, text[:300])
        seen += bool(event.dagster_event and event.dagster_event.is_step_materialization)
    assert seen >= len(ALL_ASSETS), "every asset's materialization was read"
