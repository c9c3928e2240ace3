"""Whether the published serving snapshot lags the store: the one comparison of the two.

A run commits to `memory.duckdb`, then publishes the snapshot the bot reads. When the
publish fails (a full disk, a kill between the two), the store is ahead of what the
bot sees. The `serving_snapshot_in_step` check reports it, and the next run of the
familiar republishes because of it (`projectors.runtime.FamiliarRuntime.flush`), even
when it has nothing new to project.
"""

from __future__ import annotations

import json
from pathlib import Path

from familiar_pipeline.storage.store import ProjectionStore


def snapshot_lag(store: ProjectionStore, serving_dir: Path) -> dict | None:
    """None when the published manifest matches the store's watermarks, else both sides."""
    try:
        manifest = json.loads((Path(serving_dir) / "manifest.json").read_text())
    except (OSError, ValueError):
        return {"store": store.serving_watermark(), "snapshot": None}
    published = manifest.get("store_watermark")
    current = store.serving_watermark()
    return None if published == current else {"store": current, "snapshot": published}
