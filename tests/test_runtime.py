"""Snapshot publishing inside one projection run (familiar_pipeline.engine.runtime)."""

from __future__ import annotations

import familiar_pipeline.engine.runtime as runtime_mod
from familiar_pipeline.config import load_config
from familiar_pipeline.engine.runtime import FamiliarRuntime
from familiar_pipeline.storage.snapshots import SnapshotReader
from familiar_pipeline.projectors.summary import tables as summary_db

from .helpers import make_familiar


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def paced_runtime(tmp_path, monkeypatch, publish_cost_s: float):
    paths = make_familiar(tmp_path, "fam")
    clock = Clock()
    real_publish = runtime_mod.publish_snapshot

    def slow_publish(*args, **kwargs):
        clock.now += publish_cost_s
        return real_publish(*args, **kwargs)

    monkeypatch.setattr(runtime_mod.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(runtime_mod, "publish_snapshot", slow_publish)
    rt = FamiliarRuntime(paths=paths, config=load_config("fam", root=tmp_path))
    return rt, clock, paths


def write_summary(rt, text: str, turn_id: int) -> None:
    with rt.store() as store:
        summary_db.put_summary(store, text, turn_id)
        rt.publish(store)


def test_writes_publish_once_at_close_or_every_interval_on_a_long_catch_up(tmp_path, monkeypatch):
    """A familiar's step publishes once, at close; a catch-up longer than the interval shows progress on the way."""
    rt, clock, paths = paced_runtime(tmp_path, monkeypatch, publish_cost_s=0.01)
    write_summary(rt, "first", 1)
    clock.now += 0.2
    write_summary(rt, "second", 2)
    assert rt.published_version == 0, "within the interval from the runtime's start: held for close()"
    clock.now += runtime_mod.PUBLISH_INTERVAL_S
    write_summary(rt, "third", 3)
    during = rt.published_version
    assert during > 0, "a long catch-up publishes every PUBLISH_INTERVAL_S"
    assert summary_db.summary(SnapshotReader(paths.serving_dir).current()).summary_text == "third"
    write_summary(rt, "fourth", 4)
    assert rt.published_version == during
    rt.close()
    assert rt.published_version > during
    assert summary_db.summary(SnapshotReader(paths.serving_dir).current()).summary_text == "fourth"


class SlowModel:
    """A model client whose reply takes `delay_s`; it records whether memory.duckdb was free meanwhile."""

    def __init__(self, paths, delay_s: float):
        self.paths, self.delay_s, self.free_during_call = paths, delay_s, []

    def complete(self, messages, **kwargs):
        import time

        from familiar_pipeline.storage.store import ProjectionStore

        time.sleep(self.delay_s)
        try:
            ProjectionStore(self.paths.memory_db, read_only=True).close()
            self.free_during_call.append(True)
        except Exception:
            self.free_during_call.append(False)
        return "reply"


def test_a_slow_model_call_gives_up_the_write_connection_and_a_fast_one_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime_mod, "MODEL_CALL_GRACE_S", 0.1)
    paths = make_familiar(tmp_path, "fam")
    opened = []
    real_store = runtime_mod.ProjectionStore

    def counting_store(*args, **kwargs):
        opened.append(args)
        return real_store(*args, **kwargs)

    monkeypatch.setattr(runtime_mod, "ProjectionStore", counting_store)
    for delay, free, opens in ((0.6, True, 2), (0.0, False, 1)):
        opened.clear()
        model = SlowModel(paths, delay)
        rt = FamiliarRuntime(paths=paths, config=load_config("fam", root=tmp_path), llm_client=model)
        write_summary(rt, "before", 1)
        assert rt.llm.complete([]) == "reply"
        write_summary(rt, "after", 2)
        rt.close()
        # slow: a notebook could open the file during the call, and the next write reopened it;
        # fast: the call held the connection (another process would have been refused), no reopen.
        assert model.free_during_call == [free] and len(opened) == opens, (delay, model.free_during_call, opened)


def test_a_bad_block_met_mid_run_moves_the_store_aside_and_the_next_open_starts_the_rebuild(tmp_path):
    """DuckDB may find a bad block only when a query reads it: that error moves the store aside
    (after closing it), and the next `store()` opens an empty one, marked as being rebuilt."""
    import duckdb
    import pytest

    from familiar_pipeline.storage import corrupt

    paths = make_familiar(tmp_path, "fam")
    rt = FamiliarRuntime(paths=paths, config=load_config("fam", root=tmp_path))
    write_summary(rt, "kept", 3)
    rt.fts_turns().upsert_many([(1, "an indexed turn")])
    bad_block = "Corrupt database file: computed checksum 1 does not match stored checksum 2 in block at location 8192"
    with pytest.raises(duckdb.Error):
        with rt.store():
            raise duckdb.Error(bad_block)
    [moved] = corrupt.moved_aside(paths)
    assert corrupt.rebuilding(paths)["reason"] == bad_block and not paths.fts_dir.exists()
    with rt.store() as store:
        assert store.get_watermark("rolling_summary").turn_id == 0, "an empty store: the rebuild starts from turn 1"
    with pytest.raises(duckdb.Error, match="lock"):  # a busy store, a full disk: not corruption, left in place
        with rt.store():
            raise duckdb.IOException("Could not set lock on file")
    assert corrupt.moved_aside(paths) == [moved]
    rt.close()
