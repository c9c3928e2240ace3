"""The projected rows as records, and the one definition of which facts a read sees.

The projection store (``store.py``, DuckDB) and the serving snapshot
(``snapshots.py``, Arrow) hand out the same frozen records defined here, so the
pipeline, the bot and the CLI never see two shapes of one row.

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
from familiar_pipeline.storage.times import as_utc, now_or

_ARROW_TS = pa.timestamp("us", tz="UTC")


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

    id: int
    channel_id: int | None
    text: str
    source_turn_ids: tuple[int, ...]
    subjects: tuple[Subject, ...]
    importance: int | None
    created_at: datetime  # system time: recorded
    superseded_at: datetime | None  # system time: retired (None while believed)
    superseded_by: int | None
    valid_from: datetime | None  # world time, inclusive
    valid_to: datetime | None  # world time, exclusive; None is open-ended

    @property
    def current(self) -> bool:
        """Not retired (system time). World-time expiry is part of a read's :class:`FactView`."""
        return self.superseded_at is None

    @property
    def subject_keys(self) -> tuple[str, ...]:
        return tuple(s.canonical_key for s in self.subjects)


@dataclass(frozen=True)
class Reflection:
    id: int
    channel_id: int | None
    text: str
    cited_turn_ids: tuple[int, ...]
    cited_fact_ids: tuple[int, ...]
    last_turn_id: int
    last_fact_id: int
    created_at: datetime


@dataclass(frozen=True)
class Summary:
    summary_text: str
    last_turn_id: int
    created_at: datetime


@dataclass(frozen=True)
class Dossier:
    canonical_key: str
    dossier_text: str
    last_fact_id: int
    created_at: datetime


@dataclass(frozen=True)
class Watermark:
    """How far one projector has read; all zeros (and no time) when it never ran."""

    projector: str
    turn_id: int = 0
    fact_id: int = 0
    change_seq: int = 0
    updated_at: datetime | None = None


# --------------------------------------------------------------------------- which facts a read sees


def validity_sql(alias: str, *, as_of: bool, include_superseded: bool = False, at: str = "?") -> str:
    """The SQL of a :class:`FactView` with the instant as the SQL expression ``at``:
    a ``?`` parameter for the store's reads, ``now()`` or a macro argument for
    the notebook views (``store_schema.NOTEBOOK_VIEWS``)."""
    ended = f"({alias}.valid_to IS NULL OR {alias}.valid_to > {at})"
    if as_of:
        return f"({alias}.valid_from IS NULL OR {alias}.valid_from <= {at}) AND {ended}"
    if include_superseded:
        return ended
    return f"{alias}.superseded_at IS NULL AND {ended}"



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

    def sql(self, alias: str = "f") -> tuple[str, list[Any]]:
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
