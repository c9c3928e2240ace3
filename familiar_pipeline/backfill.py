"""Rebuild or catch up one projection for one familiar, through Dagster so the run shows in the UI.

With this checkout's `familiar up` running (verified by the marker it leaves in
DAGSTER_HOME, see :mod:`familiar_pipeline.webserver`), the run is submitted over
GraphQL and goes through the run queue, so it never overlaps another run of the
same familiar. Otherwise it runs in this process against the same instance
(DAGSTER_HOME), after checking that no run of that familiar is in flight. A
webserver that merely answers on some port is never used: it may serve another
checkout or data root.

By default it waits for the run to end and says how it ended: success with what the
run wrote, or failure with the step that failed and its error (and a non-zero exit in
`familiar backfill`); `wait=None` only queues it (`--no-wait`), as it always did before.
A queued run is watched through the same webserver's GraphQL that took it (a control
plane's too), an in-process one through its result.

An operator command, not a Dagster definition: it sits above the code location it runs
(`definitions`), so `defs/` never imports back up.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import dagster as dg

from familiar_pipeline.config import load_config
from familiar_pipeline.definitions import defs  # loads plugins (FAMILIAR_PLUGINS) too
from familiar_pipeline.defs.assets import op_name
from familiar_pipeline.defs.jobs import PROJECTION_JOB
from familiar_pipeline.defs.partitions import PROJECTION_QUEUE_TAG
from familiar_pipeline.defs.sensors import in_flight_runs
from familiar_pipeline.shards import key_prefix, location_name, queue_value
from familiar_pipeline.webserver import UnverifiedWebserver, read_control_plane_marker, verified_webserver
from familiar_pipeline.engine import registry
from familiar_pipeline.storage.paths import REPO_ROOT, FamiliarPaths, validate_familiar_id

class BackfillError(RuntimeError):
    pass


class ProjectionDisabled(BackfillError):
    """The projection's projector is not in the familiar's active set: a config matter, not a failure."""


@dataclass(frozen=True)
class BackfillOutcome:
    mode: str  # "succeeded" (waited for) | "queued" (--no-wait)
    run_id: str
    detail: str


@dataclass(frozen=True)
class RunEnd:
    """How a run ended: Dagster's status, the step that failed and why, what it wrote for the familiar."""

    status: str  # SUCCESS | FAILURE | CANCELED
    failed_step: str | None = None
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # the asset's materialization for the familiar


class BackfillFailed(BackfillError):
    """The run ran and did not succeed (or did not end in time): the message says which step and why."""

    def __init__(self, message: str, run_id: str):
        super().__init__(message)
        self.run_id = run_id


TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")
WAIT_S = 600.0  # `familiar backfill --wait` default: a rebuild of facts over a long log takes minutes
POLL_S = 1.0


