"""The fact-driven assets follow `facts` by declarative automation, per partition, with a RUNNING sensor."""

from __future__ import annotations

import dagster as dg

from familiar_pipeline.defs.assets import FACT_DRIVEN, MEMORY
from familiar_pipeline.definitions import defs, fact_automation_sensor

FOLLOWERS = {"fact_supersessions", "people_dossiers", "reflections", "fact_embeddings"}


def requested(result) -> set[tuple[str, str]]:
    return {
        (key.path[-1], partition)
        for key in (dg.AssetKey(n) for n in FOLLOWERS)
        for partition in result.get_requested_partitions(key)
    }


def test_sensor_is_running_and_targets_the_fact_driven_assets():
    sensor = defs.resolve_sensor_def("fact_automation_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert isinstance(fact_automation_sensor, dg.AutomationConditionSensorDefinition)
    graph = defs.resolve_asset_graph()
    targeted = {k.path[-1] for k in sensor.asset_selection.resolve(graph)}
    assert targeted == FOLLOWERS
    conditions = MEMORY.automation_conditions_by_key
    assert FACT_DRIVEN and all(conditions.get(key) is not None for key in FACT_DRIVEN)


def changed(asset: str, partition: str, version: str) -> dg.AssetMaterialization:
    """A materialization that changed the rows (a new data version), as a run that wrote some reports."""
    return dg.AssetMaterialization(asset, partition=partition, tags={"dagster/data_version": version})


def test_facts_update_requests_followers_for_that_partition_only():
    assets = defs  # the real code location: its resources and every asset
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["alpha", "beta"])
        first = dg.evaluate_automation_conditions(defs=assets, instance=instance)
        assert requested(first) == set(), "nothing changed yet"
        instance.report_runless_asset_event(changed("facts", "alpha", "v1"))
        second = dg.evaluate_automation_conditions(defs=assets, instance=instance, cursor=first.cursor)
        assert requested(second) == {(name, "alpha") for name in FOLLOWERS}
        third = dg.evaluate_automation_conditions(defs=assets, instance=instance, cursor=second.cursor)
        assert requested(third) == set(), "one request per change"
        instance.report_runless_asset_event(changed("fact_supersessions", "beta", "v2"))
        fourth = dg.evaluate_automation_conditions(defs=assets, instance=instance, cursor=third.cursor)
        assert requested(fourth) == set(), "beta has no facts yet: a missing dependency holds its followers"
        instance.report_runless_asset_event(changed("facts", "beta", "v3"))
        fifth = dg.evaluate_automation_conditions(defs=assets, instance=instance, cursor=fourth.cursor)
        assert requested(fifth) == {(name, "beta") for name in FOLLOWERS}
        instance.report_runless_asset_event(changed("fact_supersessions", "beta", "v4"))
        sixth = dg.evaluate_automation_conditions(defs=assets, instance=instance, cursor=fifth.cursor)
        assert requested(sixth) == {("people_dossiers", "beta"), ("reflections", "beta")}


def test_operator_can_still_materialize_one_alone(tmp_path):
    from familiar_pipeline.testing.fake_llm import install_fake_llm
    from familiar_pipeline.testing.scripted import careful_model

    from .fact_helpers import familiar, materialize, metadata
    from .helpers import append_chat

    install_fake_llm().script(careful_model)
    paths = familiar(tmp_path)
    append_chat(paths, 20)
    with dg.instance_for_test() as instance:
        result = materialize(tmp_path, instance, ["people_dossiers"], rebuild=True)
        assert result.success and metadata(result, "people_dossiers")["status"].startswith("no-op")


def test_a_sensor_run_that_already_included_the_followers_does_not_trigger_them_again(tmp_path):
    from familiar_pipeline.defs.assets import FOLLOWERS_INCLUDED_TAG
    from familiar_pipeline.defs.jobs import materialize_in_process
    from familiar_pipeline.testing.fake_llm import install_fake_llm
    from familiar_pipeline.testing.scripted import careful_model

    from .helpers import append_chat, make_familiar

    install_fake_llm().script(careful_model)
    paths = make_familiar(tmp_path, "alpha")
    append_chat(paths, 10)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["alpha"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        materialize_in_process(["facts"], instance=instance, data_root=tmp_path, partition_key="alpha",
                               tags=FOLLOWERS_INCLUDED_TAG)
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert requested(second) == set()
        append_chat(paths, 10, start=10)  # new facts, extracted by a run without the tag
        materialize_in_process(["facts"], instance=instance, data_root=tmp_path, partition_key="alpha",
                               tags={"trigger": "familiar backfill"})
        third = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor)
        assert requested(third) == {(name, "alpha") for name in FOLLOWERS}


def test_a_materialization_that_wrote_nothing_does_not_trigger_the_followers():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["alpha"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        instance.report_runless_asset_event(changed("facts", "alpha", "v1"))
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert requested(second) == {(name, "alpha") for name in FOLLOWERS}
        instance.report_runless_asset_event(changed("facts", "alpha", "v1"))  # a no-op run keeps the version
        third = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor)
        assert requested(third) == set()
