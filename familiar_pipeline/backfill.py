"""Rebuild or catch up one projection for one familiar, through Dagster so the run shows in the UI.

With this checkout's `familiar up` running (verified by the marker it leaves in
DAGSTER_HOME, see :mod:`familiar_pipeline.webserver`), the run is submitted over
GraphQL and goes through the run queue, so it never overlaps another run of the
same familiar. Otherwise it runs in this process against the same instance
(DAGSTER_HOME), after checking that no run of that familiar is in flight. A
webserver that merely answers on some port is never used: it may serve another
checkout or data root.

An operator command, not a Dagster definition: it sits above the code location it runs
(`definitions`), so `defs/` never imports back up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import dagster as dg

from familiar_pipeline.config import load_config
from familiar_pipeline.definitions import defs  # loads plugins (FAMILIAR_PLUGINS) too
from familiar_pipeline.defs.assets import op_name
from familiar_pipeline.defs.jobs import PROJECTION_JOB
from familiar_pipeline.defs.partitions import PROJECTION_QUEUE_TAG
from familiar_pipeline.defs.sensors import in_flight_runs
from familiar_pipeline.shards import key_prefix, location_name, queue_value
from familiar_pipeline.webserver import UnverifiedWebserver, read_control_plane_marker, verified_webserver
from familiar_pipeline.projectors import registry
from familiar_pipeline.storage.paths import REPO_ROOT, FamiliarPaths, validate_familiar_id

class BackfillError(RuntimeError):
    pass


class ProjectionDisabled(BackfillError):
    """The projection's projector is not in the familiar's active set: a config matter, not a failure."""


@dataclass(frozen=True)
class BackfillOutcome:
    mode: str  # "queued" | "in-process"
    run_id: str
    detail: str


def resolve_asset(projection: str) -> str:
    """The asset of a projector, named by its projector name (`rich_note`) or its asset name (`facts`)."""
    try:
        asset = registry.resolve(projection).asset
    except registry.UnknownProjectorError as exc:
        raise BackfillError(str(exc)) from None
    names = {key.path[-1] for key in defs.resolve_asset_graph().get_all_asset_keys()}
    if asset not in names:
        raise BackfillError(f"projection {projection!r} has no asset {asset!r} in the code location")
    return asset


def ensure_dagster_home() -> str:
    home = os.environ.setdefault("DAGSTER_HOME", str(REPO_ROOT / "dagster_home"))
    os.makedirs(home, exist_ok=True)
    return home


def submit(familiar_id: str, asset: str, *, rebuild: bool, url: str) -> str:
    from urllib.parse import urlsplit

    from dagster_graphql import DagsterGraphQLClient

    address = urlsplit(url)
    assert address.hostname is not None  # a verified webserver's http://host:port
    client = DagsterGraphQLClient(address.hostname, port_number=address.port, timeout=30)
    return client.submit_job_execution(
        PROJECTION_JOB,
        run_config={"ops": {op_name(asset): {"config": {"rebuild": rebuild}}}},
        tags={"dagster/partition": familiar_id, "familiar": familiar_id, "trigger": "familiar backfill",
              **PROJECTION_QUEUE_TAG},
        asset_selection=[asset],
    )


def run_in_process(familiar_id: str, asset: str, *, rebuild: bool):
    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    if familiar_id in in_flight_runs(instance, list(instance.get_dynamic_partitions("familiars"))):
        raise BackfillError(f"a run serving {familiar_id!r} is already queued or running; try again when it ends")
    instance.add_dynamic_partitions("familiars", [familiar_id])
    job = defs.resolve_job_def(PROJECTION_JOB)
    result = job.execute_in_process(
        instance=instance,
        partition_key=familiar_id,
        run_config={"ops": {op_name(asset): {"config": {"rebuild": rebuild}}}},
        asset_selection=[dg.AssetKey(asset)],
        tags={"familiar": familiar_id, "trigger": "familiar backfill"},
        raise_on_error=False,
    )
    return result


def check_enabled(familiar_id: str, asset: str) -> None:
    """Refuse to backfill an asset whose projector the familiar's config leaves out.

    Such a run would only report `disabled`; saying so up front, with the setting to
    change, beats a "queued" that does nothing.
    """
    projector = defs.resolve_asset_graph().get(dg.AssetKey(asset)).tags.get("projector")
    if projector not in registry.known_projectors() or load_config(familiar_id).memory.is_active(projector):
        return
    raise ProjectionDisabled(
        f"{asset} is disabled for {familiar_id!r}: add \"{projector}\" to [providers.memory].projectors in "
        f"{FamiliarPaths.for_id(familiar_id).character_toml} (or FAMILIAR__PROVIDERS__MEMORY__PROJECTORS)"
    )


PARTITION_KEYS_QUERY = """
query FamiliarPartitions($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) { __typename ... on AssetNode { partitionKeys } }
}
"""


def graphql_client(url: str):
    from urllib.parse import urlsplit

    from dagster_graphql import DagsterGraphQLClient

    address = urlsplit(url)
    assert address.hostname is not None
    return DagsterGraphQLClient(address.hostname, port_number=address.port, timeout=30)


def shard_familiars(client, shard: str, asset: str) -> set[str]:
    """The familiars (partitions) the control plane shows for `asset` of `shard`; empty if its location is down."""
    data = client._execute(PARTITION_KEYS_QUERY, {"assetKey": {"path": [*key_prefix(shard), asset]}})
    node = data.get("assetNodeOrError") or {}
    return set(node.get("partitionKeys") or ())


def backfill_on_shard(familiar_id: str, asset: str, *, rebuild: bool, marker: dict, shard: str | None = None) -> BackfillOutcome:
    """Queue the run on the control plane, in the code location of the shard that owns the familiar.

    The shard is `shard` if given, else the one whose partitions list the familiar (ids are
    unique across shards). The run goes through the control plane's queue and is launched
    by its daemon through that shard's code server, so it runs on that shard's host.
    """
    url, shards = marker["url"], sorted(marker["shards"])
    if shard is not None and shard not in shards:
        raise BackfillError(f"unknown shard {shard!r}: the control plane at {url} serves {', '.join(shards)}")
    client = graphql_client(url)
    try:
        owners = [s for s in ([shard] if shard else shards) if familiar_id in shard_familiars(client, s, asset)]
    except Exception as exc:
        raise BackfillError(f"the control plane at {url} did not answer: {' '.join(str(exc).split())}") from None
    if not owners:
        where = f"shard {shard!r}" if shard else f"any shard ({', '.join(shards)})"
        raise BackfillError(f"familiar {familiar_id!r} is not a partition of {asset} on {where}: its shard's sensor adds "
                            "it once its turn log exists there, and a shard that is down lists nothing")
    if len(owners) > 1:
        raise BackfillError(f"familiar {familiar_id!r} is on shards {', '.join(owners)}: ids must be unique across shards; "
                            "pass --shard")
    owner = owners[0]
    try:
        run_id = client.submit_job_execution(
            PROJECTION_JOB, repository_location_name=location_name(owner), repository_name="__repository__",
            run_config={"ops": {op_name(asset): {"config": {"rebuild": rebuild}}}},
            tags={"dagster/partition": familiar_id, "familiar": familiar_id, "trigger": "familiar backfill",
                  "familiar/queue": queue_value(owner)},
            asset_selection=[dg.AssetKey([*key_prefix(owner), asset])],
        )
    except Exception as exc:
        raise BackfillError(f"the control plane at {url} refused the run: {' '.join(str(exc).split())}") from exc
    return BackfillOutcome("queued", run_id, f"queued {asset} for {familiar_id} on shard {owner}: {url}/runs/{run_id}")


def verified_target() -> str | None:
    """The URL of this checkout's own webserver on this DAGSTER_HOME, or None to run in-process."""
    try:
        marker = verified_webserver(ensure_dagster_home())
    except UnverifiedWebserver as exc:
        raise BackfillError(str(exc)) from None
    return marker.url if marker is not None else None


