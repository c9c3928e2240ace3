"""The facts' SQL: writing facts with their subjects (near-duplicates suppressed) and every read of them.

Rules that matter to callers:

* Rows come back as :class:`~.tables.Fact` (the snapshot reader returns the same), and
  which facts a read sees is :class:`~.tables.FactView`: current truth by default (not
  superseded, not expired in world time); ``as_of`` reads give the world-time slice
  including retired rows.
* A write validates every draft before touching the database, so bad input raises a
  clear error and never dooms a surrounding transaction.
* Fact ids come from a sequence and only grow. Dropping the facts (a rebuild) drops
  everything that cites a fact id with them and restarts the sequence, so no old
  citation can point at a new fact and a rebuild gives every fact the id the
  incremental build gave it.
* Near-duplicates (same normalised text, subject set and kind among current facts) are
  suppressed at insert: the twin is returned untouched.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from familiar_pipeline.storage import values
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.times import as_utc, now_or

from .tables import FACT_KINDS, FACTS, Fact, FactView, Subject, stored_subject


@dataclass(frozen=True)
class FactDraft:
    """A fact to write (what an extractor or a test hands the store). Lists are accepted and frozen into tuples.

    ``scope``: where its source turns were said (``scopes.scope_of_turns``).
    """

    text: str
    source_turn_ids: tuple[int, ...] = ()
    subjects: tuple[Subject, ...] = ()
    channel_id: int | None = None
    importance: Any = None
    valid_from: datetime | date | str | None = None
    valid_to: datetime | date | str | None = None
    scope: str = FAMILIAR_WIDE
    kind: str = "fact"  # or "wish" (`tables.Fact.kind`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_turn_ids", tuple(self.source_turn_ids))
        object.__setattr__(self, "subjects", tuple(self.subjects))


# --------------------------------------------------------------------------- normalisation

# Straight, curly, low-9 and angle quotes, not only ' and ": the same sentence
# quoted differently (a phone keyboard types curly quotes) is the same fact.
_QUOTES = "'\"\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a"
_QUOTE_TABLE = str.maketrans("", "", _QUOTES)
_EDGE_CHARS = ".,!?;:()[]{}\u2026 \t\n"


def normalize_fact_text(text: str) -> str:
    """The text half of the dedup key: catches case, spacing, quoting and end punctuation.

    Lowercase (after Unicode NFC, so composed and decomposed accents agree),
    remove every quote character, collapse whitespace runs to one space, and
    strip ``. , ! ? ; : ( ) [ ] { } …`` and whitespace from both ends. Internal
    punctuation stays, and paraphrases ("goes by" vs "is called") are
    deliberately not caught: dedup is exact after this normalisation.
    """
    if not isinstance(text, str):
        raise TypeError(f"fact text must be a string, got {type(text).__name__}")
    lowered = unicodedata.normalize("NFC", text).lower().translate(_QUOTE_TABLE)
    return " ".join(lowered.split()).strip(_EDGE_CHARS)


def subject_set_key(keys: Iterable[str]) -> str:
    """The subject half of the dedup key: sorted distinct keys joined by newlines."""
    return "\n".join(sorted(set(keys)))


def clamp_importance(value: Any) -> int | None:
    """1..10, or None when unknown. Booleans are not scores and read as unknown."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"importance {value!r} is not a number") from None
    if isinstance(value, numbers.Integral):
        score = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(value):
        score = int(math.trunc(value))  # what int() does to a Real, spelled so the stubs follow
    else:
        raise ValueError(f"importance must be a number 1-10, got {value!r}")
    return max(1, min(10, score))


def _subjects(items: Iterable[Any]) -> tuple[Subject, ...]:
    """Distinct subjects by key, first one wins (a set of people, in mention order)."""
    seen: dict[str, Subject] = {}
    for value in items:
        if not isinstance(value, Subject):
            raise TypeError(f"subjects must be Subject instances, got {value!r}")
        seen.setdefault(value.canonical_key, value)
    return tuple(seen.values())


def dedup_key(fact: Fact) -> str:
    """Normalised text and subject set (and the kind, for a wish): equal for near-duplicates (see module doc).

    A wish is not the twin of the same words as a plain fact: "Cass wants short answers" said by
    Cass is a wish to pin, the same sentence from Bo's claim about her is not (``run.wish_source_ids``).
    """
    return _dedup_key(normalize_fact_text(fact.text), subject_set_key(fact.subject_keys), fact.kind)


def _dedup_key(norm_text: str, subject_set: str, kind: str) -> str:
    return f"{norm_text}\n{subject_set}" + ("\nwish" if kind == "wish" else "")


