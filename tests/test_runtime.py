"""Snapshot publishing inside one projection run (familiar_pipeline.projectors.runtime)."""

from __future__ import annotations

import familiar_pipeline.projectors.runtime as runtime_mod
from familiar_pipeline.config import load_config
from familiar_pipeline.projectors.runtime import FamiliarRuntime
from familiar_pipeline.storage.snapshots import SnapshotReader

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
        store.put_summary(text, turn_id)
        rt.publish(store)


def test_first_write_publishes_at_once_and_close_publishes_the_rest(tmp_path, monkeypatch):
    rt, clock, paths = paced_runtime(tmp_path, monkeypatch, publish_cost_s=0.01)
    write_summary(rt, "first", 1)
    first = rt.published_version
    assert first > 0  # the write a waiting conversation sees is never held back
    clock.now += 0.2
    write_summary(rt, "second", 2)
    assert rt.published_version == first  # within the interval: held
    rt.close()
    assert rt.published_version > first
    assert SnapshotReader(paths.serving_dir).current().summary().summary_text == "second"
