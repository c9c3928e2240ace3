"""Serving snapshots: publish from DuckDB, read in the bot without touching DuckDB's file."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import numpy as np
import pytest

from familiar_pipeline.storage import snapshots, store_schema
from familiar_pipeline.storage.snapshots import (
    MANIFEST_NAME,
    Manifest,
    SnapshotFormatError,
    SnapshotPublishError,
    SnapshotReader,
    load_snapshot,
    publish_snapshot,
    read_manifest,
)
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.projectors.summary.tables import Summary
from familiar_pipeline.storage.records import Watermark
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.facts import reads as fact_reads
from familiar_pipeline.projectors.fact_embeddings import tables as fact_vectors
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.summary import tables as summary_db
from familiar_pipeline.projectors.supersede import tables as supersede_db
from familiar_pipeline.engine import registry
from familiar_pipeline.storage.snapshots import served_schema, served_tables

SERVING_TABLES = served_tables(registry.tables())
SERVING_SCHEMAS = {name: served_schema(name) for name in SERVING_TABLES}

UTC = timezone.utc
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

def make_store(path: Path | str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A bare connection holding the store's tables exactly as their declarations create them."""
    conn = duckdb.connect(str(path))
    conn.execute(store_schema.KERNEL_DDL["watermarks"])
    for table in registry.tables():
        for statement in table.ddl():
            conn.execute(statement)
    return conn


def add_fact(conn, fact_id, text, *, subjects=(), channel_id=100, importance=5, created_at=T0,
             superseded_at=None, superseded_by=None, valid_from=T0, valid_to=None, turns=(1,)):
    subject_set = "\n".join(sorted(k for k, _ in subjects))
    conn.execute(
        "INSERT INTO facts (id, channel_id, text, norm_text, subject_set, dedup_key, source_turn_ids, importance, "
        "created_at, superseded_at, superseded_by, valid_from, valid_to, scope, kind) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'familiar', 'fact')",
        [fact_id, channel_id, text, text.lower(), subject_set, f"{text.lower()}\n{subject_set}",
         list(turns), importance, created_at, superseded_at, superseded_by, valid_from, valid_to],
    )
    for position, (key, display) in enumerate(subjects):
        conn.execute("INSERT INTO fact_subjects VALUES (?, ?, ?, ?, 'familiar')", [fact_id, key, display, position])


def seed_memory(conn) -> None:
    add_fact(conn, 1, "Cass likes pho.", subjects=[("discord:1", "Cass"), ("discord:11", "Bo")])
    add_fact(conn, 2, "Cass lives in Lyon.", subjects=[("discord:1", "Cass")],
             superseded_at=T0 + timedelta(days=2), superseded_by=3, valid_to=None)
    add_fact(conn, 3, "Cass moved to Oslo.", subjects=[("discord:1", "Cass")],
             valid_from=T0 + timedelta(days=2), importance=None, turns=(7, 9))
    # Expired in world time, written with a -05:00 offset: must compare as an instant.
    add_fact(conn, 4, "Bo is on holiday.", subjects=[("discord:11", "Bo")],
             valid_to=datetime(2026, 6, 3, 7, 0, tzinfo=timezone(timedelta(hours=-5))))
    add_fact(conn, 5, "The familiar hums when idle.", subjects=[("ego:fam", "Fam")], channel_id=None)
    conn.execute("INSERT INTO summaries VALUES ('familiar', 'They talked about food.', 42, ?)", [T0])
    conn.execute("INSERT INTO people_dossiers VALUES ('discord:1', 'Cass: likes pho, moved to Oslo.', 3, ?, "
                 "'familiar', [1, 3])", [T0])
    conn.execute("INSERT INTO people_dossiers VALUES ('ego:fam', 'Hums.', 5, ?, 'familiar', [5])", [T0])
    for rid, channel in ((1, 10), (2, None), (3, 20), (4, 10)):
        conn.execute("INSERT INTO reflections VALUES (?, ?, ?, ?, ?, 40, 5, ?, 'familiar')",
                     [rid, channel, f"reflection {rid}", [40 + rid], [rid], T0 + timedelta(hours=rid)])
    for fid in (1, 3):
        conn.execute("INSERT INTO fact_embeddings VALUES (?, 'hash-v1', 3, ?, ?, 'familiar')",
                     [fid, [fid, 0.5, -1.0], T0])
    conn.execute("INSERT INTO fact_embeddings VALUES (1, 'other', 2, [9, 9], ?, 'familiar')", [T0])
    conn.execute("INSERT INTO watermarks VALUES ('rich_note', 42, 5, 7, ?)", [T0])


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != snapshots.LOCK_NAME)


