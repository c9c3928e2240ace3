"""Schema, forward migrations and notebook views of ``memory.duckdb``.

The file is written only by pipeline runs, so migrations run when a *writer*
opens it; a read-only open never changes the file (it may be a notebook
peeking while no run holds it). Each version's DDL and its ``schema_version``
row commit together, so a crash mid-migration leaves the file at a clean
earlier version that the next writer open picks up from.

Notebook views are not part of any numbered migration: they are derived SQL,
so every writer open replaces them with the definitions in this module. That
keeps a view from ever referring to a column an older migration chain has not
created yet, and lets a view fix ship without a version bump.

Two DuckDB facts shape the DDL (checked against duckdb 2.0.1):

* Only a single-column ART index is used for lookups, and only for equality
  on that column. Neither a two-column index nor an expression index speeds
  up ``norm_text = ? AND subject_set = ?``. Hence the stored ``dedup_key``
  column (``norm_text || '\\n' || subject_set``; normalised text never holds a
  newline) with its own index: dedup at insert is an index probe, not a scan.
* Columns that supersession updates (``superseded_at``, ``superseded_by``)
  carry no index, so those UPDATEs stay in place rather than becoming the
  delete-plus-insert that indexed-column updates turn into.
"""

from __future__ import annotations

import hashlib

import duckdb

from familiar_pipeline.storage.records import validity_sql

SCHEMA_VERSION = 4

_V1 = (
    """
    CREATE SEQUENCE facts_id_seq START 1
    """,
    """
    CREATE TABLE facts (
        id              BIGINT PRIMARY KEY,
        channel_id      BIGINT,
        text            VARCHAR NOT NULL,
        norm_text       VARCHAR NOT NULL,
        subject_set     VARCHAR NOT NULL,
        dedup_key       VARCHAR NOT NULL,
        source_turn_ids BIGINT[] NOT NULL,
        importance      TINYINT CHECK (importance BETWEEN 1 AND 10),
        created_at      TIMESTAMPTZ NOT NULL,
        superseded_at   TIMESTAMPTZ,
        superseded_by   BIGINT,
        valid_from      TIMESTAMPTZ,
        valid_to        TIMESTAMPTZ,
        CHECK (superseded_by IS NULL OR superseded_at IS NOT NULL)
    )
    """,
    """
    CREATE INDEX facts_dedup_key ON facts (dedup_key)
    """,
    """
    CREATE TABLE fact_subjects (
        fact_id          BIGINT NOT NULL,
        canonical_key    VARCHAR NOT NULL,
        display_at_write VARCHAR NOT NULL,
        position         INTEGER NOT NULL,
        PRIMARY KEY (fact_id, canonical_key)
    )
    """,
    """
    CREATE INDEX fact_subjects_key ON fact_subjects (canonical_key)
    """,
    """
    CREATE INDEX fact_subjects_fact ON fact_subjects (fact_id)
    """,
    """
    CREATE TABLE summaries (
        scope        VARCHAR PRIMARY KEY,
        summary_text VARCHAR NOT NULL,
        last_turn_id BIGINT NOT NULL,
        created_at   TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE people_dossiers (
        canonical_key VARCHAR PRIMARY KEY,
        dossier_text  VARCHAR NOT NULL,
        last_fact_id  BIGINT NOT NULL,
        created_at    TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE SEQUENCE reflections_id_seq START 1
    """,
    """
    CREATE TABLE reflections (
        id             BIGINT PRIMARY KEY,
        channel_id     BIGINT,
        text           VARCHAR NOT NULL,
        cited_turn_ids BIGINT[] NOT NULL,
        cited_fact_ids BIGINT[] NOT NULL,
        last_turn_id   BIGINT NOT NULL,
        last_fact_id   BIGINT NOT NULL,
        created_at     TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE fact_embeddings (
        fact_id    BIGINT NOT NULL,
        model      VARCHAR NOT NULL,
        dim        INTEGER NOT NULL,
        vector     FLOAT[] NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (fact_id, model)
    )
    """,
    """
    CREATE TABLE watermarks (
        projector  VARCHAR PRIMARY KEY,
        turn_id    BIGINT NOT NULL DEFAULT 0,
        fact_id    BIGINT NOT NULL DEFAULT 0,
        change_seq BIGINT NOT NULL DEFAULT 0,
        updated_at TIMESTAMPTZ NOT NULL
    )
    """,
)

