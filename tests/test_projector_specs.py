"""Every projector is declared once, by its spec, and every consumer reads it from there."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import dagster as dg
import pytest

from familiar_bot.app.cli import main as cli
from familiar_pipeline.config import MemoryConfig
from familiar_pipeline.backfill import BackfillError, resolve_asset
from familiar_pipeline.definitions import defs
from familiar_pipeline.engine import registry
from familiar_pipeline.engine.spec import FACTS, NoKnobs, ProjectorSpec
from familiar_pipeline.projectors import builtin
from familiar_pipeline.storage.store import ProjectionStore

from .fact_helpers import populate_every_table
from .helpers import append_chat, make_familiar

SPECS = registry.specs()


def test_the_builtins_are_the_registered_specs():
    assert [s.name for s in SPECS] == list(builtin.BUILTIN_PROJECTORS)
    assert builtin.BUILTIN_PROJECTORS == (
        "turns_fts", "rolling_summary", "rich_note", "fact_embedding", "fact_supersede", "standing_wish", "people_dossier",
        "reflection", "turn_embedding", "turn_window_embedding", "turn_passage_embedding")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_builtin_names_its_run_logic_and_each_name_resolves(spec):
    # The spec module imports none of it (tests/test_architecture.py); the names are checked here.
    assert isinstance(spec.run, str) and re.fullmatch(r"familiar_pipeline\.projectors\.[a-z_]+\.run:run", spec.run)
    run = spec.load_run()
    assert callable(run) and run.__name__ == "run" and run.__module__ == spec.run.partition(":")[0]
    spec.load_hooks()
    for hook in ("scripted", "batch_closed", "search_rows", "forget_person"):
        value = getattr(spec, hook)
        loaded = getattr(spec, f"load_{hook}")()
        assert (loaded is None) == (value is None) and (loaded is None or callable(loaded)), hook
    assert (spec.load_scripted() is not None) == spec.needs_llm, "every model-driven projector answers the scripted model"


CALLS: list[bool] = []
NOT_CALLABLE = "a constant"


def recorded_run(rt, report, *, rebuild: bool = False) -> None:
    """A run named by its place ("tests.test_projector_specs:recorded_run") in the test below."""
    CALLS.append(rebuild)


def test_a_hook_is_a_callable_or_its_name_imported_on_first_use():
    CALLS.clear()
    direct = ProjectorSpec(name="direct_hook", run=recorded_run, needs_llm=False)
    named = ProjectorSpec(name="named_hook", run=f"{__name__}:recorded_run", needs_llm=False)
    assert direct.load_run() is named.load_run() is recorded_run
    run = named.load_run()
    assert run is not None
    run(None, None, rebuild=True)
    assert CALLS == [True]
    with pytest.raises(ValueError, match=r"run 'tests\.test_projector_specs\.recorded_run' is not 'package\.module:attribute'"):
        ProjectorSpec(name="dotted", run=f"{__name__}.recorded_run")
    with pytest.raises(TypeError, match="scripted must be callable"):
        ProjectorSpec(name="number", scripted=42)  # type: ignore[arg-type]
    with pytest.raises(ImportError, match="projector 'missing': its run 'tests.no_such_plugin:run' does not import"):
        ProjectorSpec(name="missing", run="tests.no_such_plugin:run").load_run()
    with pytest.raises(ImportError, match="its search_rows 'tests.test_projector_specs:nothing' does not import"):
        ProjectorSpec(name="absent", search_index="turns", search_rows=f"{__name__}:nothing").load_search_rows()
    with pytest.raises(TypeError, match="its run 'tests.test_projector_specs:NOT_CALLABLE' is not callable"):
        ProjectorSpec(name="constant", run=f"{__name__}:NOT_CALLABLE").load_run()


def test_loading_a_config_imports_no_run_logic_prompt_or_model_client(tmp_path):
    # A fresh interpreter (this one has imported everything): loading a config registers every spec
    # (the built-ins' entry point), and a spec names its run logic rather than importing it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAMILIAR")}
    env["FAMILIAR_DATA_ROOT"] = str(tmp_path)
    code = ("import sys; from familiar_pipeline.config import load_config; load_config(); "
            "print('\\n'.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    modules = set(done.stdout.split())
    assert {"familiar_pipeline.projectors.builtin", "familiar_pipeline.projectors.facts.spec"} <= modules, "the specs registered"
    heavy = sorted(m for m in modules
                   if re.fullmatch(r"familiar_pipeline\.projectors\.[a-z_]+\.(run|prompt|scripted)", m)
                   or m.startswith(("familiar_pipeline.models.llm", "litellm", "dagster")))
    assert heavy == []


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_projector_resolves_for_backfill_by_either_name(spec):
    assert resolve_asset(spec.name) == spec.asset
    assert resolve_asset(spec.asset) == spec.asset


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_projector_has_an_asset_built_from_its_spec(spec):
    graph = defs.resolve_asset_graph()
    node = graph.get(dg.AssetKey(spec.asset))
    assert node.tags["projector"] == spec.name
    assert node.group_name == spec.group and set(node.kinds) == set(spec.kinds)
    assert {k.path[-1] for k in node.parent_keys} == set(spec.reads)  # inputs and soft inputs
    assert (node.automation_condition is not None) == (spec.trigger == FACTS)
    assert node.description


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_projector_has_knobs_that_config_finds_through_the_registry(spec):
    assert dataclasses.is_dataclass(spec.knobs)
    memory = MemoryConfig()
    if spec.has_knobs:
        assert memory.knobs(spec.name) == spec.knobs() == getattr(memory, spec.name)
    else:
        assert spec.knobs is NoKnobs and spec.name not in memory.tables
    assert spec.always_on == (spec.name not in registry.known_projectors())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_projector_has_a_drop_rule_that_clears_its_rows_and_watermark(tmp_path, spec):
    with ProjectionStore(tmp_path / "m.duckdb") as store:
        populate_every_table(store)
        registry.drop_projection(store, spec.name)
        marks = {row[0] for row in store.table_rows("watermarks")}
        gone = {spec.name} | ({d.name for d in registry.dependants(spec.name)} if spec.drop.cascade else set())
        assert marks == {s.name for s in SPECS} - gone
        assert set(spec.dropped_tables) == {t.name for t in spec.tables} or spec.drop.tables is not None
        for table in spec.dropped_tables:
            assert table in store.tables and store.table_rows(table) == []


def test_dropping_facts_takes_every_projection_that_reads_them():
    assert [d.name for d in registry.dependants("rich_note")] == [
        "fact_embedding", "people_dossier", "reflection", "fact_supersede", "standing_wish"]
    assert registry.dependants("rolling_summary") == []


def test_unknown_names_fail_with_the_valid_ones():
    with pytest.raises(BackfillError, match="unknown projection 'nope'; valid: .*turn_embedding.*turn_embeddings"):
        resolve_asset("nope")
    with pytest.raises(registry.UnknownProjectorError):
        registry.resolve("facts_typo")
    with pytest.raises(ValueError, match="taken by 'rich_note'"):
        registry.register_projector(ProjectorSpec(name="other", asset="facts"))
    with pytest.raises(ValueError, match="batch_knob"):
        ProjectorSpec(name="x", trigger="turns")


def test_cli_backfill_turn_embedding_runs_in_process(clean_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    paths = make_familiar(clean_env, "fam", '[providers.embedding]\nbackend = "hash"\ndim = 64\n'
                          '[providers.memory]\nprojectors = ["turn_embedding"]\n')
    turns = append_chat(paths, 6)
    code = cli.main(["backfill", "--familiar", "fam", "--projection", "turn_embedding", "--local"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.fullmatch(r"succeeded: turn_embeddings for fam: ok, rows written 6 \(run [0-9a-f-]{36}, in this process\)",
                        out.strip()), out
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert store.get_watermark("turn_embedding").turn_id == turns[-1].id
    code = cli.main(["backfill", "--familiar", "fam", "--projection", "turn_embeddings", "--local", "--rebuild"])
    out, _ = capsys.readouterr()
    assert code == 0 and out.strip().startswith("succeeded: turn_embeddings for fam: ok, rows written 6 (run ")
