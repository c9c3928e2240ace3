"""One partition per familiar: familiars are independent, so they shard with no shared writer."""

import dagster as dg

familiars_partitions = dg.DynamicPartitionsDefinition(name="familiars")
