"""Whether the published serving snapshot lags the store: the one comparison of the two.

A run commits to `memory.duckdb`, then publishes the snapshot the bot reads. When the
publish fails (a full disk, a kill between the two), the store is ahead of what the
bot sees; a snapshot file lost or cut short leaves it damaged. The
`serving_snapshot_in_step` check reports either, and the next run of the familiar
republishes because of it (`engine.runtime.FamiliarRuntime.flush`), even
when it has nothing new to project.
"""

from __future__ import annotations

from pathlib import Path

from familiar_pipeline.storage.snapshots import published_manifests
from familiar_pipeline.storage.store import ProjectionStore


def snapshot_lag(store: ProjectionStore, serving_dir: Path) -> dict | None:
    """None when the published snapshot is whole and its manifest matches the store's watermarks, else both sides
    (and, for a damaged snapshot, what is wrong with it: `snapshots.published_manifests`)."""
    published = published_manifests(serving_dir)
    current = store.serving_watermark()
    snapshot = dict(published.manifest.store_watermark) if published.manifest is not None else None
    if published.problem is not None:
        return {"store": current, "snapshot": snapshot, "damaged": published.problem}
    return None if snapshot == current else {"store": current, "snapshot": snapshot}
