"""Config faults: a malformed character.toml is a clear one-line error wherever it is loaded
(pipeline step, bot start, CLI); a malformed lorebook.toml at runtime is a warning and the
running bot keeps the previous good entries."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import logging

import dagster as dg
import pytest

from familiar_bot.app.cli import main as cli
from familiar_bot.responder.messages import IncomingMessage, Person
from familiar_bot.responder.opening import open_responder
from familiar_pipeline.config import ConfigError, load_config
from familiar_pipeline.testing.fake_llm import fake_llm
from familiar_pipeline.defs.jobs import materialize_in_process

from .helpers import make_familiar

# The projection assets these tests run, by name.
facts = "facts"

GOOD = 'aliases = ["Fam"]\n[llm.reply]\nmodel = "fake/reply"\nmax_retries = 0\n'
MALFORMED = {
    "not_toml": ('aliases = ["Fam"\n[llm', "TOML"),
    "wrong_type": ("aliases = 3\n", "aliases"),
    "unknown_key": ("[pipeline]\nmax_batches_per_runn = 3\n", "max_batches_per_runn"),
    "out_of_range": ("[pipeline]\nmax_batches_per_run = 0\n", "max_batches_per_run"),
    "bad_channel_id": ('[channels."general"]\nrespond_to_all = true\n', "general"),
    "bad_env_name": ('[llm.reply]\nmodel = "fake/x"\napi_key_env = "sk-live-abc123"\n', "api_key_env"),
    "unknown_projector": ('[providers.memory]\nprojectors = ["rich_note", "telepathy"]\n', "telepathy"),
    "binary_garbage": ("\x00\x01\x02 = = =\n", "character.toml"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_character_toml_is_one_clear_error_everywhere(clean_env, case, capsys):
    text, named = MALFORMED[case]
    paths = make_familiar(clean_env, "fam", text)
    with pytest.raises(ConfigError) as err:
        load_config("fam", root=clean_env, env={})
    message = str(err.value)
    assert str(paths.character_toml) in message and named.lower() in message.lower(), message
    assert "sk-live-abc123" not in message, "a rejected value that may be a secret is not echoed"

    assert cli.main(["prompt", "--familiar", "fam", "--channel", "1", "hi"]) == cli.EXIT_CONFIG
    err_text = capsys.readouterr().err.strip()
    assert "Traceback" not in err_text and str(paths.character_toml) in err_text, err_text

    with pytest.raises(ConfigError):
        open_responder(paths, load_config("fam", root=clean_env, env={}))

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["fam"])
        result = materialize_in_process([facts], instance=instance, data_root=clean_env, partition_key="fam",
                                        raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "ConfigError" in failure.event_specific_data.error.to_string()


def test_a_lorebook_broken_at_runtime_keeps_the_last_good_entries(clean_env, caplog):
    paths = make_familiar(clean_env, "fam", GOOD)
    paths.character_md.write_text("You are Fam.")
    paths.lorebook_toml.write_text('[[entries]]\nkeys = ["bakery"]\ncontent = "The bakery opens at six."\n')
    ana = Person("discord:111", "ana", "Ana")
    with fake_llm() as fake:
        fake.script(lambda messages: "ok!")
        handle = open_responder(paths, load_config("fam", root=clean_env, env={}))
        try:
            async def ask():
                return await handle.responder.handle(
                    IncomingMessage(10, ana, "Fam, when does the bakery open?", guild_id=1, addressed=True))

            assert asyncio.run(ask()) == ["ok!"]
            assert "opens at six" in fake.calls[-1].messages[0]["content"]
            for broken in ('[[entries]\nkeys = ["bakery"', "entries = 3\n", "\x00\xff"):
                paths.lorebook_toml.write_text(broken)
                st = paths.lorebook_toml.stat()
                os.utime(paths.lorebook_toml, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
                with caplog.at_level(logging.WARNING):
                    assert asyncio.run(ask()) == ["ok!"], "a broken lorebook never stops a reply"
                assert "opens at six" in fake.calls[-1].messages[0]["content"], broken
            assert "lorebook" in caplog.text.lower()
        finally:
            handle.close()
