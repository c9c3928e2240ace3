"""A projector with a table of its own is one folder and one registration line (tests/word_tally).

Loaded through FAMILIAR_PLUGINS as the code location loads any plugin, its table is created
by the store from its declaration, published in the serving snapshot, read back through the
snapshot reader as its records, covered by the provenance walk, and a rebuild from turns gives
the rows the incremental runs gave.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import dagster as dg
import pytest

from familiar_pipeline.config import ConfigError, load_config
from familiar_pipeline.defs.jobs import import_plugins, materialize_in_process, plugin_assets
from familiar_pipeline.engine import registry
from familiar_pipeline.storage import tables as declarations
from familiar_pipeline.storage.snapshots import SnapshotReader, read_manifest
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import provenance_sql
from familiar_pipeline.storage.turns import TurnLog

from .helpers import append_chat, make_familiar

PLUGIN = "tests.word_tally"
REPO = Path(__file__).resolve().parents[1]
TOML = '[providers.memory]\nprojectors = ["word_tally"]\n[providers.memory.word_tally]\nbatch_size = 4\n'


@pytest.fixture
def word_tally(monkeypatch):
    monkeypatch.setenv("FAMILIAR_PLUGINS", PLUGIN)
    import_plugins()
    yield importlib.import_module(f"{PLUGIN}.tables")
    registry.unregister_projector("word_tally")
    for name in [m for m in sys.modules if m == PLUGIN or m.startswith(PLUGIN + ".")]:
        sys.modules.pop(name)


def run(root, instance, *, rebuild=False):
    return materialize_in_process(["word_tallies"], instance=instance, data_root=root, partition_key="fam",
                                  rebuild=rebuild, extra_assets=plugin_assets())


def rows(paths):
    with ProjectionStore(paths.memory_db, read_only=True, tables=registry.tables()) as store:
        return store.table_rows("word_tallies"), store.get_watermark("word_tally").turn_id


def test_a_table_plugin_is_stored_published_read_and_rebuilt_equal(tmp_path, word_tally):
    assert [a.key.path[-1] for a in plugin_assets()] == ["word_tallies"]
    paths = make_familiar(tmp_path, extra_toml=TOML)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["fam"])
        append_chat(paths, 6)
        first = run(tmp_path, instance)
        append_chat(paths, 7, start=6)
        run(tmp_path, instance)
        incremental, mark = rows(paths)
        assert mark == 12 and len(incremental) == 9  # three batches of 4 turns, three speakers each
        meta = first.asset_materializations_for_node("word_tallies")[0].metadata
        assert meta["rows_written"].value == 3 and meta["watermark_after"].value == {"turn_id": 4}

        # Published with the snapshot and read back as the declaration's records.
        manifest = read_manifest(paths.serving_dir)
        assert manifest.tables["word_tallies"].rows == 9
        reader = SnapshotReader(paths.serving_dir)
        served = word_tally.tallies(reader)
        assert [(t.batch_end, t.speaker_key, t.words, list(t.source_turn_ids), t.scope) for t in served] == \
            [tuple(r) for r in incremental]
        assert {t.scope for t in served} == {"guild:1"}
        cass = word_tally.tallies(reader, "discord:111")
        assert [t.source_turn_ids for t in cass] == [(1, 4), (7,), (10,)]

        # A rebuild drops its rows and watermark and gives the same rows again.
        run(tmp_path, instance, rebuild=True)
        assert rows(paths) == (incremental, mark)

    # Every row's provenance points at turns the log has.
    with ProjectionStore(paths.memory_db, read_only=True, tables=registry.tables()) as store, \
            TurnLog(paths.turns_db, readonly=True) as log:
        cited = store.sql(f"SELECT row_key, turn_id FROM ({provenance_sql(word_tally.WORD_TALLIES)})").fetchall()
        assert cited and {t for _, t in cited} <= {t.id for t in log.turns_after(0)}


def test_nothing_outside_its_folder_names_the_plugin():
    folder = REPO / "tests" / "word_tally"
    named = [p.relative_to(REPO) for root in ("familiar_pipeline", "familiar_bot", "data", "tests")
             for p in (REPO / root).rglob("*") if p.is_file() and p.suffix in (".py", ".toml")
             and folder not in p.parents and p != Path(__file__) and "word_tall" in p.read_text(errors="ignore")]
    assert named == []


def test_unregistering_it_forgets_its_table(word_tally):
    assert declarations.declared("word_tallies") is not None and "word_tallies" in {t.name for t in registry.tables()}
    registry.unregister_projector("word_tally")
    assert declarations.declared("word_tallies") is None
    registry.register_projector(importlib.import_module(f"{PLUGIN}.spec").SPEC)  # the fixture unregisters it
    declarations.register(word_tally.WORD_TALLIES)


def test_its_knobs_are_validated_and_reported_and_its_name_resolves(tmp_path, word_tally):
    assert registry.resolve("word_tally").asset == "word_tallies" == registry.resolve("word_tallies").asset
    paths = make_familiar(tmp_path, extra_toml=TOML + "min_words = 40\n")
    assert load_config("fam", root=tmp_path).memory.word_tally.min_words == 40
    append_chat(paths, 4)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["fam"])
        meta = run(tmp_path, instance).asset_materializations_for_node("word_tallies")[0].metadata
    assert meta["effective_config"].value == {"batch_size": 4, "min_words": 40, "max_batches_per_run": 20}
    assert meta["rows_written"].value == 0  # no one said 40 words in four turns
    bad = make_familiar(tmp_path, "bad", '[providers.memory.word_tally]\nmin_words = 0\n')
    with pytest.raises(ConfigError, match=r"\[providers.memory.word_tally\].min_words = 0 is invalid"):
        load_config(bad.dir.name, root=tmp_path)
