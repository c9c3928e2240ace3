"""The transport-free responder, end to end over a real turn log, real layers and the fake LLM."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from familiar_bot.prompt.assembly import Assembler
from familiar_bot.prompt.layers.character_card import CharacterCardLayer
from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.responder.flow import Responder
from familiar_bot.responder.messages import IncomingMessage, Person, reply_reason
from familiar_bot.responder.notices import APOLOGY
from familiar_bot.responder.reply_text import DISCORD_MESSAGE_LIMIT, build_messages, split_message, strip_speaker_prefix
from familiar_pipeline.config import load_config
from familiar_pipeline.testing.fake_llm import FakeLLM, fake_llm
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLog
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

CARD = "You are Fam, a small fox spirit who loves puns."
CHANNEL, QUIET_CHANNEL, LOUD_CHANNEL, BARE_CHANNEL = 10, 20, 30, 40
GUILD = 1
ANA = Person(key="discord:111", username="ana_l", global_name="Ana", guild_nick="Ana the Great", nick_known=True)
BO = Person(key="discord:222", username="bo", global_name="Bo", nick_known=True)

TOML = f"""
aliases = ["Fam", "Foxy"]

[llm.reply]
model = "fake/reply"
max_retries = 0

[channels."{LOUD_CHANNEL}"]
respond_to_all = true

[channels."{BARE_CHANNEL}"]
prompt_layers = ["character_card"]
respond_to_all = true
"""


class SpyAssembler:
    """Wraps the real assembler and keeps what each assembly saw, plus the log at that moment."""

    def __init__(self, inner: Assembler, turn_log: TurnLog):
        self.inner = inner
        self.turn_log = turn_log
        self.seen: list[tuple] = []  # (ctx, prompt, ids of the channel's turns at assembly time)

    def assemble(self, ctx):
        prompt = self.inner.assemble(ctx)
        turns = self.turn_log.recent(ctx.channel_id, 100)
        self.seen.append((ctx, prompt, [(t.role, t.content) for t in turns]))
        return prompt


class BrokenAssembler:
    def assemble(self, ctx):
        raise RuntimeError("snapshot folder vanished")


def make(root: Path, toml: str = TOML, *, assembler=None):
    paths = FamiliarPaths.for_id("fam", root)
    paths.dir.mkdir(parents=True)
    paths.character_toml.write_text(toml)
    paths.character_md.write_text(CARD)
    config = load_config("fam", root=root, env={})
    turn_log = TurnLog(paths.turns_db)
    memory = MemoryView(paths, config, turn_log=turn_log)
    spy = SpyAssembler(Assembler(memory, [CharacterCardLayer(), RecentHistoryLayer()]), turn_log)
    llm = client_for(config.llm, "reply", familiar_id="fam")
    responder = Responder(paths, config, assembler=assembler or spy, llm=llm, turn_log=turn_log)
    return responder, spy, turn_log


@pytest.fixture
def fake():
    with fake_llm() as f:
        yield f


def msg(content: str, *, channel: int = CHANNEL, author: Person = ANA, message_id: str | None = None, **kw):
    return IncomingMessage(channel_id=channel, author=author, content=content, guild_id=GUILD,
                           platform_message_id=message_id, **kw)


class Outbox:
    """A transport's send: remembers pieces and what the log held when each was sent."""

    def __init__(self, turn_log: TurnLog, channel: int = CHANNEL, fail_after: int | None = None):
        self.turn_log, self.channel, self.fail_after = turn_log, channel, fail_after
        self.sent: list[str] = []
        self.assistant_turns_at_send: list[int] = []

    async def __call__(self, piece: str) -> str:
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise ConnectionError("discord went away")
        self.assistant_turns_at_send.append(
            sum(t.role == "assistant" for t in self.turn_log.recent(self.channel, 1000)))
        self.sent.append(piece)
        return f"out-{len(self.sent)}"


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- the flow


