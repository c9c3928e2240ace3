"""A third-party projector registers by name and contributes its own asset to the Definitions.

This is the documented example: a tiny projector counting words per speaker.
"""



import dagster as dg
import pytest

from familiar_pipeline.engine import registry
from familiar_pipeline.defs.assets import MEMORY, turns
from familiar_pipeline.config import ConfigError, load_config
from familiar_pipeline.defs.jobs import plugin_assets
from familiar_pipeline.defs.partitions import familiars_partitions
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource
from familiar_pipeline.storage.turns import TurnLog

from .helpers import append_chat, make_familiar


def word_counts_asset():
    @dg.asset(name="word_counts", partitions_def=familiars_partitions, group_name="plugins", deps=[turns], kinds={"python"})
    def word_counts(context: dg.AssetExecutionContext, familiar_data: FamiliarData) -> dg.MaterializeResult:
        """Words said per speaker (an example third-party projector)."""
        config = familiar_data.config(context.partition_key)
        if "word_counts" not in config.memory.projectors:
            return dg.MaterializeResult(metadata={"status": "disabled"})
        counts: dict[str, int] = {}
        with TurnLog(familiar_data.paths(context.partition_key).turns_db, readonly=True) as log:
            for turn in log.turns_after(0):
                counts[turn.label] = counts.get(turn.label, 0) + len(turn.content.split())
        return dg.MaterializeResult(metadata={"status": "ok", "counts": dg.MetadataValue.json(counts)})

    return word_counts


@pytest.fixture
def registered():
    registry.register_projector("word_counts", word_counts_asset, description="words per speaker", needs_llm=False)
    yield
    registry.unregister_projector("word_counts")


def test_plugin_asset_joins_the_definitions_and_runs(tmp_path, registered):
    assets = plugin_assets()
    assert [a.key.path[-1] for a in assets] == ["word_counts"]
    defs = dg.Definitions(
        assets=[turns, MEMORY, *assets],
        resources={"familiar_data": FamiliarData(data_root=str(tmp_path)), "llm": LlmResource(),
                   "embedder": EmbedderResource()},
    )
    dg.Definitions.validate_loadable(defs)
    paths = make_familiar(tmp_path, extra_toml='[providers.memory]\nprojectors = ["word_counts", "rich_note"]\n')
    append_chat(paths, 3)
    assert load_config("fam", root=tmp_path).memory.projectors == ("word_counts", "rich_note")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["fam"])
        result = dg.materialize(
            [turns, *assets], partition_key="fam", instance=instance, selection=["word_counts"],
            resources={"familiar_data": FamiliarData(data_root=str(tmp_path))},
        )
    meta = result.asset_materializations_for_node("word_counts")[0].metadata
    assert meta["counts"].value == {"Cass": 13, "Bo": 11, "Mia": 13}


def test_unregistered_projector_name_fails_at_config_load(tmp_path):
    make_familiar(tmp_path, extra_toml='[providers.memory]\nprojectors = ["word_counts"]\n')
    with pytest.raises(ConfigError) as err:
        load_config("fam", root=tmp_path)
    assert "word_counts" in str(err.value) and "rich_note" in str(err.value)