def backfill(
    familiar_id: str,
    projection: str,
    *,
    rebuild: bool = False,
    allow_local: bool = True,
    force_local: bool = False,
    shard: str | None = None,
) -> BackfillOutcome:
    validate_familiar_id(familiar_id)
    asset = resolve_asset(projection)
    marker = None if force_local else read_control_plane_marker(ensure_dagster_home())
    if marker is not None:  # a sharded deployment: the familiar's config is on its shard's host
        return backfill_on_shard(familiar_id, asset, rebuild=rebuild, marker=marker, shard=shard)
    if shard is not None:
        raise BackfillError(f"--shard {shard}: no `familiar control-plane` runs on DAGSTER_HOME {ensure_dagster_home()}")
    check_enabled(familiar_id, asset)
    url = None if force_local else verified_target()
    if url is not None:
        try:
            run_id = submit(familiar_id, asset, rebuild=rebuild, url=url)
        except Exception as exc:
            raise BackfillError(f"the Dagster webserver at {url} refused the run: {exc}") from exc
        return BackfillOutcome("queued", run_id, f"queued {asset} for {familiar_id}: {url}/runs/{run_id}")
    if not allow_local:
        raise BackfillError("no `familiar up` of this checkout is running on this DAGSTER_HOME")
    result = run_in_process(familiar_id, asset, rebuild=rebuild)
    if not result.success:
        raise BackfillError(f"the {asset} run for {familiar_id} failed (run {result.run_id}); see the Dagster UI for its logs")
    meta = {}
    for event in result.get_asset_materialization_events():
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
    return BackfillOutcome("in-process", result.run_id,
                           f"{asset} for {familiar_id}: {meta.get('status', 'done')}, rows written {meta.get('rows_written', 0)}")
