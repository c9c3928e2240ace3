"""Where the fact log stood at a point of the turn log: what keeps fact-driven projections replayable.

Dossiers and reflections read facts, and facts change under them (new ones are
extracted, old ones retired). For an incremental build and a rebuild from
scratch to send the same prompts, what a projection sees at each step must be a
function of the logs, not of how far the other assets happened to have run.
Two rules give that:

* The fact horizon at turn T is the highest fact id whose source turns are all
  at or before T. Extraction batches are consecutive runs of turns and fact ids
  grow batch by batch, so this is exactly "the facts extracted from turns up to
  T", whenever it is asked.
* A fact is current at horizon H when it is not retired, or when the fact that
  retired it is newer than H. Supersession evaluates new facts oldest first and
  only ever lets a newer fact retire an older one, so this reproduces which
  facts were current right after the fact with id H was evaluated.

Facts written outside the extraction batches (no source turns) count from the
first horizon past their id.
"""

from __future__ import annotations

from familiar_pipeline.storage.store import Fact, ProjectionStore


def fact_horizon(store: ProjectionStore, turn_id: int) -> int:
    """Highest fact id whose source turns are all <= turn_id (0 when none)."""
    row = store.conn.execute(
        "SELECT coalesce(max(id), 0) FROM facts WHERE len(source_turn_ids) > 0 AND list_max(source_turn_ids) <= ?",
        [turn_id],
    ).fetchone()
    return int(row[0])


def current_at(fact: Fact, horizon: int) -> bool:
    """Not retired as of the moment facts up to `horizon` had been evaluated.

    A plain retire (no replacement id) has no position on the fact axis, so it
    counts as retired at every horizon.
    """
    if fact.superseded_at is None:
        return True
    return fact.superseded_by is not None and fact.superseded_by > horizon


def subject_fact_ids(store: ProjectionStore, key: str, *, after_id: int, upto_id: int) -> list[int]:
    """Ids of every fact naming `key` with after_id < id <= upto_id, retired and expired ones included."""
    rows = store.conn.execute(
        "SELECT fact_id FROM fact_subjects WHERE canonical_key = ? AND fact_id > ? AND fact_id <= ? ORDER BY fact_id",
        [key, after_id, upto_id],
    ).fetchall()
    return [row[0] for row in rows]


def facts_in_range(store: ProjectionStore, after_id: int, upto_id: int) -> list[Fact]:
    """Every fact with after_id < id <= upto_id, ascending, whatever its status."""
    rows = store.conn.execute("SELECT id FROM facts WHERE id > ? AND id <= ? ORDER BY id", [after_id, upto_id]).fetchall()
    return store.facts_by_ids([row[0] for row in rows])


def retired_between(store: ProjectionStore, after_id: int, upto_id: int) -> list[Fact]:
    """Facts retired by a replacement with after_id < replacement id <= upto_id."""
    rows = store.conn.execute(
        "SELECT id FROM facts WHERE superseded_by > ? AND superseded_by <= ? ORDER BY id", [after_id, upto_id]
    ).fetchall()
    return store.facts_by_ids([row[0] for row in rows])
