"""Every recipe of docs/playbook.md, run against a small familiar built here (fake model, no network).

The familiar is called `familiar`, as the one `familiar up --demo` runs, which the
playbook's examples use; the Python snippets are run as written and must print what they read.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from familiar_bot.app.cli.main import main
from familiar_pipeline.defs.assets import MEMORY
from familiar_pipeline.config import load_config
from familiar_pipeline.defs.sensors import build_turn_watermark_sensor, run_requests
from familiar_pipeline.engine.schedule import plan_tick
from tests.fact_helpers import ALL_ASSETS, familiar, materialize, metadata
from tests.helpers import append_chat

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = (REPO / "docs" / "playbook.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PLAYBOOK, flags=re.S)


def command_lines(prefix: str) -> list[str]:
    return [line for block in blocks("bash") for line in block.splitlines() if prefix in line]


def cli_args(line: str) -> list[str]:
    """`ENV=x uv run familiar backfill ...` -> (["backfill", ...]); quotes honoured."""
    import shlex

    words = shlex.split(line.split("uv run familiar ", 1)[1])
    return words


DEMO = "familiar"
ENV = {"FAMILIAR_FAKE_LLM": "familiar_pipeline.testing.scripted:careful_model", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A familiar with 30 turns and the whole graph materialized by the fake model (built once)."""
    root = tmp_path_factory.mktemp("template") / "familiars"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**ENV, "FAMILIAR_DATA_ROOT": str(root)}.items():
            patch.setenv(name, value)
        paths = familiar(root, DEMO)
        append_chat(paths, 30)
        with dg.instance_for_test() as instance:
            materialize(root, instance, ALL_ASSETS, familiar_id=DEMO)
    return root


@pytest.fixture
def built(template, tmp_path, monkeypatch):
    """A private copy of the template familiar, with a throwaway Dagster home."""
    root, home = tmp_path / "familiars", tmp_path / "dagster_home"
    shutil.copytree(template, root)
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    for name, value in {**ENV, "FAMILIAR_DATA_ROOT": str(root), "DAGSTER_HOME": str(home)}.items():
        monkeypatch.setenv(name, value)
    from familiar_pipeline.storage.paths import FamiliarPaths

    return FamiliarPaths.for_id(DEMO, root)


def facts_and_dossiers(paths) -> tuple[list, list]:
    with duckdb.connect(str(paths.memory_db), read_only=True) as con:
        facts = con.sql("SELECT text, source_turn_ids FROM facts ORDER BY id").fetchall()
        dossiers = con.sql("SELECT canonical_key, dossier_text FROM people_dossiers ORDER BY 1").fetchall()
    return facts, dossiers


def test_rebuild_a_projection_from_the_ui_run_config_and_the_cli(built, tmp_path, capsys):
    before = facts_and_dossiers(built)
    assert before[0] and before[1]

    # The UI recipe: the documented launchpad run config, on the projection job.
    run_config = json.loads(blocks("json")[0])
    assert run_config == {"ops": {"memory": {"config": {"rebuild": True}}}}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", [DEMO])
        from familiar_pipeline.definitions import defs

        job = defs.resolve_job_def("project_memory")
        result = job.execute_in_process(run_config=run_config, partition_key=DEMO, instance=instance,
                                        asset_selection=[dg.AssetKey("facts")])
        assert result.success
        facts_meta = metadata(result, "facts")
        assert facts_meta["status"].startswith("ok")
        assert facts_meta["llm_cached_calls"] > 0 and facts_meta["llm_calls"] == 0  # same prompts, no tokens
    assert facts_and_dossiers(built)[0] == before[0]

    # The CLI recipe (no webserver here, so it runs in-process; --local would force it).
    [line] = [ln for ln in command_lines("backfill") if "--projection facts" in ln]
    assert main(cli_args(line)) == 0
    assert "in this process" in capsys.readouterr().out
    assert facts_and_dossiers(built)[0] == before[0]


def test_force_a_dossier_refold(built, capsys, monkeypatch):
    before = facts_and_dossiers(built)[1]
    plain, no_cache = [ln for ln in command_lines("people_dossier") if "backfill" in ln]
    assert main(cli_args(plain)) == 0
    assert "in this process" in capsys.readouterr().out
    assert facts_and_dossiers(built)[1] == before  # replayed from the cache: same text

    # The cache-bypassing variant really calls the model again (the fake answers the same).
    env, command = no_cache.split(" uv run ", 1)
    name, value = env.split("=")
    monkeypatch.setenv(name, value)
    assert load_config(DEMO).llm.slot("background").cache is False
    assert main(cli_args(no_cache)) == 0
    assert facts_and_dossiers(built)[1] == before


def test_forget_a_person_or_a_message(built, capsys):
    import sqlite3

    from familiar_pipeline.storage.turns import TurnLog

    listed, person, message, status = command_lines("familiar forget")
    assert main(cli_args(listed)) == 0
    assert "discord:111\tCass" in capsys.readouterr().out
    with TurnLog(built.turns_db, readonly=True) as log:
        cass = [t.id for t in log.turns_after(0) if t.author_key == "discord:111"]
        other = next(t for t in log.turns_after(0) if t.author_key != "discord:111")
    with sqlite3.connect(built.turns_db) as conn:  # the message id the recipe names (chat imports have none)
        conn.execute("UPDATE turns SET platform_message_id = '1234567890' WHERE id = ?", (other.id,))
    conn.close()
    assert main(cli_args(person) + ["--local"]) == 0
    assert "erasure #1 done" in capsys.readouterr().out
    assert main(cli_args(message) + ["--local"]) == 0
    assert "erasure #2 done" in capsys.readouterr().out
    assert main(cli_args(status)) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert f": person discord:111, {len(cass)} message(s), done " in first
    assert ": message 1234567890 in guild:1, 1 message(s), done " in second
    with TurnLog(built.turns_db, readonly=True) as log:
        assert all(t.content == "" for t in log.turns_by_ids([*cass, other.id]))