def prepare(draft: FactDraft, now: datetime) -> Fact:
    """A validated draft as the row it becomes (id 0 until the insert gives it one)."""
    if not isinstance(draft, FactDraft):
        raise TypeError(f"expected a FactDraft, got {type(draft).__name__}")
    text = values.text(draft.text, "fact text")
    if not normalize_fact_text(text):
        raise ValueError(f"fact text {text!r} has no content after normalisation")
    valid_from = as_utc(draft.valid_from, what="valid_from") or now
    valid_to = as_utc(draft.valid_to, what="valid_to")
    if valid_to is not None and valid_to <= valid_from:
        raise ValueError(
            f"valid_to {valid_to.isoformat()} is not after valid_from {valid_from.isoformat()}; "
            "a fact that ended before it began is never valid (give valid_from explicitly "
            "for facts about the past)"
        )
    return Fact(
        id=0,
        channel_id=values.opt_int(draft.channel_id, "channel_id"),
        text=text,
        source_turn_ids=values.ids(draft.source_turn_ids, "source_turn_ids"),
        subjects=_subjects(draft.subjects),
        importance=clamp_importance(draft.importance),
        created_at=now,
        superseded_at=None,
        superseded_by=None,
        valid_from=valid_from,
        valid_to=valid_to,
        scope=values.scope(draft.scope),
        kind=_kind(draft.kind),
    )


def _kind(kind: Any) -> str:
    if kind not in FACT_KINDS:
        raise ValueError(f"fact kind {kind!r} is not one of {', '.join(FACT_KINDS)}")
    return kind


# --------------------------------------------------------------------------- writes


def append_fact(store: ProjectionStore, draft: FactDraft, *, now: Any = None, dedup: bool = True) -> tuple[Fact, bool]:
    """Write a fact unless a current twin exists; returns ``(fact, inserted)``.

    A twin is a current fact (not retired, ``valid_to`` NULL or after ``now``) with
    equal normalised text and an equal subject-key set, found by one index probe on
    ``dedup_key``. The twin is returned untouched: its sources, channel, importance
    and validity are not merged. A draft with ``valid_to`` always inserts, because it
    may bound an earlier fact. Importance is clamped to 1..10; ``valid_from`` defaults
    to ``now``; every time is stored in UTC.
    """
    return append_facts(store, [draft], now=now, dedup=dedup)[0]


def append_facts(store: ProjectionStore, drafts: Iterable[FactDraft], *, now: Any = None,
                 dedup: bool = True) -> list[tuple[Fact, bool]]:
    """`append_fact` for a whole batch in a few statements: one twin lookup, one insert per table.

    Same rules, applied in order, so a draft that repeats an earlier draft of the same
    batch is suppressed too. Returns ``(fact, inserted)`` per draft.
    """
    at = now_or(now)
    prepared = [prepare(d, at) for d in drafts]
    if not prepared:
        return []
    keys = [dedup_key(p) for p in prepared]
    with store.transaction():
        twins: dict[str, int] = {}
        if dedup:
            wanted = sorted({k for p, k in zip(prepared, keys) if p.valid_to is None})
            # Equality on dedup_key alone is what DuckDB answers from the ART index; the
            # validity predicates would turn the probe into a scan, so they are applied here.
            rows = store.sql(
                "SELECT id, dedup_key, superseded_at::TIMESTAMP, valid_to::TIMESTAMP FROM facts "
                "WHERE dedup_key IN (SELECT unnest(?::VARCHAR[]))",
                [wanted],
            ).fetchall() if wanted else []
            view = FactView(at)
            for fact_id, key, superseded_at, valid_to in sorted(rows):
                if view.admits_times(superseded_at, None, as_utc(valid_to)):
                    twins.setdefault(key, fact_id)
        plan: list[int | None] = []  # per draft: a twin's id, -1 - index of an earlier fresh row, or None
        fresh: list[Fact] = []
        seen_in_batch: dict[str, int] = {}
        for p, key in zip(prepared, keys):
            if dedup and p.valid_to is None:
                if key in twins:
                    plan.append(twins[key])
                    continue
                if key in seen_in_batch:
                    plan.append(-1 - seen_in_batch[key])
                    continue
                seen_in_batch[key] = len(fresh)
            plan.append(None)
            fresh.append(p)
        written = insert_facts(store, fresh)
        existing = {f.id: f for f in facts_by_ids(store, sorted({i for i in plan if i is not None and i >= 0}))}
        results: list[tuple[Fact, bool]] = []
        fresh_iter = iter(written)
        for ref in plan:
            if ref is None:
                results.append((next(fresh_iter), True))
            elif ref >= 0:
                results.append((existing[ref], False))
            else:
                results.append((written[-1 - ref], False))
        return results