def test_user_turn_is_in_the_prompt_and_assistant_turn_follows_the_send(tmp_path, fake):
    responder, spy, log = make(tmp_path)
    fake.script(lambda messages: "Fam: Hello Ana! Any puns today?")
    out = Outbox(log)

    replies = run(responder.handle(msg("hey @Fam, how are you?", message_id="m1", addressed=True), send=out))

    assert replies == ["Hello Ana! Any puns today?"]  # the copied "Fam:" prefix is gone
    # The assembler ran after the user turn was written, and the prompt shows it.
    (ctx, prompt, log_at_assembly), = spy.seen
    assert log_at_assembly == [("user", "hey @Fam, how are you?")]
    assert ctx.cue == "hey @Fam, how are you?" and ctx.channel_id == CHANNEL and ctx.guild_id == GUILD
    assert prompt.history[-1].content.endswith("hey @Fam, how are you?")
    assert "Ana the Great" in prompt.history[-1].content  # the guild nickname was recorded first
    # What the model got: card + instructions, then the history ending with the message, once.
    call = fake.calls[0]
    assert call.messages[0]["role"] == "system" and CARD in call.messages[0]["content"]
    assert "last one is from Ana the Great" in call.messages[0]["content"]
    assert [m["role"] for m in call.messages] == ["system", "user"]
    assert call.user.count("how are you?") == 1
    # The assistant turn did not exist while sending, and exists after, with the sent id.
    assert out.assistant_turns_at_send == [0]
    user, assistant = log.recent(CHANNEL, 10)
    assert (user.role, user.platform_message_id, user.author_key) == ("user", "m1", "discord:111")
    assert (assistant.role, assistant.content, assistant.author_key) == ("assistant", replies[0], "ego:fam")
    assert assistant.platform_message_id == "out-1" and assistant.reply_to_message_id == "m1"
    assert log.guild_nick("discord:111", GUILD) == "Ana the Great"
    assert responder.stats.replies == 1


def test_mentions_become_participants_and_turn_mentions(tmp_path, fake):
    responder, _, log = make(tmp_path)
    run(responder.handle(msg("<@222> did you see this?", mentions=(BO,))))  # not addressed: no reply
    turn, = log.recent(CHANNEL, 10)
    assert log.mentions_for_turn(turn.id) == ["discord:222"]
    assert log.participant("discord:222").global_name == "Bo"
    assert fake.calls == []


def test_the_next_prompt_in_a_channel_sees_the_previous_reply(tmp_path, fake):
    """Two messages at once in one channel: each prompt has its own message, the second the first reply."""
    responder, spy, log = make(tmp_path)
    counter = iter(range(1, 10))
    fake.script(lambda messages: f"reply number {next(counter)}")

    async def both():
        return await asyncio.gather(
            responder.handle(msg("first question", addressed=True)),
            responder.handle(msg("second question", author=BO, addressed=True)),
        )

    first, second = run(both())
    assert first == ["reply number 1"] and second == ["reply number 2"]
    first_prompt, second_prompt = (s[1] for s in spy.seen)
    assert "first question" in first_prompt.history[-1].content or any(
        "first question" in m.content for m in first_prompt.history)
    contents = [m.content for m in second_prompt.history]
    # It ends with the message it answers; the first reply, sent after that message arrived, is shown
    # right after the question it answered.
    assert contents[-1].endswith("second question") and contents[-2] == "reply number 1", contents
    assert [t.role for t in log.recent(CHANNEL, 10)] == ["user", "user", "assistant", "assistant"]


def test_channel_without_history_layer_gets_the_message_once(tmp_path, fake):
    responder, spy, _ = make(tmp_path)
    fake.script(lambda messages: "ok!")
    run(responder.handle(msg("what is a pun?", channel=BARE_CHANNEL)))
    (_, prompt, _), = spy.seen
    assert prompt.history == []  # the channel's prompt_layers leave history out
    messages = fake.calls[0].messages
    assert messages[-1] == {"role": "user", "content": "Ana the Great: what is a pun?"}
    assert fake.calls[0].user.count("what is a pun?") == 1


def test_build_messages_never_repeats_a_shown_message(tmp_path, fake):
    responder, spy, _ = make(tmp_path)
    fake.script(lambda messages: "sure")
    message = msg("tell me a joke <@222>", addressed=True, mentions=(BO,))
    run(responder.handle(message))
    (_, prompt, _), = spy.seen
    # The history renders the ping as a name, so text matching would miss it; the rule does not.
    assert "[@Bo]" in prompt.history[-1].content
    assert len(build_messages(prompt, message, "Fam")) == 1 + len(prompt.history)