def _one_line(text: object, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe_end(end: RunEnd, asset: str, familiar_id: str, run_id: str, where: str) -> BackfillOutcome:
    """The success line, or BackfillFailed naming the failed step and its error (`where`: in this process, or the URL)."""
    if end.status == "SUCCESS":
        meta = end.metadata
        return BackfillOutcome("succeeded", run_id, f"{asset} for {familiar_id}: {meta.get('status', 'done')}, rows "
                                                    f"written {meta.get('rows_written', 0)} (run {run_id}, {where})")
    if end.status == "CANCELED":
        raise BackfillFailed(f"the {asset} run for {familiar_id} was canceled (run {run_id}, {where})", run_id)
    step = f" at step {end.failed_step}" if end.failed_step else ""
    why = f": {end.error}" if end.error else ""
    raise BackfillFailed(f"the {asset} run for {familiar_id} failed{step}{why} (run {run_id}, {where})", run_id)


def end_of_result(result, asset: str, familiar_id: str) -> RunEnd:
    """An in-process run's end, from its events."""
    failures = [e for e in result.all_events if e.is_step_failure]
    error = failures[0].step_failure_data.error if failures else None
    while error is not None and error.cause is not None and "DagsterExecution" in (error.cls_name or ""):
        error = error.cause  # Dagster's wrapper around what the step raised
    return RunEnd(
        "SUCCESS" if result.success else "FAILURE",
        failed_step=failures[0].step_key if failures else None,
        error=_one_line(f"{error.cls_name}: {error.message.split(': ', 1)[-1]}") if error is not None else None,
        metadata=materialized(
            ((e.asset_key.path[-1], e.partition, {k: v.value for k, v in e.materialization.metadata.items()})
             for e in result.get_asset_materialization_events()), asset, familiar_id),
    )


def materialized(events, asset: str, familiar_id: str) -> dict[str, Any]:
    """The metadata of the last materialization of `asset` for `familiar_id` among (asset, partition, metadata)."""
    found: dict[str, Any] = {}
    for name, partition, metadata in events:
        if name == asset and partition in (familiar_id, None):
            found = metadata
    return found


RUN_END_QUERY = """
query FamiliarRunEnd($runId: ID!) {
  runOrError(runId: $runId) { __typename ... on Run { status } }
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on ExecutionStepFailureEvent { stepKey error { className message cause { className message } } }
        ... on RunFailureEvent { message }
        ... on MaterializationEvent {
          assetKey { path } partition
          metadataEntries { label ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } }
        }
      }
    }
  }
}
"""


def end_of_run(client, run_id: str, asset: str, familiar_id: str) -> RunEnd | None:
    """A queued run's end, asked of the webserver that took it; None while it has not ended."""
    data = client._execute(RUN_END_QUERY, {"runId": run_id})
    run = data.get("runOrError") or {}
    status = run.get("status")
    if run.get("__typename") != "Run":
        raise BackfillError(f"the webserver no longer knows run {run_id} ({run.get('__typename')})")
    if status not in TERMINAL:
        return None
    events = (data.get("logsForRun") or {}).get("events") or []
    step, error = None, None
    for event in events:
        if event["__typename"] == "ExecutionStepFailureEvent" and step is None:
            step, raw = event.get("stepKey"), event.get("error") or {}
            raw = raw.get("cause") or raw if "DagsterExecution" in (raw.get("className") or "") else raw
            error = _one_line(f"{raw.get('className')}: {(raw.get('message') or '').split(': ', 1)[-1]}")
        elif event["__typename"] == "RunFailureEvent" and error is None:
            error = _one_line(event.get("message") or "")
    metadata = materialized(
        ((e["assetKey"]["path"][-1], e.get("partition"),
          {m["label"]: m.get("text", m.get("intValue")) for m in e.get("metadataEntries") or []})
         for e in events if e["__typename"] == "MaterializationEvent"), asset, familiar_id)
    return RunEnd(status, failed_step=step, error=error, metadata=metadata)


def wait_for_run(client, run_id: str, asset: str, familiar_id: str, url: str, *, wait_s: float, where: str = "",
                 clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S) -> BackfillOutcome:
    """Poll the webserver until the run ends; its outcome line, or BackfillFailed (failed, canceled, or not ended in time).

    `where`: how the line names the run's place (default: its page in the UI).
    """
    deadline = clock() + wait_s
    where = where or f"{url}/runs/{run_id}"
    while True:
        try:
            end = end_of_run(client, run_id, asset, familiar_id)
        except BackfillError:
            raise
        except Exception as exc:
            raise BackfillError(f"the Dagster webserver at {url} stopped answering while run {run_id} ran "
                                f"({_one_line(exc)}); see {where}") from None
        if end is not None:
            return describe_end(end, asset, familiar_id, run_id, where)
        if clock() >= deadline:
            raise BackfillFailed(f"the {asset} run for {familiar_id} has not ended after {wait_s:.0f} s; it goes on "
                                 f"(run {run_id}, {where}); `--wait SECONDS` waits longer, `--no-wait` not at all",
                                 run_id)
        time.sleep(poll_s)


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
    client = graphql_client(url)
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


def backfill_on_shard(familiar_id: str, asset: str, *, rebuild: bool, marker: dict, shard: str | None = None,
                      wait_s: float | None = None) -> BackfillOutcome:
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
    if wait_s is not None:
        return wait_for_run(client, run_id, asset, familiar_id, url, wait_s=wait_s,
                            where=f"on shard {owner}: {url}/runs/{run_id}")
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
    wait_s: float | None = WAIT_S,
) -> BackfillOutcome:
    """Run (or queue) the backfill and, unless `wait_s` is None, wait up to `wait_s` for it to end.

    Returns the outcome line of a run that succeeded (or was only queued); raises
    BackfillFailed for one that failed, was canceled or did not end in time. In process
    the run always ends before this returns: `wait_s` matters only for a queued run.
    """
    validate_familiar_id(familiar_id)
    asset = resolve_asset(projection)
    marker = None if force_local else read_control_plane_marker(ensure_dagster_home())
    if marker is not None:  # a sharded deployment: the familiar's config is on its shard's host
        return backfill_on_shard(familiar_id, asset, rebuild=rebuild, marker=marker, shard=shard, wait_s=wait_s)
    if shard is not None:
        raise BackfillError(f"--shard {shard}: no `familiar control-plane` runs on DAGSTER_HOME {ensure_dagster_home()}")
    check_enabled(familiar_id, asset)
    url = None if force_local else verified_target()
    if url is not None:
        try:
            run_id = submit(familiar_id, asset, rebuild=rebuild, url=url)
        except Exception as exc:
            raise BackfillError(f"the Dagster webserver at {url} refused the run: {exc}") from exc
        if wait_s is not None:
            return wait_for_run(graphql_client(url), run_id, asset, familiar_id, url, wait_s=wait_s)
        return BackfillOutcome("queued", run_id, f"queued {asset} for {familiar_id}: {url}/runs/{run_id}")
    if not allow_local:
        raise BackfillError("no `familiar up` of this checkout is running on this DAGSTER_HOME")
    result = run_in_process(familiar_id, asset, rebuild=rebuild)
    return describe_end(end_of_result(result, asset, familiar_id), asset, familiar_id, result.run_id, "in this process")
