"""The projection job (for CLI backfills and UI launches) and third-party projector assets."""

from __future__ import annotations

import importlib
import os

import dagster as dg

from familiar_pipeline.defs.assets import projection_asset
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
    """Assets of registered third-party projectors: the spec's own factory, else the same shell as a built-in."""
    import_plugins()
    assets = []
    for spec in registry.specs():
        if spec.name in registry.BUILTIN_PROJECTORS:
            continue
        if spec.factory is not None:
            made = spec.factory()
            assets.extend(made if isinstance(made, (list, tuple)) else [made])
        elif spec.run is not None:
            assets.append(projection_asset(spec))
    return assets
