"""One partition per familiar: familiars are independent, so they shard with no shared writer."""

import dagster as dg

from familiar_pipeline import shards

# The shard this code location serves (FAMILIAR_SHARD; None on a single host): see familiar_pipeline.shards.
SHARD = shards.current_shard()
KEY_PREFIX = shards.key_prefix(SHARD)

FAMILIARS = shards.partitions_name(SHARD)  # the dynamic partitions: one per familiar ("familiars" on one host)
familiars_partitions = dg.DynamicPartitionsDefinition(name=FAMILIARS)


def asset_key(name: str) -> dg.AssetKey:
    """The key of an asset by its name: `facts` on one host, `shard_a/facts` in shard a's code location."""
    return dg.AssetKey([*KEY_PREFIX, name])

# Runs that may serve many familiars (the turn sensor's, declarative automation's, the CLI
# backfill's) carry this tag, and the run queue (dagster_home/dagster.yaml) starts a fixed
# number of them at a time (`sensors.run_lanes` reads it): a run over a range of familiars has
# no `dagster/partition` tag, so the per-partition limit cannot keep two of them off one
# familiar. The familiar's writer lock does (engine.runtime.WriterLock): a run that finds
# it held leaves that familiar to its end and waits for it there.
PROJECTION_QUEUE_TAG = {"familiar/queue": shards.queue_value(SHARD)}  # one value per shard

# A run in one of these states has not started: it waits for a free lane of the run queue.
WAITING_STATUSES = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED)


def projection_run_queued(instance: dg.DagsterInstance) -> bool:
    """Whether a run with PROJECTION_QUEUE_TAG waits in the queue, not started (every lane is busy)."""
    filters = dg.RunsFilter(statuses=list(WAITING_STATUSES), tags=PROJECTION_QUEUE_TAG)
    return bool(instance.get_run_records(filters=filters, limit=1))
