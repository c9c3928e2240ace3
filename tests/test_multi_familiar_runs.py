"""Runs that serve many familiars: one run over a partition range, each familiar on its own.

Every run here goes through Dagster (`dg.materialize` with the partition range tags the
turn sensor puts on its request) against a test instance, with the scripted model at the
network edge. What is checked: each familiar's rows and watermarks, one materialization
per familiar per asset with that familiar's metadata, a failing familiar reported on its
own partition while the others commit, and the writer lock refusing a second writer.
"""

from __future__ import annotations

import time

import dagster as dg
import pytest

import familiar_pipeline.defs.assets as assets_module
import familiar_pipeline.engine.run_loop as run_loop
from familiar_pipeline.defs.assets import MEMORY
from familiar_pipeline.defs.jobs import execute_request, materialize_in_process
from familiar_pipeline.defs.sensors import build_turn_watermark_sensor
from familiar_pipeline.engine.runtime import FamiliarBusy, WriterLock
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.testing.fake_llm import fake_llm
from familiar_pipeline.testing.scripted import careful_model
from familiar_pipeline.projectors.facts import store as facts_db

from .helpers import append_chat, make_familiar

RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
FACTS_AND_INDEX = ["turns_fts", "facts"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    with fake_llm(careful_model), dg.instance_for_test() as instance:
        yield tmp_path, instance


def run_range(root, instance, assets, first: str, last: str, *, plan: dict[str, list[str]] | None = None,
              tags: dict | None = None) -> dg.ExecuteInProcessResult:
    """One run over the familiars `first`..`last` (partition order), as the turn sensor requests it."""
    return materialize_in_process(assets, instance=instance, data_root=root, familiars=plan,
                                  tags={RANGE_START: first, RANGE_END: last, **(tags or {})}, raise_on_error=False)


def by_partition(result, asset: str) -> dict[str, dict]:
    """Partition -> the metadata of its one materialization of `asset` in this run."""
    out: dict[str, dict] = {}
    for event in result.get_asset_materialization_events():
        m = event.materialization
        if m.asset_key.path[-1] == asset:
            assert m.partition not in out, f"two materializations of {asset} for {m.partition}"
            out[m.partition] = {k: v.value for k, v in m.metadata.items()}
    return out


def facts_and_mark(paths: FamiliarPaths) -> tuple[int, int]:
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return len(facts_db.all_fact_ids(store)), store.get_watermark("rich_note").turn_id


def familiars(root, instance, names_and_turns) -> dict[str, FamiliarPaths]:
    out = {}
    for name, n in names_and_turns:
        out[name] = make_familiar(root, name)
        append_chat(out[name], n)
    instance.add_dynamic_partitions("familiars", [name for name, _ in names_and_turns])
    return out


def test_one_run_writes_each_familiars_rows_and_reports_each_partition(env):
    root, instance = env
    fams = familiars(root, instance, [("a1", 10), ("a2", 20), ("a3", 10)])
    result = run_range(root, instance, FACTS_AND_INDEX, "a1", "a3")
    assert result.success
    facts = by_partition(result, "facts")
    assert sorted(facts) == ["a1", "a2", "a3"]
    for name, batches in (("a1", 1), ("a2", 2), ("a3", 1)):
        meta = facts[name]
        assert meta["status"] == "ok" and meta["batches"] == batches and meta["turns_read"] == 10 * batches
        assert meta["watermark_after"]["turn_id"] == 10 * batches, "each familiar's own watermark"
        count, mark = facts_and_mark(fams[name])
        assert count == meta["rows_written"] > 0 and mark == 10 * batches
    assert by_partition(result, "turns_fts")["a2"]["rows_written"] == 20
    # The checks ran over the three familiars: one evaluation per familiar, on its partition; all passed.
    evaluations = result.get_asset_check_evaluations()
    assert evaluations and all(e.passed for e in evaluations)
    assert {(e.check_name, e.partition) for e in evaluations if e.asset_key.path[-1] == "facts"} == {
        (check, name) for check in ("facts_cite_existing_turns", "fact_subjects_are_participants",
                                    "serving_snapshot_in_step") for name in ("a1", "a2", "a3")}
    # Each partition's materialization is in the event log under its own key, as the UI reads it.
    for name in ("a1", "a2", "a3"):
        record = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("facts"), asset_partitions=[name]), limit=1).records
        assert record and record[0].asset_materialization.metadata["status"].value == "ok"


