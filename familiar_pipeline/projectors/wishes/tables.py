"""The standing wishes' table (`wishes`), its record, and the one definition of which wishes are current.

One row per wish a person stated in one turn, on one point (``detect.py``). Validity is
kept in the style of Graphiti's edges and of the facts (`facts/tables.py`): ``valid_from``
is when it was said (the turn's time); a newer wish by the same person, in the same scope,
on the same point retires it: ``retired_at`` is the newer wish's ``valid_from`` and
``retired_by`` its id. Retirement is a pure function of the rows (`retire_sql`), so a
deleted newer wish brings the older one back, and a rebuild equals the incremental build.

Which rows a read sees is a :class:`WishView`: **current** (``retired_at IS NULL``), or every
row held (``/memory export``). :meth:`WishView.admits` states the rule over one record,
:meth:`WishView.sql` and :meth:`WishView.arrow_mask` are its store and snapshot forms.
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
from familiar_pipeline.storage.tables import Index, Provenance, Table, col
from familiar_pipeline.storage.times import now_or

MAX_CHARS = 200  # a wish's text as kept, at most (cut at a word; the knob `max_chars` defaults to it)


@dataclass(frozen=True)
class StandingWish:
    """A person's instruction or preference for the familiar, from one of their turns (module doc)."""

    id: int = col("BIGINT")
    person_key: str = col("VARCHAR")
    point: str = col("VARCHAR")  # what it is about: "address", "length", "topic:ex", ... (detect.point_of)
    text: str = col("VARCHAR", prose=True)  # the sentence as said, trimmed
    source_turn_ids: tuple[int, ...] = col("BIGINT[]")
    channel_id: int = col("BIGINT")
    valid_from: datetime = col("TIMESTAMPTZ")  # when it was said
    retired_at: datetime | None = col("TIMESTAMPTZ", nullable=True)  # the newer wish's valid_from
    retired_by: int | None = col("BIGINT", nullable=True)  # the newer wish on the same point
    created_at: datetime = col("TIMESTAMPTZ", system_time=True)
    scope: str = col("VARCHAR", default=FAMILIAR_WIDE)

    @property
    def current(self) -> bool:
        return self.retired_at is None


WISHES = Table(
    "wishes",
    StandingWish,
    key=("id",),
    sequence="wishes_id_seq",
    indexes=(Index("wishes_person_idx", "person_key"),),
    # A wish rests on the turn that said it: an edit or a deletion removes it (the projector then
    # reads an edited turn again, and brings back the wish the removed one had retired).
    provenance=Provenance(turns=("source_turn_ids",)),
    description="Standing wishes: instructions and preferences people addressed to the familiar, one per "
                "person, scope and point current (projector standing_wish).",
)


@dataclass(frozen=True)
class WishView:
    """Which wishes a read sees: the current ones, or (``include_retired``) every row held."""

    include_retired: bool = False

    def admits(self, wish: StandingWish) -> bool:
        return self.include_retired or wish.retired_at is None

    def sql(self, alias: str = "t") -> str:
        return "TRUE" if self.include_retired else f"{alias}.retired_at IS NULL"

    def arrow_mask(self, table: pa.Table) -> Any:
        if self.include_retired:
            return pa.array([True] * table.num_rows, pa.bool_())
        return pc.is_null(table["retired_at"])


CURRENT = WishView()


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class WishDraft:
    """A wish to store: who said it, on what point, in which turn, where and when."""

    person_key: str
    point: str
    text: str
    turn_id: int
    channel_id: int
    valid_from: datetime
    scope: str


def insert_wishes(store: ProjectionStore, drafts: Iterable[WishDraft], *, now: Any = None) -> list[int]:
    """Store the drafts (checked first, then one INSERT); their ids. Retire with `retire` after."""
    checked = []
    for d in drafts:
        point = values.text(d.point, "wish point")
        checked.append((check_key(d.person_key, "wish person_key"), point, values.text(d.text, "wish text"),
                        [values.as_int(d.turn_id, "turn_id", minimum=1)], values.as_int(d.channel_id, "channel_id"),
                        d.valid_from, values.scope(d.scope)))
    if not checked:
        return []
    ids = store.next_ids("wishes_id_seq", len(checked))
    columns = list(zip(*checked))
    store.sql(
        "INSERT INTO wishes SELECT unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
        "unnest(?::VARCHAR[]), unnest(?::BIGINT[][]), unnest(?::BIGINT[]), unnest(?::TIMESTAMPTZ[]), NULL, NULL, ?, "
        "unnest(?::VARCHAR[])",
        [ids, list(columns[0]), list(columns[1]), list(columns[2]), list(columns[3]), list(columns[4]),
         list(columns[5]), now_or(now), list(columns[6])],
    )
    return ids