def insert_facts(store: ProjectionStore, rows: list[Fact]) -> list[Fact]:
    """Insert prepared rows (no dedup) with their subjects; the rows with their new ids."""
    if not rows:
        return []
    ids = store.next_ids("facts_id_seq", len(rows))
    norm = [normalize_fact_text(p.text) for p in rows]
    subject_sets = [subject_set_key(p.subject_keys) for p in rows]
    store.sql(
        "INSERT INTO facts (id, channel_id, text, norm_text, subject_set, dedup_key, source_turn_ids, "
        "importance, created_at, valid_from, valid_to, scope, kind) "
        "SELECT unnest(?::BIGINT[]), unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
        "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::BIGINT[][]), unnest(?::TINYINT[]), "
        "unnest(?::TIMESTAMPTZ[]), unnest(?::TIMESTAMPTZ[]), unnest(?::TIMESTAMPTZ[]), unnest(?::VARCHAR[]), "
        "unnest(?::VARCHAR[])",
        [
            ids, [p.channel_id for p in rows], [p.text for p in rows], norm, subject_sets,
            [_dedup_key(n, s, p.kind) for n, s, p in zip(norm, subject_sets, rows)],
            [list(p.source_turn_ids) for p in rows],
            [p.importance for p in rows], [p.created_at for p in rows], [p.valid_from for p in rows],
            [p.valid_to for p in rows], [p.scope for p in rows], [p.kind for p in rows],
        ],
    )
    subject_rows = [(fid, s.canonical_key, s.display_at_write, i, p.scope)
                    for fid, p in zip(ids, rows) for i, s in enumerate(p.subjects)]
    if subject_rows:
        store.sql(
            "INSERT INTO fact_subjects (fact_id, canonical_key, display_at_write, position, scope) "
            "SELECT unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::INTEGER[]), "
            "unnest(?::VARCHAR[])",
            [list(column) for column in zip(*subject_rows)],
        )
    return [dataclasses.replace(p, id=i) for p, i in zip(rows, ids)]


# --------------------------------------------------------------------------- reads


def select(store: ProjectionStore, where: str, params: list[Any], order: str = "t.id",
           limit: int | None = None) -> list[Fact]:
    """Facts (alias ``t``) matching ``where``, with their subjects.

    Subjects come from a second query for the ids just read rather than a correlated
    list() per fact, which DuckDB runs as a join over all of fact_subjects even for one
    fact (and rather than running the selection again).
    """
    sql = f"{FACTS.select_sql('t')} WHERE {where} ORDER BY {order}"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    rows = store.sql(sql, params).fetchall()
    if not rows:
        return []
    grouped: dict[int, list[Subject]] = {}
    for fact_id, key, display in store.sql(
        "SELECT fact_id, canonical_key, display_at_write FROM fact_subjects "
        "WHERE fact_id IN (SELECT unnest(?::BIGINT[])) ORDER BY fact_id, position",
        [[row[0] for row in rows]],
    ).fetchall():
        grouped.setdefault(fact_id, []).append(stored_subject(key, display))
    return [FACTS.from_row(row, subjects=tuple(grouped.get(row[0], ()))) for row in rows]


def facts_by_ids(store: ProjectionStore, ids: Iterable[int]) -> list[Fact]:
    """Every listed fact that exists, retired or expired too, ascending by id."""
    wanted = list(values.ids(ids, "ids"))
    if not wanted:
        return []
    return select(store, "t.id IN (SELECT unnest(?))", [wanted])


def current_facts(store: ProjectionStore, *, now: Any = None, ids: Iterable[int] | None = None) -> list[Fact]:
    """Current truth at ``now`` (``FactView``), ascending; with ``ids``, only among those."""
    where, params = FactView.of(now=now).sql()
    if ids is not None:
        where, params = f"t.id IN (SELECT unnest(?::BIGINT[])) AND {where}", [list(values.ids(ids, "ids")), *params]
    return select(store, where, params)


def recent_facts(store: ProjectionStore, limit: int, *, include_superseded: bool = False, as_of: Any = None,
                 now: Any = None) -> list[Fact]:
    """Newest first. ``as_of`` overrides ``include_superseded`` (see ``FactView``)."""
    limit = values.as_int(limit, "limit")
    if limit <= 0:
        return []
    where, params = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now).sql()
    return select(store, where, params, order="t.id DESC", limit=limit)