@pytest.fixture
def store():
    conn = make_store()
    seed_memory(conn)
    yield conn
    conn.close()


# --------------------------------------------------------------------------- #


def test_round_trip_and_read_semantics(store, tmp_path):
    serving = tmp_path / "serving"
    manifest = publish_snapshot(store, serving, store_watermark={"rich_note": 42, "at": T0})

    assert manifest.version == 1 and manifest.format == 1
    assert manifest.store_watermark == {"rich_note": 42, "at": "2026-06-01T12:00:00+00:00"}
    assert manifest.tables["facts"].file == "facts.v1.parquet"
    assert manifest.tables["facts"].rows == 5 and manifest.tables["fact_embeddings"].rows == 3
    assert datetime.fromisoformat(manifest.published_at).utcoffset() == timedelta(0)
    assert read_manifest(serving) == manifest
    assert listing(serving) == sorted([MANIFEST_NAME, "manifest.v1.json"] + [f"{t}.v1.parquet" for t in SERVING_TABLES])

    reader = SnapshotReader(serving)
    assert reader.version == 1 and reader.manifest == manifest and reader.last_error is None
    for name, schema in SERVING_SCHEMAS.items():
        assert reader.table(name).schema.equals(schema), name
    assert reader.table("facts")["id"].to_pylist() == [1, 2, 3, 4, 5]  # superseded rows served

    later = T0 + timedelta(days=5)
    by_ids = fact_reads.facts_by_ids(reader, [3, 1, 99, 2])
    assert [f.id for f in by_ids] == [1, 2, 3]
    first = by_ids[0]
    assert first.subjects == (Subject("discord:1", "Cass"), Subject("discord:11", "Bo"))
    assert first.created_at == T0 and first.created_at.tzinfo == UTC
    assert by_ids[1].superseded_by == 3 and by_ids[2].source_turn_ids == (7, 9)
    assert by_ids[2].importance is None

    assert [f.id for f in fact_reads.current_facts(reader, now=later)] == [1, 3, 5]
    # Fact 4 expires at 12:00Z on June 3rd (07:00-05:00): current just before, gone at the instant.
    assert 4 in [f.id for f in fact_reads.current_facts(reader, now=datetime(2026, 6, 3, 11, 59, tzinfo=UTC))]
    assert 4 not in [f.id for f in fact_reads.current_facts(reader, now=datetime(2026, 6, 3, 12, 0, tzinfo=UTC))]
    assert [f.id for f in fact_reads.recent_facts(reader, 2, now=later)] == [5, 3]
    assert fact_reads.recent_facts(reader, 0) == [] and fact_reads.recent_facts(reader, -1) == []
    # as_of is a world-time slice that includes superseded rows.
    assert [f.id for f in fact_reads.recent_facts(reader, 10, as_of=T0 + timedelta(days=1))] == [5, 4, 2, 1]
    assert [f.id for f in fact_reads.recent_facts(reader, 10, as_of=T0 + timedelta(days=3))] == [5, 3, 2, 1]

    assert [f.id for f in fact_reads.facts_for_subject(reader, "discord:1", now=later)] == [1, 3]
    assert [f.id for f in fact_reads.facts_for_subject(reader, "discord:1", as_of=T0)] == [1, 2]
    assert [f.id for f in fact_reads.facts_for_subject(reader, "discord:11", now=later)] == [1]  # 4 expired
    assert fact_reads.facts_for_subject(reader, "discord:", now=later) == []

    assert fact_reads.superseded_fact_ids(reader, [1, 2, 3, 77]) == {2} and fact_reads.superseded_fact_ids(reader, []) == set()
    assert fact_reads.latest_fact_id(reader) == 5

    summary = summary_db.summary(reader)
    assert summary == Summary("familiar", "They talked about food.", 42, T0)
    assert summary_db.summary(reader, "other-scope") is None
    assert dossier_db.dossier_in(reader, "discord:1").last_fact_id == 3 and dossier_db.dossier_in(reader, "discord:2") is None
    assert set(dossier_db.dossiers_for(reader, ["discord:1", "ego:fam", "discord:2"])) == {"discord:1", "ego:fam"}

    assert [r.id for r in reflection_db.recent_reflections_in(reader, 10, 10)] == [4, 2, 1]
    assert [r.id for r in reflection_db.recent_reflections_in(reader, 20, 1)] == [3]
    assert [r.id for r in reflection_db.recent_reflections_in(reader, None, 10)] == [4, 3, 2, 1]
    assert reflection_db.recent_reflections_in(reader, 10, 0) == []
    assert reflection_db.recent_reflections_in(reader, 10, 1)[0].cited_fact_ids == (4,)

    vectors = fact_vectors.vectors_in(reader, "hash-v1", [1, 2, 3])
    assert set(vectors) == {1, 3}
    assert vectors[3].dtype == np.float32 and vectors[3].tolist() == [3.0, 0.5, -1.0]
    assert fact_vectors.vectors_in(reader, "other", [1, 3])[1].tolist() == [9.0, 9.0]
    assert fact_vectors.vectors_in(reader, "missing-model", [1]) == {} and fact_vectors.vectors_in(reader, "hash-v1", []) == {}

    assert reader.watermark("rich_note") == Watermark("rich_note", 42, 5, 7, T0)
    assert reader.watermark("reflection") == Watermark("reflection")