def test_familiars_between_the_due_ones_are_skipped_unopened(env):
    root, instance = env
    fams = familiars(root, instance, [("a1", 10), ("a2", 10), ("a3", 10)])
    result = run_range(root, instance, FACTS_AND_INDEX, "a1", "a3",
                       plan={"facts": ["a1", "a3"], "turns_fts": ["a1", "a3"]})
    assert result.success
    assert "a2" not in by_partition(result, "facts"), "no materialization of a familiar the run did not process"
    assert not fams["a2"].memory_db.exists() and not fams["a2"].writer_lock.exists(), "nothing opened"
    assert facts_and_mark(fams["a1"])[1] == facts_and_mark(fams["a3"])[1] == 10


def test_one_familiar_failing_leaves_the_others_committed_and_is_retried(env):
    root, instance = env
    fams = familiars(root, instance, [("a1", 10), ("a2", 10), ("a3", 10)])
    # A store that cannot be opened and is not corrupt (a corrupt one is moved aside and rebuilt:
    # test_reliability_heal): a directory where the file should be.
    fams["a2"].memory_db.mkdir()
    result = run_range(root, instance, ["facts"], "a1", "a3")
    assert result.success, "one familiar's failure does not fail the step"
    blocking = [e for e in result.get_asset_check_evaluations() if e.blocking]
    assert blocking and all(e.severity == dg.AssetCheckSeverity.WARN for e in blocking if not e.passed), \
        "the unreadable familiar warns; it does not block the others' followers"
    facts = by_partition(result, "facts")
    assert facts["a1"]["status"] == facts["a3"]["status"] == "ok"
    assert facts["a2"]["status"].startswith("failed: ")
    assert not [e for e in result.all_events if e.is_step_failure]
    logs = instance.all_logs(result.run_id)
    assert any(entry.level >= 40 and "[a2] facts failed" in entry.user_message for entry in logs)
    assert facts_and_mark(fams["a1"])[1] == facts_and_mark(fams["a3"])[1] == 10
    fams["a2"].memory_db.rmdir()  # repaired: the next run picks it up from its watermark (none yet)
    retry = run_range(root, instance, ["facts"], "a1", "a3", plan={"facts": ["a2"]})
    assert by_partition(retry, "facts")["a2"]["status"] == "ok"
    assert facts_and_mark(fams["a2"])[1] == 10


def test_a_raising_projector_fails_the_step_only_when_every_familiar_failed(env, monkeypatch):
    import familiar_pipeline.projectors.facts.run as facts_module

    root, instance = env
    familiars(root, instance, [("a1", 10), ("a2", 10)])

    def broken(*args, **kwargs):
        raise RuntimeError("extractor exploded")

    monkeypatch.setattr(facts_module, "extraction_messages", broken)  # inside the projector, per batch
    result = run_range(root, instance, ["facts"], "a1", "a2")
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "every familiar failed" in failure.event_specific_data.error.message
    assert "a1: RuntimeError: extractor exploded" in failure.event_specific_data.error.message


def test_a_second_writer_is_refused_at_once_naming_the_familiar(env, monkeypatch):
    root, instance = env
    monkeypatch.setattr(assets_module, "BUSY_WAIT_S", 0.3)
    fams = familiars(root, instance, [("a1", 10), ("a2", 10)])
    with WriterLock(fams["a2"]):  # another writer holds a2 (a lock is per open file, so this process counts)
        started = time.monotonic()
        with pytest.raises(FamiliarBusy, match="familiar 'a2' is being written by another process"):
            WriterLock(fams["a2"]).acquire()
        assert time.monotonic() - started < 0.2, "refused at once, not after a wait"
        result = run_range(root, instance, ["facts"], "a1", "a2")
        assert result.success
        facts = by_partition(result, "facts")
        assert facts["a1"]["status"] == "ok"
        assert facts["a2"]["status"].startswith("failed: FamiliarBusy: familiar 'a2' is being written")
        assert "(waited 0.3 s)" in facts["a2"]["status"], "the run came back to it and waited first"
        assert not fams["a2"].memory_db.exists(), "the refused writer wrote nothing"
    later = run_range(root, instance, ["facts"], "a1", "a2")
    assert by_partition(later, "facts")["a2"]["status"] == "ok", "a later run retries it"