def facts_for_subject(store: ProjectionStore, key: str, *, min_id_exclusive: int = 0,
                      include_superseded: bool = False, as_of: Any = None, now: Any = None) -> list[Fact]:
    """Facts whose subjects include ``key`` exactly, ascending by id."""
    where, params = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now).sql()
    return select(
        store, "t.id IN (SELECT fact_id FROM fact_subjects WHERE canonical_key = ?) AND t.id > ? AND " + where,
        [key, values.as_int(min_id_exclusive, "min_id_exclusive"), *params],
    )


def subjects_with_facts(store: ProjectionStore, *, now: Any = None) -> dict[str, int]:
    """Each subject key with its newest current fact id, sorted by key."""
    where, params = FactView.of(now=now).sql("f")
    rows = store.sql(
        "SELECT s.canonical_key, max(f.id) FROM fact_subjects s JOIN facts f ON f.id = s.fact_id "
        f"WHERE {where} GROUP BY s.canonical_key ORDER BY s.canonical_key",
        params,
    ).fetchall()
    return {key: fact_id for key, fact_id in rows}


def latest_fact_id(store: ProjectionStore) -> int:
    """The highest fact id present, retired rows included; 0 when there are none."""
    row = store.sql("SELECT coalesce(max(id), 0) FROM facts").fetchone()
    assert row is not None  # an aggregate returns one row
    return int(row[0])


def all_fact_ids(store: ProjectionStore) -> set[int]:
    return {row[0] for row in store.sql("SELECT id FROM facts").fetchall()}


def superseded_fact_ids(store: ProjectionStore, ids: Iterable[int]) -> set[int]:
    wanted = list(values.ids(ids, "ids"))
    if not wanted:
        return set()
    rows = store.sql(
        "SELECT id FROM facts WHERE id IN (SELECT unnest(?)) AND superseded_at IS NOT NULL", [wanted]
    ).fetchall()
    return {row[0] for row in rows}


def ancestors_of(store: ProjectionStore, fact_id: int) -> list[Fact]:
    """The rows ``fact_id`` directly replaced (one hop), ascending by id."""
    return select(store, "t.superseded_by = ?", [values.as_int(fact_id, "fact_id")])


def fact_texts(store: ProjectionStore) -> list[tuple[int, str]]:
    """``(id, text)`` of every fact, ascending: what the full-text index of facts holds."""
    return store.sql("SELECT id, text FROM facts ORDER BY id").fetchall()


# --------------------------------------------------------------------------- the fact axis
# Dossiers and reflections replay facts by id ("horizons", see projectors/horizon.py):
# these reads select by position on that axis.


def fact_horizon(store: ProjectionStore, turn_id: int) -> int:
    """Highest fact id whose source turns are all <= ``turn_id`` (0 when none)."""
    row = store.sql(
        "SELECT coalesce(max(id), 0) FROM facts WHERE len(source_turn_ids) > 0 AND list_max(source_turn_ids) <= ?",
        [values.as_int(turn_id, "turn_id")],
    ).fetchone()
    assert row is not None  # an aggregate returns one row
    return int(row[0])


def facts_in_range(store: ProjectionStore, after_id: int, upto_id: int) -> list[Fact]:
    """Every fact with ``after_id < id <= upto_id``, ascending, retired and expired ones included."""
    return select(store, "t.id > ? AND t.id <= ?",
                  [values.as_int(after_id, "after_id"), values.as_int(upto_id, "upto_id")])


def fact_ids_for_subject(store: ProjectionStore, key: str, *, after_id: int, upto_id: int) -> list[int]:
    """Ids of every fact naming ``key`` with ``after_id < id <= upto_id``, retired and expired ones included."""
    rows = store.sql(
        "SELECT fact_id FROM fact_subjects WHERE canonical_key = ? AND fact_id > ? AND fact_id <= ? ORDER BY fact_id",
        [key, values.as_int(after_id, "after_id"), values.as_int(upto_id, "upto_id")],
    ).fetchall()
    return [row[0] for row in rows]


def facts_for_subjects(store: ProjectionStore, keys: Iterable[str], *, after_id: int,
                       upto_id: int) -> dict[str, list[Fact]]:
    """Per key, `facts_by_ids(fact_ids_for_subject(key, ...))`: in two statements for all the keys."""
    wanted = sorted(set(keys))
    after, upto = values.as_int(after_id, "after_id"), values.as_int(upto_id, "upto_id")
    out: dict[str, list[Fact]] = {key: [] for key in wanted}
    if not wanted:
        return out
    facts = select(
        store,
        "t.id IN (SELECT fact_id FROM fact_subjects WHERE canonical_key IN (SELECT unnest(?::VARCHAR[])) "
        "AND fact_id > ? AND fact_id <= ?)", [wanted, after, upto])
    for fact in facts:  # ascending by id, as each key's own read gave them
        for key in dict.fromkeys(fact.subject_keys):
            if key in out:
                out[key].append(fact)
    return out