def test_reader_before_anything_is_published(tmp_path):
    reader = SnapshotReader(tmp_path / "not-yet")
    assert reader.version == 0 and reader.manifest is None and reader.last_error is None
    assert reader.refresh() is False
    for name, schema in SERVING_SCHEMAS.items():
        assert reader.table(name).num_rows == 0 and reader.table(name).schema.equals(schema)
    assert fact_reads.current_facts(reader) == [] and fact_reads.latest_fact_id(reader) == 0 and summary_db.summary(reader) is None
    assert reflection_db.recent_reflections_in(reader, 1, 5) == [] and fact_vectors.vectors_in(reader, "hash-v1", [1]) == {}
    assert reader.watermark("rich_note").turn_id == 0
    with pytest.raises(KeyError, match="no serving table 'nope'"):
        reader.table("nope")


def test_version_changes_only_on_publish_and_refresh_is_a_noop_otherwise(store, tmp_path):
    serving = tmp_path / "serving"
    publish_snapshot(store, serving, store_watermark={})
    reader = SnapshotReader(serving)
    loaded = reader.current()
    for _ in range(3):
        assert reader.refresh() is False
    assert reader.current() is loaded and reader.version == 1

    store.execute("UPDATE summaries SET summary_text = 'New summary.'")
    assert reader.refresh() is False and summary_db.summary(reader).summary_text == "They talked about food."

    manifest = publish_snapshot(store, serving, store_watermark={})
    assert manifest.version == 2
    assert reader.refresh() is True and reader.version == 2
    assert summary_db.summary(reader).summary_text == "New summary."
    assert summary_db.summary(loaded).summary_text == "They talked about food."  # old snapshot is immutable
    assert reader.refresh() is False


def test_old_versions_are_collected_but_the_previous_survives(store, tmp_path):
    serving = tmp_path / "serving"
    publish_snapshot(store, serving, store_watermark={})
    stray = serving / ".facts.v9.4242.deadbeef.tmp"
    stray.write_bytes(b"half a file from a killed publisher")
    manifests = [publish_snapshot(store, serving, store_watermark={}) for _ in range(3)]
    assert [m.version for m in manifests] == [2, 3, 4]

    expected = [MANIFEST_NAME, "manifest.v3.json", "manifest.v4.json"] + [
        f"{t}.v{v}.parquet" for t in SERVING_TABLES for v in (3, 4)]
    assert listing(serving) == sorted(expected)
    # A reader that read the v3 manifest just before v4 was published can still open v3.
    assert load_snapshot(serving, manifests[1]).version == 3
    with pytest.raises(SnapshotFormatError, match="facts.v2.parquet is missing"):
        load_snapshot(serving, manifests[0])


def _fail_on(monkeypatch, predicate):
    real_replace = os.replace

    def flaky_replace(src, dst, *args, **kwargs):
        if predicate(Path(dst).name):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", flaky_replace)


