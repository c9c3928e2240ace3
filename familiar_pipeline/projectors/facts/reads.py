"""Reads of the facts in a serving snapshot (what the bot and `familiar facts` use).

Same signatures and results as the store's reads of the same name (``store.py``), and
the same :class:`~.tables.FactView`, applied as an Arrow mask, so the two read paths
cannot drift. Each takes a serving snapshot or a reader (its current snapshot).

The bot's reads take ``scopes`` (keyword): a collection of scope strings
(``storage.scopes``), only facts of those scopes; None (the default) reads every scope.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.storage.snapshots import Snapshot, where

from .tables import FACTS, Fact, FactView, stored_subject


def _scope_mask(facts: pa.Table, scopes: Iterable[str] | None) -> Any:
    """True for rows of one of ``scopes``; None when every scope is read."""
    if scopes is None:
        return None
    wanted = pa.array(sorted({str(s) for s in scopes}), type=pa.string())
    return pc.is_in(facts["scope"], value_set=wanted)


def _and(mask: Any, other: Any) -> Any:
    return mask if other is None else pc.and_(mask, other)


def records(snap: Snapshot, rows: pa.Table) -> list[Fact]:
    """Fact records of served fact rows, their subjects as shared ``Subject`` records."""
    subjects = [
        tuple(stored_subject(s["canonical_key"], s["display_at_write"]) for s in found or ())
        for found in rows["subjects"].to_pylist()
    ]
    return snap.records(FACTS, rows, subjects=subjects)


def _rows(snap: Snapshot, ids: Iterable[int]) -> pa.Table:
    """The fact rows with these ids, ascending: a binary search of the sorted id
    column, so a reply's few dozen candidates never scan every fact."""
    facts = snap.table("facts")
    known = snap.cached("fact_ids", lambda: facts["id"].to_numpy())
    wanted = np.unique(np.fromiter((int(i) for i in ids), dtype=np.int64))
    at = np.searchsorted(known, wanted)
    hit = at[(at < len(known)) & (known[np.minimum(at, len(known) - 1)] == wanted)] if len(known) else at[:0]
    return facts.take(pa.array(hit, pa.int64()))


def facts_by_ids(source: Any, ids: Iterable[int]) -> list[Fact]:
    """Every row with these ids, superseded or expired included, ascending."""
    snap = source.current()
    return records(snap, _rows(snap, ids))


def current_facts(source: Any, now: datetime | None = None, *, ids: Iterable[int] | None = None,
                  scopes: Iterable[str] | None = None) -> list[Fact]:
    """Current truth at ``now`` (``FactView``), ascending; with ``ids``, only among those; with ``scopes``, only theirs."""
    snap = source.current()
    facts = snap.table("facts") if ids is None else _rows(snap, ids)
    return records(snap, where(facts, _and(FactView.of(now=now).arrow_mask(facts), _scope_mask(facts, scopes))))


def recent_facts(source: Any, limit: int, as_of: datetime | None = None, *, include_superseded: bool = False,
                 now: datetime | None = None, scopes: Iterable[str] | None = None) -> list[Fact]:
    """Newest first: the ``FactView`` of these arguments (of ``scopes`` only, when given), at most ``limit`` rows."""
    if limit <= 0:
        return []
    snap = source.current()
    facts = snap.table("facts")
    view = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now)
    visible = pc.indices_nonzero(pc.fill_null(_and(view.arrow_mask(facts), _scope_mask(facts, scopes)), False))
    newest = visible.slice(max(len(visible) - int(limit), 0))
    return records(snap, facts.take(newest))[::-1]


def facts_for_subject(source: Any, key: str, as_of: datetime | None = None, *, include_superseded: bool = False,
                      now: datetime | None = None, scopes: Iterable[str] | None = None) -> list[Fact]:
    """Facts naming ``key`` as a subject (exact key match) in the ``FactView`` (of ``scopes`` only, when given), ascending."""
    snap = source.current()
    subjects = snap.table("fact_subjects")
    ids = where(subjects, pc.equal(subjects["canonical_key"], pa.scalar(key, pa.string())))["fact_id"]
    if len(ids) == 0:
        return []
    facts = snap.table("facts")
    named = pc.is_in(facts["id"], value_set=ids.combine_chunks())
    view = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now)
    return records(snap, where(facts, _and(pc.and_(named, view.arrow_mask(facts)), _scope_mask(facts, scopes))))


def superseded_fact_ids(source: Any, ids: Iterable[int]) -> set[int]:
    wanted = pa.array(sorted({int(i) for i in ids}), type=pa.int64())
    if len(wanted) == 0:
        return set()
    facts = source.current().table("facts")
    mask = pc.and_(pc.is_in(facts["id"], value_set=wanted), pc.is_valid(facts["superseded_at"]))
    return set(where(facts, mask)["id"].to_pylist())


def latest_fact_id(source: Any) -> int:
    """Highest fact id ever written (superseded rows count), or 0."""
    highest = pc.max(source.current().table("facts")["id"]).as_py()
    return int(highest) if highest is not None else 0