# v2: the audit log of supersession decisions, so an operator can see what the
# LLM was shown and what it retired or had skipped.
_V2 = (
    """
    CREATE SEQUENCE supersede_decisions_id_seq START 1
    """,
    """
    CREATE TABLE supersede_decisions (
        id              BIGINT PRIMARY KEY,
        new_fact_id     BIGINT NOT NULL,
        subject_key     VARCHAR NOT NULL,
        shown_prior_ids BIGINT[] NOT NULL,
        retired_ids     BIGINT[] NOT NULL,
        skipped         VARCHAR NOT NULL,
        model           VARCHAR,
        decided_at      TIMESTAMPTZ NOT NULL
    )
    """,
)

def _turn_vector_table(name: str) -> str:
    """DDL of a table holding one vector per (turn, model)."""
    return f"""
    CREATE TABLE {name} (
        turn_id    BIGINT NOT NULL,
        model      VARCHAR NOT NULL,
        dim        INTEGER NOT NULL,
        vector     FLOAT[] NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (turn_id, model)
    )
    """


# v3: opt-in turn embeddings (projector `turn_embedding`), a vector per (turn, model),
# for hybrid BM25 + cosine turn retrieval. Keyed like fact_embeddings so a model
# swap accumulates beside the old rows.
_V3 = (_turn_vector_table("turn_embeddings"),)

# v4: context-window vectors (projector `turn_window_embedding`): per (turn, model) the vector
# of the turn together with its nearest same-channel turns, shaped like turn_embeddings.
_V4 = (_turn_vector_table("turn_window_embeddings"),)

MIGRATIONS: dict[int, tuple[str, ...]] = {1: _V1, 2: _V2, 3: _V3, 4: _V4}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))

# Every table, with the columns that order its rows deterministically.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "facts": ("id",),
    "fact_subjects": ("fact_id", "position"),
    "summaries": ("scope",),
    "people_dossiers": ("canonical_key",),
    "reflections": ("id",),
    "fact_embeddings": ("fact_id", "model"),
    "turn_embeddings": ("turn_id", "model"),
    "turn_window_embeddings": ("turn_id", "model"),
    "watermarks": ("projector",),
    "supersede_decisions": ("id",),
    "schema_version": ("version",),
}

# Subjects of fact `f` as an ordered list of structs; shared by the views.
_SUBJECTS_OF_F = """
    COALESCE(
        (SELECT list(struct_pack(canonical_key := s.canonical_key,
                                 display_at_write := s.display_at_write)
                     ORDER BY s.position)
         FROM fact_subjects s WHERE s.fact_id = f.id),
        []::STRUCT(canonical_key VARCHAR, display_at_write VARCHAR)[])
"""

NOTEBOOK_VIEWS: dict[str, str] = {
    # Current truth at query time (records.FactView): not retired, not expired in world time.
    "current_facts": f"""
        CREATE OR REPLACE VIEW current_facts AS
        SELECT f.id, f.channel_id, f.text,
               {_SUBJECTS_OF_F} AS subjects,
               COALESCE((SELECT list(s.canonical_key ORDER BY s.position) FROM fact_subjects s
                         WHERE s.fact_id = f.id), []::VARCHAR[]) AS subject_keys,
               f.importance, f.source_turn_ids, f.created_at, f.valid_from, f.valid_to
        FROM facts f
        WHERE {validity_sql("f", as_of=False, at="now()")}
    """,
    # World-time slice [valid_from, valid_to) at `ts`, retired rows included,
    # so an earlier belief can be reconstructed. `ts` may be a string; a string
    # without an offset is read in the session's TimeZone.
    "facts_as_of": f"""
        CREATE OR REPLACE MACRO facts_as_of(ts) AS TABLE
        SELECT f.id, f.channel_id, f.text,
               {_SUBJECTS_OF_F} AS subjects,
               f.importance, f.source_turn_ids, f.created_at, f.valid_from, f.valid_to,
               f.superseded_at, f.superseded_by
        FROM facts f
        WHERE {validity_sql("f", as_of=True, at="CAST(ts AS TIMESTAMPTZ)")}
    """,
    # One hop each way: what a fact replaced, and what (if anything) replaced it.
    # A plain retire has superseded_at set and superseded_by NULL.
    "fact_lineage": """
        CREATE OR REPLACE VIEW fact_lineage AS
        SELECT f.id, f.text, f.created_at,
               COALESCE((SELECT list(p.id ORDER BY p.id) FROM facts p
                         WHERE p.superseded_by = f.id), []::BIGINT[]) AS supersedes,
               f.superseded_by, f.superseded_at
        FROM facts f
    """,
    # Every fact connected to `fact_id` by supersession, transitively: depth < 0
    # are the facts it (indirectly) replaced, depth > 0 its replacements.
    "supersession_chain": """
        CREATE OR REPLACE MACRO supersession_chain(fact_id) AS TABLE
        WITH RECURSIVE
            older(id, depth) AS (
                SELECT CAST(fact_id AS BIGINT), 0
                UNION
                SELECT p.id, o.depth - 1 FROM facts p JOIN older o ON p.superseded_by = o.id
            ),
            newer(id, depth) AS (
                SELECT CAST(fact_id AS BIGINT), 0
                UNION
                SELECT f.superseded_by, n.depth + 1 FROM facts f JOIN newer n ON f.id = n.id
                WHERE f.superseded_by IS NOT NULL
            )
        SELECT c.depth, f.id, f.text, f.created_at, f.superseded_at, f.superseded_by
        FROM (SELECT * FROM older UNION SELECT * FROM newer) c
        JOIN facts f ON f.id = c.id
        ORDER BY c.depth, f.id
    """,
    # One row per (subject, fact), every fact including retired and expired ones,
    # with `is_current` for the default filter.
    "facts_by_subject": """
        CREATE OR REPLACE VIEW facts_by_subject AS
        SELECT s.canonical_key, s.display_at_write, f.id AS fact_id, f.text, f.importance,
               f.channel_id, f.source_turn_ids, f.created_at, f.valid_from, f.valid_to,
               f.superseded_at, f.superseded_by,
               (f.superseded_at IS NULL AND (f.valid_to IS NULL OR f.valid_to > now())) AS is_current
        FROM fact_subjects s JOIN facts f ON f.id = s.fact_id
    """,
}


