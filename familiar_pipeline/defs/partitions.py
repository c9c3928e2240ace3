"""One partition per familiar: familiars are independent, so they shard with no shared writer."""

import dagster as dg

familiars_partitions = dg.DynamicPartitionsDefinition(name="familiars")

# Runs that may serve many familiars (the turn sensor's, declarative automation's, the CLI
# backfill's) carry this tag, and the run queue (dagster_home/dagster.yaml) starts one of
# them at a time: a run over a range of familiars has no `dagster/partition` tag, so the
# per-partition limit cannot keep two of them off one familiar. A run queued behind another
# then waits for it instead of meeting a held writer lock (projectors.runtime.WriterLock).
PROJECTION_QUEUE_TAG = {"familiar/queue": "projections"}