def test_a_familiar_another_writer_holds_is_taken_up_after_the_others_once_free(env, monkeypatch):
    """Two runs at a time: one that meets a familiar the other is writing comes back to it at its end."""
    root, instance = env
    monkeypatch.setattr(assets_module, "BUSY_WAIT_S", 30.0)
    fams = familiars(root, instance, [("a1", 10), ("a2", 10), ("a3", 10)])
    other = WriterLock(fams["a1"])
    other.acquire()
    real = run_loop.project_familiar

    def the_other_run_finishes_a1_meanwhile(specs, familiar_id, **kwargs):
        if familiar_id == "a3":  # this run does a2 and a3 while the other one still holds a1
            other.release()
        return real(specs, familiar_id, **kwargs)

    monkeypatch.setattr(run_loop, "project_familiar", the_other_run_finishes_a1_meanwhile)
    result = run_range(root, instance, ["facts"], "a1", "a3")
    assert result.success
    facts = by_partition(result, "facts")
    assert {f: m["status"] for f, m in facts.items()} == {"a1": "ok", "a2": "ok", "a3": "ok"}
    order = [e.materialization.partition for e in result.get_asset_materialization_events()]
    assert order == ["a2", "a3", "a1"], "the held familiar waited at the end, not in front of the others"
    assert facts_and_mark(fams["a1"])[1] == 10


