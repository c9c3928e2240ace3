"""`familiar backfill` waits for its run and says how it ended (issue 50, item 6).

Before, it printed "queued: ..." and returned, whatever became of the run, and an in-process
failure said only "see the Dagster UI"; `--projection fact` got no "did you mean". Here the
command runs in this process against a real Dagster instance of the test's own (DAGSTER_HOME
under tmp_path); `tests/test_up.py` runs it against a real `familiar up`.
"""

from __future__ import annotations

import dagster as dg
import pytest

from familiar_bot.app.cli.main import main
from tests.helpers import append_chat, make_familiar


@pytest.fixture
def root(tmp_path, monkeypatch):
    root = tmp_path / "familiars"
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for name in ("FAMILIAR_ID", "FAMILIAR__PIPELINE__SENSOR_INTERVAL_S"):
        monkeypatch.delenv(name, raising=False)
    append_chat(make_familiar(root, "fam", extra_toml=""), 6)
    broken = make_familiar(root, "broken", extra_toml="")
    broken.turns_db.write_bytes(b"this is not a database, it was overwritten " * 100)
    return root


def test_an_unknown_projection_gets_a_did_you_mean(root, capsys):
    assert main(["backfill", "--familiar", "fam", "--projection", "fact"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown projection 'fact'; did you mean 'facts'?" in err, err
    # The same words as for an unknown familiar.
    assert main(["backfill", "--familiar", "fan", "--projection", "facts"]) == 1
    assert "did you mean 'fam'?" in capsys.readouterr().err


def test_an_in_process_backfill_says_how_its_run_ended(root, capsys):
    assert main(["backfill", "--familiar", "fam", "--projection", "turns_fts", "--rebuild"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("succeeded: turns_fts for fam: ok") and out.endswith(", in this process)\n"), out
    assert "rows written 6" in out

    assert main(["backfill", "--familiar", "broken", "--projection", "turns_fts"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]  # after the run's own log (Dagster's, as in the UI)
    assert err.startswith("error: the turns_fts run for broken failed at step memory: "), err
    assert "TurnLogError" in err and "not a usable SQLite turn log" in err
    run_id = err.rsplit("(run ", 1)[1].split(",")[0]
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        ok = [r for r in instance.get_runs() if r.tags.get("familiar") == "fam"]
        assert [r.status for r in ok] == [dg.DagsterRunStatus.SUCCESS]


def test_wait_and_no_wait_contradict(root, capsys):
    assert main(["backfill", "--familiar", "fam", "--projection", "facts", "--no-wait", "--wait", "5"]) == 2
    assert "contradict" in capsys.readouterr().err
