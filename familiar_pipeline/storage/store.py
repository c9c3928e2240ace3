"""The projection store: one familiar's ``memory.duckdb``.

Everything here is a projection of the turn log (docs/architecture.md §1): facts with their
subjects, supersessions, dossiers, reflections, the rolling summary, fact
embeddings, and the per-projector watermarks that say how far each projection
has read. Only pipeline runs write it, one process at a time per file; a
notebook may open it read-only while no run holds it (DuckDB allows a single
process per file, so the bot reads Parquet snapshots instead).

Rules that matter to callers:

* Every timestamp is stored as a UTC ``TIMESTAMPTZ`` and returned as an aware
  UTC ``datetime`` (``times.as_utc`` reads the inputs: aware datetimes in any
  offset, naive datetimes taken as UTC, dates as UTC midnight, ISO-8601
  strings). Comparisons are on instants, never on offset text, so ``-05:00``
  values order correctly.
* Rows come back as the records of ``records.py`` (the snapshot reader returns
  the same ones), and which facts a read sees is ``records.FactView``.
* Writes validate their input before touching the database, so bad input
  raises a clear error and never dooms a surrounding transaction.
* ``transaction()`` groups writes, e.g. a projection's outputs and its
  watermark, so a killed or failed run leaves neither behind.
* Reads default to current truth: not superseded and not expired in world
  time. ``as_of`` reads give the world-time slice including retired rows.
* Fact ids come from a sequence and only grow. Dropping the facts (a
  rebuild) drops everything that cites a fact id with them and restarts the
  sequence, so no old citation can point at a new fact and a rebuild gives
  every fact the id the incremental build gave it.

A store object is not thread-safe; use one per thread (a run is one thread).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import threading
import unicodedata
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any, Callable

import duckdb

from familiar_pipeline.storage import store_schema
from familiar_pipeline.storage.identity import check_key
from familiar_pipeline.storage.records import (
    Dossier,
    Fact,
    FactView,
    Reflection,
    Subject,
    Summary,
    Watermark,
    stored_subject,
)
from familiar_pipeline.storage.times import as_utc, now_or

SUMMARY_SCOPE = "conversation"

# Columns that carry wall-clock system time; leave them out when comparing an
# incremental build with a rebuild (`table_rows(..., exclude=...)`).
SYSTEM_TIME_COLUMNS = ("created_at", "superseded_at", "updated_at", "decided_at", "applied_at")

SKIP_UNKNOWN = "unknown fact id={}"
SKIP_ALREADY_SUPERSEDED = "fact id={} already superseded"
SKIP_SELF = "fact id={} cannot supersede itself"
SKIP_REPLACEMENT_RETIRED = "replacement fact id={} is already superseded"

# Sequence names `drop_rows` may restart (it formats them into SQL).
_SEQUENCE = re.compile(r"^[a-z_][a-z0-9_]*_seq$")


class StoreError(RuntimeError):
    """A problem with the store file itself (not with one call's input)."""


class StoreLockedError(StoreError):
    """Another process holds the file (DuckDB allows one process per file)."""


class SchemaVersionError(StoreError):
    """The file's schema is not the one this code reads."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted on a store opened read-only."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class FactDraft:
    """A fact to write. Lists are accepted and frozen into tuples."""

    text: str
    source_turn_ids: tuple[int, ...] = ()
    subjects: tuple[Subject, ...] = ()
    channel_id: int | None = None
    importance: Any = None
    valid_from: datetime | date | str | None = None
    valid_to: datetime | date | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_turn_ids", tuple(self.source_turn_ids))
        object.__setattr__(self, "subjects", tuple(self.subjects))


@dataclass(frozen=True)
class SupersedeResult:
    minted: Fact | None
    superseded: tuple[int, ...]
    skipped: tuple[tuple[int, str], ...]
    dropped_dossiers: tuple[str, ...] = ()


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


# --------------------------------------------------------------------------- input checks


def _int(value: Any, what: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def _opt_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _ids(values: Iterable[Any] | None, what: str) -> tuple[int, ...]:
    """Distinct ids in first-seen order."""
    if values is None:
        return ()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a collection of integer ids, got {values!r}")
    return tuple(dict.fromkeys(_int(v, f"{what} item") for v in values))


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
        score = int(value)
    else:
        raise ValueError(f"importance must be a number 1-10, got {value!r}")
    return max(1, min(10, score))


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{what} is empty")
    return value


def _subjects(values: Iterable[Any]) -> tuple[Subject, ...]:
    """Distinct subjects by key, first one wins (a set of people, in mention order)."""
    seen: dict[str, Subject] = {}
    for value in values:
        if not isinstance(value, Subject):
            raise TypeError(f"subjects must be Subject instances, got {value!r}")
        seen.setdefault(value.canonical_key, value)
    return tuple(seen.values())


def _projector_name(projector: Any) -> str:
    if not isinstance(projector, str) or not projector.strip():
        raise ValueError(f"projector name must be a non-empty string, got {projector!r}")
    return projector


@dataclass(frozen=True)
class _PreparedFact:
    """A draft after validation: exactly what an INSERT needs."""

    text: str
    norm_text: str
    subject_set: str
    subjects: tuple[Subject, ...]
    source_turn_ids: tuple[int, ...]
    channel_id: int | None
    importance: int | None
    valid_from: datetime
    valid_to: datetime | None

    @property
    def dedup_key(self) -> str:
        return f"{self.norm_text}\n{self.subject_set}"


def _prepare(draft: FactDraft, now: datetime) -> _PreparedFact:
    if not isinstance(draft, FactDraft):
        raise TypeError(f"expected a FactDraft, got {type(draft).__name__}")
    text = _text(draft.text, "fact text")
    norm = normalize_fact_text(text)
    if not norm:
        raise ValueError(f"fact text {text!r} has no content after normalisation")
    subjects = _subjects(draft.subjects)
    valid_from = as_utc(draft.valid_from, what="valid_from") or now
    valid_to = as_utc(draft.valid_to, what="valid_to")
    if valid_to is not None and valid_to <= valid_from:
        raise ValueError(
            f"valid_to {valid_to.isoformat()} is not after valid_from {valid_from.isoformat()}; "
            "a fact that ended before it began is never valid (give valid_from explicitly "
            "for facts about the past)"
        )
    return _PreparedFact(
        text=text,
        norm_text=norm,
        subject_set=subject_set_key(s.canonical_key for s in subjects),
        subjects=subjects,
        source_turn_ids=_ids(draft.source_turn_ids, "source_turn_ids"),
        channel_id=_opt_int(draft.channel_id, "channel_id"),
        importance=clamp_importance(draft.importance),
        valid_from=valid_from,
        valid_to=valid_to,
    )


# --------------------------------------------------------------------------- row mapping

# Times are fetched as UTC wall-clock TIMESTAMPs (the session TimeZone is UTC)
# and tagged in Python: DuckDB's TIMESTAMPTZ-to-Python conversion costs
# several microseconds per value, which dominated whole-table reads.
_FACT_SELECT = """
    SELECT f.id, f.channel_id, f.text, f.source_turn_ids, f.importance,
           f.created_at::TIMESTAMP, f.superseded_at::TIMESTAMP, f.superseded_by,
           f.valid_from::TIMESTAMP, f.valid_to::TIMESTAMP
    FROM facts f
"""


def _fact(row: tuple, subjects: tuple[Subject, ...]) -> Fact:
    return Fact(
        id=row[0],
        channel_id=row[1],
        text=row[2],
        source_turn_ids=tuple(row[3]),
        subjects=subjects,
        importance=row[4],
        created_at=as_utc(row[5]),
        superseded_at=as_utc(row[6]),
        superseded_by=row[7],
        valid_from=as_utc(row[8]),
        valid_to=as_utc(row[9]),
    )


_REFLECTION_SELECT = (
    "SELECT id, channel_id, text, cited_turn_ids, cited_fact_ids, last_turn_id, last_fact_id, created_at "
    "FROM reflections"
)


def _reflection(row: tuple) -> Reflection:
    rid, channel_id, text, turn_ids, fact_ids, last_turn_id, last_fact_id, created_at = row
    return Reflection(rid, channel_id, text, tuple(turn_ids), tuple(fact_ids), last_turn_id, last_fact_id,
                      as_utc(created_at))


# --------------------------------------------------------------------------- the store


def _checked_vector(model: Any, kind: str, key: int, vector: Iterable[float]) -> list[float]:
    """The vector as floats; a one-line error for a bad model name or a non-numeric, empty or non-finite vector."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be a non-empty string, got {model!r}")
    try:
        values = [float(x) for x in vector]
    except (TypeError, ValueError):
        raise TypeError(f"the vector of {kind} {key} is not a sequence of numbers") from None
    if not values:
        raise ValueError(f"the vector of {kind} {key} is empty")
    if not all(math.isfinite(x) for x in values):
        raise ValueError(f"embedding of {kind} {key} under {model} holds NaN or infinity")
    return values


