"""Supersession's table (`supersede_decisions`, the audit log of every judgement) and its writes to the facts.

Supersession never deletes: it retires facts (``facts.superseded_at``/``superseded_by``)
and logs each decision: what the model was shown, what it retired, what was skipped.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from familiar_pipeline.projectors.dossiers.tables import drop_dossiers
from familiar_pipeline.projectors.facts.store import FactDraft, facts_by_ids, insert_facts, prepare
from familiar_pipeline.projectors.facts.tables import Fact
from familiar_pipeline.storage import values
from familiar_pipeline.storage.identity import check_key
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import Provenance, Table, Through, col
from familiar_pipeline.storage.times import now_or

SKIP_UNKNOWN = "unknown fact id={}"
SKIP_ALREADY_SUPERSEDED = "fact id={} already superseded"
SKIP_SELF = "fact id={} cannot supersede itself"
SKIP_REPLACEMENT_RETIRED = "replacement fact id={} is already superseded"


@dataclass(frozen=True)
class SupersedeDecision:
    """One judged (new fact, subject): the priors shown, those retired, those skipped and why (JSON)."""

    id: int = col("BIGINT")
    new_fact_id: int = col("BIGINT")
    subject_key: str = col("VARCHAR")
    shown_prior_ids: tuple[int, ...] = col("BIGINT[]")
    retired_ids: tuple[int, ...] = col("BIGINT[]")
    skipped: str = col("VARCHAR")
    model: str | None = col("VARCHAR", nullable=True)
    decided_at: datetime = col("TIMESTAMPTZ", system_time=True)
    scope: str = col("VARCHAR", fill=f"'{FAMILIAR_WIDE}'", default=FAMILIAR_WIDE)


SUPERSEDE_DECISIONS = Table(
    "supersede_decisions",
    SupersedeDecision,
    key=("id",),
    sequence="supersede_decisions_id_seq",
    provenance=Provenance(through=(Through("new_fact_id", "facts"),)),
    description="Every supersession judgement: what was shown, retired and skipped (projector fact_supersede).",
)


@dataclass(frozen=True)
class SupersedeResult:
    minted: Fact | None
    superseded: tuple[int, ...]
    skipped: tuple[tuple[int, str], ...]
    dropped_dossiers: tuple[str, ...] = ()


def supersede(store: ProjectionStore, obsolete_ids: Iterable[int], new_fact: int | Fact | FactDraft | None, *,
              now: Any = None) -> SupersedeResult:
    """Retire facts; never deletes one. Three forms, chosen by ``new_fact``:

    * ``None`` (retire): each id separately gets ``superseded_at=now`` and
      no replacement. Unknown and already superseded ids go to
      ``skipped`` and the rest proceed (not atomic).
    * an ``int`` id or a ``Fact`` (existing replacement, what the
      supersede projector uses): the same per-id behaviour with
      ``superseded_by`` set; nothing is minted. The replacement must
      exist (``ValueError`` otherwise); naming it among the obsolete ids
      skips that id. A replacement that is itself retired could close a
      cycle in the lineage, so then every id is skipped.
    * a ``FactDraft`` (atomic merge): all or nothing. If the list is empty
      or any id is unknown or already superseded, nothing is written and
      the stale ids are reported in ``skipped``. Otherwise one fact is
      minted (no dedup; its sources are the union of the retired rows'
      sources, then the draft's) and every listed row points at it.

    Every form deletes the people dossiers of the subjects of each row it
    actually retired, so they rebuild from current facts; the
    replacement's subjects and everyone else's dossiers are untouched.
    """
    at = now_or(now)
    ids = values.ids(obsolete_ids, "obsolete_ids")
    if new_fact is None or isinstance(new_fact, FactDraft):
        replacement_id = None
    elif isinstance(new_fact, Fact):
        replacement_id = new_fact.id
    elif isinstance(new_fact, numbers.Integral) and not isinstance(new_fact, bool):
        replacement_id = int(new_fact)
    else:
        raise TypeError(f"new_fact must be None, a fact id, a Fact or a FactDraft; got {new_fact!r}")
    draft = prepare(new_fact, at) if isinstance(new_fact, FactDraft) else None

    with store.transaction():
        rows = {f.id: f for f in facts_by_ids(store, ids)}
        live = [i for i in ids if i in rows and rows[i].current]
        skipped = {
            i: SKIP_UNKNOWN.format(i) if i not in rows else SKIP_ALREADY_SUPERSEDED.format(i)
            for i in ids
            if i not in rows or not rows[i].current
        }
        if draft is not None:
            if not ids or skipped:
                return SupersedeResult(minted=None, superseded=(), skipped=tuple(skipped.items()))
            sources = [t for i in ids for t in rows[i].source_turn_ids] + list(draft.source_turn_ids)
            (minted,) = insert_facts(store, [_with_sources(draft, sources)])
            dropped = _retire(store, ids, minted.id, at, rows)
            return SupersedeResult(minted=minted, superseded=ids, skipped=(), dropped_dossiers=dropped)

        if replacement_id is not None:
            replacement = facts_by_ids(store, [replacement_id])
            if not replacement:
                raise ValueError(f"supersede: replacement fact id={replacement_id} does not exist")
            if not replacement[0].current:
                skipped.update((i, SKIP_REPLACEMENT_RETIRED.format(replacement_id)) for i in live)
                live = []
            elif replacement_id in live:
                skipped[replacement_id] = SKIP_SELF.format(replacement_id)
                live.remove(replacement_id)
        dropped = _retire(store, live, replacement_id, at, rows) if live else ()
        return SupersedeResult(
            minted=None,
            superseded=tuple(live),
            skipped=tuple((i, skipped[i]) for i in ids if i in skipped),
            dropped_dossiers=dropped,
        )


def _with_sources(draft: Fact, sources: list[int]) -> Fact:
    return replace(draft, source_turn_ids=tuple(dict.fromkeys(sources)))


def _retire(store: ProjectionStore, ids: Iterable[int], replacement_id: int | None, at: datetime,
            rows: dict[int, Fact]) -> tuple[str, ...]:
    ids = list(ids)
    store.sql(
        "UPDATE facts SET superseded_at = ?, superseded_by = ? "
        "WHERE id IN (SELECT unnest(?)) AND superseded_at IS NULL",
        [at, replacement_id, ids],
    )
    keys = sorted({k for i in ids for k in rows[i].subject_keys})
    return tuple(drop_dossiers(store, keys, scopes={rows[i].scope for i in ids}))


def unretire_all(store: ProjectionStore) -> None:
    """Make every retired fact current again, and delete the dossiers of their subjects.

    Un-retiring changes what is current for those subjects, so their dossiers
    go, exactly as retiring the facts did.
    """
    with store.transaction():
        keys = [
            row[0]
            for row in store.sql(
                "SELECT DISTINCT s.canonical_key FROM fact_subjects s JOIN facts f ON f.id = s.fact_id "
                "WHERE f.superseded_at IS NOT NULL"
            ).fetchall()
        ]
        drop_dossiers(store, keys)
        store.sql("UPDATE facts SET superseded_at = NULL, superseded_by = NULL WHERE superseded_at IS NOT NULL")


def record_supersede_decision(store: ProjectionStore, *, now: Any = None, **decision: Any) -> int:
    """Log one supersession decision (what was shown, what was retired); returns its id.

    ``decision``: ``new_fact_id``, ``subject_key``, ``shown_prior_ids``,
    ``retired_ids``, ``skipped`` ((id, reason) pairs), ``model`` and optionally ``scope``.
    """
    (decision_id,) = record_supersede_decisions(store, [decision], now=now)
    return decision_id


def record_supersede_decisions(store: ProjectionStore, decisions: Iterable[dict[str, Any]], *,
                               now: Any = None) -> list[int]:
    """Log decisions (each the keyword arguments of `record_supersede_decision`) in order; their ids.

    Every decision is checked before anything is written; then two statements
    (the ids, in order, then one INSERT) however many there are: a step logs
    ~16 per familiar, and a statement each was a tenth of its store time.
    """
    at = now_or(now)
    rows = [_decision_row(**d) for d in decisions]
    if not rows:
        return []
    with store.transaction():
        ids = store.next_ids("supersede_decisions_id_seq", len(rows))
        columns = list(zip(*rows))
        store.sql(
            "INSERT INTO supersede_decisions (id, new_fact_id, subject_key, shown_prior_ids, retired_ids, skipped, "
            "model, scope, decided_at) SELECT unnest(?::BIGINT[]), unnest(?::BIGINT[]), unnest(?::VARCHAR[]), "
            "unnest(?::BIGINT[][]), unnest(?::BIGINT[][]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
            "unnest(?::VARCHAR[]), ?",
            [ids, *(list(c) for c in columns), at],
        )
    return ids


def _decision_row(*, new_fact_id: int, subject_key: str, shown_prior_ids: Iterable[int], retired_ids: Iterable[int],
                  skipped: Iterable[tuple[int, str]], model: str | None, scope: str = FAMILIAR_WIDE) -> tuple:
    fact_id = values.as_int(new_fact_id, "new_fact_id")
    check_key(subject_key, "subject key")
    shown = list(values.ids(shown_prior_ids, "shown_prior_ids"))
    retired = list(values.ids(retired_ids, "retired_ids"))
    skipped_list = []
    for pair in skipped:
        try:
            sid, reason = pair
        except (TypeError, ValueError):
            raise TypeError(f"skipped items must be (id, reason) pairs, got {pair!r}") from None
        skipped_list.append([values.as_int(sid, "skipped id"), str(reason)])
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model must be a string or None, got {model!r}")
    return fact_id, subject_key, shown, retired, json.dumps(skipped_list), model, values.scope(scope)


def facts_retired_more_than_once(store: ProjectionStore) -> list[tuple[int, int]]:
    """``(fact id, times)`` for facts that more than one supersession decision retired."""
    return store.sql(
        "SELECT fact_id, count(*) FROM (SELECT unnest(retired_ids) AS fact_id FROM supersede_decisions) "
        "GROUP BY fact_id HAVING count(*) > 1 ORDER BY fact_id"
    ).fetchall()


def dangling_replacements(store: ProjectionStore) -> list[tuple[int, int]]:
    """``(fact id, superseded_by)`` where the replacement does not exist or is the fact itself."""
    return store.sql(
        "SELECT f.id, f.superseded_by FROM facts f LEFT JOIN facts r ON r.id = f.superseded_by "
        "WHERE f.superseded_by IS NOT NULL AND (r.id IS NULL OR r.id = f.id) ORDER BY f.id"
    ).fetchall()
