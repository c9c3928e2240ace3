"""The reflections' table: cited syntheses over windows of turns, with their reads and writes."""

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
from familiar_pipeline.storage.tables import Provenance, Table, Through, col
from familiar_pipeline.storage.times import now_or


@dataclass(frozen=True)
class Reflection:
    """A synthesis citing the turns and facts it rests on; ``last_*`` say what the window saw."""

    id: int = col("BIGINT")
    channel_id: int | None = col("BIGINT", nullable=True)
    text: str = col("VARCHAR", prose=True)
    cited_turn_ids: tuple[int, ...] = col("BIGINT[]")
    cited_fact_ids: tuple[int, ...] = col("BIGINT[]")
    last_turn_id: int = col("BIGINT")
    last_fact_id: int = col("BIGINT")
    created_at: datetime = col("TIMESTAMPTZ", system_time=True)
    scope: str = col("VARCHAR", fill=f"'{FAMILIAR_WIDE}'", default=FAMILIAR_WIDE)


REFLECTIONS = Table(
    "reflections",
    Reflection,
    key=("id",),
    sequence="reflections_id_seq",
    provenance=Provenance(turns=("cited_turn_ids",), through=(Through("cited_fact_ids", "facts"),)),
    description="Cited reflections over windows of turns and the newest facts (projector reflection).",
)


def append_reflection(store: ProjectionStore, *, channel_id: int | None, text: str, cited_turn_ids: Iterable[int],
                      cited_fact_ids: Iterable[int], last_turn_id: int, last_fact_id: int,
                      scope: str = FAMILIAR_WIDE, now: Any = None) -> Reflection:
    """Store a reflection. It must cite at least one turn or fact (uncited ones are dropped upstream)."""
    (reflection,) = append_reflections(store, [(text, cited_turn_ids, cited_fact_ids)], channel_id=channel_id,
                                       last_turn_id=last_turn_id, last_fact_id=last_fact_id, scope=scope, now=now)
    return reflection


def append_reflections(store: ProjectionStore, rows: Iterable[tuple[str, Iterable[int], Iterable[int]]], *,
                       channel_id: int | None, last_turn_id: int, last_fact_id: int, scope: str = FAMILIAR_WIDE,
                       now: Any = None) -> list[Reflection]:
    """`append_reflection` for one window's ``(text, cited turn ids, cited fact ids)`` rows, in order.

    Every row is checked first; then two statements (the ids, one INSERT) for all of them.
    """
    channel = values.opt_int(channel_id, "channel_id")
    turn_wm = values.as_int(last_turn_id, "last_turn_id", minimum=0)
    fact_wm = values.as_int(last_fact_id, "last_fact_id", minimum=0)
    where_said = values.scope(scope)
    checked = []
    for text, cited_turn_ids, cited_fact_ids in rows:
        body = values.text(text, "reflection text")
        turns = values.ids(cited_turn_ids, "cited_turn_ids")
        facts = values.ids(cited_fact_ids, "cited_fact_ids")
        if not turns and not facts:
            raise ValueError("a reflection must cite at least one turn or fact")
        checked.append((body, turns, facts))
    if not checked:
        return []
    at = now_or(now)
    with store.transaction():
        ids = store.next_ids("reflections_id_seq", len(checked))
        store.sql(
            "INSERT INTO reflections SELECT unnest(?::BIGINT[]), ?, unnest(?::VARCHAR[]), unnest(?::BIGINT[][]), "
            "unnest(?::BIGINT[][]), ?, ?, ?, ?",
            [ids, channel, [c[0] for c in checked], [list(c[1]) for c in checked], [list(c[2]) for c in checked],
             turn_wm, fact_wm, at, where_said],
        )
    return [Reflection(id=i, channel_id=channel, text=body, cited_turn_ids=turns, cited_fact_ids=facts,
                       last_turn_id=turn_wm, last_fact_id=fact_wm, created_at=at, scope=where_said)
            for i, (body, turns, facts) in zip(ids, checked)]


def recent_reflections(store: ProjectionStore, channel_id: int | None = None, limit: int = 10) -> list[Reflection]:
    """Newest first. With a channel: that channel's rows plus channel-agnostic (NULL) ones."""
    limit = values.as_int(limit, "limit")
    if limit <= 0:
        return []
    if channel_id is None:
        return store.rows(REFLECTIONS, order="t.id DESC", limit=limit)
    return store.rows(REFLECTIONS, "t.channel_id = ? OR t.channel_id IS NULL",
                      [values.as_int(channel_id, "channel_id")], order="t.id DESC", limit=limit)


def all_reflections(store: ProjectionStore) -> list[Reflection]:
    """Every reflection, ascending by id."""
    return store.rows(REFLECTIONS)


def recent_reflections_in(source: Any, channel_id: int | None = None, limit: int = 10) -> list[Reflection]:
    """Newest first from a serving snapshot (or a reader's current one): that channel's rows plus
    channel-agnostic (NULL) rows; with ``channel_id=None`` every row."""
    if limit <= 0:
        return []
    snap = source.current()
    table = snap.table("reflections")
    if channel_id is not None:
        channel = table["channel_id"]
        here = pc.equal(channel, pa.scalar(int(channel_id), pa.int64()))
        table = where(table, pc.or_kleene(pc.is_null(channel), here))
    newest = table.slice(max(table.num_rows - int(limit), 0))
    return snap.records(REFLECTIONS, newest)[::-1]
