"""The turn log: schema, validation, edits/deletions, identity, migrations, concurrency."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from familiar_pipeline.storage.turns import (
    MAX_CONTENT_BYTES,
    SCHEMA_VERSION,
    Participant,
    Turn,
    TurnLog,
    TurnLogError,
    TurnLogUnavailable,
)

UTC = timezone.utc
T0 = datetime(2026, 6, 13, 10, 0, 0, tzinfo=UTC)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "fam" / "turns.db"


@pytest.fixture
def log(db_path: Path):
    with TurnLog(db_path) as opened:
        yield opened


def say(log: TurnLog, content: str = "hello", *, channel: int = 10, author: str | None = "discord:1", **kw) -> Turn:
    role = kw.pop("role", "user" if author else "assistant")
    return log.append_turn(channel_id=channel, role=role, content=content, author_key=author, **kw)


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path)


def assert_file_healthy(path: Path, expected_contents: list[str]) -> None:
    conn = raw(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [r[0] for r in conn.execute("SELECT content FROM turns ORDER BY id")] == expected_contents
    finally:
        conn.close()


# --------------------------------------------------------------------------- opening


def test_open_creates_parents_schema_and_wal(tmp_path: Path):
    path = tmp_path / "a" / "b" / "turns.db"
    with TurnLog(str(path)) as log:
        assert log.count() == 0
        assert log.latest_id() == 0
        assert log.latest_change_seq() == 0
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"turns", "turn_changes", "participants", "guild_nicks", "turn_mentions"} <= tables
    conn.close()


def test_append_round_trips_every_field_and_persists(db_path: Path):
    with TurnLog(db_path) as log:
        written = log.append_turn(
            channel_id=10, guild_id=99, role="user", content="hi there", author_key="discord:1",
            author_display="Ada", mode="full_rp", platform_message_id=555, reply_to_message_id="554",
            created_at=T0,
        )
        assert written.id > 0
        assert written.platform_message_id == "555"
        assert written.created_at == T0
        assert not written.deleted and written.revision == 0
    with TurnLog(db_path) as reopened:
        assert reopened.turns_by_ids([written.id]) == [written]


def test_ids_strictly_increase_across_channels(log: TurnLog):
    ids = [say(log, f"m{i}", channel=10 + i % 3).id for i in range(6)]
    assert ids == sorted(ids) and len(set(ids)) == 6
    assert log.latest_id() == ids[-1]
    assert log.latest_id(channel_id=11) == ids[4]
    assert log.latest_id(channel_id=12345) == 0


def test_turn_label_falls_back_from_display_to_key_to_role(log: TurnLog):
    assert say(log, author_display="Ada").label == "Ada"
    assert say(log).label == "discord:1"
    assert say(log, author=None).label == "assistant"


def test_context_manager_closes_and_closed_log_errors_clearly(db_path: Path):
    with TurnLog(db_path) as log:
        say(log)
    with pytest.raises(TurnLogError, match="closed"):
        log.count()
    log.close()  # idempotent


def test_not_a_database_is_rejected_and_left_untouched(tmp_path: Path):
    path = tmp_path / "turns.db"
    path.write_bytes(b"this is not sqlite at all, just some notes" * 50)
    before = path.read_bytes()
    with pytest.raises(TurnLogError, match="not a usable SQLite"):
        TurnLog(path)
    assert path.read_bytes() == before


# --------------------------------------------------------------------------- timestamps


def test_timestamps_are_normalised_to_fixed_width_utc(db_path: Path):
    with TurnLog(db_path) as log:
        naive = say(log, "naive", created_at=datetime(2026, 6, 13, 10, 0, 0))
        plus_two = say(log, "plus two", created_at=datetime(2026, 6, 13, 11, 30, tzinfo=timezone(timedelta(hours=2))))
        minus_five = say(log, "minus five", created_at="2026-06-13T05:00:00.5-05:00")
        zulu = say(log, "zulu", created_at="2026-06-13T09:59:59Z")
        defaulted = say(log, "now")
    assert naive.created_at == T0
    assert plus_two.created_at == datetime(2026, 6, 13, 9, 30, tzinfo=UTC)
    assert minus_five.created_at == datetime(2026, 6, 13, 10, 0, 0, 500000, tzinfo=UTC)
    assert zulu.created_at.tzinfo is not None and zulu.created_at.utcoffset() == timedelta(0)
    assert abs(defaulted.created_at - datetime.now(UTC)) < timedelta(minutes=1)
    stored = [r[0] for r in raw(db_path).execute("SELECT created_at FROM turns ORDER BY created_at")]
    assert stored[:4] == [
        "2026-06-13T09:30:00.000000+00:00",
        "2026-06-13T09:59:59.000000+00:00",
        "2026-06-13T10:00:00.000000+00:00",
        "2026-06-13T10:00:00.500000+00:00",
    ]


def test_bad_timestamp_is_rejected(log: TurnLog):
    with pytest.raises(TurnLogError, match="not an ISO-8601"):
        say(log, created_at="yesterday-ish")
    with pytest.raises(TurnLogError, match="must be a datetime"):
        say(log, created_at=1718272800)
    assert log.count() == 0


# --------------------------------------------------------------------------- content and bad input


def test_awkward_content_round_trips_intact(db_path: Path):
    big = ("0123456789abcdef" * 6400) + "ünïcødé 🐈"  # ~100 KB
    with TurnLog(db_path) as log:
        empty = say(log, "")
        nul = say(log, "before\x00after\x00")
        large = say(log, big)
    with TurnLog(db_path, readonly=True) as reader:
        got = {t.id: t.content for t in reader.turns_after(0)}
    assert got == {empty.id: "", nul.id: "before\x00after\x00", large.id: big}


def test_content_size_limit_counts_utf8_bytes(log: TurnLog):
    say(log, "x" * MAX_CONTENT_BYTES)  # exactly 1 MiB is fine
    with pytest.raises(TurnLogError, match="1 MiB"):
        say(log, "é" * (MAX_CONTENT_BYTES // 2 + 1))  # fewer characters, but over 1 MiB of UTF-8
    assert log.count() == 1


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"role": "moderator"}, "role must be one of"),
        ({"role": None}, "role must be one of"),
        ({"channel_id": True}, "channel_id must be an integer"),
        ({"channel_id": "10"}, "channel_id must be an integer"),
        ({"channel_id": 10.0}, "channel_id must be an integer"),
        ({"channel_id": 2**64}, "64-bit"),
        ({"content": None}, "content must be a string"),
        ({"content": b"bytes"}, "content must be a string"),
        ({"content": "half a pair \ud800 here"}, "surrogate"),
        ({"author_display": "Ada\udfff"}, "author_display contains a lone UTF-16 surrogate"),
        ({"guild_id": False}, "guild_id must be an integer"),
        ({"author_key": "Ada"}, "malformed author_key"),
        ({"author_key": "discord: 1"}, "malformed author_key"),
        ({"platform_message_id": ""}, "must not be empty"),
        ({"mentions": "discord:2"}, "not a single string"),
        ({"mentions": ["nobody"]}, "malformed mention key"),
    ],
)
def test_bad_input_is_rejected_without_damage(db_path: Path, bad: dict, match: str):
    args = {"channel_id": 10, "role": "user", "content": "fine", "author_key": "discord:1"}
    with TurnLog(db_path) as log:
        say(log, "kept one")
        say(log, "kept two")
        with pytest.raises(TurnLogError, match=match):
            log.append_turn(**{**args, **bad})
        assert log.count() == 2
        say(log, "still writable")
    assert_file_healthy(db_path, ["kept one", "kept two", "still writable"])


def test_turn_log_error_is_a_value_error():
    assert issubclass(TurnLogError, ValueError)


# --------------------------------------------------------------------------- bulk import


def test_append_turns_writes_all_in_order_with_mentions(log: TurnLog):
    rows = [
        {"channel_id": 1, "role": "user", "content": "hi @bo", "author_key": "discord:1", "mentions": ["discord:2"]},
        {"channel_id": 1, "role": "assistant", "content": "hello"},
        {"channel_id": 2, "role": "user", "content": "elsewhere", "author_key": "discord:2", "created_at": T0},
    ]
    turns = log.append_turns(rows)
    assert [t.content for t in turns] == ["hi @bo", "hello", "elsewhere"]
    assert [t.id for t in turns] == sorted(t.id for t in turns)
    assert log.turns_after(0) == turns
    assert log.mentions_for_turn(turns[0].id) == ["discord:2"]
    assert log.append_turns([]) == []


@pytest.mark.parametrize(
    "bad_row, match",
    [
        ({"channel_id": 1, "role": "user", "content": "\ud83d"}, r"row 1: content contains a lone"),
        ({"channel_id": 1, "role": "user", "content": "x", "colour": "red"}, r"row 1: unknown field\(s\) colour"),
        ({"channel_id": 1, "role": "user"}, r"row 1: .*content"),
        (["not", "a", "dict"], r"row 1: expected a dict"),
    ],
)
def test_append_turns_rejects_a_bad_row_before_writing_any(db_path: Path, bad_row, match: str):
    good = {"channel_id": 1, "role": "user", "content": "good"}
    with TurnLog(db_path) as log:
        say(log, "before")
        with pytest.raises(TurnLogError, match=match):
            log.append_turns([good, bad_row, good])
    assert_file_healthy(db_path, ["before"])


def test_failure_inside_the_transaction_rolls_back_the_whole_batch(db_path: Path):
    with TurnLog(db_path) as log:
        say(log, "before")
    conn = raw(db_path)  # a trigger lets the database itself refuse a row mid-batch
    conn.execute(
        "CREATE TRIGGER refuse_boom BEFORE INSERT ON turns WHEN NEW.content = 'boom' "
        "BEGIN SELECT RAISE(ABORT, 'boom refused'); END"
    )
    conn.commit()
    conn.close()
    with TurnLog(db_path) as log:
        with pytest.raises(TurnLogError, match="rolled back.*boom refused"):
            log.append_turns([{"channel_id": 1, "role": "user", "content": c} for c in ("a", "boom", "c")])
        with pytest.raises(TurnLogError, match="boom refused"):
            say(log, "boom")
        assert log.count() == 1
        say(log, "after")
    assert_file_healthy(db_path, ["before", "after"])


# --------------------------------------------------------------------------- edits and deletions


def test_edit_by_id_and_by_message_id_records_prior_text(log: TurnLog):
    first = say(log, "I live in Lyon", platform_message_id="m1")
    edited = log.record_edit(turn_id=first.id, new_content="I live in Paris", edited_at=T0)
    assert (edited.content, edited.revision, edited.edited_at) == ("I live in Paris", 1, T0)
    again = log.record_edit(platform_message_id="m1", new_content="I live in Nice")
    assert again.revision == 2
    assert log.turns_by_ids([first.id]) == [again]
    changes = log.changes_after(0)
    assert [(c.kind, c.turn_id, c.revision, c.prior_content) for c in changes] == [
        ("edit", first.id, 1, "I live in Lyon"),
        ("edit", first.id, 2, "I live in Paris"),
    ]
    assert changes[0].at == T0
    assert log.latest_change_seq() == changes[-1].seq


def test_edit_that_changes_nothing_is_not_a_change(log: TurnLog):
    turn = say(log, "same")
    assert log.record_edit(turn_id=turn.id, new_content="same") == turn
    assert log.latest_change_seq() == 0


def test_edit_and_delete_of_unknown_turn_return_none(log: TurnLog):
    assert log.record_edit(turn_id=42, new_content="x") is None
    assert log.record_deletion(platform_message_id="nope") is None
    assert log.latest_change_seq() == 0


def test_edit_and_delete_need_exactly_one_locator(log: TurnLog):
    turn = say(log, platform_message_id="m1")
    with pytest.raises(TurnLogError, match="exactly one"):
        log.record_edit(new_content="x")
    with pytest.raises(TurnLogError, match="exactly one"):
        log.record_deletion(turn_id=turn.id, platform_message_id="m1")
    with pytest.raises(TurnLogError, match="surrogate"):
        log.record_edit(turn_id=turn.id, new_content="\udc00")
    assert log.turns_by_ids([turn.id]) == [turn]


def test_deletion_tombstones_and_hides_by_default(log: TurnLog):
    a = say(log, "keep")
    b = say(log, "regret this", platform_message_id=777)
    c = say(log, "keep too")
    gone = log.record_deletion(platform_message_id=777, deleted_at=T0)
    assert gone.deleted and gone.deleted_at == T0 and gone.content == "regret this"
    assert [t.id for t in log.recent(10, 10)] == [a.id, c.id]
    assert [t.id for t in log.recent(10, 10, include_deleted=True)] == [a.id, b.id, c.id]
    assert [t.id for t in log.recent_cross_channel(10)] == [a.id, c.id]
    assert [t.id for t in log.turns_after(0)] == [a.id, b.id, c.id]  # projections see tombstones
    assert [t.id for t in log.turns_after(0, include_deleted=False)] == [a.id, c.id]
    assert log.count() == 3 and log.count(include_deleted=False) == 2
    # deleting again keeps the first tombstone; editing a deleted turn changes nothing
    assert log.record_deletion(turn_id=b.id) == gone
    assert log.record_edit(turn_id=b.id, new_content="sneaky") == gone
    assert [(c.kind, c.revision) for c in log.changes_after(0)] == [("delete", 0)]


def test_changes_after_is_a_cursor(log: TurnLog):
    turns = [say(log, f"t{i}") for i in range(4)]
    for t in turns:
        log.record_edit(turn_id=t.id, new_content=t.content + "!")
    log.record_deletion(turn_id=turns[0].id)
    all_changes = log.changes_after(0)
    assert [c.seq for c in all_changes] == sorted(c.seq for c in all_changes)
    assert log.changes_after(all_changes[1].seq, limit=2) == all_changes[2:4]
    assert log.changes_after(log.latest_change_seq()) == []


# --------------------------------------------------------------------------- reads


def test_recent_is_oldest_first_per_channel_with_limit_and_before(log: TurnLog):
    assert log.recent(10, 5) == []
    ids = [say(log, f"m{i}").id for i in range(5)]
    other = say(log, "other", channel=20)
    assert [t.id for t in log.recent(10, 3)] == ids[2:]
    assert [t.id for t in log.recent(10, 100)] == ids
    assert [t.id for t in log.recent(10, 2, before_id=ids[3])] == ids[1:3]
    assert [t.id for t in log.recent(20, 10)] == [other.id]
    assert log.recent(10, 0) == []


def test_recent_cross_channel_spans_channels(log: TurnLog):
    ids = [say(log, f"m{i}", channel=i % 3).id for i in range(6)]
    assert [t.id for t in log.recent_cross_channel(4)] == ids[2:]
    assert log.recent_cross_channel(0) == []


def test_turns_after_in_range_and_by_ids(log: TurnLog):
    ids = [say(log, f"m{i}").id for i in range(10)]
    assert [t.id for t in log.turns_after(ids[4])] == ids[5:]
    assert [t.id for t in log.turns_after(0, limit=3)] == ids[:3]
    assert log.turns_after(ids[-1]) == []
    assert [t.id for t in log.turns_in_range(ids[1], ids[4])] == ids[2:5]
    assert [t.id for t in log.turns_by_ids([ids[7], ids[2], ids[7], 999])] == [ids[2], ids[7]]
    assert log.turns_by_ids([]) == []
    with pytest.raises(TurnLogError, match="limit"):
        log.turns_after(0, limit=-1)


def test_by_id_lookups_take_large_id_lists(log: TurnLog):
    turns = log.append_turns([{"channel_id": 1, "role": "user", "content": str(i)} for i in range(2000)])
    wanted = [t.id for t in turns] + list(range(10**6, 10**6 + 40000))  # past SQLite's variable limit
    assert len(log.turns_by_ids(wanted)) == 2000
    assert len(log.mentions_for_turns(wanted)) == len(wanted)


def test_recent_distinct_authors(log: TurnLog):
    for key in ["discord:a", "discord:b", "discord:a", "discord:c"]:
        say(log, author=key)
    say(log, author=None)  # assistant
    say(log, author="discord:z", channel=99)
    assert log.recent_distinct_authors(10, 10) == ["discord:c", "discord:a", "discord:b"]
    assert log.recent_distinct_authors(10, 2) == ["discord:c", "discord:a"]
    assert log.recent_distinct_authors(10, 0) == []
    assert log.recent_distinct_authors(99, 5) == ["discord:z"]


def test_recent_distinct_authors_reaches_past_a_long_monologue(log: TurnLog):
    say(log, "long ago", author="discord:quiet")
    log.append_turns([{"channel_id": 10, "role": "user", "content": "...", "author_key": "discord:loud"}] * 600)
    deleted = say(log, "oops", author="discord:ghost")
    log.record_deletion(turn_id=deleted.id)
    assert log.recent_distinct_authors(10, 5) == ["discord:loud", "discord:quiet"]


# --------------------------------------------------------------------------- mentions


def test_mentions_dedup_sort_and_skip_the_familiar_itself(log: TurnLog):
    turn = say(log, "hey @c @b @b", mentions=["discord:c", "discord:b", "ego:sapphire"])
    log.record_mentions(turn.id, ["discord:a", "discord:b"])
    log.record_mentions(turn.id, [])
    assert log.mentions_for_turn(turn.id) == ["discord:a", "discord:b", "discord:c"]
    plain = say(log, "no pings")
    assert log.mentions_for_turns([plain.id, turn.id]) == {
        plain.id: [],
        turn.id: ["discord:a", "discord:b", "discord:c"],
    }
    with pytest.raises(TurnLogError, match="does not exist"):
        log.record_mentions(12345, ["discord:a"])


# --------------------------------------------------------------------------- identity


def test_participant_upsert_keeps_known_values(log: TurnLog):
    first = log.upsert_participant("discord:1", username="ada", global_name="Ada L", pronouns="she/her", seen_at=T0)
    assert first == Participant("discord:1", "discord", "1", "ada", "Ada L", "she/her", None, T0, T0)
    later = T0 + timedelta(days=2)
    second = log.upsert_participant("discord:1", global_name="Ada Lovelace", bio="maths", seen_at=later)
    assert (second.username, second.global_name, second.pronouns, second.bio) == ("ada", "Ada Lovelace", "she/her", "maths")
    # an import of old history widens the window instead of moving last_seen_at backwards
    third = log.upsert_participant("discord:1", seen_at=T0 - timedelta(days=1))
    assert (third.first_seen_at, third.last_seen_at) == (T0 - timedelta(days=1), later)
    assert log.participant("discord:1") == third
    assert log.participant("discord:404") is None


def test_participants_are_sorted_and_keys_validated(log: TurnLog):
    log.upsert_participant("twitch:zed")
    log.upsert_participant("discord:2")
    assert [p.canonical_key for p in log.participants()] == ["discord:2", "twitch:zed"]
    with pytest.raises(TurnLogError, match="familiar itself"):
        log.upsert_participant("ego:sapphire")
    with pytest.raises(TurnLogError, match="malformed"):
        log.upsert_participant("ada")
    assert len(log.participants()) == 2


def test_guild_nick_upsert_overwrite_and_clear(log: TurnLog):
    log.upsert_guild_nick("discord:1", 7, "Countess")
    assert log.guild_nick("discord:1", 7) == "Countess"
    log.upsert_guild_nick("discord:1", 7, "Ada!")
    assert log.guild_nick("discord:1", 7) == "Ada!"
    log.upsert_guild_nick("discord:1", 7, None)
    assert log.guild_nick("discord:1", 7) is None
    with pytest.raises(TurnLogError, match="guild_id"):
        log.upsert_guild_nick("discord:1", True, "x")


def test_resolve_label_order(log: TurnLog):
    log.upsert_participant("discord:1", username="ada", global_name="Ada Lovelace")
    log.upsert_guild_nick("discord:1", 7, "Countess")
    assert log.resolve_label("discord:1", 7) == "Countess"
    assert log.resolve_label("discord:1", 8) == "Ada Lovelace"  # no nick in that guild
    assert log.resolve_label("discord:1") == "Ada Lovelace"  # no guild: nick skipped
    log.upsert_guild_nick("discord:1", 7, None)
    assert log.resolve_label("discord:1", 7) == "Ada Lovelace"
    log.upsert_participant("discord:2", username="bob")
    assert log.resolve_label("discord:2", 7) == "bob"
    say(log, author="discord:3", author_display="Cass (snapshot)")
    assert log.resolve_label("discord:3") == "Cass (snapshot)"  # no account row, but we saw them speak
    assert log.resolve_label("discord:999") == "999"
    assert log.resolve_label("ego:sapphire") == "sapphire"
    assert log.resolve_label("ego:sapphire", ego_label="Sapphire") == "Sapphire"
    assert log.resolve_label("weird") == "weird"


# --------------------------------------------------------------------------- read-only access


def test_readonly_requires_an_existing_file(tmp_path: Path):
    with pytest.raises(TurnLogError, match="does not exist"):
        TurnLog(tmp_path / "missing" / "turns.db", readonly=True)
    assert not (tmp_path / "missing").exists()


def test_readonly_reads_but_never_writes(db_path: Path):
    with TurnLog(db_path) as writer:
        turn = say(writer, "hello")
    # the writer closed, so the -wal/-shm files are gone: a reader must still open
    with TurnLog(db_path, readonly=True) as reader:
        assert reader.turns_after(0) == [turn]
        for attempt in (
            lambda: say(reader),
            lambda: reader.record_deletion(turn_id=turn.id),
            lambda: reader.upsert_participant("discord:1"),
        ):
            with pytest.raises(TurnLogError, match="read-only"):
                attempt()
    assert_file_healthy(db_path, ["hello"])


def test_reader_thread_sees_appends_while_writer_writes(db_path: Path):
    writer = TurnLog(db_path)
    reader = TurnLog(db_path, readonly=True)
    seen: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def read_loop():
        try:
            while not done.is_set():
                latest = reader.latest_id()
                tail = reader.recent(10, 5)
                assert all(t.id <= reader.latest_id() for t in tail)
                seen.append(latest)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        for i in range(300):
            say(writer, f"turn {i}")
    finally:
        done.set()
        thread.join(timeout=10)
    assert not errors
    assert seen == sorted(seen)  # never goes backwards
    assert reader.latest_id() == writer.latest_id() == 300
    writer.close()
    reader.close()


def test_reader_in_another_process_while_writer_appends(db_path: Path):
    writer = TurnLog(db_path)
    say(writer, "first")
    script = textwrap.dedent(
        f"""
        import time
        from familiar_pipeline.storage.turns import TurnLog
        reader = TurnLog({str(db_path)!r}, readonly=True)
        print("ready", flush=True)
        observed = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            latest = reader.latest_id()
            assert not observed or latest >= observed[-1], (latest, observed[-1])
            if not observed or latest != observed[-1]:
                observed.append(latest)
            if latest >= 200:
                break
        print(len(observed), reader.count(), len(reader.turns_after(0)))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        for i in range(199):
            say(writer, f"turn {i}")
            time.sleep(0.0005)  # spread the writes so the reader observes them landing
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        writer.close()
    assert proc.returncode == 0, err
    distinct_values_seen, count, read = map(int, out.split())
    assert distinct_values_seen > 1  # it really read while the writer was appending
    assert count == read == 200