def wish_facts_after(store: ProjectionStore, after_id: int) -> list[Fact]:
    """The not-retired facts of kind "wish" with an id above ``after_id``, ascending (the standing_wish
    projector's read: it turns them into pinned wishes)."""
    return select(store, "t.kind = 'wish' AND t.superseded_at IS NULL AND t.id > ?",
                  [values.as_int(after_id, "after_id", minimum=0)])


def facts_retired_between(store: ProjectionStore, after_id: int, upto_id: int) -> list[Fact]:
    """Facts retired by a replacement with ``after_id < superseded_by <= upto_id``, ascending."""
    return select(store, "t.superseded_by > ? AND t.superseded_by <= ?",
                  [values.as_int(after_id, "after_id"), values.as_int(upto_id, "upto_id")])


def facts_current_at_horizon(store: ProjectionStore, horizon: int, limit: int, *,
                             scope: str | None = None) -> list[Fact]:
    """The ``limit`` newest facts with id <= ``horizon`` that were current right after fact
    ``horizon`` was evaluated (not retired, or retired by a newer fact), newest first;
    only facts of ``scope`` when given."""
    limit, horizon = values.as_int(limit, "limit"), values.as_int(horizon, "horizon")
    if limit <= 0 or horizon <= 0:
        return []
    where = "t.id <= ? AND (t.superseded_at IS NULL OR t.superseded_by > ?)"
    params: list[Any] = [horizon, horizon]
    if scope is not None:
        where, params = where + " AND t.scope = ?", [*params, scope]
    return select(store, where, params, order="t.id DESC", limit=limit)


def fact_ids_existing(store: ProjectionStore, ids: Iterable[int]) -> list[int]:
    """Those of ``ids`` that are facts in the store, ascending."""
    wanted = sorted({values.as_int(i, "fact id") for i in ids})
    if not wanted:
        return []
    return [row[0] for row in store.sql("SELECT id FROM facts WHERE id IN (SELECT unnest(?::BIGINT[])) ORDER BY id",
                                        [wanted]).fetchall()]


def fact_ids_upto(store: ProjectionStore, upto_id: int, *, scope: str | None = None) -> set[int]:
    """Ids of the facts that exist with id <= ``upto_id`` (of ``scope`` only, when given)."""
    where = "id <= ?"
    params: list[Any] = [values.as_int(upto_id, "upto_id")]
    if scope is not None:
        where, params = where + " AND scope = ?", [*params, scope]
    return {row[0] for row in store.sql(f"SELECT id FROM facts WHERE {where}", params).fetchall()}


def source_turns(facts: Iterable[Fact]) -> set[int]:
    """The turns ``facts`` were extracted from: what a prompt quoting them rests on (``models.llm.llm_sources``)."""
    return {turn for fact in facts for turn in fact.source_turn_ids}


def source_turns_of(store: ProjectionStore, fact_ids: Iterable[int]) -> tuple[set[int], bool]:
    """The source turns of the facts ``fact_ids`` (what a text folded from them rests on), and whether
    every one of them is still in the store: the turns of a removed fact are no longer known."""
    wanted = sorted({values.as_int(i, "fact id") for i in fact_ids})
    if not wanted:
        return set(), True
    rows = store.sql("SELECT id, source_turn_ids FROM facts WHERE id IN (SELECT unnest(?::BIGINT[]))",
                     [wanted]).fetchall()
    return {int(turn) for _, turns in rows for turn in turns}, len(rows) == len(wanted)


# --------------------------------------------------------------------------- integrity reads (asset checks)


def fact_source_turns(store: ProjectionStore) -> list[tuple[int, int]]:
    """``(fact id, source turn id)`` for every citation, by fact id."""
    return store.sql("SELECT id, unnest(source_turn_ids) AS turn_id FROM facts ORDER BY id").fetchall()


def fact_subject_keys(store: ProjectionStore) -> list[tuple[int, str]]:
    """``(fact id, subject key)`` for every subject of every fact, by fact id."""
    return store.sql("SELECT fact_id, canonical_key FROM fact_subjects ORDER BY fact_id").fetchall()