@pytest.mark.parametrize("failure", ["third_table_replace", "manifest_replace", "copy_query"])
def test_failed_publish_leaves_previous_snapshot_readable(store, tmp_path, monkeypatch, failure):
    serving = tmp_path / "serving"
    publish_snapshot(store, serving, store_watermark={"seq": 1})
    before = listing(serving)
    reader = SnapshotReader(serving)
    store.execute("UPDATE summaries SET summary_text = 'Should not be served.'")

    tables = dict(SERVING_TABLES)
    if failure == "third_table_replace":
        third = list(SERVING_TABLES)[2]
        _fail_on(monkeypatch, lambda name: name.startswith(f"{third}.v2"))
    elif failure == "manifest_replace":
        _fail_on(monkeypatch, lambda name: name == MANIFEST_NAME)
    else:
        tables["watermarks"] = "SELECT * FROM no_such_table"

    with pytest.raises(SnapshotPublishError, match="v1 is still the published snapshot") as info:
        publish_snapshot(store, serving, store_watermark={"seq": 2}, tables=tables)
    assert info.value.__cause__ is not None
    monkeypatch.undo()

    assert listing(serving) == before  # no temp files, no half-published v2 files
    assert read_manifest(serving).version == 1
    assert reader.refresh() is False and reader.last_error is None
    fresh = SnapshotReader(serving)
    assert fresh.version == 1 and summary_db.summary(fresh).summary_text == "They talked about food."

    assert publish_snapshot(store, serving, store_watermark={"seq": 2}).version == 2
    assert reader.refresh() is True and summary_db.summary(reader).summary_text == "Should not be served."


def test_bad_publish_arguments_write_nothing(store, tmp_path):
    serving = tmp_path / "serving"
    with pytest.raises(ValueError, match="store_watermark"):
        publish_snapshot(store, serving, store_watermark={"obj": object()})
    with pytest.raises(ValueError, match="bad serving table name"):
        publish_snapshot(store, serving, store_watermark={}, tables={"../facts": "SELECT 1"})
    assert not serving.exists()


def test_publish_sees_committed_state_and_leaves_the_callers_transaction_alone(store, tmp_path):
    serving = tmp_path / "serving"
    store.execute("BEGIN TRANSACTION")
    add_fact(store, 6, "Not committed yet.")
    assert publish_snapshot(store, serving, store_watermark={}).tables["facts"].rows == 5
    add_fact(store, 7, "The caller's transaction is still usable.")
    store.execute("COMMIT")
    assert publish_snapshot(store, serving, store_watermark={}).tables["facts"].rows == 7


