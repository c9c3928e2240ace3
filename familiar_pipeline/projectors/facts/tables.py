"""The facts' tables (`facts`, `fact_subjects`), their records, and the one definition of which facts a read sees.

The projection store (``store.py``, DuckDB) and the serving snapshot (``reads.py``,
Arrow) hand out the same frozen records defined here, so the pipeline, the bot and
the CLI never see two shapes of one row; the table declarations below generate the
DDL, the served Parquet schema and the row mapping from these records.

Facts are bi-temporal, in the style of Graphiti's entity edges:

* world time says when the statement holds: ``valid_from`` (inclusive) to
  ``valid_to`` (exclusive; NULL means open-ended);
* system time says when the store learnt it and when it stopped believing it:
  ``created_at`` (recorded) and ``superseded_at`` (retired by supersession,
  with ``superseded_by`` naming the replacement when there is one).

Which rows a read sees is a :class:`FactView`, and there are exactly three:

* **current at now** (the default): not retired and not expired,
  ``superseded_at IS NULL AND (valid_to IS NULL OR valid_to > now)``. A fact
  whose ``valid_from`` lies in the future is current: it was stated now.
* **live at now** (``include_superseded``): not expired, retired or not.
* **as of t**: the world-time slice, ``valid_from <= t < valid_to`` with NULL
  bounds open, retired rows included (an earlier belief is reconstructable).

:meth:`FactView.admits` states the rule over one record; :meth:`FactView.sql`
and :meth:`FactView.arrow_mask` are its two implementations (the store's SQL,
also rendered into the notebook views ``current_facts`` and ``facts_as_of``;
the snapshot's pyarrow compute). ``tests/test_records.py`` checks over random
bi-temporal rows that all three agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.storage.identity import check_key
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE
from familiar_pipeline.storage.tables import Column, Index, Internal, Provenance, Table, Through, col
from familiar_pipeline.storage.times import as_utc, now_or

_ARROW_TS = pa.timestamp("us", tz="UTC")
_FILL_SCOPE = f"'{FAMILIAR_WIDE}'"  # rows written before scopes were read familiar-wide (see `scopes`)
SUBJECTS_TYPE = "STRUCT(canonical_key VARCHAR, display_at_write VARCHAR)[]"
# A plain fact; a standing wish its subject addressed to the familiar ("call me Sam"), which the
# standing_wish projector pins in every reply to them (projectors/wishes/run.py).
FACT_KINDS = ("fact", "wish")


@dataclass(frozen=True)
class Subject:
    """Who a fact is about: a stable canonical key plus the name shown at write time."""

    canonical_key: str
    display_at_write: str

    def __post_init__(self) -> None:
        key = check_key(self.canonical_key, "subject key")
        if not isinstance(self.display_at_write, str):
            raise TypeError(
                f"display_at_write for {key} must be a string, got {type(self.display_at_write).__name__}"
            )


@lru_cache(maxsize=4096)
def stored_subject(key: str, display: str) -> Subject:
    """A subject read back from storage; the same few people recur, so they are shared."""
    return Subject(key, display)


@dataclass(frozen=True)
class Fact:
    """One extracted statement with its world-time validity and system-time lineage (see module doc)."""

    id: int = col("BIGINT")
    channel_id: int | None = col("BIGINT", nullable=True)
    text: str = col("VARCHAR", prose=True)
    source_turn_ids: tuple[int, ...] = col("BIGINT[]")
    # Stored in fact_subjects (in mention order); served as a list joined from there.
    subjects: tuple[Subject, ...] = col(SUBJECTS_TYPE, stored=False, serve_sql="COALESCE(s.subjects, [])")
    importance: int | None = col("TINYINT", nullable=True, serve_type="INTEGER", check="importance BETWEEN 1 AND 10")
    created_at: datetime = col("TIMESTAMPTZ", system_time=True)  # system time: recorded
    superseded_at: datetime | None = col("TIMESTAMPTZ", nullable=True, system_time=True)  # retired (None: believed)
    superseded_by: int | None = col("BIGINT", nullable=True)
    valid_from: datetime | None = col("TIMESTAMPTZ", nullable=True)  # world time, inclusive
    valid_to: datetime | None = col("TIMESTAMPTZ", nullable=True)  # world time, exclusive; None is open-ended
    scope: str = col("VARCHAR", fill=_FILL_SCOPE, default=FAMILIAR_WIDE)
    # "fact", or "wish": its subject asked the familiar to keep doing something (FACT_KINDS).
    kind: str = col("VARCHAR", fill="'fact'", default="fact")  # checked on write (store.prepare); DuckDB adds no CHECK column

    @property
    def current(self) -> bool:
        """Not retired (system time). World-time expiry is part of a read's :class:`FactView`."""
        return self.superseded_at is None

    @property
    def subject_keys(self) -> tuple[str, ...]:
        return tuple(s.canonical_key for s in self.subjects)


@dataclass(frozen=True)
class FactSubject:
    """One subject of one fact, in the order the fact names them."""

    fact_id: int = col("BIGINT")
    canonical_key: str = col("VARCHAR")
    display_at_write: str = col("VARCHAR", prose=True)
    position: int = col("INTEGER")
    scope: str = col("VARCHAR", fill=_FILL_SCOPE)


# Subjects of fact `f` as an ordered list of structs; shared by the views.
_SUBJECTS_OF_F = f"""
    COALESCE(
        (SELECT list(struct_pack(canonical_key := s.canonical_key,
                                 display_at_write := s.display_at_write)
                     ORDER BY s.position)
         FROM fact_subjects s WHERE s.fact_id = f.id),
        []::{SUBJECTS_TYPE})
"""


