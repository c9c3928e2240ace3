"""The projection job (for CLI backfills and UI launches) and third-party projector assets."""

from __future__ import annotations

import importlib
import os

import dagster as dg

from familiar_pipeline.projectors import registry

PROJECTION_JOB = "project_memory"

projection_job = dg.define_asset_job(
    PROJECTION_JOB,
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets("turns"),
    description="Materialize memory projections for one familiar; pick assets with an asset selection.",
)


def import_plugins(env: dict | None = None) -> list[str]:
    """Import modules named in FAMILIAR_PLUGINS (comma-separated) so they can register projectors."""
    names = [n.strip() for n in (env or os.environ).get("FAMILIAR_PLUGINS", "").split(",") if n.strip()]
    for name in names:
        importlib.import_module(name)
    return names


def plugin_assets() -> list:
    """Assets contributed by registered third-party projectors (those with an asset factory)."""
    import_plugins()
    assets = []
    for name in registry.known_projectors():
        spec = registry.get_projector(name)
        if name in registry.BUILTIN_PROJECTORS or spec.factory is None:
            continue
        made = spec.factory()
        assets.extend(made if isinstance(made, (list, tuple)) else [made])
    return assets