def test_corrupt_manifest_keeps_the_last_good_snapshot(store, tmp_path, caplog):
    serving = tmp_path / "serving"
    publish_snapshot(store, serving, store_watermark={})
    reader = SnapshotReader(serving)

    good = (serving / MANIFEST_NAME).read_bytes()
    (serving / MANIFEST_NAME).write_text("{}")
    assert reader.refresh() is False and "unsupported snapshot format" in reader.last_error
    (serving / MANIFEST_NAME).write_bytes(good)
    assert reader.refresh() is False and reader.last_error is None  # in step again

    (serving / MANIFEST_NAME).write_text('{"format": 1, "version": ')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="familiar_pipeline.storage.snapshots"):
        assert reader.refresh() is False
        assert reader.refresh() is False
    assert reader.version == 1 and fact_reads.latest_fact_id(reader) == 5
    assert "unreadable snapshot manifest" in reader.last_error
    assert len([r for r in caplog.records if "unreadable" in r.getMessage()]) == 1  # no log spam
    with pytest.raises(SnapshotFormatError):
        read_manifest(serving)

    # The publisher repairs it, and never reuses a version number that has files.
    assert publish_snapshot(store, serving, store_watermark={}).version == 2
    assert reader.refresh() is True and reader.version == 2 and reader.last_error is None

    (serving / MANIFEST_NAME).unlink()
    assert reader.refresh() is False and reader.version == 2 and "missing" in reader.last_error


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"format": 2, "version": 1, "published_at": "x", "tables": {}}, "unsupported snapshot format"),
        ({"format": 1, "version": 0, "published_at": "x", "tables": {}}, "positive integer"),
        ({"format": 1, "version": True, "published_at": "x", "tables": {}}, "positive integer"),
        ({"format": 1, "version": 1, "published_at": "x",
          "tables": {"facts": {"file": "../facts.v1.parquet", "rows": 1, "bytes": 1}}}, "bad file"),
        ({"format": 1, "version": 1, "published_at": "x",
          "tables": {"facts": {"file": "summaries.v1.parquet", "rows": 1, "bytes": 1}}}, "bad file"),
        ({"format": 1, "version": 1, "published_at": "x",
          "tables": {"facts": {"file": "facts.v1.parquet", "rows": -1, "bytes": 1}}}, "rows/bytes"),
        ({"format": 1, "version": 1, "published_at": "x", "tables": {}, "matrices": {}}, "must be a list"),
        ({"format": 1, "version": 1, "published_at": "x", "tables": {},
          "matrices": [{"model": "m", "share": 0.5, "file": "../turn_context_0.v1.npy",
                        "ids_file": "turn_context_0_ids.v1.npy", "rows": 1, "dim": 2}]}, "bad file"),
        ({"format": 1, "version": 1, "published_at": "x", "tables": {},
          "matrices": [{"model": "m", "share": 0.5, "file": "facts.v1.npy",
                        "ids_file": "turn_context_0_ids.v1.npy", "rows": 1, "dim": 2}]}, "bad file"),
        ({"format": 1, "version": 1, "published_at": "x", "tables": {},
          "matrices": [{"model": "m", "share": 1.5, "file": "turn_context_0.v1.npy",
                        "ids_file": "turn_context_0_ids.v1.npy", "rows": 1, "dim": 2}]}, "bad model or share"),
        ({"format": 1, "version": 1, "published_at": "x", "tables": {},
          "matrices": [{"model": "m", "share": 0.5, "file": "turn_context_0.v1.npy",
                        "ids_file": "turn_context_0_ids.v1.npy", "rows": -1, "dim": 2}]}, "rows/dim"),
        ({"format": 1, "version": 1, "published_at": "x", "tables": {}, "matrices": [{"model": "m"}]},
         "exactly"),
        ({"format": 1, "version": 1, "published_at": "x",
          "tables": {"facts": {"file": "facts.v1.npy", "rows": 1, "bytes": 1}}}, "bad file"),
    ],
)
def test_manifest_validation(payload, message):
    with pytest.raises(SnapshotFormatError, match=message):
        Manifest.from_json(payload)


def test_deleted_or_damaged_parquet_keeps_the_last_good_snapshot(store, tmp_path):
    serving = tmp_path / "serving"
    publish_snapshot(store, serving, store_watermark={})
    reader = SnapshotReader(serving)
    store.execute("UPDATE summaries SET summary_text = 'v2'")
    publish_snapshot(store, serving, store_watermark={})

    v2_facts = (serving / "facts.v2.parquet").read_bytes()
    (serving / "facts.v2.parquet").unlink()
    assert reader.refresh() is False
    assert reader.version == 1 and summary_db.summary(reader).summary_text == "They talked about food."
    assert "cannot load snapshot v2" in reader.last_error and "keeping v1" in reader.last_error
    # A snapshot that failed is not re-read on every refresh, only after a pause.
    (serving / "facts.v2.parquet").write_bytes(v2_facts)
    assert reader.refresh() is False and reader.version == 1
    reader.retry_failed_after = 0.0
    assert reader.refresh() is True and reader.version == 2 and reader.last_error is None
    reader.retry_failed_after = 30.0

    store.execute("UPDATE summaries SET summary_text = 'v3'")
    publish_snapshot(store, serving, store_watermark={})
    (serving / "summaries.v3.parquet").write_bytes(b"PAR1 this is not parquet")
    assert reader.refresh() is False and reader.version == 2 and "v3" in reader.last_error

    publish_snapshot(store, serving, store_watermark={})
    assert reader.refresh() is True and reader.version == 4 and summary_db.summary(reader).summary_text == "v3"


