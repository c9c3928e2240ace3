"""The familiar's half of an erasure, in the turn log (issue 47): its replies to erased messages are
erased with them, its other replies that repeat their distinctive words are redacted, a reply to a
message erased while it was composed is stored blank, and replies written before replies named the
turn they answer are linked by the migration."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

from familiar_pipeline.storage.turns import MIGRATIONS, TurnLog
from familiar_pipeline.storage.words import ERASED, distinctive_words, redact

CASS, BO, EGO = "discord:111", "discord:222", "ego:fam"
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


class Chat:
    def __init__(self, log: TurnLog):
        self.log = log
        self.clock = T0

    def say(self, text: str, who: str = CASS, *, channel: int = 10, guild: int | None = 1, message: int | None = None):
        self.clock += timedelta(minutes=1)
        return self.log.append_turn(channel_id=channel, guild_id=guild, role="user", author_key=who,
                                    author_display=who[-3:], content=text, platform_message_id=message,
                                    created_at=self.clock)

    def reply(self, text: str, to, *, message: int | None = None):
        self.clock += timedelta(minutes=1)
        return self.log.append_turn(channel_id=to.channel_id, guild_id=to.guild_id, role="assistant", author_key=EGO,
                                    author_display="Fam", content=text, platform_message_id=message,
                                    reply_to_message_id=to.platform_message_id, reply_to_turn_id=to.id,
                                    created_at=self.clock)


@pytest.fixture
def chat(tmp_path):
    with TurnLog(tmp_path / "turns.db") as log:
        yield Chat(log)


def test_replies_to_erased_turns_are_erased_and_later_echoes_redacted(chat):
    log = chat.log
    early = chat.reply("Welcome! I am Fam, your Zqxfamword companion.", chat.say("hello there", BO))
    boat = chat.say("I named my boat Zqxboat after my grandmother", message=5001)
    answer = chat.reply('Noted: "I named my boat Zqxboat". That boat of yours sounds lovely.', boat, message=5002)
    chat.say("What did Cass call her boat? I like boats too", BO)
    later = chat.reply("Her boat is called ZQXBOAT, and she loves her grandmother's name.", chat.say("tell me", BO))
    own = chat.reply("As your Zqxfamword companion I remember things.", chat.say("who are you", BO))
    erasure = log.request_erasure(kind="message", target="5001", requested_by=CASS)

    assert erasure.turn_ids == (boat.id,) and erasure.replies_erased == (answer.id,)
    assert erasure.replies_redacted == (later.id,), "the reply repeating her word elsewhere"
    gone, = log.turns_by_ids([answer.id])
    assert gone.deleted and gone.content.startswith("Noted"), "tombstoned now, its text purged with hers"
    edited, = log.turns_by_ids([later.id])
    assert edited.content == f"Her boat is called {ERASED}, and she loves her {ERASED}'s name."
    assert edited.revision == 1 and not edited.deleted
    change = log.changes_after(0)[-1]
    assert (change.turn_id, change.kind, change.prior_content) == (later.id, "edit", later.content)
    # The familiar's own word before she spoke, and a word Bo used too, are not hers.
    assert [t.content for t in log.turns_by_ids([early.id, own.id])] == [early.content, own.content]
    assert "boat" in edited.content
    # The purge's due turns include the erased reply; the redaction's earlier text is due with the erasure.
    assert log.unpurged_deleted() == [boat.id, answer.id]
    assert [c.turn_id for c in log.prior_texts_due(edited_before=T0)] == [later.id]
    # The log keeps ids of both kinds of replies, never text.
    assert log.erasures()[0].replies_erased == (answer.id,) and log.erasures()[0].replies_redacted == (later.id,)


def test_a_person_erasure_takes_the_familiars_replies_to_them_in_every_scope(chat):
    log = chat.log
    dm = chat.say("only telling you: my code is zqxdmcode", channel=77, guild=None)
    dm_reply = chat.reply("Your code zqxdmcode is safe with me.", dm)
    srv = chat.say("Fam, my locker is zqxlocker", message=6001)
    srv_reply = chat.reply("Locker zqxlocker, got it.", srv, message=6002)
    bo = chat.say("Fam, what is the weather like?", BO, message=6003)
    bo_reply = chat.reply("Sunny and warm today.", bo, message=6004)
    erasure = log.request_erasure(kind="person", target=CASS, requested_by="operator:test")
    assert set(erasure.replies_erased) == {dm_reply.id, srv_reply.id} and erasure.replies_redacted == ()
    assert not log.turns_by_ids([bo_reply.id])[0].deleted
    log.purge_text(log.unpurged_deleted())
    assert [t.content for t in log.turns_by_ids([dm_reply.id, srv_reply.id])] == ["", ""]


def test_a_reply_to_a_message_erased_while_it_was_composed_is_stored_blank(chat):
    log = chat.log
    said = chat.say("my secret is zqxrace", message=7001)
    log.request_erasure(kind="message", target="7001", requested_by=CASS)
    late = chat.reply("Your secret zqxrace is safe.", said)
    stored, = log.turns_by_ids([late.id])
    assert stored.content == "" and stored.deleted and late == stored, "and the turn returned says so"
    assert log.erasures()[0].replies_erased == (late.id,)


def test_replies_written_before_this_are_linked_by_the_migration(tmp_path):
    """A v4 turn log: a Discord reply names the message it answers, a console reply nothing."""
    path = tmp_path / "turns.db"
    conn = sqlite3.connect(path)
    for version in range(1, 5):
        MIGRATIONS[version](conn)
    conn.execute("PRAGMA user_version = 4")
    rows = [(10, 1, "user", CASS, "hi", "900", None), (10, 1, "assistant", EGO, "hello", "901", "900"),
            (1, None, "user", "console:sam", "first", None, None), (1, None, "user", "console:sam", "second", None, None),
            (1, None, "assistant", EGO, "answer", None, None)]
    for channel, guild, role, key, text, message, answers in rows:
        conn.execute("INSERT INTO turns (channel_id, guild_id, role, author_key, content, platform_message_id, "
                     "reply_to_message_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, '2026-05-01T12:00:00.000000Z')",
                     (channel, guild, role, key, text, message, answers))
    conn.commit()
    conn.close()
    with TurnLog(path) as log:
        assert [t.reply_to_turn_id for t in log.turns_after(0)] == [None, 1, None, None, 4]
        erasure = log.request_erasure(kind="message", target="turn:4", requested_by="console:sam")
        assert erasure.replies_erased == (5,)


def test_what_an_opted_out_person_says_and_the_replies_to_it_are_hidden_from_memory_and_due(chat, tmp_path):
    log = chat.log
    chat.reply("Hello Cass!", chat.say("hi, I am Cass"))
    log.request_erasure(kind="person", target=CASS, requested_by=CASS)
    again = chat.say("I am back, my dog is zqxdog")
    answer = chat.reply("Welcome back!", again)
    bo = chat.say("hello all", BO)
    bo_answer = chat.reply("Hello Bo!", bo)
    assert log.said_after_forgotten() == [again.id, answer.id]
    assert log.answers_forgotten(again.id) and not log.answers_forgotten(bo.id)
    with TurnLog(log.path, hide_forgotten=True) as memory_reads:
        assert [t.id for t in memory_reads.turns_after(again.id - 1)] == [bo.id, bo_answer.id]


def test_distinctive_words_and_redaction():
    assert distinctive_words(["My Zqxcat Pixel sleeps", "ok"], ["pixel is a cat", "sleeps a lot"]) == {"zqxcat"}
    assert redact("ZQXCAT and zqxcat, not zqxcats", frozenset({"zqxcat"})) == f"{ERASED} and {ERASED}, not zqxcats"
