"""The `familiar` CLI: help, init, config show, and one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from familiar_bot.app.cli import main as cli
from familiar_pipeline.storage import paths
from tests.conftest import host_free

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(clean_env) -> Path:
    return clean_env


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    return lines[0]


def test_help_lists_the_subcommands(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in cli.COMMANDS:
        assert command.name in out and command.help in out


def test_config_help_lists_show(capsys):
    code, out, _ = run(capsys, "config", "--help")
    assert code == 0 and "show" in out


def test_no_subcommand_is_a_usage_error(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "usage:" in err


def test_init_creates_the_familiar(root, capsys):
    code, out, err = run(capsys, "init", "night-owl")
    assert code == 0, err
    familiar = paths.FamiliarPaths.for_id("night-owl", root)
    override = tomllib.loads(familiar.character_toml.read_text())
    assert override == {"aliases": ["Night Owl"]}  # everything else is a commented hint
    assert familiar.character_md.read_bytes() == (paths.SHIPPED_DEFAULT_DIR / "character.md").read_bytes()
    assert familiar.turns_db.exists()
    assert "'night-owl' (Night Owl) is ready" in out


def test_init_creates_a_real_turn_log(root, capsys):
    turns = pytest.importorskip("familiar_pipeline.storage.turns", reason="the turn log module is written by another issue")
    assert run(capsys, "init", "sapphire")[0] == 0
    log = turns.TurnLog(paths.FamiliarPaths.for_id("sapphire", root).turns_db)
    try:
        assert log.count() == 0
    finally:
        log.close()
    assert paths.list_familiars(root) == ["sapphire"]


def test_init_with_alias(root, capsys):
    assert run(capsys, "init", "sapphire", "--alias", "Saph")[0] == 0
    code, out, _ = run(capsys, "config", "show", "--familiar", "sapphire")
    assert code == 0 and 'aliases = ["Saph"]' in out


def test_init_twice_refuses_and_changes_nothing(root, capsys):
    assert run(capsys, "init", "sapphire")[0] == 0
    familiar = paths.FamiliarPaths.for_id("sapphire", root)
    familiar.character_md.write_text("my own persona\n")
    before = sorted(p.name for p in familiar.dir.iterdir())

    code, _, err = run(capsys, "init", "sapphire")
    assert code == 1
    line = assert_one_line_error(err)
    assert "already exists" in line and "--force" in line
    assert familiar.character_md.read_text() == "my own persona\n"
    assert sorted(p.name for p in familiar.dir.iterdir()) == before


def test_init_force_keeps_turns_and_backs_up_edited_files(root, capsys):
    turns = pytest.importorskip("familiar_pipeline.storage.turns", reason="the turn log module is written by another issue")
    assert run(capsys, "init", "sapphire")[0] == 0
    familiar = paths.FamiliarPaths.for_id("sapphire", root)
    log = turns.TurnLog(familiar.turns_db)
    log.append_turn(channel_id=1, role="user", content="remember me", author_key="discord:42")
    log.close()
    familiar.character_md.write_text("my own persona\n")

    code, out, err = run(capsys, "init", "sapphire", "--force")
    assert code == 0, err
    assert "kept turn log" in out
    log = turns.TurnLog(familiar.turns_db)
    try:
        assert [t.content for t in log.turns_after(0)] == ["remember me"]
    finally:
        log.close()
    backups = list(familiar.dir.glob("character.md.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == "my own persona\n"
    assert not list(familiar.dir.glob("character.toml.bak-*"))  # unchanged: nothing to back up
    assert familiar.character_md.read_bytes() == (paths.SHIPPED_DEFAULT_DIR / "character.md").read_bytes()


def test_init_rejects_a_bad_id(root, capsys):
    code, _, err = run(capsys, "init", "Not Valid")
    assert code == 2
    assert "invalid familiar id 'Not Valid'" in assert_one_line_error(err)
    assert list(root.iterdir()) == []


def test_config_show_prints_the_effective_config(root, capsys, monkeypatch):
    assert run(capsys, "init", "sapphire")[0] == 0
    monkeypatch.setenv("FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE", "7")
    monkeypatch.setenv("DISCORD_TOKEN", "planted-discord-token")
    code, out, err = run(capsys, "config", "show", "--familiar", "sapphire")
    assert code == 0, err
    shown = tomllib.loads(out)
    assert shown["providers"]["memory"]["rich_note"]["batch_size"] == 7
    assert shown["aliases"] == ["Sapphire"]
    assert "planted-discord-token" not in out + err
    assert '"***set***"' in out
    assert str(paths.FamiliarPaths.for_id("sapphire", root).character_toml) in out


def test_config_show_defaults_to_familiar_id_env(root, capsys, monkeypatch):
    monkeypatch.setenv("FAMILIAR_ID", "owl")
    code, out, err = run(capsys, "config", "show")
    assert code == 0
    assert "familiar 'owl'" in out
    assert "does not exist; showing the defaults" in err


def test_malformed_toml_is_one_line_and_exit_2(root, capsys):
    assert run(capsys, "init", "sapphire")[0] == 0
    own = paths.FamiliarPaths.for_id("sapphire", root).character_toml
    own.write_text("[pipeline]\nsensor_interval_s = \n")
    code, out, err = run(capsys, "config", "show", "--familiar", "sapphire")
    assert code == 2 and out == ""
    line = assert_one_line_error(err)
    assert f"{own}: invalid TOML at line 2" in line


def test_invalid_value_is_one_line_and_exit_2(root, capsys):
    assert run(capsys, "init", "sapphire")[0] == 0
    own = paths.FamiliarPaths.for_id("sapphire", root).character_toml
    own.write_text('[providers.memory]\nprojectors = ["rich_notes"]\n')
    code, _, err = run(capsys, "config", "show", "--familiar", "sapphire")
    assert code == 2
    assert "unknown projector 'rich_notes'; valid:" in assert_one_line_error(err)


def _familiar_command() -> list[str]:
    uv = shutil.which("uv")
    if uv:
        return [uv, "run", "--no-sync", "familiar"]  # --no-sync: never modify the environment
    return [str(Path(sys.executable).parent / "familiar")]


def test_real_process_config_show(tmp_path):
    env = {k: v for k, v in os.environ.items() if not host_free(k)}
    env.update(FAMILIAR_DATA_ROOT=str(tmp_path), DISCORD_TOKEN="planted-subprocess-token")
    good = subprocess.run(_familiar_command() + ["config", "show", "--familiar", "owl"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert tomllib.loads(good.stdout)["pipeline"]["sensor_interval_s"] == 5
    assert "planted-subprocess-token" not in good.stdout + good.stderr

    (tmp_path / "owl").mkdir()
    (tmp_path / "owl" / "character.toml").write_text("aliases = [\n")
    bad = subprocess.run(_familiar_command() + ["config", "show", "--familiar", "owl"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert_one_line_error(bad.stderr)


def test_an_unknown_familiar_is_refused_the_same_way_everywhere_with_near_names(root, capsys, tmp_path):
    """A typo never silently becomes a new familiar: chat refuses it as facts, import and prompt do."""
    assert run(capsys, "init", "demo")[0] == 0
    transcript = tmp_path / "talk.jsonl"
    transcript.write_text('{"speaker": "Sam", "text": "hi", "timestamp": "2024-05-01T10:00:00Z"}\n')
    for argv in (["chat", "--familiar", "demp", "--as", "Sam"], ["facts", "--familiar", "demp"],
                 ["import", "--familiar", "demp", str(transcript)], ["prompt", "--familiar", "demp", "--channel", "1", "hi"],
                 ["backfill", "--familiar", "demp", "--projection", "facts"]):
        code, _, err = run(capsys, *argv)
        line = assert_one_line_error(err)
        assert code == 1 and line == (f"error: no familiar 'demp' under {root}; did you mean 'demo'? "
                                      "(to create it: familiar init demp)"), argv
    assert not (root / "demp").exists(), "nothing created"


def test_the_first_familiar_on_an_empty_data_root_is_created_by_chat(root, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    code, _, err = run(capsys, "chat", "--familiar", "first", "--as", "Sam")
    assert code == 0 and "created familiar 'first' from the defaults" in err
    assert (root / "first" / "turns.db").exists()


# --------------------------------------------------------------------------- .env (issue 50 item 3)


def test_familiar_reads_dotenv_and_the_environment_both_the_environment_winning(tmp_path):
    """A real `familiar` process: one variable from the environment, others from a .env file (python-dotenv's
    quoting), and a variable set in both keeps the environment's value."""
    dotenv = tmp_path / "my.env"
    dotenv.write_text("# a comment\nFAMILIAR_ID=owl\nexport FAMILIAR__PIPELINE__SENSOR_INTERVAL_S=17\n"
                      "FAMILIAR__PIPELINE__MAX_FAMILIARS_PER_TICK=99\n"
                      "FAMILIAR__LLM__BACKGROUND__MODEL='openrouter/some model'\n")
    env = {k: v for k, v in os.environ.items() if not host_free(k)}
    env.update(FAMILIAR_DATA_ROOT=str(tmp_path / "familiars"), FAMILIAR_ENV_FILE=str(dotenv),
               FAMILIAR__PIPELINE__MAX_FAMILIARS_PER_TICK="7")
    shown = subprocess.run(_familiar_command() + ["config", "show"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    config = tomllib.loads(shown.stdout)
    assert config["pipeline"]["sensor_interval_s"] == 17, "from .env"
    assert config["pipeline"]["max_familiars_per_tick"] == 7, "the environment wins over .env"
    assert config["llm"]["background"]["model"] == "openrouter/some model"
    assert f"{tmp_path / 'familiars' / 'owl' / 'character.toml'} does not exist" in shown.stderr, \
        "FAMILIAR_ID from .env, FAMILIAR_DATA_ROOT from the environment"


def test_the_repository_dotenv_is_the_default_and_an_empty_setting_reads_none(tmp_path, monkeypatch):
    from familiar_bot.app.cli.main import CliError, ENV_FILE_VAR, load_env_file

    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    (tmp_path / ".env").write_text("DISCORD_TOKEN=from-dotenv\nFAMILIAR_ID=kept\n")
    environ = {"FAMILIAR_ID": "set"}
    assert load_env_file(environ) == tmp_path / ".env"
    assert environ == {"FAMILIAR_ID": "set", "DISCORD_TOKEN": "from-dotenv"}
    assert load_env_file(environ := {ENV_FILE_VAR: ""}) is None and environ == {ENV_FILE_VAR: ""}
    (tmp_path / ".env").unlink()
    assert load_env_file(environ := {}) is None and environ == {}, "no .env: nothing to read, no error"
    with pytest.raises(CliError, match="names no file"):
        load_env_file({ENV_FILE_VAR: str(tmp_path / "missing.env")})
