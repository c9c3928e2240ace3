"""`familiar facts`: current facts, retired ones with lineage, subject filter, as-of slices; reads the snapshot."""

from __future__ import annotations

import pytest

from familiar_bot.app.cli.main import main
from familiar_pipeline.storage.snapshots import publish_snapshot
from familiar_pipeline.projectors.facts.store import FactDraft
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

from .fact_helpers import BO, CASS
from .helpers import make_familiar


@pytest.fixture
def published(tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path)
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_fact(store, FactDraft("Cass lives in Berlin.", (1,), (CASS,), valid_from="2026-01-01", importance=6))
        facts_db.append_fact(store, FactDraft("Cass moved to Lisbon.", (5,), (CASS,), valid_from="2026-03-01"))
        facts_db.append_fact(store, FactDraft("Bo keeps bees.", (7,), (BO,), valid_from="2026-02-01"))
        supersede_db.supersede(store, [1], 2)
        publish_snapshot(store.conn, paths.serving_dir, store_watermark=store.serving_watermark())
    return paths


def test_current_facts_with_lineage(published, capsys):
    assert main(["facts", "--familiar", "fam"]) == 0
    out = capsys.readouterr().out
    assert "2 fact(s), current" in out and "#2 [current] Cass moved to Lisbon." in out and "replaces #1" in out
    assert "Berlin" not in out and "valid 2026-03-01 → …" in out and "from turns 5" in out


def test_include_retired_and_subject_filter(published, capsys):
    assert main(["facts", "--familiar", "fam", "--subject", "discord:111", "--include-retired"]) == 0
    out = capsys.readouterr().out
    assert "#1 [retired " in out and "by #2] Cass lives in Berlin." in out and "importance 6" in out
    assert "bees" not in out


def test_as_of_gives_the_world_time_slice(published, capsys):
    assert main(["facts", "--familiar", "fam", "--as-of", "2026-02-15"]) == 0
    out = capsys.readouterr().out
    assert "Cass lives in Berlin." in out and "Bo keeps bees." in out and "Lisbon" not in out


def test_works_while_a_run_holds_the_store(published, capsys):
    with ProjectionStore(published.memory_db):  # a pipeline run's write connection
        assert main(["facts", "--familiar", "fam"]) == 0
    assert "Lisbon" in capsys.readouterr().out


def test_bad_input_is_one_clear_error(published, capsys):
    assert main(["facts", "--familiar", "nobody"]) != 0
    assert "no familiar 'nobody'" in capsys.readouterr().err
    assert main(["facts", "--familiar", "fam", "--as-of", "last tuesday"]) != 0
    assert "--as-of" in capsys.readouterr().err


def test_nothing_published_yet(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    make_familiar(tmp_path, "new")
    assert main(["facts", "--familiar", "new"]) == 0
    assert "no facts published yet" in capsys.readouterr().out


def test_scope_keeps_only_that_scopes_facts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path)
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_fact(store, FactDraft("Cass plays oboe.", (1,), (CASS,), scope="guild:111"))
        facts_db.append_fact(store, FactDraft("Cass told a secret.", (2,), (CASS,), scope="channel:9"))
        facts_db.append_fact(store, FactDraft("Bo keeps bees.", (3,), (BO,), scope="guild:222"))
        facts_db.append_fact(store, FactDraft("Old mixed fact.", (4,), (BO,)))  # written before scopes
        publish_snapshot(store.conn, paths.serving_dir, store_watermark=store.serving_watermark())
    for scope, shown in (("guild:111", "oboe"), ("channel:9", "secret"), ("guild:222", "bees"),
                         ("familiar", "mixed")):
        assert main(["facts", "--familiar", "fam", "--scope", scope]) == 0
        out = capsys.readouterr().out
        assert f"1 fact(s) in scope {scope}, current" in out and shown in out
        assert f"scope {scope}" in out
        assert sum(word in out for word in ("oboe", "secret", "bees", "mixed")) == 1
    assert main(["facts", "--familiar", "fam", "--scope", "guild:333"]) == 0
    assert "0 fact(s) in scope guild:333" in capsys.readouterr().out
    assert main(["facts", "--familiar", "fam"]) == 0
    assert "4 fact(s), current" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["server:1", "guild:", "guild:x", "dm:5", ""])
def test_bad_scope_is_one_clear_error(published, capsys, bad):
    assert main(["facts", "--familiar", "fam", "--scope", bad]) != 0
    err = capsys.readouterr().err
    assert f"--scope {bad!r} is not a scope" in err and len(err.strip().splitlines()) == 1