# --------------------------------------------------------------------------- failures


def test_llm_failure_apologises_logs_and_keeps_the_turn(tmp_path, fake, caplog):
    responder, _, log = make(tmp_path)
    fake.script(lambda messages: FakeLLM.error("auth", "bad key"))
    out = Outbox(log)
    with caplog.at_level(logging.ERROR, logger="familiar_bot.responder"):
        replies = run(responder.handle(msg("hello Fam", message_id="m9"), send=out))
    assert replies == [APOLOGY] and out.sent == [APOLOGY]
    assert [t.role for t in log.recent(CHANNEL, 10)] == ["user"]  # kept; the apology is not a turn
    assert any("reply model call failed" in r.getMessage() and "AuthenticationError" in r.getMessage()
               for r in caplog.records)
    assert responder.stats.llm_errors == 1


def test_empty_model_reply_is_an_apology_not_an_empty_message(tmp_path, fake):
    responder, _, log = make(tmp_path)
    fake.script(lambda messages: "   ")
    assert run(responder.handle(msg("hello Fam"))) == [APOLOGY]
    assert [t.role for t in log.recent(CHANNEL, 10)] == ["user"]


def test_a_broken_assembler_never_crashes_the_transport(tmp_path, fake, caplog):
    responder, _, log = make(tmp_path, assembler=BrokenAssembler())
    with caplog.at_level(logging.ERROR, logger="familiar_bot.responder"):
        assert run(responder.handle(msg("hello Fam"))) == [APOLOGY]
    assert fake.calls == []
    assert any("snapshot folder vanished" in (r.exc_text or "") for r in caplog.records)
    assert len(log.recent(CHANNEL, 10)) == 1


def test_send_failure_records_only_what_was_delivered(tmp_path, fake):
    responder, _, log = make(tmp_path)
    long_reply = ("word " * 700).strip()  # 3499 characters: two pieces
    fake.script(lambda messages: long_reply)
    out = Outbox(log, fail_after=1)
    delivered = run(responder.handle(msg("talk a lot, Fam"), send=out))
    assert len(delivered) == 1 and delivered == out.sent
    assert [t.role for t in log.recent(CHANNEL, 10)] == ["user", "assistant"]
    assert responder.stats.send_errors == 1


def test_without_a_reply_model_it_records_and_says_so_once_per_channel(tmp_path, fake):
    responder, spy, log = make(tmp_path, toml='aliases = ["Fam"]\n')

    first = run(responder.handle(msg("hi Fam")))
    assert len(first) == 1
    assert "[llm.reply].model" in first[0] and "character.toml of familiar 'fam'" in first[0]
    assert str(tmp_path) not in first[0], "a server path must not reach the channel"
    assert "FAMILIAR__LLM__REPLY__MODEL" in first[0]
    assert run(responder.handle(msg("hello?? Fam"))) == []  # told once in this channel
    assert len(run(responder.handle(msg("Fam?", channel=LOUD_CHANNEL)))) == 1  # new channel: told again
    assert fake.calls == [] and spy.seen == []
    assert [t.content for t in log.recent(CHANNEL, 10)] == ["hi Fam", "hello?? Fam"]
    assert all(t.role == "user" for t in log.recent_cross_channel(10))


def test_missing_api_key_variable_is_told_once_and_names_the_variable(tmp_path, fake, monkeypatch):
    monkeypatch.delenv("FAM_TEST_KEY", raising=False)
    toml = TOML.replace("max_retries = 0", 'max_retries = 0\napi_key_env = "FAM_TEST_KEY"')
    responder, _, log = make(tmp_path, toml=toml)
    first = run(responder.handle(msg("hi Fam")))
    assert len(first) == 1 and "FAM_TEST_KEY" in first[0]
    assert run(responder.handle(msg("hi again Fam"))) == []
    assert fake.calls == [] and len(log.recent(CHANNEL, 10)) == 2


