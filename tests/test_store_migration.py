"""A store written by the code before table declarations migrates without losing a row.

`tests/fixtures/store_v4/` is a real store built by main at 3e67a85 (schema v4: hand-written
DDL, no scope or provenance columns), exported with its turn log. Opening it with this code's
store adds every declared column, fills it, runs each declared migration once, and keeps every
row and value it had; a read-only open never changes it. A v1 store (before the decision log
and the vector tables) gets the missing tables created from their declarations.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import duckdb
import pytest

from familiar_pipeline.engine import registry
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.facts.store import FactDraft
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.storage import store_schema
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.store import ProjectionStore, SchemaVersionError
from familiar_pipeline.storage.tables import provenance_sql
from familiar_pipeline.storage.turns import TurnLog

FIXTURE = Path(__file__).parent / "fixtures" / "store_v4"
LEGACY_TABLES = ("facts", "fact_subjects", "summaries", "people_dossiers", "reflections", "fact_embeddings",
                 "turn_embeddings", "turn_window_embeddings", "watermarks", "supersede_decisions")


def legacy_store(folder: Path, *, version: int = 4) -> Path:
    """The fixture imported into ``folder/memory.duckdb`` (and its turn log); ``version`` 1 drops what v2-v4 added."""
    path = folder / "memory.duckdb"
    with duckdb.connect(str(path)) as conn:
        conn.execute((FIXTURE / "memory" / "schema.sql").read_text())
        for parquet in sorted((FIXTURE / "memory").glob("*.parquet")):
            conn.execute(f"COPY {parquet.stem} FROM '{parquet}' (FORMAT parquet)")
        if version == 1:
            for table in ("supersede_decisions", "turn_embeddings", "turn_window_embeddings"):
                conn.execute(f"DROP TABLE {table}")
            conn.execute("DROP SEQUENCE supersede_decisions_id_seq")
            conn.execute("DELETE FROM schema_version WHERE version > 1")
    TurnLog(folder / "turns.db").close()  # the turn log as this code creates it, then the fixture's rows
    log = json.loads((FIXTURE / "turns.json").read_text())
    with sqlite3.connect(folder / "turns.db") as turns:
        for table in ("turns", "turn_changes"):
            columns = log[table]["columns"]
            turns.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                              log[table]["rows"])
    return path


def rows_of(conn, table: str) -> list[tuple]:
    return conn.execute(f'SELECT * FROM "{table}" ORDER BY ALL').fetchall()


def test_a_store_written_by_main_migrates_without_losing_a_row(tmp_path):
    path = legacy_store(tmp_path)
    with duckdb.connect(str(path), read_only=True) as raw:
        before = {t: rows_of(raw, t) for t in LEGACY_TABLES}
        old_columns = {t: len(raw.execute(f"DESCRIBE {t}").fetchall()) for t in LEGACY_TABLES}
    assert sum(len(rows) for rows in before.values()) > 300  # the fixture is a real store, not an empty one

    with pytest.raises(SchemaVersionError, match="read-only open never migrates"):
        ProjectionStore(path, read_only=True, tables=registry.tables())

    with ProjectionStore(path, tables=registry.tables()) as store:
        assert store.schema_version == store_schema.SCHEMA_VERSION
        for table in LEGACY_TABLES:
            after = rows_of(store.conn, table)
            kept = sorted(row[: old_columns[table]] for row in after)
            if table == "summaries":  # the one familiar-wide summary was named "conversation"
                assert [r[0] for r in kept] == [FAMILIAR_WIDE]
                kept = [("conversation", *r[1:]) for r in kept]
            assert kept == sorted(before[table]), table
        # Every declared table now has its scope, filled as what the old rows were: familiar-wide.
        for table in registry.tables():
            scopes = store.sql(f"SELECT DISTINCT scope FROM {table.name}").fetchall()
            assert scopes in ([], [(FAMILIAR_WIDE,)]), table.name
        # A dossier's provenance: the facts about its subject it had folded.
        for key, last, sources in store.sql(
                "SELECT canonical_key, last_fact_id, source_fact_ids FROM people_dossiers").fetchall():
            assert sources and max(sources) <= last
            assert all(key in f.subject_keys for f in facts_db.facts_by_ids(store, sources))
        # The migrated store keeps working: its dedup index, its sequence.
        fact = facts_db.current_facts(store)[0]
        assert facts_db.append_fact(store, FactDraft(fact.text, subjects=fact.subjects))[1] is False
        new, inserted = facts_db.append_fact(store, FactDraft("Cass adopted a cat.", subjects=[Subject("discord:111", "Cass")]))
        assert inserted and new.id == max(r[0] for r in before["facts"]) + 1
        migrations = dict(store.sql("SELECT name, migrations FROM table_versions").fetchall())
        assert migrations["summaries"] == ["familiar-wide scope"] and migrations["people_dossiers"] == ["source facts"]
        # Dossiers were keyed by subject; now by subject and scope (rekeyed by copying every row).
        [(key,)] = store.sql("SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = "
                             "'people_dossiers' AND constraint_type = 'PRIMARY KEY'").fetchall()
        assert list(key) == ["canonical_key", "scope"]
        subject = store.sql("SELECT canonical_key FROM people_dossiers LIMIT 1").fetchone()[0]
        dossier_db.put_dossier(store, subject, "What was said in one server.", 1, scope="guild:1")
        assert {d.scope for d in dossier_db.dossiers(store) if d.canonical_key == subject} == {FAMILIAR_WIDE, "guild:1"}
    with ProjectionStore(path, read_only=True, tables=registry.tables()) as reader:  # now current: reads work
        assert reader.schema_version == store_schema.SCHEMA_VERSION


def test_a_v1_store_gets_the_tables_added_since(tmp_path):
    path = legacy_store(tmp_path, version=1)
    with ProjectionStore(path, tables=registry.tables()) as store:
        names = {r[0] for r in store.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert {"supersede_decisions", "turn_embeddings", "turn_window_embeddings"} <= names
        assert store.next_ids("supersede_decisions_id_seq", 1) == [1]
        assert len(facts_db.current_facts(store)) > 0


def test_every_migrated_row_cites_turns_of_the_log(tmp_path):
    """The provenance of every row of every declared table points at turns the log has."""
    path = legacy_store(tmp_path)
    with sqlite3.connect(tmp_path / "turns.db") as turns:
        known = {r[0] for r in turns.execute("SELECT id FROM turns")}
    with ProjectionStore(path, tables=registry.tables()) as store:
        for table in registry.tables():
            cited = store.sql(f"SELECT row_key, turn_id FROM ({provenance_sql(table)})").fetchall()
            missing = [(k, t) for k, t in cited if abs(t) not in known]
            assert not missing, (table.name, missing[:5])
            if store.count(table):
                assert cited, f"{table.name} has rows but no provenance"


def test_reopening_a_migrated_store_changes_nothing(tmp_path):
    path = legacy_store(tmp_path)
    ProjectionStore(path, tables=registry.tables()).close()
    with duckdb.connect(str(path), read_only=True) as raw:
        first = raw.execute("SELECT name, fingerprint, migrations FROM table_versions ORDER BY name").fetchall()
    ProjectionStore(path, tables=registry.tables()).close()
    with duckdb.connect(str(path), read_only=True) as raw:
        assert raw.execute("SELECT name, fingerprint, migrations FROM table_versions ORDER BY name").fetchall() == first
        assert raw.execute("SELECT count(*) FROM schema_version WHERE version = ?",
                           [store_schema.SCHEMA_VERSION]).fetchone()[0] == 1


def test_an_existing_familiar_gets_its_scopes_by_the_documented_rebuild(tmp_path, fake_llm):
    """Issue 26 item 4, as docs/memory.md says: a familiar whose rows were written before scopes
    (they carry `familiar`) is re-scoped by `familiar backfill --projection <asset> --rebuild`;
    every turn stays, and every rebuilt row carries the scope of the turns it came from."""
    import dagster as dg

    from familiar_pipeline.storage.scopes import turn_scope

    from .fact_helpers import ALL_ASSETS, GRAPH_TOML, materialize
    from .helpers import make_familiar

    paths = make_familiar(tmp_path, "old", GRAPH_TOML)
    legacy_store(paths.dir)
    with TurnLog(paths.turns_db) as log:
        turns = {t.id: t for t in log.turns_after(0)}
        for turn in turns.values():  # the fixture kept turns, not the participants table
            if turn.author_key and turn.role == "user":
                log.upsert_participant(turn.author_key, username=turn.author_display or None)
    with dg.instance_for_test() as instance:
        assert materialize(tmp_path, instance, ALL_ASSETS, familiar_id="old", rebuild=True).success
    with TurnLog(paths.turns_db) as log:
        assert {t.id for t in log.turns_after(0)} == set(turns), "no turn lost"
    with ProjectionStore(paths.memory_db, read_only=True, tables=registry.tables()) as store:
        facts = store.sql("SELECT scope, source_turn_ids FROM facts").fetchall()
        assert facts, "the rebuild extracted facts again"
        for scope, sources in facts:
            assert scope == turn_scope(turns[sources[0]]) != FAMILIAR_WIDE
        for table in ("summaries", "people_dossiers", "reflections"):
            scopes = {r[0] for r in store.sql(f"SELECT DISTINCT scope FROM {table}").fetchall()}
            assert scopes and FAMILIAR_WIDE not in scopes, table