def test_file_vanishing_after_the_manifest_read_retries_with_the_new_manifest(store, tmp_path, monkeypatch):
    serving = tmp_path / "serving"
    publish_snapshot(store, serving, store_watermark={})
    reader = SnapshotReader(serving)
    store.execute("UPDATE summaries SET summary_text = 'v4'")
    publish_snapshot(store, serving, store_watermark={})

    real_read_manifest = snapshots.read_manifest
    calls: list[int] = []
    racing = []

    def read_then_race(folder):
        manifest = real_read_manifest(folder)
        if racing:  # the publisher's own read
            return manifest
        if not calls:  # two publishes land between this read and the file opens: v2 is collected
            racing.append(True)
            publish_snapshot(store, serving, store_watermark={})
            publish_snapshot(store, serving, store_watermark={})
            racing.clear()
        calls.append(manifest.version)
        return manifest

    monkeypatch.setattr(snapshots.reader, "read_manifest", read_then_race)
    assert reader.refresh() is True
    assert calls == [2, 4] and reader.version == 4 and summary_db.summary(reader).summary_text == "v4"
    assert reader.last_error is None


def test_threads_query_while_the_reader_refreshes(tmp_path):
    conn = make_store()
    serving = tmp_path / "serving"
    _write_marker(conn, 0, create=True)
    publish_snapshot(conn, serving, store_watermark={"marker": 0}, durable=False)
    reader = SnapshotReader(serving)
    stop = threading.Event()
    failures: list[str] = []

    def query_loop():
        while not stop.is_set():
            try:
                snap = reader.current()
                marker = summary_db.summary(snap).summary_text
                if {f.text for f in fact_reads.current_facts(snap)} != {marker}:
                    failures.append(f"torn view at v{snap.version}")
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                failures.append(repr(exc))

    threads = [threading.Thread(target=query_loop) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(1, 21):
        _write_marker(conn, i)
        publish_snapshot(conn, serving, store_watermark={"marker": i}, durable=False)
        assert reader.refresh() is True
    stop.set()
    for t in threads:
        t.join()
    assert failures == [] and reader.version == 21


def test_publish_from_a_real_projection_store_agrees_with_its_reads(tmp_path):
    from familiar_pipeline.projectors.facts.store import FactDraft
    from familiar_pipeline.storage.store import ProjectionStore

    store = ProjectionStore(tmp_path / "memory.duckdb")
    if not hasattr(store, "conn"):
        store.close()
        pytest.skip("ProjectionStore does not expose .conn yet")
    try:
        cass, bo = Subject("discord:1", "Cass"), Subject("discord:11", "Bo")
        first, _ = facts_db.append_fact(store, FactDraft("Cass lives in Lyon.", (1,), (cass,), channel_id=5), now=T0)
        second, _ = facts_db.append_fact(store,
            FactDraft("Cass moved to Oslo.", (2, 3), (cass, bo), channel_id=5, importance=8),
            now=T0 + timedelta(days=1),
        )
        facts_db.append_fact(store, FactDraft("Bo was away.", (4,), (bo,), valid_to=T0 + timedelta(hours=1)), now=T0)
        supersede_db.supersede(store, [first.id], second.id, now=T0 + timedelta(days=1))
        summary_db.put_summary(store, "They met.", 4, now=T0)
        dossier_db.put_dossier(store, "discord:1", "Cass, now in Oslo.", second.id, now=T0)
        reflection_db.append_reflection(store, channel_id=None, text="Moves a lot.", cited_turn_ids=[2],
                                cited_fact_ids=[first.id], last_turn_id=4, last_fact_id=second.id, now=T0)
        fact_vectors.set_fact_embedding(store, second.id, "hash-v1", [0.25, -0.5, 1.0], now=T0)
        store.set_watermark("rich_note", turn_id=4, fact_id=second.id, now=T0)
        publish_snapshot(store.conn, tmp_path / "serving", store_watermark={"rich_note": 4})

        reader = SnapshotReader(tmp_path / "serving")
        later = T0 + timedelta(days=2)
        all_ids = sorted(facts_db.all_fact_ids(store))

        # The same records, not look-alikes: equal field by field.
        assert fact_reads.facts_by_ids(reader, all_ids) == facts_db.facts_by_ids(store, all_ids)
        assert fact_reads.current_facts(reader, now=later) == facts_db.current_facts(store, now=later)
        assert fact_reads.current_facts(reader, now=later, ids=[second.id, 999]) == facts_db.facts_by_ids(store, [second.id])
        assert fact_reads.facts_for_subject(reader, "discord:1", as_of=T0) == facts_db.facts_for_subject(store, "discord:1", as_of=T0)
        assert fact_reads.recent_facts(reader, 9, include_superseded=True, now=later) == facts_db.recent_facts(store,
            9, include_superseded=True, now=later)
        assert fact_reads.superseded_fact_ids(reader, all_ids) == facts_db.superseded_fact_ids(store, all_ids) == {first.id}
        assert fact_reads.latest_fact_id(reader) == facts_db.latest_fact_id(store)
        assert summary_db.summary(reader) == summary_db.get_summary(store)
        assert dossier_db.dossier_in(reader, "discord:1") == dossier_db.get_dossier(store, "discord:1")
        assert reflection_db.recent_reflections_in(reader, 9, 5) == reflection_db.recent_reflections(store, 9, 5)
        assert fact_vectors.vectors_in(reader, "hash-v1", all_ids)[second.id].tolist() == \
            fact_vectors.embeddings_for(store, "hash-v1", all_ids)[second.id]
        assert reader.watermark("rich_note") == store.get_watermark("rich_note")
    finally:
        store.close()


# --------------------------------------------------------------------------- #
# Cross-process: the bot reading while a Dagster run publishes.
# --------------------------------------------------------------------------- #

MARKER_PROJECTOR = "rich_note"


def _write_marker(conn, marker: int, *, create: bool = False) -> None:
    """Make every served table carry ``v<marker>`` so a torn read is visible."""
    text = f"v{marker}"
    if create:
        for fid in range(1, 6):
            add_fact(conn, fid, text, subjects=[(f"discord:{fid}", text)])
            conn.execute("INSERT INTO fact_embeddings VALUES (?, 'hash-v1', 2, [0, 0], ?, 'familiar')", [fid, T0])
        conn.execute("INSERT INTO summaries VALUES ('familiar', ?, 0, ?)", [text, T0])
        conn.execute("INSERT INTO people_dossiers VALUES ('discord:1', ?, 0, ?, 'familiar', [])", [text, T0])
        conn.execute("INSERT INTO reflections VALUES (1, NULL, ?, [1], [1], 0, 0, ?, 'familiar')", [text, T0])
        conn.execute("INSERT INTO watermarks VALUES (?, 0, 0, 0, ?)", [MARKER_PROJECTOR, T0])
    conn.execute("BEGIN TRANSACTION")
    conn.execute("UPDATE facts SET text = ?, norm_text = ?", [text, text])
    conn.execute("UPDATE fact_subjects SET display_at_write = ?", [text])
    conn.execute("UPDATE fact_embeddings SET vector = [?, ?]", [marker, marker])
    conn.execute("UPDATE summaries SET summary_text = ?, last_turn_id = ?", [text, marker])
    conn.execute("UPDATE people_dossiers SET dossier_text = ?", [text])
    conn.execute("UPDATE reflections SET text = ?", [text])
    conn.execute("UPDATE watermarks SET change_seq = ?", [marker])
    conn.execute("COMMIT")


def _markers_of(snap) -> set[str]:
    """Every marker visible in one loaded snapshot, through Arrow and through the helpers."""
    seen = set(snap.table("facts")["text"].to_pylist())
    seen |= {s["display_at_write"] for row in snap.table("facts")["subjects"].to_pylist() for s in row}
    seen |= set(snap.table("fact_subjects")["display_at_write"].to_pylist())
    seen |= {f"v{int(x)}" for v in snap.table("fact_embeddings")["vector"].to_pylist() for x in v}
    seen |= set(snap.table("reflections")["text"].to_pylist())
    seen |= {summary_db.summary(snap).summary_text, f"v{summary_db.summary(snap).last_turn_id}"}
    seen |= {dossier_db.dossier_in(snap, "discord:1").dossier_text}
    seen |= {f"v{snap.watermark(MARKER_PROJECTOR).change_seq}"}
    seen |= {f.text for f in fact_reads.current_facts(snap)}
    seen |= {f"v{snap.manifest.store_watermark['marker']}"}
    return seen


def _reader_process(serving_dir: str, ready, stop, results) -> None:
    """Runs in a spawned process: refresh and read in a loop until told to stop."""
    reader = SnapshotReader(serving_dir)
    ready.set()
    errors: list[str] = []
    torn: list[str] = []
    versions: set[int] = set()
    loads = reads = 0
    while True:
        stopping = stop.is_set()
        try:
            loads += reader.refresh()
            snap = reader.current()
            if snap.version:
                reads += 1
                versions.add(snap.version)
                markers = _markers_of(snap)
                if markers != {f"v{snap.version}"}:
                    torn.append(f"v{snap.version}: {sorted(markers)}")
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            errors.append(repr(exc))
        if stopping:
            break
    results.put({"errors": errors[:5], "n_errors": len(errors), "torn": torn[:5], "n_torn": len(torn),
                 "versions": sorted(versions), "loads": loads, "reads": reads,
                 "final_version": reader.version, "last_error": reader.last_error})


@pytest.mark.timeout(120)
def test_reader_in_another_process_never_sees_a_torn_snapshot(tmp_path):
    publishes = 200
    serving = tmp_path / "serving"
    conn = make_store(tmp_path / "memory.duckdb")
    _write_marker(conn, 0, create=True)

    ctx = multiprocessing.get_context("spawn")
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_reader_process, args=(str(serving), ready, stop, results), daemon=True)
    child.start()
    try:
        assert ready.wait(60), "reader process did not start"
        for marker in range(1, publishes + 1):
            _write_marker(conn, marker)
            # fsync buys crash durability, not visibility to other processes; skip it for speed.
            manifest = publish_snapshot(conn, serving, store_watermark={"marker": marker}, durable=False)
            assert manifest.version == marker
        stop.set()
        report = results.get(timeout=60)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        conn.close()

    print(f"\ncross-process reader: {report['reads']} reads, {report['loads']} loads, "
          f"{len(report['versions'])} distinct versions")
    assert report["n_errors"] == 0, report["errors"]
    assert report["n_torn"] == 0, report["torn"]
    assert report["final_version"] == publishes
    assert len(report["versions"]) >= 20, report["versions"]


