"""Which shard a code location serves: its name, its familiars, and the names that keep shards apart.

A shard is one host's share of the familiars: a set of familiar ids under its own data
root, its own bot, and its own gRPC code location (`familiar shard serve`). Every shard
runs the same `familiar_pipeline.definitions`; the environment of its code server
names it, and everything Dagster keeps in the shared instance is then named per shard:

* asset keys get the prefix ``shard_<name>`` (``shard_a/facts``): the same asset in two
  locations would be one asset to Dagster, with one latest materialization;
* the dynamic partitions set is ``familiars_<name>``: partition sets are instance-wide,
  so each shard's assets show only that shard's familiars, and a sensor adds only its own;
* the run queue tag ``familiar/queue`` has the value ``projections_<name>``, so each
  shard's range runs get their own lanes (``applyLimitPerUniqueValue``);
* the code location is ``familiar_shard_<name>``.

With no shard named (``FAMILIAR_SHARD`` unset: `familiar up`, one host) every name is the
one it always was (``facts``, ``familiars``, ``projections``, ``familiar_pipeline``).
No Dagster import here: the CLI and the benchmarks read these names too.
"""

from __future__ import annotations

import os
import re

SHARD_ENV = "FAMILIAR_SHARD"  # the shard this process serves (unset: the single-host names)
SHARD_FAMILIARS_ENV = "FAMILIAR_SHARD_FAMILIARS"  # comma-separated familiar ids it owns (unset: every one under its data root)

SHARD_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,31}$")
LOCATION_PREFIX = "familiar_shard_"
SINGLE_HOST_LOCATION = "familiar_pipeline"


class ShardError(ValueError):
    """A bad shard name or familiar list: an operator's mistake, said in one line."""


def validate_shard(name: str) -> str:
    if not SHARD_NAME.fullmatch(name or ""):
        raise ShardError(f"invalid shard name {name!r}: use 1-32 characters a-z, 0-9 and '_', starting with a letter or digit")
    return name


def current_shard(env: dict | None = None) -> str | None:
    """The shard named by FAMILIAR_SHARD, or None on a single host."""
    name = (env if env is not None else os.environ).get(SHARD_ENV, "").strip()
    return validate_shard(name) if name else None


def shard_familiars(env: dict | None = None) -> frozenset[str] | None:
    """The familiar ids the shard owns (FAMILIAR_SHARD_FAMILIARS), or None: every familiar of its data root."""
    raw = (env if env is not None else os.environ).get(SHARD_FAMILIARS_ENV, "")
    ids = [f.strip() for f in raw.split(",") if f.strip()]
    return frozenset(ids) if ids else None


def key_prefix(shard: str | None) -> list[str]:
    return [f"shard_{shard}"] if shard else []


def partitions_name(shard: str | None) -> str:
    return f"familiars_{shard}" if shard else "familiars"


def queue_value(shard: str | None) -> str:
    return f"projections_{shard}" if shard else "projections"


def location_name(shard: str | None) -> str:
    return f"{LOCATION_PREFIX}{shard}" if shard else SINGLE_HOST_LOCATION


def shard_of_location(location: str) -> str | None:
    return location[len(LOCATION_PREFIX):] if location.startswith(LOCATION_PREFIX) else None