def test_a_single_partition_run_takes_the_same_lock(env, monkeypatch):
    root, instance = env
    monkeypatch.setattr(assets_module, "BUSY_WAIT_S", 0.2)
    fams = familiars(root, instance, [("a1", 10)])
    with WriterLock(fams["a1"]):
        result = materialize_in_process(["facts"], instance=instance, data_root=root, partition_key="a1",
                                        raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "familiar 'a1' is being written by another process" in str(failure.event_specific_data.error)


def test_sensor_ticks_feed_range_runs_and_a_familiar_added_mid_way_joins_the_next(env, monkeypatch):
    root, instance = env
    monkeypatch.setenv("FAMILIAR__PIPELINE__INDEX_QUIET_S", "0")
    sensor = build_turn_watermark_sensor([MEMORY])
    for name in ("b1", "b2", "b3"):
        append_chat(make_familiar(root, name), 10)

    def tick_and_run(cursor):
        result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions("familiars", list(request.partition_keys))
        assert len(result.run_requests) == 1
        request = result.run_requests[0]
        run = execute_request(request, instance=instance, data_root=root)
        return result.cursor, request, by_partition(run, "facts")

    cursor, first, facts = tick_and_run(None)
    assert (first.tags[RANGE_START], first.tags[RANGE_END]) == ("b1", "b3")
    assert {f: m["status"] for f, m in facts.items()} == {"b1": "ok", "b2": "ok", "b3": "ok"}
    append_chat(make_familiar(root, "a0"), 10)  # sorts first; added as the last partition
    append_chat(FamiliarPaths.for_id("b2", root), 10, start=10)
    cursor, second, facts = tick_and_run(cursor)
    assert list(instance.get_dynamic_partitions("familiars")) == ["b1", "b2", "b3", "a0"]
    assert (second.tags[RANGE_START], second.tags[RANGE_END]) == ("b2", "a0")
    assert "b3" not in facts, "in the range, not due: not opened, not materialized"
    assert facts["b2"]["watermark_after"]["turn_id"] == 20 and facts["a0"]["watermark_after"]["turn_id"] == 10


def test_projection_assets_backfill_many_familiars_in_one_run():
    assert MEMORY.backfill_policy == dg.BackfillPolicy.single_run()


# ----------------------------------------------------------------------------- one step, each familiar once


def test_a_run_over_many_familiars_publishes_every_familiars_facts_before_any_followers(env, monkeypatch):
    """Two passes: each familiar's facts (one open, one publish), then the rest (again).

    The bot sees every familiar's new facts after the first pass over the run; a run of one
    familiar keeps one pass: one open for all its projections and one publish.
    """
    import familiar_pipeline.engine.runtime as runtime_module
    import familiar_pipeline.storage.store as store_module

    root, instance = env
    familiars(root, instance, [("a1", 10), ("a2", 10)])
    published, opened, ran = [], [], []
    real_publish, real_init = runtime_module.publish_snapshot, store_module.ProjectionStore.__init__
    real_run = run_loop.run_projector

    def counting_publish(conn, serving_dir, **kwargs):
        published.append(serving_dir.parent.name)
        return real_publish(conn, serving_dir, **kwargs)

    def counting_init(self, path, *args, **kwargs):
        opened.append((path.parent.name, kwargs.get("read_only", False)))
        real_init(self, path, *args, **kwargs)

    def recording_run(spec, runtime, cfg, **kwargs):
        ran.append((runtime.paths.familiar_id, spec.asset))
        return real_run(spec, runtime, cfg, **kwargs)

    monkeypatch.setattr(runtime_module, "publish_snapshot", counting_publish)
    monkeypatch.setattr(store_module.ProjectionStore, "__init__", counting_init)
    monkeypatch.setattr(run_loop, "run_projector", recording_run)
    everything = ["turns_fts", "rolling_summary", "facts", "fact_supersessions", "people_dossiers", "reflections"]
    result = run_range(root, instance, everything, "a1", "a2")
    assert result.success
    assert published == ["a1", "a2", "a1", "a2"], "one publish per familiar and pass"
    assert ran[:2] == [("a1", "facts"), ("a2", "facts")], ran
    assert ran[2:] == [(f, a) for f in ("a1", "a2") for a in ("turns_fts", "rolling_summary", "fact_supersessions",
                                                                "people_dossiers", "reflections")], ran
    for name in ("a1", "a2"):
        # One open per pass; the model calls close it (a notebook may read meanwhile), so a few
        # reopens follow, but none per projector or per check: fewer opens than projections.
        writes = [ro for f, ro in opened if f == name and not ro]
        assert 2 <= len(writes) < len(everything), opened
        assert not [ro for f, ro in opened if f == name and ro], "the checks read through the writer's connection"
    assert {e.check_name for e in result.get_asset_check_evaluations()} >= {"facts_cite_existing_turns",
                                                                             "serving_snapshot_in_step"}

    append_chat(FamiliarPaths.for_id("a1", root), 10, start=10)
    published.clear(), opened.clear()
    assert run_range(root, instance, everything, "a1", "a1").success
    assert published == ["a1"], "a run of one familiar: one pass, one publish"
    assert 1 <= len([ro for f, ro in opened if not ro]) < len(everything)

    assert all(e.passed for e in result.get_asset_check_evaluations())


EVERYTHING = ["turns_fts", "wishes", "rolling_summary", "facts", "fact_supersessions", "people_dossiers", "reflections"]
FOLLOWERS = ["turns_fts", "rolling_summary", "fact_supersessions", "wishes", "people_dossiers", "reflections"]


def pending(paths: FamiliarPaths) -> tuple[str, ...]:
    from familiar_pipeline.storage.snapshots import read_manifest

    return read_manifest(paths.serving_dir).pending_assets


def test_a_run_leaves_its_second_pass_to_a_later_run_while_another_waits_and_the_sensor_requests_it(env, monkeypatch):
    """Facts first, then yield: a queued projection run gets the lane, the followers are not lost.

    With a projection run waiting for a lane, a run over several familiars publishes every
    familiar's facts and stops; each snapshot lists what was left as pending, the next sensor
    tick requests exactly that, and the run that does it clears the list.
    """
    from familiar_pipeline.defs.partitions import PROJECTION_QUEUE_TAG

    root, instance = env
    monkeypatch.setenv("FAMILIAR__PIPELINE__INDEX_QUIET_S", "3600")  # the index waits: only `pending` asks for it
    fams = familiars(root, instance, [("a1", 10), ("a2", 10)])
    instance.add_run(dg.DagsterRun(job_name="project_memory", run_id="waiting", status=dg.DagsterRunStatus.NOT_STARTED,
                                   tags=PROJECTION_QUEUE_TAG))
    result = run_range(root, instance, EVERYTHING, "a1", "a2")
    assert result.success
    assert sorted(by_partition(result, "facts")) == ["a1", "a2"]
    for asset in FOLLOWERS:
        assert by_partition(result, asset) == {}, f"{asset}: left to a later run"
    assert [pending(p) for p in fams.values()] == [tuple(FOLLOWERS)] * 2
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any("left to a later run" in m and "a1, a2" in m for m in logs), logs

    instance.delete_run("waiting")  # it started and finished: no run waits any more
    sensor = build_turn_watermark_sensor([MEMORY])
    tick = sensor(dg.build_sensor_context(instance=instance, cursor=None))
    [request] = tick.run_requests
    assert sorted(k.path[-1] for k in request.asset_selection) == sorted(FOLLOWERS)
    run = execute_request(request, instance=instance, data_root=root)
    assert run.success
    assert sorted(by_partition(run, "fact_supersessions")) == ["a1", "a2"]
    assert [pending(p) for p in fams.values()] == [(), ()], "done: nothing pending"
    again = sensor(dg.build_sensor_context(instance=instance, cursor=tick.cursor))
    assert again.run_requests == [], "nothing left to request"


def test_only_a_familiar_published_in_the_first_pass_is_left_so_the_sensor_sees_it_changed(env, monkeypatch):
    """A familiar with nothing in the run's first pass gets its rest done even while a run waits.

    Its manifest would not change in this run, so the sensor (whose cursor already holds that
    manifest's version) would not ask for it again: leaving it would lose its followers until
    its next turn.
    """
    from familiar_pipeline.defs.partitions import PROJECTION_QUEUE_TAG

    root, instance = env
    fams = familiars(root, instance, [("a1", 10), ("a2", 10)])
    instance.add_run(dg.DagsterRun(job_name="project_memory", run_id="waiting", status=dg.DagsterRunStatus.NOT_STARTED,
                                   tags=PROJECTION_QUEUE_TAG))
    assert run_range(root, instance, EVERYTHING, "a1", "a2").success
    assert [pending(p) for p in fams.values()] == [tuple(FOLLOWERS)] * 2
    append_chat(fams["a2"], 10, start=10)  # a2 has new facts due; a1 only its pending followers
    plan = {asset: ["a1", "a2"] for asset in FOLLOWERS} | {"facts": ["a2"]}
    result = run_range(root, instance, EVERYTHING, "a1", "a2", plan=plan)
    assert result.success
    assert sorted(by_partition(result, "facts")) == ["a2"]
    assert sorted(by_partition(result, "fact_supersessions")) == ["a1"], "a1 done, a2 left"
    assert pending(fams["a1"]) == () and pending(fams["a2"]) == tuple(FOLLOWERS)


def test_a_rebuild_never_leaves_its_followers_to_an_incremental_run(env):
    from familiar_pipeline.defs.partitions import PROJECTION_QUEUE_TAG

    root, instance = env
    fams = familiars(root, instance, [("a1", 10), ("a2", 10)])
    instance.add_run(dg.DagsterRun(job_name="project_memory", run_id="waiting", status=dg.DagsterRunStatus.NOT_STARTED,
                                   tags=PROJECTION_QUEUE_TAG))
    result = materialize_in_process(EVERYTHING, instance=instance, data_root=root, rebuild=True,
                                    tags={RANGE_START: "a1", RANGE_END: "a2"}, raise_on_error=False)
    assert result.success
    assert sorted(by_partition(result, "fact_supersessions")) == ["a1", "a2"]
    assert [pending(p) for p in fams.values()] == [(), ()]


def test_a_run_that_dies_between_passes_leaves_its_followers_pending(env, monkeypatch):
    """The snapshot says what the run had not reached: the turn sensor takes it up after a crash too."""
    root, instance = env
    fams = familiars(root, instance, [("a1", 10), ("a2", 10)])
    real = run_loop.project_familiar

    def dies_in_the_second_pass(specs, familiar_id, **kwargs):
        if specs[0].asset != "facts":
            raise KeyboardInterrupt("killed")
        return real(specs, familiar_id, **kwargs)

    monkeypatch.setattr(run_loop, "project_familiar", dies_in_the_second_pass)
    assert not run_range(root, instance, EVERYTHING, "a1", "a2").success  # Dagster records the interrupted step
    assert [pending(p) for p in fams.values()] == [tuple(FOLLOWERS)] * 2


def test_a_failed_blocking_check_holds_back_only_that_familiars_followers(env):
    from familiar_pipeline.projectors.facts.store import FactDraft

    root, instance = env
    fams = familiars(root, instance, [("a1", 10), ("a2", 10)])
    assert run_range(root, instance, ["facts"], "a1", "a2").success
    with ProjectionStore(fams["a1"].memory_db) as store:  # a fact citing a turn the log does not have
        facts_db.append_fact(store, FactDraft(text="Ghost fact", source_turn_ids=(4242,)))
    for paths in fams.values():
        append_chat(paths, 10, start=10)
    result = run_range(root, instance, ["facts", "fact_supersessions"], "a1", "a2")
    supersessions = by_partition(result, "fact_supersessions")
    assert supersessions["a1"]["status"] == "skipped: blocked: check facts_cite_existing_turns on facts failed"
    assert not supersessions["a2"]["status"].startswith(("skipped", "failed")), supersessions["a2"]
    cited = {e.partition: e for e in result.get_asset_check_evaluations() if e.check_name == "facts_cite_existing_turns"}
    assert not cited["a1"].passed and cited["a1"].metadata["violations"].value == 1
    assert cited["a2"].passed, "each familiar's result on its own partition"


def test_the_step_refuses_projectors_listed_before_what_they_read():
    from familiar_pipeline.defs.assets import projection_assets
    from familiar_pipeline.engine import registry

    specs = [registry.get_projector("fact_supersede"), registry.get_projector("rich_note")]
    with pytest.raises(ValueError, match="reads \\['facts'\\], which its step runs after it"):
        projection_assets(specs, "wrong_order")


def test_the_embedding_model_loads_once_per_run_for_many_familiars(env):
    from familiar_pipeline.models.embedders import HashEmbedder, register_embedder, unregister_embedder

    root, instance = env
    made = []
    register_embedder("counted", lambda cfg: made.append(cfg) or HashEmbedder(dim=cfg.dim))
    try:
        toml = '[llm.background]\nmodel = "fake/careful"\n[providers.embedding]\nbackend = "counted"\ndim = 32\n' \
               '[providers.memory]\nprojectors = ["turn_embedding"]\n'
        for name in ("e1", "e2", "e3"):
            append_chat(make_familiar(root, name, toml), 5)
        instance.add_dynamic_partitions("familiars", ["e1", "e2", "e3"])
        result = run_range(root, instance, ["turn_embeddings"], "e1", "e3")
        assert result.success
        assert {f: m["rows_written"] for f, m in by_partition(result, "turn_embeddings").items()} == \
            {"e1": 5, "e2": 5, "e3": 5}
        assert len(made) == 1, "one model for the three familiars that share its config"
    finally:
        unregister_embedder("counted")


def test_a_ui_backfill_through_dagsters_backfill_daemon_is_one_run_over_the_range(tmp_path, monkeypatch):
    """What the UI's "Materialize" over three familiars does: the backfill daemon launches one run (single-run policy)."""
    import logging
    import os

    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
    from dagster._core.test_utils import create_test_daemon_workspace_context
    from dagster._core.workspace.load_target import ModuleTarget
    from dagster._daemon.backfill import execute_backfill_iteration

    root, home = tmp_path / "data", tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    names = ["u1", "u2", "u3"]
    for name in names:
        append_chat(make_familiar(root, name), 10)
    overrides = {  # runs launched synchronously in this process; the repository's event log class
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
        "run_launcher": {"module": "dagster._core.launcher.sync_in_memory_run_launcher", "class": "SyncInMemoryRunLauncher"},
        "event_log_storage": {"module": "familiar_pipeline.event_log", "class": "FamiliarSqliteEventLogStorage",
                              "config": {"base_dir": str(home / "history" / "runs")}},
    }
    target = ModuleTarget(module_name="familiar_pipeline.definitions", attribute=None,
                          working_directory=os.getcwd(), location_name="familiar")
    with fake_llm(careful_model), dg.instance_for_test(temp_dir=str(home), overrides=overrides) as instance, \
            create_test_daemon_workspace_context(target, instance) as workspace:
        instance.add_dynamic_partitions("familiars", names)
        instance.add_backfill(PartitionBackfill.from_asset_partitions(
            backfill_id="ui", asset_graph=workspace.create_request_context().asset_graph, partition_names=names,
            asset_selection=[dg.AssetKey(a) for a in FACTS_AND_INDEX], backfill_timestamp=time.time(), tags={},
            dynamic_partitions_store=instance, all_partitions=False, title=None, description=None, run_config=None))
        for _ in range(5):
            list(execute_backfill_iteration(workspace, logging.getLogger("backfill")))
            if instance.get_backfill("ui").status != BulkActionStatus.REQUESTED:
                break
        assert instance.get_backfill("ui").status == BulkActionStatus.COMPLETED_SUCCESS
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert (run.tags[RANGE_START], run.tags[RANGE_END]) == ("u1", "u3")
        for name in names:
            [record] = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("facts"), asset_partitions=[name]), limit=5).records
            assert record.asset_materialization.metadata["status"].value == "ok"
            assert facts_and_mark(FamiliarPaths.for_id(name, root))[1] == 10
        planned = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED)
        assert len(planned.records) == len(FACTS_AND_INDEX), "one planned event per asset for the whole range"


