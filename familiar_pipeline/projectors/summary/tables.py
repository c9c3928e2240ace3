"""The rolling summary's table: one compounding summary per scope, with its reads and writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.storage import values
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.snapshots import where
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import Migration, Provenance, Table, col
from familiar_pipeline.storage.times import now_or


@dataclass(frozen=True)
class Summary:
    """The summary of a scope's conversation up to ``last_turn_id`` (it folds every turn before it)."""

    scope: str = col("VARCHAR")
    summary_text: str = col("VARCHAR", prose=True)
    last_turn_id: int = col("BIGINT")
    created_at: datetime = col("TIMESTAMPTZ", system_time=True)


SUMMARIES = Table(
    "summaries",
    Summary,
    key=("scope",),
    provenance=Provenance(upto="last_turn_id", on_change="own"),  # folded again: summary.run
    # The one summary written before scopes was familiar-wide, under the name "conversation".
    migrations=(Migration("familiar-wide scope", (
        f"UPDATE summaries SET scope = '{FAMILIAR_WIDE}' WHERE scope = 'conversation'",)),),
    description="The compounding summary of each scope's conversation (projector rolling_summary).",
)


def put_summary(store: ProjectionStore, summary_text: str, last_turn_id: int, *, scope: str = FAMILIAR_WIDE,
                now: Any = None) -> None:
    """Replace the scope's summary. An empty text is refused: it would erase memory."""
    text = values.text(summary_text, "summary_text")
    turn = values.as_int(last_turn_id, "last_turn_id", minimum=0)
    at = now_or(now)
    with store.transaction():
        store.sql("INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?)", [values.scope(scope), text, turn, at])


def delete_summaries(store: ProjectionStore, scopes: Iterable[str]) -> int:
    """Delete these scopes' summaries; how many existed."""
    wanted = sorted(set(scopes))
    if not wanted:
        return 0
    return len(store.sql("DELETE FROM summaries WHERE scope IN (SELECT unnest(?::VARCHAR[])) RETURNING scope",
                         [wanted]).fetchall())


def get_summary(store: ProjectionStore, scope: str = FAMILIAR_WIDE) -> Summary | None:
    rows = store.rows(SUMMARIES, "t.scope = ?", [scope])
    return rows[0] if rows else None


def summary(source: Any, scope: str = FAMILIAR_WIDE) -> Summary | None:
    """The scope's summary in a serving snapshot (or a reader's current one)."""
    snap = source.current()
    table = snap.table("summaries")
    rows = snap.records(SUMMARIES, where(table, pc.equal(table["scope"], pa.scalar(scope, pa.string()))))
    return rows[0] if rows else None


def stored_summaries(store: ProjectionStore) -> list[Summary]:
    """Every scope's summary in the store (the projector's priors)."""
    return store.rows(SUMMARIES)


def summaries(source: Any, scopes: Iterable[str] | None = None) -> list[Summary]:
    """The summaries of a serving snapshot (or a reader's current one), one per scope, sorted by scope.

    ``scopes``: only these scopes' rows (None: every scope, ``familiar`` included).
    """
    snap = source.current()
    table = snap.table("summaries")
    if scopes is not None:
        wanted = pa.array(sorted({str(s) for s in scopes}), type=pa.string())
        table = where(table, pc.is_in(table["scope"], value_set=wanted))
    return sorted(snap.records(SUMMARIES, table), key=lambda row: row.scope)