def test_lone_surrogates_are_kept_as_replacement_characters_not_refused(tmp_path, fake):
    """UTF-8 cannot store a lone surrogate; losing the whole message for it would be worse."""
    responder, _, log = make(tmp_path)
    fake.script(lambda messages: "Got it!")
    replies = run(responder.handle(msg("bad \ud800 surrogate Fam \ud83d\ude00")))
    assert replies == ["Got it!"]
    assert log.recent(CHANNEL, 10)[0].content == "bad \ufffd surrogate Fam \U0001f600"


# --------------------------------------------------------------------------- edits and deletions


def test_edits_and_deletions_are_recorded_by_platform_id(tmp_path, fake):
    responder, _, log = make(tmp_path)
    run(responder.handle(msg("I has a cat", message_id="55")))
    assert run(responder.handle_edit(55, "I have a cat")) is True
    turn, = log.recent(CHANNEL, 10)
    assert (turn.content, turn.revision) == ("I have a cat", 1)
    assert log.changes_after(0)[0].prior_content == "I has a cat"
    assert run(responder.handle_delete("55")) is True
    assert log.recent(CHANNEL, 10) == [] and log.count() == 1  # tombstoned, not erased
    assert run(responder.handle_edit("404", "x")) is False
    assert run(responder.handle_delete(404)) is False


# --------------------------------------------------------------------------- pure rules


def config_for(tmp_path):
    paths = FamiliarPaths.for_id("fam", tmp_path)
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.character_toml.write_text(TOML)
    return load_config("fam", root=tmp_path, env={})


@pytest.mark.parametrize("kwargs, expected", [
    (dict(content="nice weather"), None),
    (dict(content="nice weather", console=True), "console"),
    (dict(content="nice weather", direct=True), "direct"),
    (dict(content="nice weather", addressed=True), "mentioned"),
    (dict(content="morning, fam!"), "named"),
    (dict(content="FOXY are you there"), "named"),
    (dict(content="famous foxynet"), None),  # names match whole words only
    (dict(content="nice weather", channel_id=LOUD_CHANNEL), "respond_to_all"),
    (dict(content="in a thread", channel_id=999, parent_channel_id=LOUD_CHANNEL), "respond_to_all"),
    (dict(content="Fam, answer me", author_is_bot=True, addressed=True), None),  # never bot to bot
    (dict(content="nice weather", channel_id=QUIET_CHANNEL), None),
])
def test_reply_reason(tmp_path, kwargs, expected):
    base = dict(channel_id=CHANNEL, author=ANA, guild_id=GUILD)
    base.update(kwargs)
    assert reply_reason(IncomingMessage(**base), config_for(tmp_path)) == expected


def test_display_name_alone_is_not_a_name_to_answer_to(tmp_path):
    config = replace(config_for(tmp_path), aliases=())
    assert config.display_name == "Fam"  # derived from the id
    assert reply_reason(IncomingMessage(channel_id=CHANNEL, author=ANA, content="fam is here"), config) is None


def test_split_prefers_paragraphs_then_lines_then_words():
    text = "A" * 1500 + "\n\n" + "B" * 1000 + "\n" + "C" * 900
    pieces = split_message(text)
    assert pieces == ["A" * 1500, "B" * 1000 + "\n" + "C" * 900]
    words = " ".join(["pun"] * 1000)  # 3999 characters, no line breaks
    pieces = split_message(words)
    assert all(len(p) <= DISCORD_MESSAGE_LIMIT for p in pieces) and len(pieces) == 2
    assert " ".join(pieces) == words  # cut between words, nothing lost
    assert split_message("x" * 4500) == ["x" * 2000, "x" * 2000, "x" * 500]  # no boundary: hard cut
    assert split_message("") == [] and split_message("short") == ["short"]


def test_split_keeps_code_blocks_rendering_as_code():
    code = "```python\n" + "\n".join(f"value_{i} = {i}" for i in range(300)) + "\n```"
    pieces = split_message("Here you go:\n" + code + "\nEnjoy!")
    assert len(pieces) >= 2 and all(len(p) <= DISCORD_MESSAGE_LIMIT for p in pieces)
    assert all(p.count("```") % 2 == 0 for p in pieces)
    assert all(p.startswith("```python\n") for p in pieces[1:])
    body = "".join(pieces)
    assert all(f"value_{i} = {i}" in body for i in range(300))