class _AttachedFiles:
    """The process's writable store files, each ATTACHed to one shared in-memory DuckDB instance.

    Creating a DuckDB instance costs ~16 ms of CPU (its catalog of built-in
    functions) and attaching a file to a live one ~1 ms; a projection step opens one
    store per familiar, so each gets a connection (a cursor) of the shared instance
    with its file as the default database (`USE`). The file is locked exactly as by
    `duckdb.connect` (one process per file) and released at DETACH, when its last
    store in this process closes, so two stores on one file share one attachment as
    two connections to the file shared one instance before. A forked child starts
    its own instance (a parent's does not survive the fork).
    """

    _lock = threading.Lock()
    _pid: int | None = None
    _host: duckdb.DuckDBPyConnection | None = None
    _files: dict[str, list] = {}  # resolved path -> [alias, open stores]
    _count = 0

    @classmethod
    def open(cls, path: Path) -> tuple[duckdb.DuckDBPyConnection, str]:
        """A connection whose default database is `path`; with the key to give `release`."""
        key = str(path.resolve())
        with cls._lock:
            if cls._pid != os.getpid():
                cls._pid, cls._host, cls._files, cls._count = os.getpid(), duckdb.connect(":memory:"), {}, 0
            entry = cls._files.get(key)
            if entry is None:
                cls._count += 1
                alias = f"familiar_store_{cls._count}"
                with cls._host.cursor() as cursor:
                    cursor.execute(f"ATTACH '{key.replace(chr(39), chr(39) * 2)}' AS {alias}")
                entry = cls._files[key] = [alias, 0]
            entry[1] += 1
            conn = cls._host.cursor()
        try:
            conn.execute(f"USE {entry[0]}")
        except BaseException:
            conn.close()
            cls.release(key)
            raise
        return conn, key

    @classmethod
    def release(cls, key: str) -> None:
        """One store of `key` closed (its connection first); the last one detaches the file."""
        with cls._lock:
            entry = cls._files.get(key)
            if entry is None or cls._pid != os.getpid():
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del cls._files[key]
            with cls._host.cursor() as cursor:
                cursor.execute(f"DETACH {entry[0]}")


