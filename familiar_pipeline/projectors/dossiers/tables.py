"""The people dossiers' table: one compounding dossier per subject, with its reads and writes.

A dossier lists the facts folded into it (``source_fact_ids``: its provenance, through
the facts to the turns they came from); a rebuilt dossier lists only what it was
rebuilt from.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.storage import values
from familiar_pipeline.storage.identity import check_key
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.snapshots import where
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import Migration, Provenance, Table, Through, col
from familiar_pipeline.storage.times import now_or


@dataclass(frozen=True)
class Dossier:
    canonical_key: str = col("VARCHAR")
    dossier_text: str = col("VARCHAR", prose=True)
    last_fact_id: int = col("BIGINT")
    created_at: datetime = col("TIMESTAMPTZ", system_time=True)
    scope: str = col("VARCHAR", fill=f"'{FAMILIAR_WIDE}'", default=FAMILIAR_WIDE)
    source_fact_ids: tuple[int, ...] = col("BIGINT[]", fill="[]", default=())


DOSSIERS = Table(
    "people_dossiers",
    Dossier,
    key=("canonical_key", "scope"),  # one per subject and scope (a store keyed by subject alone is rekeyed)
    provenance=Provenance(through=(Through("source_fact_ids", "facts"),), on_change="own"),  # rebuilt: dossiers.run
    # A dossier written before provenance folded every fact about its subject up to its last_fact_id.
    migrations=(Migration("source facts", (
        "UPDATE people_dossiers d SET source_fact_ids = coalesce((SELECT list(s.fact_id ORDER BY s.fact_id) "
        "FROM fact_subjects s WHERE s.canonical_key = d.canonical_key AND s.fact_id <= d.last_fact_id), [])",)),),
    description="One compounding dossier per person and scope, and the familiar's self-record (projector "
                "people_dossier).",
)


def put_dossier(store: ProjectionStore, key: str, text: str, last_fact_id: int, *,
                source_fact_ids: Iterable[int] = (), scope: str = FAMILIAR_WIDE, now: Any = None) -> None:
    """Replace a subject's dossier in `scope`. An empty text is refused (never overwrite with nothing)."""
    check_key(key, "subject key")
    body = values.text(text, "dossier text")
    fact_id = values.as_int(last_fact_id, "last_fact_id", minimum=0)
    sources = list(values.ids(source_fact_ids, "source_fact_ids"))
    at = now_or(now)
    with store.transaction():
        store.sql("INSERT OR REPLACE INTO people_dossiers VALUES (?, ?, ?, ?, ?, ?)",
                  [key, body, fact_id, at, values.scope(scope), sources])


def get_dossier(store: ProjectionStore, key: str, scope: str | None = None) -> Dossier | None:
    """The subject's dossier in `scope` (None: its first by scope, for a subject heard in one)."""
    if scope is None:
        rows = store.rows(DOSSIERS, "t.canonical_key = ?", [key])
    else:
        rows = store.rows(DOSSIERS, "t.canonical_key = ? AND t.scope = ?", [key, scope])
    return rows[0] if rows else None


def dossiers(store: ProjectionStore) -> list[Dossier]:
    return store.rows(DOSSIERS)


def delete_dossiers(store: ProjectionStore, keys: Iterable[str]) -> int:
    """Delete these subjects' dossiers; returns how many rows existed."""
    return len(drop_dossiers(store, keys))


def drop_dossiers(store: ProjectionStore, keys: Iterable[str], scopes: Iterable[str] | None = None) -> list[str]:
    """Delete these subjects' dossiers (in `scopes` only, when given); the keys that had one, sorted."""
    wanted = sorted(set(keys))
    if not wanted:
        return []
    where, params = "canonical_key IN (SELECT unnest(?::VARCHAR[]))", [wanted]
    if scopes is not None:
        where, params = where + " AND scope IN (SELECT unnest(?::VARCHAR[]))", [wanted, sorted(set(scopes))]
    with store.transaction():
        rows = store.sql(f"DELETE FROM people_dossiers WHERE {where} RETURNING canonical_key", params).fetchall()
    return sorted({row[0] for row in rows})


def delete_dossier_rows(store: ProjectionStore, pairs: Iterable[tuple[str, str]]) -> int:
    """Delete these (subject key, scope) dossiers; how many existed."""
    wanted = sorted(set(pairs))
    if not wanted:
        return 0
    with store.transaction():
        rows = store.sql("DELETE FROM people_dossiers d WHERE EXISTS (SELECT 1 FROM (SELECT unnest(?::VARCHAR[]) AS k, "
                         "unnest(?::VARCHAR[]) AS s) w WHERE w.k = d.canonical_key AND w.s = d.scope) "
                         "RETURNING canonical_key", [[k for k, _ in wanted], [s for _, s in wanted]]).fetchall()
    return len(rows)


def dossiers_for(source: Any, keys: Iterable[str]) -> dict[str, Dossier]:
    """``{key: dossier}`` of a serving snapshot (or a reader's current one), for the keys that have one."""
    wanted = pa.array(sorted({str(k) for k in keys}), type=pa.string())
    if len(wanted) == 0:
        return {}
    snap = source.current()
    table = snap.table("people_dossiers")
    rows = snap.records(DOSSIERS, where(table, pc.is_in(table["canonical_key"], value_set=wanted)))
    return {r.canonical_key: r for r in rows}


def dossier_in(source: Any, key: str) -> Dossier | None:
    """One subject's dossier in a serving snapshot (or a reader's current one), or None."""
    return dossiers_for(source, [key]).get(key)
