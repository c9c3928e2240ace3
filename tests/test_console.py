"""`familiar chat` as a user runs it: a real subprocess, lines on stdin, the fake model by config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from familiar_bot.transports.console import console_person
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLog
from tests.conftest import host_free

REPO = Path(__file__).resolve().parents[1]
FAKE_RESPONDER = "tests.test_console:answer_from_history"


def answer_from_history(messages):
    """The subprocess's scripted model: proves it saw the system prompt and the latest line."""
    last = messages[-1]["content"]
    return f"you said: {last.split('] ', 1)[-1]} (system prompt {len(messages[0]['content'])} chars)"


def familiar_command() -> list[str]:
    script = Path(sys.executable).parent / "familiar"
    return [str(script)] if script.exists() else [sys.executable, "-c",
                                                  "import sys; from familiar_bot.app.cli.main import main; sys.exit(main())"]


def chat(tmp_path: Path, stdin: str, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not host_free(k)}
    env.update(FAMILIAR_DATA_ROOT=str(tmp_path), FAMILIAR_FAKE_LLM=FAKE_RESPONDER,
               LITELLM_LOCAL_MODEL_COST_MAP="True",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    env.update(env_extra or {})
    return subprocess.run(familiar_command() + ["chat", *args], input=stdin, capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


def turns_of(tmp_path: Path, familiar_id: str):
    with TurnLog(FamiliarPaths.for_id(familiar_id, tmp_path).turns_db, readonly=True) as log:
        return log.recent_cross_channel(100), log.participants()


def test_chat_creates_the_familiar_replies_and_exits_zero_at_eof(tmp_path):
    # One subprocess for the whole session: importing litellm dominates its run time.
    stdin = "hello there\n\nhow are you?\n/context lantern\n/quit\nnever read\n"
    result = chat(tmp_path, stdin, "--familiar", "owl", "--as", "Ana Lima", "--channel", "7",
                  env_extra={"FAMILIAR__LLM__REPLY__MODEL": "fake/console"})
    assert result.returncode == 0, result.stderr
    assert "created familiar 'owl'" in result.stderr
    replies = [line for line in result.stdout.splitlines() if line.startswith("Owl: ")]
    assert len(replies) == 2 and all(line.startswith("Owl: you said: ") for line in replies)
    # Both lines are recorded as soon as they are read (a reply never holds the next line back),
    # and each reply, composed one after the other, ends its history with the line it answers.
    assert "hello there" in replies[0] and "how are you?" in replies[1]
    # /context printed the report; /quit ended the session before "never read".
    report = result.stdout.split(replies[1], 1)[1]
    assert "=== character_card:" in report and "=== recent_history:" in report and "=== total:" in report
    turns, people = turns_of(tmp_path, "owl")
    assert [(t.role, t.channel_id) for t in turns] == [("user", 7)] * 2 + [("assistant", 7)] * 2
    assert [t.content for t in turns if t.role == "user"] == ["hello there", "how are you?"]  # blank line skipped
    assert {t.author_key for t in turns} == {"console:ana-lima", "ego:owl"}
    assert [(p.canonical_key, p.global_name) for p in people] == [("console:ana-lima", "Ana Lima")]
    assert FamiliarPaths.for_id("owl", tmp_path).character_md.is_file()  # made from the defaults


def test_chat_without_a_model_records_and_says_so_once(tmp_path):
    result = chat(tmp_path, "one\ntwo\nthree\n", "--familiar", "quiet", "--as", "bo")
    assert result.returncode == 0, result.stderr
    notices = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(notices) == 1 and "[llm.reply].model" in notices[0]
    turns, _ = turns_of(tmp_path, "quiet")
    assert [t.content for t in turns] == ["one", "two", "three"]
    assert {t.channel_id for t in turns} == {1} and {t.author_key for t in turns} == {"console:bo"}


def test_bad_arguments_are_one_line_errors(tmp_path):
    bad_channel = chat(tmp_path, "", "--channel", "0")
    assert bad_channel.returncode == 2 and bad_channel.stderr.strip().startswith("error: --channel")
    bad_name = chat(tmp_path, "", "--as", "!!!")
    assert bad_name.returncode == 2 and "error: --as" in bad_name.stderr
    bad_id = chat(tmp_path, "", "--familiar", "Not Valid")
    assert bad_id.returncode == 2 and "invalid familiar id" in bad_id.stderr
    assert not list(tmp_path.iterdir())  # nothing created on a refusal


@pytest.mark.parametrize("name, key, shown", [
    ("Ana", "console:ana", "Ana"),
    ("  Ana   Lima ", "console:ana-lima", "Ana Lima"),
    ("zoë", "console:zo", "zoë"),
])
def test_console_person(name, key, shown):
    person = console_person(name)
    assert (person.key, person.label) == (key, shown)


def test_the_speaker_is_asked_once_per_familiar_and_remembered(tmp_path):
    import io

    from familiar_bot.transports.console import SPEAKER_FILE, resolve_speaker

    asked = io.StringIO()
    person = resolve_speaker(tmp_path, None, fallback="root", stdin=io.StringIO("!!!\nSam Reyes\n"),
                             stdout=asked, interactive=True)
    assert (person.key, person.label) == ("console:sam-reyes", "Sam Reyes")
    assert asked.getvalue().count("What name should I know you by?") == 2  # "!!!" was refused, asked again
    assert (tmp_path / SPEAKER_FILE).read_text() == "Sam Reyes\n"
    again = io.StringIO()
    assert resolve_speaker(tmp_path, None, fallback="root", stdin=io.StringIO(""), stdout=again,
                           interactive=True).label == "Sam Reyes"
    assert again.getvalue() == "", "remembered: not asked a second time"
    assert resolve_speaker(tmp_path, "Ana", fallback="root").label == "Ana"  # --as wins for this session
    assert (tmp_path / SPEAKER_FILE).read_text() == "Sam Reyes\n"
    fresh = tmp_path / "other"
    assert resolve_speaker(fresh, None, fallback="root", stdin=io.StringIO("x\n"), interactive=False).label == "root"
    assert resolve_speaker(fresh, None, fallback="root", stdin=io.StringIO(""), stdout=io.StringIO(),
                           interactive=True) is None  # end of input before a name
    assert not (fresh / SPEAKER_FILE).exists()


def test_chat_prompt_shows_the_remembered_speaker(tmp_path):
    from familiar_bot.transports.console import SPEAKER_FILE

    (tmp_path / "owl").mkdir()
    (tmp_path / "owl" / SPEAKER_FILE).write_text("Sam\n")
    result = chat(tmp_path, "my sister Ana lives in Porto\n", "--familiar", "owl")
    assert result.returncode == 0, result.stderr
    turns, people = turns_of(tmp_path, "owl")
    assert {t.author_key for t in turns} == {"console:sam"}
    assert [(p.canonical_key, p.global_name) for p in people] == [("console:sam", "Sam")]


def test_a_scripted_model_outside_the_demo_is_refused_in_one_line(tmp_path):
    (tmp_path / "owl").mkdir()
    (tmp_path / "owl" / "character.toml").write_text('[llm.reply]\nmodel = "fake/reply"\n')
    result = chat(tmp_path, "hello\n", "--familiar", "owl", "--as", "Sam",
                  env_extra={"FAMILIAR_FAKE_LLM": ""})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "`familiar up --demo`" in lines[0] and "fake/reply" in lines[0]
    assert not (tmp_path / "owl" / "turns.db").exists() or not turns_of(tmp_path, "owl")[0]


def test_demo_model_answers_replies_plainly_labelled_and_projections_as_the_careful_model():
    from familiar_pipeline.testing.scripted import DEMO_REPLY_PREFIX, careful_model, demo_model

    reply = demo_model([{"role": "system", "content": "You are Fam.\n\n## Replying\nYou are Fam."},
                        {"role": "user", "content": "[10:00 Sam] I moved to Porto."}])
    assert reply.startswith(DEMO_REPLY_PREFIX) and '"I moved to Porto"' in reply
    facts_prompt = [{"role": "system", "content": "Extract atomic facts"}, {"role": "user", "content": "nothing"}]
    assert demo_model(facts_prompt) == careful_model(facts_prompt)


# --------------------------------------------------------------------------- a real terminal


async def slow_first_reply(messages):
    """The first reply takes 3 s (a slow model, a cold start); later ones answer at once."""
    import asyncio

    if not getattr(slow_first_reply, "warm", False):
        slow_first_reply.warm = True
        await asyncio.sleep(3)
    return "noted"


class Terminal:
    """`familiar chat` on a pseudo-terminal: what a person at a keyboard gets (line discipline included)."""

    def __init__(self, tmp_path: Path, *args: str, env_extra: dict | None = None):
        import pty
        import threading

        env = {k: v for k, v in os.environ.items() if not host_free(k)}
        env.update(FAMILIAR_DATA_ROOT=str(tmp_path), FAMILIAR_FAKE_LLM="tests.test_console:slow_first_reply",
                   LITELLM_LOCAL_MODEL_COST_MAP="True", TERM="xterm", INPUTRC="/dev/null",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])), **(env_extra or {}))
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(familiar_command() + ["chat", *args], stdin=slave, stdout=slave, stderr=slave,
                                        env=env, cwd=tmp_path, start_new_session=True)
        os.close(slave)
        self.output = bytearray()
        self._reader = threading.Thread(target=self._drain, daemon=True)  # a full pty would block the child
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output += chunk

    def type(self, text: str) -> None:
        data = text.encode()
        while data:
            data = data[os.write(self.master, data[:4096]):]

    def wait_for(self, needle: bytes, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while needle not in self.output:
            assert time.monotonic() < deadline and self.process.poll() is None, bytes(self.output[-2000:])
            time.sleep(0.05)

    def close(self) -> int:
        self.type("\x04")  # Ctrl-D: end of input
        try:
            return self.process.wait(timeout=60)
        finally:
            os.close(self.master)


def test_a_long_line_typed_on_a_terminal_is_stored_whole(tmp_path):
    """The terminal's canonical line buffer cuts a line at 4,095 bytes; the chat reads with line
    editing (readline), so a 51,197-character line typed (pasted) on a terminal is stored whole."""
    # The control: a plain read on a terminal gets the cut line, as `familiar chat` once did.
    import pty

    master, slave = pty.openpty()
    plain = subprocess.Popen([sys.executable, "-c", "import sys; print('got', len(sys.stdin.readline()))"],
                             stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    os.write(master, b"x" * 5000 + b"\n")
    assert plain.wait(timeout=30) == 0
    seen = b""
    try:
        while True:
            seen += os.read(master, 65536)
    except OSError:  # the child is gone and its output read
        pass
    os.close(master)
    assert b"got 4096" in seen, "the kernel's line buffer: 4,095 characters and the newline"

    make_familiar_with_model(tmp_path)
    line = " ".join(f"w{i}" for i in range(12000))[:51197]
    assert len(line) == 51197
    terminal = Terminal(tmp_path, "--familiar", "fam", "--as", "Sam")
    try:
        terminal.wait_for(b"Sam> ", 60)
        terminal.type(line + "\r")
        terminal.wait_for(b"Fam: noted", 90)
    finally:
        assert terminal.close() == 0
    turns, _ = turns_of(tmp_path, "fam")
    assert [len(t.content) for t in turns if t.role == "user"] == [51197]


def test_lines_typed_while_a_reply_is_composed_are_recorded_at_once_each_with_its_time(tmp_path):
    import time

    make_familiar_with_model(tmp_path)
    terminal = Terminal(tmp_path, "--familiar", "fam", "--as", "Sam")
    try:
        terminal.wait_for(b"Sam> ", 60)
        for n in range(3):  # the first reply takes 3 s: the next two lines are typed meanwhile
            terminal.type(f"line {n}\r")
            time.sleep(0.6)
        with TurnLog(FamiliarPaths.for_id("fam", tmp_path).turns_db, readonly=True) as log:
            recorded = [t for t in log.recent(1, 10)]
        assert [(t.role, t.content) for t in recorded] == [("user", f"line {n}") for n in range(3)], \
            "recorded before the first reply came back"
        terminal.wait_for(b"Fam: noted", 30)
    finally:
        assert terminal.close() == 0
    turns, _ = turns_of(tmp_path, "fam")
    users = [t for t in turns if t.role == "user"]
    gaps = [(b.created_at - a.created_at).total_seconds() for a, b in zip(users, users[1:])]
    assert all(0.4 < gap < 1.5 for gap in gaps), gaps  # each line's own time, as typed


def make_familiar_with_model(root: Path) -> None:
    familiar = FamiliarPaths.for_id("fam", root)
    familiar.dir.mkdir(parents=True)
    familiar.character_toml.write_text('aliases = ["Fam"]\n[llm.reply]\nmodel = "fake/console"\nmax_retries = 0\n')
    TurnLog(familiar.turns_db).close()


# --------------------------------------------------------------------------- /memory and /forget (issue 27)


def test_forget_me_through_familiar_chat_asks_then_erases_and_records_neither_line(tmp_path):
    result = chat(tmp_path, "I grow tomatoes\n/forget me\nyes\n", "--familiar", "owl", "--as", "Sam")
    assert result.returncode == 0, result.stderr
    assert "This forgets everything you (console:sam) have said to me, everywhere" in result.stdout
    assert "Type yes to confirm:" in result.stdout
    assert "Done (erasure #1): 1 message forgotten." in result.stdout
    with TurnLog(FamiliarPaths.for_id("owl", tmp_path).turns_db, readonly=True) as log:
        turns = log.recent_cross_channel(100, include_deleted=True)
        erasure, = log.erasures()
    assert [(t.content, t.deleted) for t in turns] == [("I grow tomatoes", True)]  # "/forget me", "yes": not turns
    assert (erasure.kind, erasure.target, erasure.scope, erasure.requested_by) == (
        "person", "console:sam", None, "console:sam")


@pytest.fixture
def console_familiar(tmp_path):
    """A familiar whose memory holds facts about the console's Sam (channel 1) and about Cass elsewhere."""
    from familiar_bot.prompt.assembly import Assembler
    from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.responder.flow import Responder
    from familiar_pipeline.models.llm import client_for
    from familiar_pipeline.projectors import builtin  # noqa: F401 - every built-in table declared first
    from tests.test_assembly import CASS, World

    world = World(tmp_path)
    sam = ("console:sam", "Sam")
    said = [world.say("I grow tomatoes", sam, channel=1, guild=None),
            world.say("and peppers", sam, channel=1, guild=None),
            world.say("I play the oboe", CASS, channel=10, guild=111)]
    world.fact("Sam grows tomatoes.", [sam], [said[0].id], channel=1, scope="channel:1")
    world.fact("Sam grows peppers.", [sam], [said[1].id], channel=1, scope="channel:1")
    world.fact("Cass plays the oboe.", [CASS], [said[2].id], channel=10, scope="guild:111")
    world.publish()
    config = world.config()
    memory = MemoryView(world.paths, config, turn_log=world.log)
    responder = Responder(world.paths, config, assembler=Assembler(memory, [RecentHistoryLayer()]),
                          llm=client_for(config.llm, "reply"), turn_log=world.log)
    yield world, responder, said
    memory.close()
    world.close()


def console_session(responder, typed: str) -> str:
    import asyncio
    import io

    from familiar_bot.transports.console import run_console

    out = io.StringIO()
    assert asyncio.run(run_console(responder, speaker=console_person("Sam"), stdin=io.StringIO(typed), stdout=out,
                                   interactive=False)) == 0
    return out.getvalue()


def test_console_memory_lists_what_is_held_here_and_exports_it_privately(console_familiar, tmp_path):
    import stat

    world, responder, said = console_familiar
    target = tmp_path / "exports"
    target.mkdir()
    printed = console_session(responder, f"/memory\n/memory export {target}\n/memory export {target / 'sam.json'}\n")
    assert "What I remember about you here (channel:1):" in printed
    assert f"- Sam grows tomatoes. [turn #{said[0].id}]" in printed and "Cass" not in printed
    assert "Messages of yours I remember here: 2." in printed
    written = [line.split(" to ", 1)[1].split(" (readable")[0] for line in printed.splitlines()
               if line.startswith("Wrote 2 messages and 2 facts about you to ")]
    assert len(written) == 2 and written[1] == str((target / "sam.json").resolve())
    for path in map(Path, written):
        assert path.parent == target.resolve() and stat.S_IMODE(path.stat().st_mode) == 0o600
        data = json.loads(path.read_text())
        assert data["person"] == "console:sam" and data["scopes"] == ["channel:1"]
        assert [t["content"] for t in data["turns"]] == ["I grow tomatoes", "and peppers"]
        assert [f["text"] for f in data["facts"]] == ["Sam grows tomatoes.", "Sam grows peppers."]
    assert sorted(p.name for p in target.iterdir()) == sorted(Path(w).name for w in written)  # no partial files
    assert world.log.count() == 3  # commands are not messages


def test_console_forget_a_turn_then_everything_after_a_yes(console_familiar):
    world, responder, said = console_familiar
    printed = console_session(responder, f"/forget #{said[0].id}\n/forget me\nno\n/forget 999\n/forget me\nyes\n/help\n")
    lines = printed.splitlines()
    assert lines[0] == ("Done (erasure #1): 1 message forgotten. I no longer quote them, and what was learnt "
                        "from them leaves memory within a minute or so.")
    assert lines[1].startswith("This forgets everything you (console:sam)") and lines[1].endswith("Type yes to confirm:")
    assert lines[2] == "Cancelled: nothing was erased."
    assert lines[3] == "I have no message 999 on record, so there is nothing to forget."
    # Both of Sam's turns: the one forgotten already is in it too, so its text is purged with the rest.
    assert lines[4].startswith("This forgets everything") and lines[5].startswith("Done (erasure #2): 2 messages")
    assert "/memory export [path]" in printed and "/forget me" in printed  # /help
    first, everything = world.log.erasures()
    assert first.turn_ids == (said[0].id,) and first.target == f"turn:{said[0].id}"
    assert (everything.kind, everything.scope) == ("person", None)
    assert world.log.count() == 3 and [t.deleted for t in world.log.turns_by_ids([s.id for s in said])] == [
        True, True, False]