def test_strip_speaker_prefix():
    assert strip_speaker_prefix("Fam: hi", ["Fam"]) == "hi"
    assert strip_speaker_prefix("[12:04 Fam] hi", ["Fam"]) == "hi"
    assert strip_speaker_prefix("[Foxy]: hi", ["Fam", "Foxy"]) == "hi"
    assert strip_speaker_prefix("[12:04 Ana] hi", ["Fam"]) == "[12:04 Ana] hi"
    assert strip_speaker_prefix("[12:04] fam:  hi", ["Fam"]) == "hi"
    assert strip_speaker_prefix("Famous: last words", ["Fam"]) == "Famous: last words"
    assert strip_speaker_prefix("Ana: hi", ["Fam"]) == "Ana: hi"


def test_context_report_names_the_retired_fact_and_its_replacement(tmp_path):
    """`/context`'s memory footer reads the serving snapshot: counts, then each retired fact and what replaced it."""
    from familiar_bot.responder.inspection import retired_facts_report
    from familiar_pipeline.storage.snapshots import SnapshotReader, publish_snapshot
    from familiar_pipeline.projectors.facts.store import FactDraft
    from familiar_pipeline.storage.store import ProjectionStore
    from familiar_pipeline.projectors.facts.tables import Subject

    sam = [Subject("discord:1", "Sam")]
    with ProjectionStore(tmp_path / "memory.duckdb") as store:
        lisbon, porto, cat = (f for f, _ in facts_db.append_facts(store, [
            FactDraft(text="Sam lives in Lisbon.", source_turn_ids=[1], subjects=sam),
            FactDraft(text="Sam moved to Porto.", source_turn_ids=[5], subjects=sam),
            FactDraft(text="Sam has a cat called Miso.", source_turn_ids=[4], subjects=sam),
        ]))
        supersede_db.supersede(store, [lisbon.id], porto.id)
        publish_snapshot(store.conn, tmp_path / "serving", store_watermark=store.serving_watermark())
    report = retired_facts_report(SnapshotReader(tmp_path / "serving").current())
    assert report.splitlines() == [
        "=== memory: 2 current facts, 1 retired ===",
        f"retired #{lisbon.id} 'Sam lives in Lisbon.' <- replaced by #{porto.id} 'Sam moved to Porto.'",
    ]
    assert retired_facts_report(SnapshotReader(tmp_path / "nothing").current()).startswith("=== memory:")


def test_context_report_quotes_only_the_scopes_the_reply_read(tmp_path):
    """The memory footer of `/context` quotes fact text: never another scope's."""
    from familiar_bot.responder.inspection import retired_facts_report
    from familiar_pipeline.storage.snapshots import SnapshotReader, publish_snapshot
    from familiar_pipeline.projectors.facts.store import FactDraft
    from familiar_pipeline.storage.store import ProjectionStore

    with ProjectionStore(tmp_path / "memory.duckdb") as store:
        old_a, new_a, old_dm, new_dm = (f for f, _ in facts_db.append_facts(store, [
            FactDraft(text="Server fact, old.", source_turn_ids=[1], scope="guild:1"),
            FactDraft(text="Server fact, new.", source_turn_ids=[2], scope="guild:1"),
            FactDraft(text="Secret from the DM, old.", source_turn_ids=[3], scope="channel:9"),
            FactDraft(text="Secret from the DM, new.", source_turn_ids=[4], scope="channel:9"),
        ]))
        supersede_db.supersede(store, [old_a.id], new_a.id)
        supersede_db.supersede(store, [old_dm.id], new_dm.id)
        publish_snapshot(store.conn, tmp_path / "serving", store_watermark=store.serving_watermark())
    snapshot = SnapshotReader(tmp_path / "serving").current()
    report = retired_facts_report(snapshot, visible=("guild:1",))
    assert report.splitlines() == [
        "=== memory in guild:1: 1 current facts, 1 retired ===",
        f"retired #{old_a.id} 'Server fact, old.' <- replaced by #{new_a.id} 'Server fact, new.'",
    ]
    assert "Secret" not in report
    assert "Secret from the DM, old." in retired_facts_report(snapshot, visible=("channel:9",))
    assert retired_facts_report(snapshot, visible=()).startswith("=== memory in no scope: 0 current facts, 0 retired")


