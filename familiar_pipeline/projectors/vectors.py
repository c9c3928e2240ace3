"""What the vector projectors share: the vector records, their store reads and writes, and embedding in batches.

Vectors are kept per ``(key, model)``: a model swap adds rows beside the old ones and
reads use only the active model's, so two embedding spaces never mix. Each vector
table is declared in its projector's folder with one of the records below
(``fact_embeddings`` keyed by fact, ``turn_embeddings`` and ``turn_window_embeddings``
keyed by turn).
"""

from __future__ import annotations

from dataclasses import make_dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from familiar_pipeline.engine.spec import ProjectorRun, ProjectorSpec
from familiar_pipeline.storage import values
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import Table, col
from familiar_pipeline.storage.times import now_or

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime

def vector_record(key: str) -> type:
    """The record of a vector table keyed by ``key`` (``fact_id`` or ``turn_id``) and the model:
    one vector per key and model, with the scope of the row it embeds."""
    return make_dataclass(f"{key.removesuffix('_id').title()}Vector", [
        (key, int, col("BIGINT")),
        ("model", str, col("VARCHAR")),
        ("dim", int, col("INTEGER")),
        ("vector", tuple, col("FLOAT[]")),
        ("created_at", datetime, col("TIMESTAMPTZ", system_time=True)),
        ("scope", str, col("VARCHAR", fill=f"'{FAMILIAR_WIDE}'", default=FAMILIAR_WIDE)),
    ], frozen=True)


FactVector = vector_record("fact_id")
TurnVector = vector_record("turn_id")


def vector_spec(*, name: str, asset: str, run: ProjectorRun | str, description: str, group: str, trigger: str,
                knobs: type, table: Table, inputs: tuple[str, ...] = ("turns",), **more: Any) -> ProjectorSpec:
    """The spec of a projector that keeps vectors: it needs the embedder, not the model; a rebuild
    drops its table's rows of every model; it has no snapshot check (opt-in, refilled from its source)."""
    return ProjectorSpec(name=name, asset=asset, run=run, description=description, group=group, kinds={"duckdb"},
                         inputs=inputs, trigger=trigger, needs_llm=False, needs_embedder=True, knobs=knobs,
                         tables=(table,), snapshot_check=False, **more)


def key_column(table: Table) -> str:
    """The id column of a vector table (``fact_id`` or ``turn_id``)."""
    return table.key[0]


def set_vectors(store: ProjectionStore, table: Table, model: str,
                rows: Iterable[tuple[int, Iterable[float], str] | tuple[int, Iterable[float]]], *, now: Any = None) -> int:
    """Upsert ``(key, vector, scope)`` rows under ``model`` in one transaction; returns the count.

    A row without a scope is familiar-wide (``scopes.FAMILIAR_WIDE``).

    Every row is validated before anything is written; one DELETE and one INSERT of
    parallel lists unnested side by side (executemany is a round trip per row).
    """
    key = key_column(table)
    checked = []
    for row_id, vector, *where in rows:
        scope = where[0] if where else FAMILIAR_WIDE
        rid = values.as_int(row_id, key, minimum=1)
        floats = values.vector(model, key.removesuffix("_id"), rid, vector)
        checked.append((rid, len(floats), floats, values.scope(scope)))
    if not checked:
        return 0
    at = now_or(now)
    with store.transaction():
        store.sql(f"DELETE FROM {table.name} WHERE model = ? AND {key} IN (SELECT unnest(?))",
                  [model, [r[0] for r in checked]])
        store.sql(f"INSERT INTO {table.name} ({key}, model, dim, vector, created_at, scope) "
                  "SELECT unnest(?::BIGINT[]), ?, unnest(?::INTEGER[]), unnest(?::FLOAT[][]), ?, unnest(?::VARCHAR[])",
                  [[r[0] for r in checked], model, [r[1] for r in checked], [r[2] for r in checked], at,
                   [r[3] for r in checked]])
    return len(checked)


def delete_vectors(store: ProjectionStore, table: Table, ids: Iterable[int]) -> int:
    """Remove every model's vector of these keys (a deleted turn must not be retrievable)."""
    key = key_column(table)
    wanted = list(values.ids(ids, f"{key}s"))
    if not wanted:
        return 0
    with store.transaction():
        row = store.sql(f"SELECT count(*) FROM {table.name} WHERE {key} IN (SELECT unnest(?))", [wanted]).fetchone()
        assert row is not None  # an aggregate returns one row
        store.sql(f"DELETE FROM {table.name} WHERE {key} IN (SELECT unnest(?))", [wanted])
    return int(row[0])


def vectors_for(store: ProjectionStore, table: Table, model: str, ids: Iterable[int]) -> dict[int, list[float]]:
    key = key_column(table)
    wanted = list(values.ids(ids, f"{key}s"))
    if not wanted:
        return {}
    rows = store.sql(f"SELECT {key}, vector FROM {table.name} WHERE model = ? AND {key} IN (SELECT unnest(?))",
                     [model, wanted]).fetchall()
    return {row_id: list(vector) for row_id, vector in rows}


def vector_count(store: ProjectionStore, table: Table, model: str) -> int:
    return store.count(table, "t.model = ?", [model])


# --------------------------------------------------------------------------- embedding in batches


def embed_all(embedder: Any, texts: list[str], report: ProjectionReport) -> Sequence[Sequence[float]] | None:
    """The texts' vectors, or None (counted as dropped) when the model returned another number
    of them: misaligned vectors would attach meaning to the wrong rows, so nothing is written."""
    vectors = embedder.embed(texts)
    if len(vectors) != len(texts):
        report.drop("length_mismatch", len(texts))
        report.extra["mismatch"] = f"{len(texts)} texts, {len(vectors)} vectors"
        return None
    return vectors


def embedder_or_skip(rt: FamiliarRuntime, report: ProjectionReport, projector: str) -> Any:
    """The run's embedder, or None after marking the run skipped with the settings to change."""
    if rt.embedder is None:
        report.status = "skipped"
        report.reason = (
            'no embedder: set [providers.embedding].backend to a backend other than "off" '
            f"(and list {projector} in [providers.memory].projectors)"
        )
    return rt.embedder