def test_ab_a_layer_order_on_one_channel(built, capsys):
    [toml] = blocks("toml")
    built.character_toml.write_text(built.character_toml.read_text() + "\n" + toml)
    outputs = {}
    for line in command_lines(f"familiar prompt --familiar {DEMO} --channel"):
        args = cli_args(line)
        if args[4] in ("10", "20"):
            assert main(args) == 0
            outputs[args[4]] = capsys.readouterr().out
    sections = {ch: [n for n in re.findall(r"^=== (\w+): \d+ tokens", out, flags=re.M) if n != "total"]
                for ch, out in outputs.items()}
    assert sections["20"] == ["character_card", "rag_context", "people_dossier", "recent_history"]
    assert sections["10"][:4] == ["character_card", "operating_mode", "standing_wishes", "lorebook"]
    assert sections["10"] != sections["20"]


def test_change_a_threshold_and_the_sensor_cadence(built, monkeypatch):
    from tests.helpers import append_chat as more

    more(built, 6, start=30)  # 6 turns past the facts watermark: below batch_size 10
    def facts_requested() -> bool:
        requests = run_requests(plan_tick({}, [DEMO], {DEMO}, root=built.root, in_flight={}, max_requests=5))
        return any(dg.AssetKey("facts") in (r.asset_selection or []) for r in requests)

    # The snapshot manifest carries the watermarks the sensor reads.
    assert not facts_requested()
    threshold, cadence = [ln for ln in command_lines("FAMILIAR__") if "familiar up" in ln]
    for line in (threshold, cadence):
        name, value = line.split(" ", 1)[0].split("=")
        monkeypatch.setenv(name, value)
    assert facts_requested()  # batch_size 5: the next tick asks for facts
    assert build_turn_watermark_sensor([MEMORY]).description.startswith("Ticks every 30s")


def test_which_familiars_have_assets_pending(built):
    [block] = [b for b in blocks("python") if "pending_assets" in b]
    code = block.replace("data/familiars/", f"{built.root}/")

    def pending() -> list:
        scope: dict = {}
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            exec(code, scope)
        assert printed.getvalue().endswith(f"{len(scope['pending'])} familiar(s) with work pending\n")
        for filename, assets in scope["pending"]:
            assert f"{filename} {assets}" in printed.getvalue(), "the snippet prints what it found"
        return scope["pending"]

    assert pending() == [], "every run finished what it planned"
    manifest_path = built.serving_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["pending_assets"] = ["reflections"]  # as a run that yielded its second pass leaves it
    manifest_path.write_text(json.dumps(manifest))
    assert pending() == [(str(manifest_path), ["reflections"])]
    requests = run_requests(plan_tick({}, [DEMO], {DEMO}, root=built.root, in_flight={}, max_requests=5))
    assert [[k.path[-1] for k in r.asset_selection] for r in requests] == [["reflections"]], "the next tick asks for it"


def test_query_facts_from_a_notebook(built):
    duck_block, snapshot_block = [b for b in blocks("python") if "pending_assets" not in b]
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(duck_block.replace(f"data/familiars/{DEMO}", str(built.dir)), scope)
    assert scope["current"] and all(isinstance(row[1], str) for row in scope["current"])
    said = scope["said"]
    assert said and {row[2] for row in said} <= {"Cass", "Bo", "Mia"}
    assert all(row[1].startswith(f"{row[2]} said:") for row in said)  # the fake model's attribution
    shown = printed.getvalue()  # as written, the snippet prints what it read
    assert all(f"#{fact_id} [{importance}] {text}" in shown for fact_id, text, importance in scope["current"])
    assert f"<- {said[0][2]}: {said[0][3]!r}" in shown

    scope = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(snapshot_block.replace(f"data/familiars/{DEMO}", str(built.dir)), scope)
    assert [row[0] for row in scope["snapshot_current"]] == [row[0] for row in duck_current(built)]
    assert printed.getvalue().splitlines() == [f"#{i} {text}" for i, text in scope["snapshot_current"]]


def duck_current(paths):
    with duckdb.connect(str(paths.memory_db), read_only=True) as con:
        return con.sql("SELECT id FROM current_facts ORDER BY id").fetchall()


def test_inspect_the_prompt_cli_and_console_context(built, capsys):
    [line] = [ln for ln in command_lines("familiar prompt") if "--channel 1 " in ln]
    assert main(cli_args(line)) == 0
    report = capsys.readouterr().out
    assert "=== character_card:" in report and "=== total:" in report

    from familiar_bot.transports.console import console_person, run_console
    from familiar_bot.responder.opening import open_responder
    from familiar_pipeline.storage.turns import TurnLog

    [example] = blocks("text")
    typed = example.split("> ", 1)[1]
    with TurnLog(built.turns_db, readonly=True) as log:
        turns_before = log.count()
    handle = open_responder(built, load_config(DEMO))
    out = io.StringIO()
    try:
        status = asyncio.run(run_console(handle.responder, speaker=console_person("you"),
                                         stdin=io.StringIO(typed), stdout=out, interactive=False))
    finally:
        handle.close()
    assert status == 0
    assert "=== character_card:" in out.getvalue() and "=== total:" in out.getvalue()
    with TurnLog(built.turns_db, readonly=True) as log:
        assert log.count() == turns_before  # /context records nothing
