"""`familiar chat` as a user runs it: a real subprocess, lines on stdin, the fake model by config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from familiar_bot.transports.console import console_person
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLog

REPO = Path(__file__).resolve().parents[1]
FAKE_RESPONDER = "tests.test_console:answer_from_history"


def answer_from_history(messages):
    """The subprocess's scripted model: proves it saw the system prompt and the latest line."""
    last = messages[-1]["content"]
    return f"you said: {last.split('] ', 1)[-1]} (system prompt {len(messages[0]['content'])} chars)"


def familiar_command() -> list[str]:
    script = Path(sys.executable).parent / "familiar"
    return [str(script)] if script.exists() else [sys.executable, "-c",
                                                  "import sys; from familiar_bot.cli.main import main; sys.exit(main())"]


def chat(tmp_path: Path, stdin: str, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAMILIAR") and k != "DISCORD_TOKEN"}
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
    assert "hello there" in replies[0] and "how are you?" in replies[1]
    # /context printed the report; /quit ended the session before "never read".
    report = result.stdout.split(replies[1], 1)[1]
    assert "=== character_card:" in report and "=== recent_history:" in report and "=== total:" in report
    turns, people = turns_of(tmp_path, "owl")
    assert [(t.role, t.channel_id) for t in turns] == [("user", 7), ("assistant", 7)] * 2
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
