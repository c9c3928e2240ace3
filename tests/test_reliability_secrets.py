"""Secrets: planted fake tokens and keys never show up anywhere a person or a file could read.

A Discord token and an LLM API key are planted in the environment; the familiar then
chats (including a provider error that quotes the key back, as real providers do),
runs its pipeline, and answers `/context` and `familiar prompt`. Afterwards every log
record, every Dagster event of the run, every file under the familiar's folder and
the Dagster instance, the reports and the exception text are searched for the secrets.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import asyncio
import logging
from pathlib import Path

import dagster as dg
import pytest

from familiar_bot.app import supervisor

from familiar_bot.app.cli import main as cli
from familiar_bot.responder.messages import IncomingMessage, Person
from familiar_bot.responder.notices import APOLOGY
from familiar_bot.responder.opening import open_responder
from familiar_pipeline.config import load_config
from familiar_pipeline.testing.fake_llm import FakeLLM, fake_llm
from familiar_pipeline.models.llm import LlmError, client_for
from familiar_pipeline.testing.scripted import careful_model
from tests.conftest import host_free

from .helpers import append_chat, make_familiar
from .test_pipeline import run_assets

# The projection assets these tests run, by name.
facts, rolling_summary, turns_fts = "facts", "rolling_summary", "turns_fts"

DISCORD_TOKEN = "MTA5ODc2NTQzMjEw.PLANTED.discord-token-never-print-me"
API_KEY = "sk-planted-4b1d-never-print-me-9f3e"
SECRETS = (DISCORD_TOKEN, API_KEY, "never-print-me")
TOML = """
aliases = ["Fam"]

[llm.reply]
model = "fake/reply"
api_key_env = "FAMILIAR_TEST_API_KEY"
max_retries = 0

[llm.background]
model = "fake/careful"
api_key_env = "FAMILIAR_TEST_API_KEY"
max_retries = 0
"""


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def file_leaks(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in SECRETS if s.encode() in data]
    return found


@pytest.fixture
def planted(monkeypatch, tmp_path):
    for name in list(os.environ):
        if host_free(name):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DISCORD_TOKEN", DISCORD_TOKEN)
    monkeypatch.setenv("FAMILIAR_TEST_API_KEY", API_KEY)
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    return tmp_path


def reply_or_leaky_error(messages):
    last = str(messages[-1]["content"])
    if "atomic facts" in str(messages[0]["content"]) or "running summary" in str(messages[0]["content"]):
        return careful_model(messages)
    if "trigger an error" in last:
        # Real providers quote (part of) the key back in auth errors.
        return FakeLLM.error("auth", f"Incorrect API key provided: {API_KEY}. Check your key.")
    return "Happy to help!"


def test_planted_secrets_never_leak(planted, caplog, capsys):
    caplog.set_level(logging.DEBUG)  # litellm's own debug logging included
    root = planted
    paths = make_familiar(root, "fam", TOML)
    paths.character_md.write_text("You are Fam.")
    append_chat(paths, 20)
    config = load_config("fam", root=root)
    assert config.secrets.discord_token == DISCORD_TOKEN, "the token was really planted"
    ana = Person(key="discord:111", username="ana", global_name="Ana")
    with fake_llm() as fake:
        fake.script(reply_or_leaky_error)
        handle = open_responder(paths, config)
        try:
            async def chat():
                ok = await handle.responder.handle(IncomingMessage(10, ana, "hi Fam", guild_id=1, addressed=True))
                bad = await handle.responder.handle(IncomingMessage(10, ana, "Fam trigger an error", guild_id=1, addressed=True))
                report = await handle.responder.context_report(10, guild_id=1, cue="hi")
                return ok, bad, report
            ok, bad, report = asyncio.run(chat())
        finally:
            handle.close()
        assert ok == ["Happy to help!"] and bad == [APOLOGY]
        assert fake.calls[0].api_key == API_KEY, "the key reached the provider"

        with pytest.raises(LlmError) as err:
            client_for(config.llm, "reply").complete([{"role": "user", "content": "trigger an error"}])
        exception_text = f"{err.value!s} {err.value!r} {err.value.__cause__!r}"

        with dg.instance_for_test() as instance:
            result = run_assets(root, "fam", instance, [turns_fts, facts, rolling_summary])
            assert result.success
            events = "\n".join(repr(e) for e in instance.all_logs(result.run_id))
            metadata = repr([m.materialization.metadata for m in result.get_asset_materialization_events()])
            instance_files = file_leaks(Path(instance.root_directory))

    assert cli.main(["prompt", "--familiar", "fam", "--channel", "10", "hi"]) == 0
    assert cli.main(["config", "show", "--familiar", "fam"]) == 0
    printed = capsys.readouterr()

    assert not leaks(exception_text), exception_text
    assert not leaks(report)
    assert not leaks(printed.out + printed.err)
    assert not leaks(caplog.text), [r.getMessage()[:200] for r in caplog.records if leaks(r.getMessage())]
    assert not leaks(events) and not leaks(metadata)
    assert not file_leaks(root) and not instance_files


def test_servers_bind_to_localhost_by_default():
    parser = cli.build_parser()
    assert parser.parse_known_args(["up"])[0].host == "127.0.0.1"
    # backfill listens on nothing and picks no address itself: it only uses the one its own
    # `familiar up` recorded in DAGSTER_HOME (tests/test_backfill_target.py).
    assert not hasattr(parser.parse_known_args(["backfill", "--familiar", "fam", "--projection", "facts"])[0], "host")
    assert "127.0.0.1" in supervisor.dagster_dev_argv(parser.parse_known_args(["up"])[0].host, 3000)