def test_passes_put_the_facts_and_what_they_read_first():
    from familiar_pipeline.engine.schedule import passes
    from familiar_pipeline.projectors import builtin

    specs = list(builtin.BUILTIN_SPECS)
    first, rest = passes(specs)
    assert [s.asset for s in first] == ["facts"]
    assert [s.asset for s in rest] == [s.asset for s in specs if s.asset != "facts"]
    assert not {s.asset for s in rest} & {i for s in first for i in s.inputs}, "nothing in the first pass reads the second"
    only_followers = [s for s in specs if s.asset in ("people_dossiers", "reflections")]
    assert passes(only_followers) == [only_followers]
    follower_of_facts = [s for s in specs if s.asset in ("facts", "fact_embeddings")]
    assert [[s.asset for s in p] for p in passes(follower_of_facts)] == [["facts"], ["fact_embeddings"]]


def test_the_ui_agrees_on_each_familiars_checks_after_a_range_run(env):
    """The checks list, the detail pane and the group view read the check's executions per partition:
    after a run over several familiars every partition's check is "passed" and none "skipped" (a
    result with no partition left Dagster's planned per-partition rows to be read as skipped, so
    the list said "Skipped", the pane "Passed" and the group view "0 / 3 passed")."""
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
    from dagster._core.storage.event_log.base import PartitionKeyFilter

    root, instance = env
    familiars(root, instance, [("a1", 10), ("a2", 10), ("a3", 10)])
    assert run_range(root, instance, FACTS_AND_INDEX, "a1", "a3").success
    # a2 is in the next run's range but not due: its results from the first run stand.
    second = run_range(root, instance, FACTS_AND_INDEX, "a1", "a3", plan={"facts": ["a1", "a3"], "turns_fts": ["a1", "a3"]})
    assert second.success
    checks = [dg.AssetCheckKey(dg.AssetKey("facts"), name) for name in
              ("facts_cite_existing_turns", "fact_subjects_are_participants", "serving_snapshot_in_step")]
    for key in checks:
        assert instance.event_log_storage.get_asset_check_execution_history(
            key, limit=10, partition_filter=PartitionKeyFilter(key=None)) == [], "no result without a partition"
        for name in ("a1", "a2", "a3"):
            [latest] = instance.event_log_storage.get_asset_check_execution_history(
                key, limit=1, partition_filter=PartitionKeyFilter(key=name))
            assert latest.status == AssetCheckExecutionRecordStatus.SUCCEEDED, (key.name, name, latest.status)
            assert latest.run_id == second.run_id
            evaluation = latest.event.dagster_event.event_specific_data
            target = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("facts"), asset_partitions=[name]), limit=1).records[0]
            assert evaluation.target_materialization_data.storage_id == target.storage_id, "checks the latest"
            # read from the index's columns (dagster_internals.latest_materialization_targets): the same run and time
            assert evaluation.target_materialization_data.run_id == target.run_id
            assert abs(evaluation.target_materialization_data.timestamp - target.timestamp) < 1e-3
            assert ("carried_over" in evaluation.metadata) == (name == "a2")
        infos = instance.event_log_storage.get_asset_check_partition_info([key])
        assert {(i.partition_key, i.latest_execution_status, i.is_current) for i in infos} == {
            (name, AssetCheckExecutionRecordStatus.SUCCEEDED, True) for name in ("a1", "a2", "a3")}