# --------------------------------------------------------------------------- a full disk


def test_a_full_disk_keeps_messages_in_order_and_stores_them_when_space_is_back(tmp_path, fake):
    """No message is lost and the transport never sees an exception: each gets a notice, no reply;
    once the disk has room they reach the log in order, each with the time it was said."""
    from tests.helpers import FullDisk, long_line

    responder, _, log = make(tmp_path)
    fake.script(lambda messages: "ok!")
    run(responder.handle(msg("before, Fam")))
    with FullDisk(log) as disk:
        notices = [run(responder.handle(msg(long_line(n) + " Fam"))) for n in range(3)]
        assert all(len(n) == 1 and "I couldn't take that message in" in n[0] and "holding on to it" in n[0]
                   for n in notices), notices
        assert str(tmp_path) not in notices[0][0]
        assert len(responder.spool) == 3 and responder.stats.spooled == 3
        assert not responder.flush_spool(), "still full"
        disk.free()
        assert responder.flush_spool() and len(responder.spool) == 0
    replies = run(responder.handle(msg("after, Fam")))
    assert replies == ["ok!"]
    users = [t for t in log.recent(CHANNEL, 100) if t.role == "user"]
    assert [t.content.split(" ")[:2] for t in users] == [["before,", "Fam"], ["line", "0"], ["line", "1"],
                                                           ["line", "2"], ["after,", "Fam"]]
    times = [t.created_at for t in users]
    assert times == sorted(times) and len(set(times)) == len(times), "each with its own time"


def test_the_spool_drains_by_itself_once_the_disk_has_room(tmp_path, fake):
    from tests.helpers import FullDisk, long_line

    responder, _, log = make(tmp_path)

    async def scenario():
        with FullDisk(log) as disk:
            await responder.handle(msg(long_line(1)))
            await responder.handle_edit("404", "never seen")  # an edit waits in line too
            disk.free()
            for _ in range(100):  # the retry loop's first attempt comes after 1 s
                if not len(responder.spool):
                    break
                await asyncio.sleep(0.05)
        return len(responder.spool)

    assert run(scenario()) == 0, "nobody spoke again, yet the kept message was stored"
    assert [t.content[:6] for t in log.recent(CHANNEL, 10)] == ["line 1"]


def test_a_full_spool_refuses_loudly(tmp_path, fake, caplog):
    from familiar_bot.responder.spool import Spool
    from tests.helpers import FullDisk, long_line

    responder, _, log = make(tmp_path)
    responder.spool = Spool(max_items=2)
    with FullDisk(log):
        kept = [run(responder.handle(msg(long_line(n)))) for n in range(2)]
        with caplog.at_level(logging.ERROR):
            refused = run(responder.handle(msg(long_line(2))))
    assert all("holding on to it" in k[0] for k in kept)
    assert "This one was not kept: please send it again later" in refused[0]
    assert responder.stats.refused == 1 and "REFUSED" in caplog.text
    assert responder.flush_spool()
    assert [t.content[:6] for t in log.recent(CHANNEL, 10)] == ["line 0", "line 1"]


def test_what_still_waits_at_exit_is_written_for_familiar_import(tmp_path, fake, caplog):
    from familiar_bot.app.cli.commands.import_ import import_transcript
    from tests.helpers import FullDisk, long_line

    responder, _, log = make(tmp_path)
    with FullDisk(log):
        for n in range(2):
            run(responder.handle(msg(long_line(n))))
        with caplog.at_level(logging.ERROR):
            responder.close_spool()
    [dumped] = list(responder.paths.dir.glob("spooled-*.jsonl"))
    assert f"familiar import --familiar fam {dumped}" in caplog.text
    result = import_transcript(log, dumped.read_text().splitlines())
    stored = log.recent(CHANNEL, 10)
    assert result.imported == 2 and [t.content[:6] for t in stored] == ["line 0", "line 1"]
    assert {t.author_key for t in stored} == {ANA.key}, "the same participant as a live message"
