"""The turn log's part of forgetting: the erasure log, tombstones, purged text, a compacted file."""

from __future__ import annotations

import sqlite3

import pytest

from familiar_pipeline.storage.turns import NothingToErase, TurnLog, TurnLogError

MARK = "zqxsecret"


@pytest.fixture
def log(tmp_path):
    with TurnLog(tmp_path / "turns.db") as turn_log:
        turn_log.upsert_participant("discord:1", username="ana_u", global_name="Ana")
        turn_log.upsert_guild_nick("discord:1", 5, "Ana-nick")
        for i in range(3):
            turn_log.append_turn(channel_id=10, guild_id=5, role="user", content=f"{MARK}{i} in the server",
                                 author_key="discord:1", author_display="Ana", platform_message_id=100 + i)
            turn_log.append_turn(channel_id=10, guild_id=5, role="user", content=f"ben says {i}",
                                 author_key="discord:2", author_display="Ben", platform_message_id=200 + i,
                                 mentions=["discord:1"])
        turn_log.append_turn(channel_id=77, role="user", content=f"{MARK} in a DM", author_key="discord:1",
                             author_display="Ana", platform_message_id=300)
        turn_log.record_edit(platform_message_id=101, new_content=f"{MARK} edited")
        yield turn_log


def test_a_person_erasure_tombstones_their_turns_and_logs_ids_only(log):
    before = log.latest_change_seq()
    erasure = log.request_erasure(kind="person", target="discord:1", requested_by="operator:me")
    assert erasure.turn_ids == (1, 3, 5, 7) and erasure.status == "pending"
    assert all(t.deleted for t in log.turns_by_ids(erasure.turn_ids))
    assert not any(t.deleted for t in log.turns_by_ids([2, 4, 6]))
    changes = log.changes_after(before)
    assert sorted(c.turn_id for c in changes) == [1, 3, 5, 7] and {c.kind for c in changes} == {"delete"}
    assert log.forgotten_people() == [("discord:1", "*", 7)]
    assert log.unpurged_deleted(deleted_before=None) == [1, 3, 5, 7]
    # The log itself holds who, when and ids: no text.
    conn = sqlite3.connect(log.path)
    assert MARK not in repr(conn.execute("SELECT * FROM erasures").fetchall())


def test_a_scoped_erasure_reaches_only_that_scope(log):
    erasure = log.request_erasure(kind="person", target="discord:1", scope="channel:77", requested_by="op")
    assert erasure.turn_ids == (7,)
    assert log.forgotten_people() == [("discord:1", "channel:77", 7)]


def test_purge_and_compact_leave_no_byte_of_the_text(log, tmp_path):
    erasure = log.request_erasure(kind="person", target="discord:1", requested_by="op")
    assert log.purge_text(erasure.turn_ids, people=["discord:1"]) == 4
    log.finish_erasures([erasure.id])
    log.compact()
    assert [t.content for t in log.turns_by_ids(erasure.turn_ids)] == [""] * 4
    assert log.participant("discord:1") is None and log.guild_nick("discord:1", 5) is None
    assert log.mentions_for_turns([2, 4, 6]) == {2: [], 4: [], 6: []}
    assert log.erasures()[0].status == "done" and log.unpurged_deleted() == []
    assert [t.content for t in log.turns_by_ids([2])] == ["ben says 0"]  # another person's words stay
    log.close()
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    for word in (MARK, "Ana-nick", "ana_u"):
        assert data.count(word.encode()) == 0, word


def test_unknown_targets_are_one_line_errors_naming_near_matches(log):
    with pytest.raises(NothingToErase, match=r"no person 'discord:3' .*did you mean discord:"):
        log.request_erasure(kind="person", target="discord:3", requested_by="op")
    with pytest.raises(NothingToErase, match=r"no message '1011' .*did you mean 101"):
        log.request_erasure(kind="message", target="1011", requested_by="op")
    with pytest.raises(TurnLogError, match="invalid scope"):
        log.request_erasure(kind="person", target="discord:1", scope="server 5", requested_by="op")
    assert log.erasures() == []


def test_deleted_messages_wait_for_their_retention(log):
    from datetime import datetime, timedelta, timezone

    long_ago = datetime(2026, 1, 1, tzinfo=timezone.utc)
    log.record_deletion(platform_message_id=200, deleted_at=long_ago)
    log.record_deletion(platform_message_id=201)
    assert log.unpurged_deleted(deleted_before=long_ago + timedelta(days=1)) == [2]
    assert log.unpurged_deleted(deleted_before=datetime.now(timezone.utc) + timedelta(seconds=1)) == [2, 4]


def test_a_message_is_found_by_its_platform_id_and_a_console_turn_erased_by_its_turn_id(log):
    assert log.turn_by_message(101).author_key == "discord:1" and log.turn_by_message("999") is None
    console = log.append_turn(channel_id=1, role="user", content=f"{MARK} on the console", author_key="console:sam")
    erasure = log.request_erasure(kind="message", target=f"turn:{console.id}", requested_by="console:sam")
    assert erasure.turn_ids == (console.id,) and erasure.target == f"turn:{console.id}"
    assert [t.deleted for t in log.turns_by_ids([console.id - 1, console.id])] == [False, True]
    with pytest.raises(NothingToErase, match="no message 'turn:999'"):
        log.request_erasure(kind="message", target="turn:999", requested_by="op")