def validity_sql(alias: str, *, as_of: bool, include_superseded: bool = False, at: str = "?") -> str:
    """The SQL of a :class:`FactView` with the instant as the SQL expression ``at``:
    a ``?`` parameter for the store's reads, ``now()`` or a macro argument for
    the notebook views."""
    ended = f"({alias}.valid_to IS NULL OR {alias}.valid_to > {at})"
    if as_of:
        return f"({alias}.valid_from IS NULL OR {alias}.valid_from <= {at}) AND {ended}"
    if include_superseded:
        return ended
    return f"{alias}.superseded_at IS NULL AND {ended}"


NOTEBOOK_VIEWS: dict[str, str] = {
    # Current truth at query time (FactView): not retired, not expired in world time.
    "current_facts": f"""
        CREATE OR REPLACE VIEW current_facts AS
        SELECT f.id, f.channel_id, f.text,
               {_SUBJECTS_OF_F} AS subjects,
               COALESCE((SELECT list(s.canonical_key ORDER BY s.position) FROM fact_subjects s
                         WHERE s.fact_id = f.id), []::VARCHAR[]) AS subject_keys,
               f.importance, f.source_turn_ids, f.created_at, f.valid_from, f.valid_to, f.scope, f.kind
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
               f.superseded_at, f.superseded_by, f.scope, f.kind
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
               f.superseded_at, f.superseded_by, f.scope, f.kind,
               (f.superseded_at IS NULL AND (f.valid_to IS NULL OR f.valid_to > now())) AS is_current
        FROM fact_subjects s JOIN facts f ON f.id = s.fact_id
    """,
}

FACTS = Table(
    "facts",
    Fact,
    key=("id",),
    sequence="facts_id_seq",
    provenance=Provenance(turns=("source_turn_ids",)),
    # Dedup at insert is one probe of an ART index, which DuckDB uses only for equality on one
    # column: hence the stored key (normalised text, newline, subject set); normalised text never
    # holds a newline. Columns that supersession updates carry no index, so those UPDATEs stay in place.
    internal=(
        Internal(Column("norm_text", "VARCHAR"), after="text"),
        Internal(Column("subject_set", "VARCHAR"), after="text"),
        Internal(Column("dedup_key", "VARCHAR"), after="text"),
    ),
    indexes=(Index("facts_dedup_key", "dedup_key"),),
    checks=("superseded_by IS NULL OR superseded_at IS NOT NULL",),
    # `facts` serves every row (retired and expired ones too: `as_of` reads and the `(stale)` flag
    # need them) with its subjects in write order; the dedup columns are store internals.
    serve_from=(
        "facts AS t LEFT JOIN (SELECT fact_id, list({'canonical_key': canonical_key, "
        "'display_at_write': display_at_write} ORDER BY position, canonical_key) AS subjects "
        "FROM fact_subjects GROUP BY fact_id) AS s ON s.fact_id = t.id"
    ),
    views=NOTEBOOK_VIEWS,
    description="Atomic attributed facts, bi-temporal (projector rich_note).",
)

FACT_SUBJECTS = Table(
    "fact_subjects",
    FactSubject,
    key=("fact_id", "canonical_key"),
    provenance=Provenance(through=(Through("fact_id", "facts"),)),
    indexes=(Index("fact_subjects_key", "canonical_key"), Index("fact_subjects_fact", "fact_id")),
    description="Who each fact is about, in mention order.",
)


# --------------------------------------------------------------------------- which facts a read sees


@dataclass(frozen=True)
class FactView:
    """One of the three read slices (module doc): ``at`` plus how to apply it.

    Build it with :meth:`of`, which maps the read API's arguments
    (``as_of``, ``include_superseded``, ``now``) to a view; ``as_of`` wins over
    ``include_superseded``.
    """

    at: datetime
    as_of: bool = False
    include_superseded: bool = False

    @classmethod
    def of(cls, *, as_of: Any = None, include_superseded: bool = False, now: Any = None) -> "FactView":
        if as_of is not None:
            return cls(as_utc(as_of, what="as_of"), as_of=True)
        return cls(now_or(now), include_superseded=bool(include_superseded))

    def admits(self, fact: Fact) -> bool:
        """The definition, over one record."""
        return self.admits_times(fact.superseded_at, fact.valid_from, fact.valid_to)

    def admits_times(
        self, superseded_at: datetime | None, valid_from: datetime | None, valid_to: datetime | None
    ) -> bool:
        not_ended = valid_to is None or valid_to > self.at
        if self.as_of:
            return (valid_from is None or valid_from <= self.at) and not_ended
        return not_ended and (self.include_superseded or superseded_at is None)

    def sql(self, alias: str = "t") -> tuple[str, list[Any]]:
        """The definition in DuckDB SQL over table alias ``alias``, with its parameters."""
        where = validity_sql(alias, as_of=self.as_of, include_superseded=self.include_superseded)
        return where, [self.at] * where.count("?")

    def arrow_mask(self, facts: pa.Table) -> pa.Array:
        """The definition in pyarrow compute over a served ``facts`` table (NULL never means true)."""
        at = pa.scalar(self.at, type=_ARROW_TS)
        valid_to = facts["valid_to"]
        mask = pc.or_kleene(pc.is_null(valid_to), pc.greater(valid_to, at))
        if self.as_of:
            valid_from = facts["valid_from"]
            starts = pc.or_kleene(pc.is_null(valid_from), pc.less_equal(valid_from, at))
            mask = pc.and_kleene(starts, mask)
        elif not self.include_superseded:
            mask = pc.and_kleene(pc.is_null(facts["superseded_at"]), mask)
        return pc.fill_null(mask, False)