def delete_resting_on(store: ProjectionStore, turn_ids: Iterable[int]) -> list[tuple[str, str, str]]:
    """Delete the wishes said in these turns; the (person, scope, point) groups they were in."""
    wanted = list(values.ids(turn_ids, "turn_ids"))
    if not wanted:
        return []
    return [tuple(r) for r in store.sql(
        "DELETE FROM wishes WHERE list_has_any(source_turn_ids, ?::BIGINT[]) RETURNING person_key, scope, point",
        [wanted]).fetchall()]


def said_points(store: ProjectionStore, turn_ids: Iterable[int]) -> set[tuple[str, int, str]]:
    """(person, turn id, point) of the wishes already stored from these turns."""
    wanted = sorted(set(values.ids(turn_ids, "turn_ids")))
    if not wanted:
        return set()
    return {(person, int(turn), point) for person, turn, point in store.sql(
        "SELECT person_key, unnest(source_turn_ids), point FROM wishes "
        "WHERE list_has_any(source_turn_ids, ?::BIGINT[])", [wanted]).fetchall()}


def retire(store: ProjectionStore, groups: Iterable[tuple[str, str, str]] | None = None) -> int:
    """Set each wish's retirement from the rows of its (person, scope, point) group: retired by the
    next wish said after it, current when none is. ``groups`` None: every group. How many rows changed."""
    wanted = sorted(set(groups)) if groups is not None else None
    if wanted == []:
        return 0
    only = "" if wanted is None else (
        " WHERE (person_key, scope, point) IN (SELECT (unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
        "unnest(?::VARCHAR[])))")
    params = [] if wanted is None else [[g[0] for g in wanted], [g[1] for g in wanted], [g[2] for g in wanted]]
    return len(store.sql(
        "WITH ordered AS (SELECT id, lead(id) OVER w AS next_id, lead(valid_from) OVER w AS next_from FROM wishes"
        f"{only} WINDOW w AS (PARTITION BY person_key, scope, point ORDER BY valid_from, id)) "
        "UPDATE wishes SET retired_by = o.next_id, retired_at = o.next_from FROM ordered o "
        "WHERE wishes.id = o.id AND (wishes.retired_by IS DISTINCT FROM o.next_id "
        "OR wishes.retired_at IS DISTINCT FROM o.next_from) RETURNING wishes.id", params).fetchall())


def forget_person(store: ProjectionStore, key: str, scope: str | None) -> set[int]:
    """Remove the wishes ``key`` stated (in ``scope``; None: everywhere); the turns they rested on.

    A wish rests on its speaker's own turn, so an erasure of their turns removes it anyway
    (its provenance); this also covers a wish whose turn is not among the erased ones."""
    where_clause, params = "person_key = ?", [key]
    if scope is not None:
        where_clause, params = where_clause + " AND scope = ?", [key, scope]
    rows = store.sql(f"DELETE FROM wishes WHERE {where_clause} RETURNING source_turn_ids", params).fetchall()
    return {int(t) for (turns,) in rows for t in turns}


def all_wishes(store: ProjectionStore) -> list[StandingWish]:
    """Every stored wish, ascending by id."""
    return store.rows(WISHES)


# --------------------------------------------------------------------------- the serving snapshot


def wishes_of(source: Any, person: str, scopes: Iterable[str] | None, view: WishView = CURRENT) -> list[StandingWish]:
    """The person's wishes in ``scopes`` (None: in every scope) that ``view`` admits, from a serving
    snapshot (or a reader's current one), newest first. Empty when the snapshot has no wishes table."""
    snap = source.current()
    try:
        table = snap.table(WISHES.name)
    except KeyError:
        return []
    if table.num_rows == 0:
        return []
    mask = pc.equal(table["person_key"], pa.scalar(person, pa.string()))
    if scopes is not None:
        wanted = pa.array(sorted(set(scopes)), pa.string())
        mask = pc.and_(mask, pc.fill_null(pc.is_in(table["scope"], value_set=wanted), False))
    rows = snap.records(WISHES, where(table, pc.and_(mask, view.arrow_mask(table))))
    return sorted(rows, key=lambda w: (w.valid_from, w.id), reverse=True)
