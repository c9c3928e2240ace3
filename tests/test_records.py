"""One definition of "current" and "as of": the store's SQL and the snapshot's Arrow agree with it.

Random bi-temporal rows (seeded, so a failure reproduces) are written through
the store, published as a serving snapshot, and read back both ways for many
random views; both must return exactly the rows ``FactView.admits`` accepts.
Times sit on a coarse hour grid so that query instants often fall exactly on a
``valid_from``/``valid_to`` bound, where a half-open slip would show.
"""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta, timezone

import pytest

from familiar_pipeline.storage.identity import check_key
from familiar_pipeline.projectors.facts.tables import Fact, FactView
from familiar_pipeline.storage.snapshots import SnapshotReader, publish_snapshot
from familiar_pipeline.projectors.facts.store import FactDraft
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.storage.times import as_utc, parse_instant, utc_text
from familiar_pipeline.projectors.facts import reads as fact_reads
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

UTC = timezone.utc
T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = ("discord:1", "discord:2", "ego:fam")
EST = timezone(timedelta(hours=-5))


def hour(n: int) -> datetime:
    return T0 + timedelta(hours=n)


def random_rows(store: ProjectionStore, rng: random.Random, count: int) -> None:
    """``count`` facts with random world-time bounds, some retired, some with an open start."""
    for n in range(count):
        start = rng.randint(0, 30)
        end = rng.choice([None, None, start + rng.randint(1, 12)])
        subjects = tuple(Subject(k, k.upper()) for k in rng.sample(KEYS, rng.randint(0, 2)))
        facts_db.append_fact(store,
            FactDraft(f"fact {n}", (n + 1,), subjects, valid_from=hour(start),
                      valid_to=None if end is None else hour(end)),
            now=hour(rng.randint(0, 20)),
            dedup=False,
        )
    ids = sorted(facts_db.all_fact_ids(store))
    for fact_id in rng.sample(ids, len(ids) // 3):
        supersede_db.supersede(store, [fact_id], None, now=hour(rng.randint(0, 40)))
    # Rows written before valid_from was always set have an open start.
    open_start = rng.sample(ids, len(ids) // 5)
    store.conn.execute("UPDATE facts SET valid_from = NULL WHERE id IN (SELECT unnest(?))", [open_start])


def random_view_args(rng: random.Random) -> dict:
    instant = hour(rng.randint(-2, 45))
    if rng.random() < 0.3:
        instant = instant.astimezone(EST)  # same instant, another offset
    kind = rng.choice(["current", "live", "as_of"])
    if kind == "as_of":
        return {"as_of": instant, "include_superseded": rng.random() < 0.5}  # as_of wins
    return {"now": instant, "include_superseded": kind == "live"}


@pytest.mark.parametrize("seed", range(6))
def test_sql_and_arrow_agree_with_the_definition_on_random_rows(tmp_path, seed):
    rng = random.Random(seed)
    store = ProjectionStore(None)
    try:
        random_rows(store, rng, 40)
        publish_snapshot(store.conn, tmp_path, store_watermark={}, durable=False)
        snapshot = SnapshotReader(tmp_path).current()
        every = facts_db.facts_by_ids(store, facts_db.all_fact_ids(store))
        assert fact_reads.facts_by_ids(snapshot, facts_db.all_fact_ids(store)) == every  # same records both ways
        assert any(f.valid_from is None for f in every) and any(not f.current for f in every)

        for _ in range(40):
            args = random_view_args(rng)
            view = FactView.of(**args)
            expected = [f for f in every if view.admits(f)]
            sql = facts_db.recent_facts(store, 10**6, **args)[::-1]
            arrow = fact_reads.recent_facts(snapshot, 10**6, args.get("as_of"), include_superseded=args["include_superseded"],
                                          now=args.get("now"))[::-1]
            assert sql == arrow == expected, args

            key = rng.choice(KEYS)
            about = [f for f in expected if key in f.subject_keys]
            assert facts_db.facts_for_subject(store, key, **args) == about, (key, args)
            assert fact_reads.facts_for_subject(snapshot, key, args.get("as_of"), include_superseded=args["include_superseded"],
                                              now=args.get("now")) == about, (key, args)

            if "now" in args and not args["include_superseded"]:
                assert facts_db.current_facts(store, now=args["now"]) == fact_reads.current_facts(snapshot, args["now"]) == expected
                some = rng.sample([f.id for f in every], 10)
                among = [f for f in expected if f.id in some]
                assert facts_db.current_facts(store, now=args["now"], ids=some) == among
                assert fact_reads.current_facts(snapshot, args["now"], ids=some) == among
    finally:
        store.close()


def test_the_three_views_on_one_fact():
    """The definition itself, spelled out on a retired fact valid [10:00, 14:00)."""
    fact = Fact(1, None, "x", (), (), None, hour(0), hour(12), None, hour(10), hour(14))
    assert not FactView.of(now=hour(11)).admits(fact)  # retired: not current
    assert FactView.of(now=hour(11), include_superseded=True).admits(fact)  # live: not expired yet
    assert not FactView.of(now=hour(14), include_superseded=True).admits(fact)  # valid_to is exclusive
    assert FactView.of(as_of=hour(10)).admits(fact)  # valid_from is inclusive, retired rows included
    assert not FactView.of(as_of=hour(14)).admits(fact)
    assert not FactView.of(as_of=hour(9), include_superseded=True).admits(fact)  # as_of wins
    assert FactView.of(as_of="2026-01-01T06:00:00-05:00").admits(fact)  # 11:00 UTC


def test_one_utc_converter():
    assert as_utc("2025-03-01T10:00:00-05:00") == datetime(2025, 3, 1, 15, tzinfo=UTC)
    assert as_utc(date(2025, 3, 1)) == datetime(2025, 3, 1, tzinfo=UTC)
    assert as_utc(datetime(2025, 3, 1, 15)).tzinfo is UTC  # naive is UTC
    assert utc_text("2025-03-01T10:00:00-05:00") == "2025-03-01T15:00:00.000000+00:00"
    with pytest.raises(ValueError, match="created_at: 'soon' is not an ISO-8601"):
        as_utc("soon", what="created_at")
    with pytest.raises(TypeError, match="created_at must be a datetime"):
        utc_text(17, what="created_at")
    # The lenient reading for model and operator text: nothing unreadable raises.
    assert parse_instant(" 2025-03-01 ") == datetime(2025, 3, 1, tzinfo=UTC)
    assert parse_instant("2025-03-01T15:00:00Z") == datetime(2025, 3, 1, 15, tzinfo=UTC)
    assert parse_instant("2025-03-01T10:00") == datetime(2025, 3, 1, 10, tzinfo=UTC)
    assert [parse_instant(v) for v in (None, "", "  ", "next week", 20250301)] == [None] * 5


@pytest.mark.parametrize("bad", [None, 42, "", "discord", "discord:", ":1", "discord: 1", "a:b\tc", "x:\ud800"])
def test_one_canonical_key_check(bad):
    with pytest.raises(ValueError, match="subject key"):
        check_key(bad, "subject key")
    assert check_key("discord:1234") == "discord:1234" and check_key("ego:fam") == "ego:fam"


def test_reads_take_a_reader_or_one_of_its_snapshots(tmp_path):
    """Each table's reads accept the reader (its snapshot current at the call) or a pinned snapshot."""
    reader = SnapshotReader(tmp_path / "nothing-yet")
    assert reader.current().current() is reader.current()
    assert fact_reads.current_facts(reader) == fact_reads.current_facts(reader.current()) == []
    assert reader.table("facts").num_rows == 0 and reader.watermark("rich_note").turn_id == 0
