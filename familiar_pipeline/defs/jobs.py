"""The projection job (for CLI backfills and UI launches) and third-party projector assets."""

from __future__ import annotations

import importlib
import os

import dagster as dg

from familiar_pipeline.defs.assets import MEMORY, op_name, projection_asset, turns
from familiar_pipeline.defs.partitions import asset_key
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource
from familiar_pipeline.engine import registry
from familiar_pipeline.projectors import builtin

PROJECTION_JOB = "project_memory"

projection_job = dg.define_asset_job(
    PROJECTION_JOB,
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets(asset_key("turns")),
    description="Materialize memory projections for the selected familiars; pick assets with an asset selection.",
)


def import_plugins(env: dict | None = None) -> list[str]:
    """Import modules named in FAMILIAR_PLUGINS (comma-separated) so they can register projectors."""
    names = [n.strip() for n in (env or os.environ).get("FAMILIAR_PLUGINS", "").split(",") if n.strip()]
    for name in names:
        importlib.import_module(name)
    return names


def plugin_assets() -> list[dg.AssetsDefinition]:
    """Assets of registered third-party projectors: the spec's own factory, else the same shell as a built-in."""
    import_plugins()
    assets: list[dg.AssetsDefinition] = []
    for spec in registry.specs():
        if spec.name in builtin.BUILTIN_PROJECTORS:
            continue
        if spec.factory is not None:
            made = spec.factory()
            assets.extend(made if isinstance(made, (list, tuple)) else [made])
        elif spec.run is not None:
            assets.append(projection_asset(spec))
    return assets


def _resources(data_root) -> dict:
    return {"familiar_data": FamiliarData(data_root=str(data_root or "")), "llm": LlmResource(),
            "embedder": EmbedderResource()}


def materialize_in_process(
    assets,
    *,
    instance: dg.DagsterInstance,
    data_root: str | os.PathLike | None = None,
    partition_key: str | None = None,
    rebuild: bool = False,
    familiars: dict[str, list[str]] | None = None,
    tags: dict[str, str] | None = None,
    extra_assets=(),
    raise_on_error: bool = True,
    log_level: str | None = None,
) -> dg.ExecuteInProcessResult:
    """Materialize projection assets (names or keys) in this process, with their checks.

    What the eval harness, the benchmarks and the tests run: the same step, resources and
    run config the daemon's runs get. `extra_assets`: other AssetsDefinitions (a plugin's)
    to include; select their keys in `assets` too. A partition range goes in `tags`.
    `log_level`: the console logger's level (e.g. "WARNING" for a quiet harness).
    """
    keys = [asset_key(a) if isinstance(a, str) else a for a in assets]
    steps = {op_name(key.path[-1]) for key in keys}
    run_config: dict = {"ops": {step: {"config": {"rebuild": rebuild, "familiars": familiars or {}}} for step in steps}}
    if log_level:
        run_config["loggers"] = {"console": {"config": {"log_level": log_level}}}
    return dg.materialize(
        [turns, MEMORY, *extra_assets],
        selection=dg.AssetSelection.assets(*keys),
        partition_key=partition_key,
        instance=instance,
        tags=tags,
        resources=_resources(data_root),
        run_config=run_config,
        raise_on_error=raise_on_error,
    )


def execute_request(
    request: dg.RunRequest,
    *,
    instance: dg.DagsterInstance,
    data_root: str | os.PathLike | None = None,
    tags: dict[str, str] | None = None,
    extra_assets=(),
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """A sensor's run request, run in this process as the daemon would launch it."""
    assert request.asset_selection is not None  # the sensors' requests name their assets
    return dg.materialize(
        [turns, MEMORY, *extra_assets],
        selection=list(request.asset_selection),
        partition_key=request.partition_key,
        instance=instance,
        tags={**request.tags, **(tags or {})},
        resources=_resources(data_root),
        run_config=request.run_config or None,
        raise_on_error=raise_on_error,
    )


def materializations(result: dg.ExecuteInProcessResult, asset: str) -> list[dg.AssetMaterialization]:
    """The run's materializations of one asset (by name), in order: one per familiar it served."""
    return [event.materialization for event in result.get_asset_materialization_events()
            if event.materialization.asset_key.path[-1] == asset]
