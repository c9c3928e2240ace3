"""`familiar prompt`: the assembled prompt, section by section, with nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from familiar_bot.app.cli import main as cli
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLog
from tests.helpers import append_chat, make_familiar

LOREBOOK = """
[[entries]]
keys = ["bakery"]
content = "The Crumb & Co bakery on Elm Street opens at six."
"""


@pytest.fixture
def root(clean_env) -> Path:
    return clean_env


def prompt(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["prompt", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prompt_shows_every_section_with_tokens_and_writes_nothing(root, capsys):
    paths = make_familiar(root, "fam", extra_toml='aliases = ["Fam"]\n')
    paths.character_md.write_text("You are Fam, a fox spirit.")
    paths.lorebook_toml.write_text(LOREBOOK)
    append_chat(paths, 6, channel_id=10)
    with TurnLog(paths.turns_db) as log:
        before = (log.count(), log.latest_change_seq())
    mtime = paths.turns_db.stat().st_mtime_ns

    code, out, err = prompt(capsys, "--familiar", "fam", "--channel", "10", "--guild", "1",
                            "what time does the bakery open?")

    assert code == 0, err
    headers = [line for line in out.splitlines() if line.startswith("=== ")]
    names = [h.split(":")[0].removeprefix("=== ") for h in headers]
    assert names == ["character_card", "operating_mode", "standing_wishes", "lorebook", "conversation_summary", "reflection",
                     "people_dossier", "rag_context", "recent_history", "total", "scopes"]
    assert all(" tokens" in h for h in headers[:-1])
    assert "You are Fam, a fox spirit." in out
    assert "Crumb & Co bakery" in out  # the lorebook matched "bakery" in the channel's recent turns
    assert "I just moved to Berlin for a new job at a bakery (#0)" in out  # recent history, as messages
    with TurnLog(paths.turns_db) as log:
        assert (log.count(), log.latest_change_seq()) == before  # no turn for the cue
    assert paths.turns_db.stat().st_mtime_ns == mtime


def test_prompt_for_an_empty_channel_still_reports(root, capsys):
    make_familiar(root, "fam")
    code, out, err = prompt(capsys, "--familiar", "fam", "--channel", "99", "hello")
    assert code == 0, err
    assert "=== recent_history: 0 tokens ===" in out and "=== total:" in out


def test_prompt_refusals_are_one_line(root, capsys):
    code, _, err = prompt(capsys, "--familiar", "ghost", "--channel", "1", "hi")
    assert code == 1 and err.startswith("error: no familiar 'ghost'") and len(err.strip().splitlines()) == 1
    assert not FamiliarPaths.for_id("ghost", root).dir.exists()
    make_familiar(root, "fam")
    code, _, err = prompt(capsys, "--familiar", "fam", "--channel", "0", "hi")
    assert code == 2 and err.startswith("error: --channel")
    code, _, err = prompt(capsys, "--familiar", "fam", "hi")  # --channel is required
    assert code == 2 and "--channel" in err


def test_prompt_says_which_scopes_it_read_and_counts_what_they_left_out(root, capsys):
    from familiar_pipeline.projectors.facts import store as facts_db
    from familiar_pipeline.projectors.facts.store import FactDraft
    from familiar_pipeline.storage.snapshots import publish_snapshot
    from familiar_pipeline.storage.store import ProjectionStore

    paths = make_familiar(root, "fam")
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_fact(store, FactDraft("The walrus lives here.", (1,), scope="guild:1"))
        facts_db.append_fact(store, FactDraft("The walrus was in a DM.", (2,), scope="channel:77"))
        facts_db.append_fact(store, FactDraft("The walrus of old.", (3,)))  # familiar-wide
        publish_snapshot(store.conn, paths.serving_dir, store_watermark=store.serving_watermark())
        from familiar_pipeline.storage.fts import FtsIndex
        with FtsIndex(paths.fts_facts, writable=True) as ix:
            ix.rebuild(store.conn.execute("SELECT id, text FROM facts").fetchall())

    code, out, err = prompt(capsys, "--familiar", "fam", "--channel", "10", "--guild", "1", "the walrus?")
    assert code == 0, err
    assert "The walrus lives here." in out and "DM" not in out and "of old" not in out
    assert "=== scopes: this reply reads guild:1 only ===" in out
    assert "rows of other scopes left out: 2 (" in out and "rag_context facts 2" in out

    (paths.character_toml).write_text(paths.character_toml.read_text()
                                      + '\n[memory.scopes]\ngroups = { mine = ["guild:1", "channel:77"] }\n')
    code, out, err = prompt(capsys, "--familiar", "fam", "--channel", "10", "--guild", "1", "the walrus?")
    assert code == 0, err
    assert "The walrus was in a DM." in out and "of old" not in out
    assert "=== scopes: this reply reads guild:1 and, joined by [memory.scopes], channel:77 ===" in out
    assert "rag_context facts 1" in out