class ProjectionStore:
    """One familiar's projection store (``memory.duckdb``); ``path=None`` is in-memory."""

    def __init__(self, path: str | Path | None, *, read_only: bool = False):
        self.path = None if path is None else Path(path)
        self.read_only = read_only
        self._tx_depth = 0
        self._tx_error: duckdb.Error | None = None
        self._marks: dict[str, Watermark] | None = None  # see _watermark_rows
        self._attached: str | None = None  # the _AttachedFiles key of a writable file store
        if self.path is None:
            if read_only:
                raise ValueError("an in-memory store cannot be read-only: there is nothing to read")
            self._conn = duckdb.connect(":memory:")
        else:
            self._conn = self._connect_file(self.path, read_only)
        try:
            self._conn.execute("SET TimeZone = 'UTC'")
            self._open_schema()
        except BaseException:
            self.close()
            raise

    def _connect_file(self, path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
        if read_only and not path.exists():
            raise FileNotFoundError(f"no projection store at {path}")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if read_only:
                return duckdb.connect(str(path), read_only=True)
            conn, self._attached = _AttachedFiles.open(path)
            return conn
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreLockedError(
                    f"{path} is held by another process (a pipeline run?); DuckDB allows one "
                    "process per file, so retry when it finishes or read the serving snapshot"
                ) from exc
            raise

    def _open_schema(self) -> None:
        found, tables, views_current = store_schema.open_state(self._conn)
        where = self.path or "in-memory store"
        if found > store_schema.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where} has schema v{found}, newer than this code's "
                f"v{store_schema.SCHEMA_VERSION}; upgrade the code before opening it"
            )
        if self.read_only:
            if found < store_schema.SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{where} has schema v{found}; this code reads v{store_schema.SCHEMA_VERSION}. "
                    "A read-only open never migrates: let a pipeline run (a writer) open it first"
                )
            return
        if found == 0 and tables > 0:
            raise SchemaVersionError(
                f"{where} holds tables but no schema_version: not a familiar projection store"
            )
        applied = store_schema.migrate(self._conn) if found < store_schema.SCHEMA_VERSION else []
        if applied or not views_current:
            store_schema.create_notebook_views(self._conn)

    @property
    def schema_version(self) -> int:
        return store_schema.current_version(self._conn)

    @property
    def conn(self) -> duckdb.DuckDBPyConnection:
        """The raw DuckDB connection (snapshot publishing, checks, notebooks-style SQL)."""
        if self._conn is None:
            raise StoreError("the store is closed")
        self._marks = None  # SQL written through it may change watermarks behind this store's back
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()  # ends (rolls back) a transaction still open on it
            finally:
                self._conn = None  # type: ignore[assignment]
                if self._attached is not None:
                    key, self._attached = self._attached, None
                    _AttachedFiles.release(key)

    def __enter__(self) -> "ProjectionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- plumbing

    def _q(self, sql: str, params: list[Any] | None = None) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            raise StoreError("the projection store is closed")
        try:
            return self._conn.execute(sql, params or [])
        except duckdb.Error as exc:
            if self._tx_depth and self._tx_error is None:
                self._tx_error = exc
            raise

    def _next_ids(self, sequence: str, n: int) -> list[int]:
        """The next `n` values of `sequence` in one statement, in order (rows inserted together get them in order)."""
        if not _SEQUENCE.fullmatch(sequence):
            raise ValueError(f"invalid sequence name {sequence!r}")
        return [r[0] for r in self._q(f"SELECT nextval('{sequence}') FROM range(?) ORDER BY range", [n]).fetchall()]

    @contextmanager
    def transaction(self) -> Iterator["ProjectionStore"]:
        """One short write transaction; a nested use joins the outer one.

        Any exception leaving the block rolls back everything written since
        the outermost ``transaction()`` began. A database error swallowed
        inside the block still aborts it: DuckDB would then turn the COMMIT
        into a silent rollback, so the block's exit raises ``StoreError``.
        """
        if self.read_only:
            raise ReadOnlyStoreError(f"{self.path} was opened read-only; writes go through a pipeline run")
        if self._tx_depth:
            self._tx_depth += 1
            try:
                yield self
            finally:
                self._tx_depth -= 1
            return
        self._q("BEGIN TRANSACTION")
        self._tx_depth, self._tx_error = 1, None
        try:
            yield self
        except BaseException:
            self._tx_depth, self._marks = 0, None
            self._q("ROLLBACK")
            raise
        self._tx_depth, failed = 0, self._tx_error
        if failed is not None:
            self._marks = None
            self._q("ROLLBACK")
            raise StoreError(f"transaction rolled back: a statement inside it failed ({failed})") from failed
        try:
            self._q("COMMIT")
        except BaseException:
            self._marks = None
            try:
                self._q("ROLLBACK")
            except duckdb.Error:
                pass  # the failed COMMIT already ended the transaction
            raise

    # ----------------------------------------------------------------- facts: writes

    def append_fact(
        self, draft: FactDraft, *, now: Any = None, dedup: bool = True
    ) -> tuple[Fact, bool]:
        """Write a fact unless a current twin exists; returns ``(fact, inserted)``.

        A twin is a current fact (not retired, ``valid_to`` NULL or after
        ``now``) with equal normalised text and an equal subject-key set, found
        by one index probe on ``dedup_key``. The twin is returned untouched:
        its sources, channel, importance and validity are not merged. A draft
        with ``valid_to`` always inserts, because it may bound an earlier
        fact. Importance is clamped to 1..10; ``valid_from`` defaults to
        ``now``; every time is stored in UTC.
        """
        at = now_or(now)
        prepared = _prepare(draft, at)
        with self.transaction():
            if dedup and prepared.valid_to is None:
                twin = self._current_twin(prepared.dedup_key, at)
                if twin is not None:
                    return twin, False
            return self._insert_fact(prepared, at), True

    def append_facts(
        self, drafts: Iterable[FactDraft], *, now: Any = None, dedup: bool = True
    ) -> list[tuple[Fact, bool]]:
        """``append_fact`` for a whole batch in a few statements: one twin lookup, one insert per table.

        Same rules, applied in order, so a draft that repeats an earlier draft
        of the same batch is suppressed too. Returns ``(fact, inserted)`` per draft.
        """
        at = now_or(now)
        prepared = [_prepare(d, at) for d in drafts]
        if not prepared:
            return []
        with self.transaction():
            twins: dict[str, int] = {}
            if dedup:
                keys = sorted({p.dedup_key for p in prepared if p.valid_to is None})
                rows = self._q(
                    "SELECT id, dedup_key, superseded_at::TIMESTAMP, valid_to::TIMESTAMP FROM facts "
                    "WHERE dedup_key IN (SELECT unnest(?::VARCHAR[]))",
                    [keys],
                ).fetchall() if keys else []
                view = FactView(at)
                for fact_id, key, superseded_at, valid_to in sorted(rows):
                    if view.admits_times(superseded_at, None, as_utc(valid_to)):
                        twins.setdefault(key, fact_id)
            plan: list[tuple[_PreparedFact, int | None]] = []
            fresh: list[_PreparedFact] = []
            seen_in_batch: dict[str, int] = {}
            for p in prepared:
                if dedup and p.valid_to is None:
                    if p.dedup_key in twins:
                        plan.append((p, twins[p.dedup_key]))
                        continue
                    if p.dedup_key in seen_in_batch:
                        plan.append((p, -1 - seen_in_batch[p.dedup_key]))  # points at a fresh row
                        continue
                    seen_in_batch[p.dedup_key] = len(fresh)
                plan.append((p, None))
                fresh.append(p)
            new_ids = self._insert_facts(fresh, at)
            existing = {f.id: f for f in self.facts_by_ids(sorted({i for _, i in plan if i is not None and i >= 0}))}
            results: list[tuple[Fact, bool]] = []
            fresh_iter = iter(range(len(fresh)))
            fresh_facts = [
                Fact(
                    id=fact_id, channel_id=p.channel_id, text=p.text, source_turn_ids=p.source_turn_ids,
                    subjects=p.subjects, importance=p.importance, created_at=at, superseded_at=None,
                    superseded_by=None, valid_from=p.valid_from, valid_to=p.valid_to,
                )
                for p, fact_id in zip(fresh, new_ids)
            ]
            for p, ref in plan:
                if ref is None:
                    results.append((fresh_facts[next(fresh_iter)], True))
                elif ref >= 0:
                    results.append((existing[ref], False))
                else:
                    results.append((fresh_facts[-1 - ref], False))
            return results

    def _insert_facts(self, rows: list[_PreparedFact], at: datetime) -> list[int]:
        if not rows:
            return []
        ids = self._next_ids("facts_id_seq", len(rows))
        self._q(
            "INSERT INTO facts (id, channel_id, text, norm_text, subject_set, dedup_key, source_turn_ids, "
            "importance, created_at, valid_from, valid_to) "
            "SELECT unnest(?::BIGINT[]), unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
            "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::BIGINT[][]), unnest(?::TINYINT[]), ?, "
            "unnest(?::TIMESTAMPTZ[]), unnest(?::TIMESTAMPTZ[])",
            [
                ids, [p.channel_id for p in rows], [p.text for p in rows], [p.norm_text for p in rows],
                [p.subject_set for p in rows], [p.dedup_key for p in rows], [list(p.source_turn_ids) for p in rows],
                [p.importance for p in rows], at, [p.valid_from for p in rows], [p.valid_to for p in rows],
            ],
        )
        subject_rows = [(fid, s.canonical_key, s.display_at_write, i) for fid, p in zip(ids, rows) for i, s in enumerate(p.subjects)]
        if subject_rows:
            self._q(
                "INSERT INTO fact_subjects (fact_id, canonical_key, display_at_write, position) "
                "SELECT unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::INTEGER[])",
                [[r[0] for r in subject_rows], [r[1] for r in subject_rows], [r[2] for r in subject_rows], [r[3] for r in subject_rows]],
            )
        return ids

    def _current_twin(self, dedup_key: str, at: datetime) -> Fact | None:
        # Equality on dedup_key alone is what DuckDB answers from the ART index;
        # adding the validity predicates turns the probe into a table scan, so
        # they are applied here to the few rows that share the key.
        rows = self._q(
            "SELECT id, superseded_at::TIMESTAMP, valid_to::TIMESTAMP FROM facts WHERE dedup_key = ?",
            [dedup_key],
        ).fetchall()
        view = FactView(at)
        for fact_id, superseded_at, valid_to in sorted(rows):
            if view.admits_times(superseded_at, None, as_utc(valid_to)):
                return self.facts_by_ids([fact_id])[0]
        return None

    def _insert_fact(self, p: _PreparedFact, at: datetime) -> Fact:
        (fact_id,) = self._q(
            "INSERT INTO facts (id, channel_id, text, norm_text, subject_set, dedup_key, "
            "source_turn_ids, importance, created_at, valid_from, valid_to) "
            "VALUES (nextval('facts_id_seq'), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            [
                p.channel_id, p.text, p.norm_text, p.subject_set, p.dedup_key,
                list(p.source_turn_ids), p.importance, at, p.valid_from, p.valid_to,
            ],
        ).fetchone()
        if p.subjects:
            self._q(
                "INSERT INTO fact_subjects (fact_id, canonical_key, display_at_write, position) "
                "SELECT ?, unnest(?), unnest(?), unnest(?)",
                [
                    fact_id,
                    [s.canonical_key for s in p.subjects],
                    [s.display_at_write for s in p.subjects],
                    list(range(len(p.subjects))),
                ],
            )
        return Fact(
            id=fact_id, channel_id=p.channel_id, text=p.text, source_turn_ids=p.source_turn_ids,
            subjects=p.subjects, importance=p.importance, created_at=at, superseded_at=None,
            superseded_by=None, valid_from=p.valid_from, valid_to=p.valid_to,
        )

    def supersede(
        self,
        obsolete_ids: Iterable[int],
        new_fact: int | Fact | FactDraft | None,
        *,
        now: Any = None,
    ) -> SupersedeResult:
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
        ids = _ids(obsolete_ids, "obsolete_ids")
        if new_fact is None or isinstance(new_fact, FactDraft):
            replacement_id = None
        elif isinstance(new_fact, Fact):
            replacement_id = new_fact.id
        elif isinstance(new_fact, numbers.Integral) and not isinstance(new_fact, bool):
            replacement_id = int(new_fact)
        else:
            raise TypeError(f"new_fact must be None, a fact id, a Fact or a FactDraft; got {new_fact!r}")
        draft = _prepare(new_fact, at) if isinstance(new_fact, FactDraft) else None

        with self.transaction():
            rows = {f.id: f for f in self.facts_by_ids(ids)}
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
                minted = self._insert_fact(replace(draft, source_turn_ids=tuple(dict.fromkeys(sources))), at)
                dropped = self._retire(ids, minted.id, at, rows)
                return SupersedeResult(minted=minted, superseded=ids, skipped=(), dropped_dossiers=dropped)

            if replacement_id is not None:
                replacement = self.facts_by_ids([replacement_id])
                if not replacement:
                    raise ValueError(f"supersede: replacement fact id={replacement_id} does not exist")
                if not replacement[0].current:
                    skipped.update((i, SKIP_REPLACEMENT_RETIRED.format(replacement_id)) for i in live)
                    live = []
                elif replacement_id in live:
                    skipped[replacement_id] = SKIP_SELF.format(replacement_id)
                    live.remove(replacement_id)
            dropped = self._retire(live, replacement_id, at, rows) if live else ()
            return SupersedeResult(
                minted=None,
                superseded=tuple(live),
                skipped=tuple((i, skipped[i]) for i in ids if i in skipped),
                dropped_dossiers=dropped,
            )

    def _retire(
        self, ids: Iterable[int], replacement_id: int | None, at: datetime, rows: dict[int, Fact]
    ) -> tuple[str, ...]:
        ids = list(ids)
        self._q(
            "UPDATE facts SET superseded_at = ?, superseded_by = ? "
            "WHERE id IN (SELECT unnest(?)) AND superseded_at IS NULL",
            [at, replacement_id, ids],
        )
        keys = sorted({k for i in ids for k in rows[i].subject_keys})
        return tuple(sorted(self._delete_dossiers(keys)))

    def record_supersede_decision(self, *, now: Any = None, **decision: Any) -> int:
        """Log one supersession decision (what was shown, what was retired); returns its id.

        ``decision``: ``new_fact_id``, ``subject_key``, ``shown_prior_ids``,
        ``retired_ids``, ``skipped`` ((id, reason) pairs) and ``model`` (see `_decision_row`).
        """
        (decision_id,) = self.record_supersede_decisions([decision], now=now)
        return decision_id

    def record_supersede_decisions(self, decisions: Iterable[dict[str, Any]], *, now: Any = None) -> list[int]:
        """Log decisions (each the keyword arguments of `record_supersede_decision`) in order; their ids.

        Every decision is checked before anything is written; then two statements
        (the ids, in order, then one INSERT) however many there are: a step logs
        ~16 per familiar, and a statement each was a tenth of its store time.
        """
        at = now_or(now)
        rows = [self._decision_row(**d) for d in decisions]
        if not rows:
            return []
        with self.transaction():
            ids = self._next_ids("supersede_decisions_id_seq", len(rows))
            columns = list(zip(*rows))
            self._q(
                "INSERT INTO supersede_decisions SELECT unnest(?::BIGINT[]), unnest(?::BIGINT[]), "
                "unnest(?::VARCHAR[]), unnest(?::BIGINT[][]), unnest(?::BIGINT[][]), unnest(?::VARCHAR[]), "
                "unnest(?::VARCHAR[]), ?",
                [ids, *(list(c) for c in columns), at],
            )
        return ids

    @staticmethod
    def _decision_row(
        *,
        new_fact_id: int,
        subject_key: str,
        shown_prior_ids: Iterable[int],
        retired_ids: Iterable[int],
        skipped: Iterable[tuple[int, str]],
        model: str | None,
    ) -> tuple:
        fact_id = _int(new_fact_id, "new_fact_id")
        check_key(subject_key, "subject key")
        shown = list(_ids(shown_prior_ids, "shown_prior_ids"))
        retired = list(_ids(retired_ids, "retired_ids"))
        skipped_list = []
        for pair in skipped:
            try:
                sid, reason = pair
            except (TypeError, ValueError):
                raise TypeError(f"skipped items must be (id, reason) pairs, got {pair!r}") from None
            skipped_list.append([_int(sid, "skipped id"), str(reason)])
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a string or None, got {model!r}")
        return fact_id, subject_key, shown, retired, json.dumps(skipped_list), model

    # ----------------------------------------------------------------- facts: reads

    def _facts(self, where: str, params: list[Any], order: str = "f.id", limit: int | None = None) -> list[Fact]:
        sql = f"{_FACT_SELECT} WHERE {where} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self._q(sql, params).fetchall()
        if not rows:
            return []
        # Subjects come from a second query for the ids just read rather than a
        # correlated list() per fact, which DuckDB runs as a join over all of
        # fact_subjects even for one fact (and rather than running the selection again).
        grouped: dict[int, list[Subject]] = {}
        for fact_id, key, display in self._q(
            "SELECT fact_id, canonical_key, display_at_write FROM fact_subjects "
            "WHERE fact_id IN (SELECT unnest(?::BIGINT[])) ORDER BY fact_id, position",
            [[row[0] for row in rows]],
        ).fetchall():
            grouped.setdefault(fact_id, []).append(stored_subject(key, display))
        return [_fact(row, tuple(grouped.get(row[0], ()))) for row in rows]

    def facts_by_ids(self, ids: Iterable[int]) -> list[Fact]:
        """Every listed fact that exists, retired or expired too, ascending by id."""
        wanted = list(_ids(ids, "ids"))
        if not wanted:
            return []
        return self._facts("f.id IN (SELECT unnest(?))", [wanted])

    def current_facts(self, *, now: Any = None, ids: Iterable[int] | None = None) -> list[Fact]:
        """Current truth at ``now`` (``FactView``), ascending; with ``ids``, only among those."""
        where, params = FactView.of(now=now).sql()
        if ids is not None:
            where, params = f"f.id IN (SELECT unnest(?::BIGINT[])) AND {where}", [list(_ids(ids, "ids")), *params]
        return self._facts(where, params)

    def recent_facts(
        self, limit: int, *, include_superseded: bool = False, as_of: Any = None, now: Any = None
    ) -> list[Fact]:
        """Newest first. ``as_of`` overrides ``include_superseded`` (see ``FactView``)."""
        limit = _int(limit, "limit")
        if limit <= 0:
            return []
        where, params = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now).sql()
        return self._facts(where, params, order="f.id DESC", limit=limit)

    def facts_for_subject(
        self,
        key: str,
        *,
        min_id_exclusive: int = 0,
        include_superseded: bool = False,
        as_of: Any = None,
        now: Any = None,
    ) -> list[Fact]:
        """Facts whose subjects include ``key`` exactly, ascending by id."""
        where, params = FactView.of(as_of=as_of, include_superseded=include_superseded, now=now).sql()
        return self._facts(
            "f.id IN (SELECT fact_id FROM fact_subjects WHERE canonical_key = ?) AND f.id > ? AND " + where,
            [key, _int(min_id_exclusive, "min_id_exclusive"), *params],
        )

    def subjects_with_facts(self, *, now: Any = None) -> dict[str, int]:
        """Each subject key with its newest current fact id, sorted by key."""
        where, params = FactView.of(now=now).sql()
        rows = self._q(
            "SELECT s.canonical_key, max(f.id) FROM fact_subjects s JOIN facts f ON f.id = s.fact_id "
            f"WHERE {where} GROUP BY s.canonical_key ORDER BY s.canonical_key",
            params,
        ).fetchall()
        return {key: fact_id for key, fact_id in rows}

    def latest_fact_id(self) -> int:
        """The highest fact id present, retired rows included; 0 when there are none."""
        return self._q("SELECT coalesce(max(id), 0) FROM facts").fetchone()[0]

    def all_fact_ids(self) -> set[int]:
        return {row[0] for row in self._q("SELECT id FROM facts").fetchall()}

    def superseded_fact_ids(self, ids: Iterable[int]) -> set[int]:
        wanted = list(_ids(ids, "ids"))
        if not wanted:
            return set()
        rows = self._q(
            "SELECT id FROM facts WHERE id IN (SELECT unnest(?)) AND superseded_at IS NOT NULL", [wanted]
        ).fetchall()
        return {row[0] for row in rows}

    def ancestors_of(self, fact_id: int) -> list[Fact]:
        """The rows ``fact_id`` directly replaced (one hop), ascending by id."""
        return self._facts("f.superseded_by = ?", [_int(fact_id, "fact_id")])

    # ----------------------------------------------------------------- facts: the fact axis
    # Dossiers and reflections replay facts by id ("horizons", see
    # projectors/horizon.py): these reads select by position on that axis.

    def fact_horizon(self, turn_id: int) -> int:
        """Highest fact id whose source turns are all <= ``turn_id`` (0 when none)."""
        row = self._q(
            "SELECT coalesce(max(id), 0) FROM facts WHERE len(source_turn_ids) > 0 AND list_max(source_turn_ids) <= ?",
            [_int(turn_id, "turn_id")],
        ).fetchone()
        return int(row[0])

    def facts_in_range(self, after_id: int, upto_id: int) -> list[Fact]:
        """Every fact with ``after_id < id <= upto_id``, ascending, retired and expired ones included."""
        return self._facts("f.id > ? AND f.id <= ?", [_int(after_id, "after_id"), _int(upto_id, "upto_id")])

    def fact_ids_for_subject(self, key: str, *, after_id: int, upto_id: int) -> list[int]:
        """Ids of every fact naming ``key`` with ``after_id < id <= upto_id``, retired and expired ones included."""
        rows = self._q(
            "SELECT fact_id FROM fact_subjects WHERE canonical_key = ? AND fact_id > ? AND fact_id <= ? ORDER BY fact_id",
            [key, _int(after_id, "after_id"), _int(upto_id, "upto_id")],
        ).fetchall()
        return [row[0] for row in rows]

    def facts_for_subjects(self, keys: Iterable[str], *, after_id: int, upto_id: int) -> dict[str, list[Fact]]:
        """Per key, `facts_by_ids(fact_ids_for_subject(key, ...))`: in two statements for all the keys."""
        wanted = sorted(set(keys))
        after, upto = _int(after_id, "after_id"), _int(upto_id, "upto_id")
        out: dict[str, list[Fact]] = {key: [] for key in wanted}
        if not wanted:
            return out
        facts = self._facts(
            "f.id IN (SELECT fact_id FROM fact_subjects WHERE canonical_key IN (SELECT unnest(?::VARCHAR[])) "
            "AND fact_id > ? AND fact_id <= ?)", [wanted, after, upto])
        for fact in facts:  # ascending by id, as each key's own read gave them
            for key in dict.fromkeys(fact.subject_keys):
                if key in out:
                    out[key].append(fact)
        return out

    def facts_retired_between(self, after_id: int, upto_id: int) -> list[Fact]:
        """Facts retired by a replacement with ``after_id < superseded_by <= upto_id``, ascending."""
        return self._facts(
            "f.superseded_by > ? AND f.superseded_by <= ?", [_int(after_id, "after_id"), _int(upto_id, "upto_id")]
        )

    def facts_current_at_horizon(self, horizon: int, limit: int) -> list[Fact]:
        """The ``limit`` newest facts with id <= ``horizon`` that were current right after fact
        ``horizon`` was evaluated (not retired, or retired by a newer fact), newest first."""
        limit, horizon = _int(limit, "limit"), _int(horizon, "horizon")
        if limit <= 0 or horizon <= 0:
            return []
        return self._facts(
            "f.id <= ? AND (f.superseded_at IS NULL OR f.superseded_by > ?)", [horizon, horizon],
            order="f.id DESC", limit=limit,
        )

    def fact_ids_upto(self, upto_id: int) -> set[int]:
        """Ids of the facts that exist with id <= ``upto_id``."""
        return {row[0] for row in self._q("SELECT id FROM facts WHERE id <= ?", [_int(upto_id, "upto_id")]).fetchall()}

    def fact_texts(self) -> list[tuple[int, str]]:
        """``(id, text)`` of every fact, ascending: what the full-text index of facts holds."""
        return self._q("SELECT id, text FROM facts ORDER BY id").fetchall()

    # ----------------------------------------------------------------- integrity reads (asset checks)

    def fact_source_turns(self) -> list[tuple[int, int]]:
        """``(fact id, source turn id)`` for every citation, by fact id."""
        return self._q("SELECT id, unnest(source_turn_ids) AS turn_id FROM facts ORDER BY id").fetchall()

    def fact_subject_keys(self) -> list[tuple[int, str]]:
        """``(fact id, subject key)`` for every subject of every fact, by fact id."""
        return self._q("SELECT fact_id, canonical_key FROM fact_subjects ORDER BY fact_id").fetchall()

    def facts_retired_more_than_once(self) -> list[tuple[int, int]]:
        """``(fact id, times)`` for facts that more than one supersession decision retired."""
        return self._q(
            "SELECT fact_id, count(*) FROM (SELECT unnest(retired_ids) AS fact_id FROM supersede_decisions) "
            "GROUP BY fact_id HAVING count(*) > 1 ORDER BY fact_id"
        ).fetchall()

    def dangling_replacements(self) -> list[tuple[int, int]]:
        """``(fact id, superseded_by)`` where the replacement does not exist or is the fact itself."""
        return self._q(
            "SELECT f.id, f.superseded_by FROM facts f LEFT JOIN facts r ON r.id = f.superseded_by "
            "WHERE f.superseded_by IS NOT NULL AND (r.id IS NULL OR r.id = f.id) ORDER BY f.id"
        ).fetchall()

    # ----------------------------------------------------------------- summary and dossiers

    def put_summary(self, summary_text: str, last_turn_id: int, *, now: Any = None) -> None:
        """Replace the conversation summary. An empty text is refused: it would erase memory."""
        text = _text(summary_text, "summary_text")
        turn = _int(last_turn_id, "last_turn_id", minimum=0)
        at = now_or(now)
        with self.transaction():
            self._q(
                "INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?)", [SUMMARY_SCOPE, text, turn, at]
            )

    def get_summary(self) -> Summary | None:
        row = self._q(
            "SELECT summary_text, last_turn_id, created_at FROM summaries WHERE scope = ?", [SUMMARY_SCOPE]
        ).fetchone()
        return None if row is None else Summary(row[0], row[1], as_utc(row[2]))

    def put_dossier(self, key: str, text: str, last_fact_id: int, *, now: Any = None) -> None:
        """Replace a subject's dossier. An empty text is refused (never overwrite with nothing)."""
        check_key(key, "subject key")
        body = _text(text, "dossier text")
        fact_id = _int(last_fact_id, "last_fact_id", minimum=0)
        at = now_or(now)
        with self.transaction():
            self._q("INSERT OR REPLACE INTO people_dossiers VALUES (?, ?, ?, ?)", [key, body, fact_id, at])

    def get_dossier(self, key: str) -> Dossier | None:
        row = self._q(
            "SELECT canonical_key, dossier_text, last_fact_id, created_at FROM people_dossiers "
            "WHERE canonical_key = ?",
            [key],
        ).fetchone()
        return None if row is None else Dossier(row[0], row[1], row[2], as_utc(row[3]))

    def dossiers(self) -> list[Dossier]:
        rows = self._q(
            "SELECT canonical_key, dossier_text, last_fact_id, created_at FROM people_dossiers "
            "ORDER BY canonical_key"
        ).fetchall()
        return [Dossier(r[0], r[1], r[2], as_utc(r[3])) for r in rows]

    def delete_dossiers(self, keys: Iterable[str]) -> int:
        """Delete these subjects' dossiers; returns how many rows existed."""
        wanted = sorted(set(keys))
        if not wanted:
            return 0
        with self.transaction():
            return len(self._delete_dossiers(wanted))

    def _delete_dossiers(self, keys: list[str]) -> list[str]:
        if not keys:
            return []
        rows = self._q(
            "DELETE FROM people_dossiers WHERE canonical_key IN (SELECT unnest(?)) RETURNING canonical_key",
            [keys],
        ).fetchall()
        return [row[0] for row in rows]

    # ----------------------------------------------------------------- reflections

    def append_reflection(
        self,
        *,
        channel_id: int | None,
        text: str,
        cited_turn_ids: Iterable[int],
        cited_fact_ids: Iterable[int],
        last_turn_id: int,
        last_fact_id: int,
        now: Any = None,
    ) -> Reflection:
        """Store a reflection. It must cite at least one turn or fact (uncited ones are dropped upstream)."""
        (reflection,) = self.append_reflections(
            [(text, cited_turn_ids, cited_fact_ids)], channel_id=channel_id,
            last_turn_id=last_turn_id, last_fact_id=last_fact_id, now=now,
        )
        return reflection

    def append_reflections(
        self,
        rows: Iterable[tuple[str, Iterable[int], Iterable[int]]],
        *,
        channel_id: int | None,
        last_turn_id: int,
        last_fact_id: int,
        now: Any = None,
    ) -> list[Reflection]:
        """`append_reflection` for one window's ``(text, cited turn ids, cited fact ids)`` rows, in order.

        Every row is checked first; then two statements (the ids, one INSERT) for all of them.
        """
        channel = _opt_int(channel_id, "channel_id")
        turn_wm = _int(last_turn_id, "last_turn_id", minimum=0)
        fact_wm = _int(last_fact_id, "last_fact_id", minimum=0)
        checked = []
        for text, cited_turn_ids, cited_fact_ids in rows:
            body = _text(text, "reflection text")
            turns = _ids(cited_turn_ids, "cited_turn_ids")
            facts = _ids(cited_fact_ids, "cited_fact_ids")
            if not turns and not facts:
                raise ValueError("a reflection must cite at least one turn or fact")
            checked.append((body, turns, facts))
        if not checked:
            return []
        at = now_or(now)
        with self.transaction():
            ids = self._next_ids("reflections_id_seq", len(checked))
            self._q(
                "INSERT INTO reflections SELECT unnest(?::BIGINT[]), ?, unnest(?::VARCHAR[]), unnest(?::BIGINT[][]), "
                "unnest(?::BIGINT[][]), ?, ?, ?",
                [ids, channel, [c[0] for c in checked], [list(c[1]) for c in checked], [list(c[2]) for c in checked],
                 turn_wm, fact_wm, at],
            )
        return [Reflection(i, channel, body, turns, facts, turn_wm, fact_wm, at) for i, (body, turns, facts) in zip(ids, checked)]

    def recent_reflections(self, channel_id: int | None = None, limit: int = 10) -> list[Reflection]:
        """Newest first. With a channel: that channel's rows plus channel-agnostic (NULL) ones."""
        limit = _int(limit, "limit")
        if limit <= 0:
            return []
        sql = _REFLECTION_SELECT
        params: list[Any] = []
        if channel_id is not None:
            sql += " WHERE channel_id = ? OR channel_id IS NULL"
            params.append(_int(channel_id, "channel_id"))
        sql += f" ORDER BY id DESC LIMIT {limit}"
        return [_reflection(row) for row in self._q(sql, params).fetchall()]

    def all_reflections(self) -> list[Reflection]:
        """Every reflection, ascending by id."""
        return [_reflection(row) for row in self._q(f"{_REFLECTION_SELECT} ORDER BY id").fetchall()]

    # ----------------------------------------------------------------- embeddings

    def set_fact_embedding(self, fact_id: int, model: str, vector: Iterable[float], *, now: Any = None) -> None:
        """Upsert the vector of ``fact_id`` under ``model`` (a new dim simply replaces the old)."""
        fid = _int(fact_id, "fact_id")
        values = _checked_vector(model, "fact", fid, vector)
        at = now_or(now)
        with self.transaction():
            if not self._q("SELECT 1 FROM facts WHERE id = ?", [fid]).fetchone():
                raise ValueError(f"cannot embed unknown fact id={fid}")
            self._q(
                "INSERT OR REPLACE INTO fact_embeddings VALUES (?, ?, ?, ?, ?)",
                [fid, model, len(values), values, at],
            )

    def embeddings_for(self, model: str, fact_ids: Iterable[int]) -> dict[int, list[float]]:
        return self._vectors("fact_embeddings", "fact_id", model, fact_ids)

    def _vectors(self, table: str, id_column: str, model: str, ids: Iterable[int]) -> dict[int, list[float]]:
        wanted = list(_ids(ids, id_column + "s"))
        if not wanted:
            return {}
        rows = self._q(
            f"SELECT {id_column}, vector FROM {table} WHERE model = ? AND {id_column} IN (SELECT unnest(?))",
            [model, wanted],
        ).fetchall()
        return {key: list(vector) for key, vector in rows}

    def unembedded_facts(self, model: str, limit: int, *, now: Any = None) -> list[Fact]:
        """Current facts (not retired, not expired) with no vector under ``model``, ascending."""
        limit = _int(limit, "limit")
        if limit <= 0:
            return []
        where, params = FactView.of(now=now).sql()
        return self._facts(
            f"{where} AND NOT EXISTS (SELECT 1 FROM fact_embeddings e WHERE e.fact_id = f.id AND e.model = ?)",
            [*params, model],
            limit=limit,
        )

    def set_turn_embeddings(self, model: str, vectors: Iterable[tuple[int, Iterable[float]]], *, now: Any = None,
                            table: str = "turn_embeddings") -> int:
        """Upsert ``(turn_id, vector)`` rows under ``model`` in one transaction; returns the count.

        ``table`` is one of ``TURN_VECTOR_TABLES``: the turn's own vector, or its
        context window's (projector ``turn_window_embedding``).

        Turns live in turns.db, so ids are not checked against it here; the
        projector only passes ids it just read from the turn log. Every row is
        validated before anything is written.
        """
        table = _turn_vector_table(table)
        rows = []
        for turn_id, vector in vectors:
            tid = _int(turn_id, "turn_id", minimum=1)
            values = _checked_vector(model, "turn", tid, vector)
            rows.append((tid, model, len(values), values))
        if not rows:
            return 0
        at = now_or(now)
        with self.transaction():
            self._q(f"DELETE FROM {table} WHERE model = ? AND turn_id IN (SELECT unnest(?))",
                    [model, [r[0] for r in rows]])
            # One statement: parallel lists unnested side by side (executemany is a round trip per row).
            self._q(f"INSERT INTO {table} SELECT unnest(?::BIGINT[]), ?, unnest(?::INTEGER[]), "
                    "unnest(?::FLOAT[][]), ?",
                    [[r[0] for r in rows], model, [r[2] for r in rows], [r[3] for r in rows], at])
        return len(rows)

    def delete_turn_embeddings(self, turn_ids: Iterable[int], *, table: str = "turn_embeddings") -> int:
        """Remove every model's vector of these turns (deleted turns must not be retrievable)."""
        table = _turn_vector_table(table)
        wanted = list(_ids(turn_ids, "turn_ids"))
        if not wanted:
            return 0
        with self.transaction():
            count = self._q(f"SELECT count(*) FROM {table} WHERE turn_id IN (SELECT unnest(?))", [wanted]).fetchone()[0]
            self._q(f"DELETE FROM {table} WHERE turn_id IN (SELECT unnest(?))", [wanted])
        return int(count)

    def turn_embeddings_for(self, model: str, turn_ids: Iterable[int], *,
                            table: str = "turn_embeddings") -> dict[int, list[float]]:
        return self._vectors(_turn_vector_table(table), "turn_id", model, turn_ids)

    def turn_embedding_count(self, model: str, *, table: str = "turn_embeddings") -> int:
        table = _turn_vector_table(table)
        return int(self._q(f"SELECT count(*) FROM {table} WHERE model = ?", [model]).fetchone()[0])

    # ----------------------------------------------------------------- watermarks

    def _watermark_rows(self) -> dict[str, Watermark]:
        """Every watermark row, read once and then kept in step by this store's own writes.

        A step asks for watermarks ~15 times per familiar (each projector its own and
        those it waits on) and sets ~5; one read instead of a statement each. Only
        this store writes the table while it is open (one writer per file), and the
        copy is dropped whenever that could be wrong: a rolled-back transaction,
        `drop_rows`, or SQL run through the raw `conn`.
        """
        if self._marks is None:
            rows = self._q("SELECT projector, turn_id, fact_id, change_seq, updated_at FROM watermarks").fetchall()
            self._marks = {r[0]: Watermark(r[0], r[1] or 0, r[2] or 0, r[3] or 0, as_utc(r[4])) for r in rows}
        return self._marks

    def get_watermark(self, projector: str) -> Watermark:
        """How far ``projector`` has read; all zeros (and no time) when it never ran."""
        name = _projector_name(projector)
        return self._watermark_rows().get(name) or Watermark(name)

    def watermarks(self) -> list[Watermark]:
        """Every projector's watermark, by projector name."""
        marks = self._watermark_rows()
        return [marks[name] for name in sorted(marks)]

    def serving_watermark(self) -> dict:
        """What a serving snapshot published now is in step with: every projector's
        watermark and the newest fact id (recorded in the snapshot's manifest)."""
        marks = {
            m.projector: {"turn_id": int(m.turn_id), "fact_id": int(m.fact_id), "change_seq": int(m.change_seq)}
            for m in self.watermarks()
        }
        return {"projectors": marks, "latest_fact_id": self.latest_fact_id()}

    def set_watermark(
        self,
        projector: str,
        *,
        turn_id: int | None = None,
        fact_id: int | None = None,
        change_seq: int | None = None,
        now: Any = None,
    ) -> Watermark:
        """Set the given axes of ``projector``'s watermark; axes left as None keep their value."""
        name = _projector_name(projector)
        given = {
            axis: _int(value, axis, minimum=0)
            for axis, value in (("turn_id", turn_id), ("fact_id", fact_id), ("change_seq", change_seq))
            if value is not None
        }
        if not given:
            raise ValueError("set_watermark needs at least one of turn_id, fact_id, change_seq")
        at = now_or(now)
        with self.transaction():
            marks = self._watermark_rows()
            prior = marks.get(name)
            base = prior or Watermark(name)
            mark = Watermark(
                name,
                given.get("turn_id", base.turn_id),
                given.get("fact_id", base.fact_id),
                given.get("change_seq", base.change_seq),
                at,
            )
            # An in-place UPDATE of a known row costs a third of INSERT OR REPLACE (a delete and an insert).
            if prior is None:
                self._q("INSERT INTO watermarks VALUES (?, ?, ?, ?, ?)",
                        [mark.projector, mark.turn_id, mark.fact_id, mark.change_seq, at])
            else:
                self._q("UPDATE watermarks SET turn_id = ?, fact_id = ?, change_seq = ?, updated_at = ? WHERE projector = ?",
                        [mark.turn_id, mark.fact_id, mark.change_seq, at, mark.projector])
            marks[name] = mark
        return mark

    # ----------------------------------------------------------------- rebuilds and comparison

    def drop_rows(
        self,
        *,
        watermarks: Iterable[str],
        tables: Iterable[str] = (),
        sequences: Iterable[str] = (),
        before: Iterable[Callable[["ProjectionStore"], None]] = (),
    ) -> None:
        """Delete projection rows so they rebuild from turns, in one transaction.

        Runs each of `before`, empties `tables` in the order given (dependants
        first), restarts `sequences` at 1 and deletes the `watermarks` rows.
        What each projection drops is declared by its projector
        (`familiar_pipeline.projectors.registry.drop_projection` resolves it).
        """
        tables, sequences, watermarks = list(tables), list(sequences), list(watermarks)
        unknown = [t for t in tables if t not in store_schema.TABLE_KEYS or t in ("watermarks", "schema_version")]
        if unknown:
            raise ValueError(f"cannot drop table(s) {', '.join(unknown)}; known: {', '.join(store_schema.TABLE_KEYS)}")
        bad = [q for q in sequences if not _SEQUENCE.fullmatch(q)]
        if bad:
            raise ValueError(f"invalid sequence name(s) {', '.join(map(repr, bad))}")
        with self.transaction():
            for step in before:
                step(self)
            for table in tables:
                self._q(f'DELETE FROM "{table}"')
            for sequence in sequences:
                self._q(f"CREATE OR REPLACE SEQUENCE {sequence} START 1")
            self._q("DELETE FROM watermarks WHERE projector IN (SELECT unnest(?))", [watermarks])
            self._marks = None

    def unretire_all(self) -> None:
        """Make every retired fact current again, and delete the dossiers of their subjects.

        Un-retiring changes what is current for those subjects, so their dossiers
        go, exactly as retiring the facts did.
        """
        with self.transaction():
            keys = [
                row[0]
                for row in self._q(
                    "SELECT DISTINCT s.canonical_key FROM fact_subjects s JOIN facts f ON f.id = s.fact_id "
                    "WHERE f.superseded_at IS NOT NULL"
                ).fetchall()
            ]
            self._delete_dossiers(keys)
            self._q("UPDATE facts SET superseded_at = NULL, superseded_by = NULL WHERE superseded_at IS NOT NULL")

    def table_rows(self, table: str, *, exclude: Iterable[str] = ()) -> list[tuple]:
        """Every row of ``table`` in key order, for table-by-table comparisons.

        ``exclude`` leaves columns out, e.g. ``SYSTEM_TIME_COLUMNS`` when
        comparing a rebuild with an incremental build made at other times.
        """
        if table not in store_schema.TABLE_KEYS:
            raise ValueError(f"unknown table {table!r}; known: {', '.join(store_schema.TABLE_KEYS)}")
        columns = [row[0] for row in self._q(f'DESCRIBE "{table}"').fetchall()]
        dropped = set(exclude)
        unknown = dropped - set(columns) - set(SYSTEM_TIME_COLUMNS)
        if unknown:
            raise ValueError(f"{table} has no column(s) {', '.join(sorted(unknown))}")
        kept = [c for c in columns if c not in dropped]
        order = ", ".join(f'"{c}"' for c in store_schema.TABLE_KEYS[table])
        select = ", ".join(f'"{c}"' for c in kept)
        return [tuple(row) for row in self._q(f'SELECT {select} FROM "{table}" ORDER BY {order}').fetchall()]


# The tables holding one vector per (turn, model): a turn's own text, and its context window's.
TURN_VECTOR_TABLES = ("turn_embeddings", "turn_window_embeddings")


def _turn_vector_table(table: str) -> str:
    if table not in TURN_VECTOR_TABLES:
        raise ValueError(f"unknown turn vector table {table!r}; known: {', '.join(TURN_VECTOR_TABLES)}")
    return table