def _has_table(conn: duckdb.DuckDBPyConnection, name: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = ?",
        [name],
    ).fetchone()
    return bool(row and row[0])


def user_table_count(conn: duckdb.DuckDBPyConnection) -> int:
    row = conn.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def current_version(conn: duckdb.DuckDBPyConnection) -> int:
    """The schema version of the open file; 0 when it has no schema yet."""
    if not _has_table(conn, "schema_version"):
        return 0
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def open_state(conn: duckdb.DuckDBPyConnection) -> tuple[int, int, bool]:
    """(schema version, user table count, notebook views current) of the open file in two statements.

    What a store checks at every open (`current_version`, `user_table_count`,
    `notebook_views_current` ask the same one at a time, ~6 statements).
    """
    rows = conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database()"
    ).fetchall()
    names = {table for schema, table in rows if schema == "main"}
    if "schema_version" not in names:
        return 0, len(rows), False
    fingerprint = "(SELECT max(fingerprint) FROM notebook_views_version)" if "notebook_views_version" in names else "NULL"
    version, views = conn.execute(f"SELECT (SELECT max(version) FROM schema_version), {fingerprint}").fetchone()
    return int(version or 0), len(rows), views == _views_fingerprint()


def migrate(conn: duckdb.DuckDBPyConnection, *, target: int = SCHEMA_VERSION) -> list[int]:
    """Apply every pending version up to ``target``; returns the versions applied.

    Each version runs in its own transaction together with its
    ``schema_version`` row. ``target`` below the latest exists for tests that
    build an old file to migrate.
    """
    if not 0 <= target <= SCHEMA_VERSION:
        raise ValueError(f"schema target must be 0..{SCHEMA_VERSION}, got {target}")
    if not _has_table(conn, "schema_version"):
        conn.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL)"
        )
    applied: list[int] = []
    for version in range(current_version(conn) + 1, target + 1):
        conn.execute("BEGIN TRANSACTION")
        try:
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, now())", [version])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(version)
    return applied


def _views_fingerprint() -> str:
    return hashlib.sha256("\n;\n".join(NOTEBOOK_VIEWS.values()).encode()).hexdigest()[:16]


def notebook_views_current(conn: duckdb.DuckDBPyConnection) -> bool:
    """True when the views were created from this code's definitions (saves ~10 ms per open)."""
    if not _has_table(conn, "notebook_views_version"):
        return False
    row = conn.execute("SELECT max(fingerprint) FROM notebook_views_version").fetchone()
    return bool(row and row[0] == _views_fingerprint())


def create_notebook_views(conn: duckdb.DuckDBPyConnection) -> None:
    """(Re)create the notebook views and table macros, in one transaction."""
    conn.execute("BEGIN TRANSACTION")
    try:
        for statement in NOTEBOOK_VIEWS.values():
            conn.execute(statement)
        conn.execute("CREATE OR REPLACE TABLE notebook_views_version (fingerprint VARCHAR)")
        conn.execute("INSERT INTO notebook_views_version VALUES (?)", [_views_fingerprint()])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