def test_one_log_shared_by_threads(log: TurnLog):
    def burst(channel: int):
        for i in range(100):
            say(log, f"{channel}-{i}", channel=channel)

    threads = [threading.Thread(target=burst, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert log.count() == 400
    assert [len(log.recent(c, 1000)) for c in range(4)] == [100] * 4


def test_snapshot_is_consistent_and_read_only(db_path: Path):
    with TurnLog(db_path) as writer, TurnLog(db_path, readonly=True) as reader:
        say(writer, "one")
        with reader.snapshot():
            before = reader.latest_id()
            say(writer, "two")  # lands during the snapshot
            assert reader.latest_id() == before
            assert len(reader.turns_after(0)) == 1
        assert reader.latest_id() == before + 1
        with writer.snapshot():
            with pytest.raises(TurnLogError, match="inside a read snapshot"):
                say(writer, "three")
        say(writer, "three")


# --------------------------------------------------------------------------- schema versions


V1_DDL = """
CREATE TABLE turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT, channel_id INTEGER NOT NULL, guild_id INTEGER,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    author_key TEXT, author_display TEXT, content TEXT NOT NULL, mode TEXT,
    platform_message_id TEXT, reply_to_message_id TEXT, created_at TEXT NOT NULL
);
CREATE TABLE participants (
    canonical_key TEXT PRIMARY KEY, platform TEXT NOT NULL, user_id TEXT NOT NULL, username TEXT,
    global_name TEXT, pronouns TEXT, bio TEXT, first_seen_at TEXT NOT NULL, last_seen_at TEXT NOT NULL
);
CREATE TABLE guild_nicks (
    canonical_key TEXT NOT NULL, guild_id INTEGER NOT NULL, nick TEXT, last_seen_at TEXT NOT NULL,
    PRIMARY KEY (canonical_key, guild_id)
);
CREATE TABLE turn_mentions (turn_id INTEGER NOT NULL, canonical_key TEXT NOT NULL, PRIMARY KEY (turn_id, canonical_key));
INSERT INTO turns (channel_id, role, author_key, author_display, content, created_at)
    VALUES (10, 'user', 'discord:1', 'Ada', 'from the old days', '2026-01-01T00:00:00.000000+00:00');
INSERT INTO turns (channel_id, role, content, created_at)
    VALUES (10, 'assistant', 'old reply', '2026-01-01T00:00:01.000000+00:00');
INSERT INTO participants VALUES ('discord:1', 'discord', '1', 'ada', NULL, NULL, NULL,
    '2026-01-01T00:00:00.000000+00:00', '2026-01-01T00:00:00.000000+00:00');
"""


def make_v1_file(path: Path, extra_sql: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = raw(path)
    conn.executescript(V1_DDL + extra_sql + "PRAGMA user_version = 1;")
    conn.close()


def test_v1_file_migrates_forward_keeping_rows(db_path: Path):
    make_v1_file(db_path)
    with pytest.raises(TurnLogError, match="older than this code"):
        TurnLog(db_path, readonly=True)  # readers never migrate
    assert raw(db_path).execute("PRAGMA user_version").fetchone()[0] == 1
    with TurnLog(db_path) as log:
        old = log.turns_after(0)
        assert [(t.content, t.revision, t.deleted) for t in old] == [("from the old days", 0, False), ("old reply", 0, False)]
        assert log.participant("discord:1").username == "ada"
        edited = log.record_edit(turn_id=old[0].id, new_content="from the old days (edited)")
        assert edited.revision == 1
        assert say(log, "new").id == 3
    assert raw(db_path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with TurnLog(db_path, readonly=True) as reader:
        assert reader.count() == 3 and reader.latest_change_seq() == 1


def test_migration_is_idempotent_on_a_half_migrated_file(db_path: Path):
    # as if a v2 migration had added one column and then been interrupted before the version bump
    make_v1_file(db_path, "ALTER TABLE turns ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;")
    with TurnLog(db_path) as log:
        assert log.count() == 2
    with TurnLog(db_path) as log:  # a second open has nothing left to do
        assert [t.revision for t in log.turns_after(0)] == [0, 0]
    assert_file_healthy(db_path, ["from the old days", "old reply"])


def test_newer_schema_is_refused_and_left_alone(db_path: Path):
    with TurnLog(db_path) as log:
        say(log, "from the future")
    conn = raw(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    for readonly in (False, True):
        with pytest.raises(TurnLogError, match="newer than this code"):
            TurnLog(db_path, readonly=readonly)
    assert raw(db_path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert_file_healthy(db_path, ["from the future"])


def test_each_log_has_its_own_id_kept_across_opens(tmp_path):
    """A familiar deleted and created again under its name gets a new log id (run keys include it)."""
    path = tmp_path / "turns.db"
    with TurnLog(path) as log:
        first = log.log_id()
    with TurnLog(path) as log, TurnLog(path, readonly=True) as reader:
        assert log.log_id() == reader.log_id() == first
    assert len(first) == 8 and int(first, 16) >= 0
    path.unlink()
    with TurnLog(path) as log:
        assert log.log_id() != first


# --------------------------------------------------------------------------- a full disk


def test_a_full_disk_fails_the_write_whole_and_the_log_goes_on_after(log: TurnLog):
    """SQLite rolls back after SQLITE_FULL itself; a second ROLLBACK used to raise
    "cannot rollback - no transaction is active" and hide the failure from every caller."""
    from tests.helpers import FullDisk, long_line

    say(log, "before")
    with FullDisk(log) as disk:
        for n in range(3):
            with pytest.raises(TurnLogUnavailable, match="failed and was rolled back") as refused:
                say(log, long_line(n))
            assert "no transaction is active" not in str(refused.value)
            with pytest.raises(TurnLogUnavailable):
                log.append_turns([{"channel_id": 10, "role": "user", "content": long_line(9)}] * 2)
        assert [t.content for t in log.turns_after(0)] == ["before"], "nothing half-written"
        disk.free()
        say(log, long_line(7))
    assert [t.content[:6] for t in log.turns_after(0)] == ["before", "line 7"]
    assert isinstance(refused.value, TurnLogError), "callers that catch TurnLogError still do"


def test_an_io_error_on_a_full_disk_is_named_for_what_it_is(db_path: Path, monkeypatch):
    """A WAL log opened on a full disk fails with SQLITE_IOERR_SHMSIZE ("disk I/O error"): named for what it is."""
    from familiar_pipeline.storage import turns as turns_module

    error = sqlite3.OperationalError("disk I/O error")
    error.sqlite_errorname = "SQLITE_IOERR_SHMSIZE"
    assert turns_module.storage_problem(db_path, error) == "disk I/O error", "with room left it is an I/O error"
    monkeypatch.setattr(turns_module, "_free_bytes", lambda folder: 0)
    message = turns_module.storage_problem(db_path, error)
    assert message == "the disk holding it is full (0 bytes free); free some space (disk I/O error)"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root to mount a small tmpfs")
def test_opening_on_a_real_full_disk(tmp_path: Path):
    """The same on a real full disk: a 512 KiB tmpfs in a private mount namespace, filled up."""
    script = textwrap.dedent(f"""
        import os, sys
        from familiar_pipeline.storage.turns import TurnLog, TurnLogUnavailable
        disk = {str(tmp_path / 'disk')!r}
        with TurnLog(disk + "/fam/turns.db") as log:
            log.append_turn(channel_id=1, role="user", content="kept")
        try:
            with open(disk + "/filler", "wb") as filler:
                while True:
                    filler.write(bytes(4096)); filler.flush()
        except OSError:
            pass
        try:
            TurnLog(disk + "/fam/turns.db")
        except TurnLogUnavailable as exc:
            print(exc)
    """)
    (tmp_path / "disk").mkdir()
    mount = f"mount -t tmpfs -o size=512k tmpfs {tmp_path / 'disk'} && exec {sys.executable} -c \"$0\""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, script],
                          capture_output=True, text=True, timeout=60)
    if "mount:" in done.stderr:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    [line] = done.stdout.splitlines()
    assert line.startswith(f"cannot open turn log {tmp_path / 'disk' / 'fam' / 'turns.db'}: the disk holding it is full")
    assert "is not a usable SQLite turn log" not in line