def test_fact_vectors_by_id_index_agrees_with_a_scan_of_every_row():
    """``embeddings_for`` looks ids up in an index built once per snapshot and model; it must
    return what a scan of every row returns: that model's rows only, the last row of a repeated
    id, no entry for a NULL vector or an unknown id."""
    import random

    import pyarrow as pa

    rng = random.Random(3)
    rows = [(fid, model, [float(fid), float(len(model)), float(i)])
            for i, (fid, model) in enumerate((fid, model) for fid in range(1, 400) for model in ("a", "bb")
                                             if rng.random() < 0.7)]
    rows += [(7, "a", [70.0, 0.0, 1.0]), (8, "a", None), (9, "bb", [1.0, 2.0])]  # repeats, NULL, another dim
    rng.shuffle(rows)
    table = pa.table({"fact_id": pa.array([r[0] for r in rows], pa.int64()),
                      "model": pa.array([r[1] for r in rows], pa.string()),
                      "dim": pa.array([len(r[2] or ()) for r in rows], pa.int32()),
                      "vector": pa.array([r[2] for r in rows], pa.list_(pa.float32())),
                      "created_at": pa.array([T0] * len(rows), pa.timestamp("us", tz="UTC")),
                      "scope": pa.array(["familiar"] * len(rows), pa.string())})
    snap = snapshots.Snapshot(None, {"fact_embeddings": table})

    def scanned(model, ids):
        out = {}
        for fid, m, vector in rows:
            if m == model and fid in ids:
                out[fid] = vector
        return {fid: v for fid, v in out.items() if v is not None}

    for model in ("a", "bb", "missing"):
        for _ in range(30):
            ids = {rng.randrange(0, 420) for _ in range(rng.randrange(0, 50))} | {7, 8, 9}
            got = fact_vectors.vectors_in(snap, model, list(ids) + list(ids)[:3])  # repeated asks are one
            want = scanned(model, ids)
            assert set(got) == set(want)
            assert all(got[f].dtype == np.float32 and got[f].tolist() == want[f] for f in want)
    assert fact_vectors.vectors_in(snap, "a", [7])[7].tolist() == [70.0, 0.0, 1.0] and 8 not in fact_vectors.vectors_in(snap, "a", [8])
    assert fact_vectors.fact_vector_count(snap, "a") == sum(r[1] == "a" for r in rows)
    assert fact_vectors.fact_vector_count(snap, "missing") == 0 and fact_vectors.fact_vector_count(snapshots.Snapshot.empty(), "a") == 0
    assert fact_vectors._fact_vector_rows(snap, "a") is fact_vectors._fact_vector_rows(snap, "a")  # once per snapshot and model
