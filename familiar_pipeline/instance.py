"""Dagster instance configurations: the shipped SQLite one, and Postgres for one host or for shards.

The shipped `dagster_home/dagster.yaml` keeps everything in SQLite files under DAGSTER_HOME
with two classes of this repository: the event log (`familiar_pipeline.event_log`, a
SQLite class) and the preloaded run launcher (`familiar_pipeline.run_launcher`). A
Postgres instance (`familiar up --instance postgresql://...`, `familiar control-plane`) is
that file with Dagster's `storage: postgres:` in place of the SQLite storage:

* the event log is Dagster's own `PostgresEventLogStorage` (the repository's class
  subclasses the SQLite one and has nothing to offer Postgres); range runs record one
  planned event per asset through Dagster's `DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS`,
  which every process started for a Postgres instance gets (`POSTGRES_ENV`);
* on one host (`familiar up --instance`) the preloaded run launcher stays: it forks runs on
  the daemon's machine, which is the only one;
* for shards (`write_instance(..., shards=True)`) the run launcher is Dagster's
  `DefaultRunLauncher`: it asks the code server of the run's location to start the run, so a
  run executes on the host that owns its familiars. The run queue gives each shard its own
  lanes (`familiar/queue` per unique value: `familiar_pipeline.shards.queue_value`). That
  launcher cannot tell that a run's host died (no worker health check), so the control
  plane's run monitoring also gets a maximum run time (`run_monitoring:
  max_runtime_seconds`, `DEFAULT_MAX_RUNTIME_S`): past it the daemon terminates the run, and
  a run whose code server is gone is marked failed, which frees its familiars for the turn
  sensor's next tick.

The connection URL is never written to a file: the YAML reads it from the environment
(`INSTANCE_URL_ENV`), which the commands set for the processes they start.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from familiar_pipeline.storage.paths import REPO_ROOT

INSTANCE_URL_ENV = "FAMILIAR_INSTANCE_URL"
SHIPPED_YAML = REPO_ROOT / "dagster_home" / "dagster.yaml"
# What every process of a Postgres instance needs: one planned materialization per asset for a
# range run, as this repository's SQLite event log records (the turn sensor then never cuts runs at gaps).
POSTGRES_ENV = {"DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1"}
CONNECT_TIMEOUT_S = 5
# A sharded deployment's bound on one run (`familiar control-plane --max-run-seconds`): well above a
# turn-sensor run's batch, so it only ends runs whose host died (or runs that hang).
DEFAULT_MAX_RUNTIME_S = 3600


class InstanceError(RuntimeError):
    """A Postgres URL that is malformed or unreachable: said in one line, with no password in it."""


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


DRIVER_SCHEME = "postgresql+psycopg2"  # what dagster-postgres brings; SQLAlchemy 2.1's default for postgresql:// is psycopg 3


def validate_url(url: str) -> str:
    """The URL with the psycopg2 driver named (`postgresql+psycopg2://`), or InstanceError."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres", DRIVER_SCHEME) or not parts.hostname or not parts.path.strip("/"):
        raise InstanceError(f"instance URL {redact(url)!r} is not a PostgreSQL URL "
                            "(postgresql://user:password@host:port/database)")
    return f"{DRIVER_SCHEME}://" + url.split("://", 1)[1]


def libpq_url(url: str) -> str:
    """The same URL as libpq (psycopg2.connect) reads it."""
    return "postgresql://" + url.split("://", 1)[1]


def check_reachable(url: str, timeout_s: int = CONNECT_TIMEOUT_S) -> str:
    """The URL, normalized, once a connection to it succeeds; else InstanceError in one line."""
    import psycopg2

    url = validate_url(url)
    try:
        psycopg2.connect(libpq_url(url), connect_timeout=timeout_s).close()
    except psycopg2.Error as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InstanceError(f"cannot reach the Dagster instance's PostgreSQL at {redact(url)}: {reason}") from None
    return url


def _shipped() -> dict:
    return yaml.safe_load(SHIPPED_YAML.read_text())


def postgres_config(*, shards: bool, max_runtime_s: int = DEFAULT_MAX_RUNTIME_S) -> dict:
    """The shipped instance config with Postgres storage (see the module docstring for what changes).

    With `shards`, `max_runtime_s` > 0 becomes run monitoring's `max_runtime_seconds` (0: no bound).
    """
    config = copy.deepcopy(_shipped())
    config.pop("event_log_storage", None)  # a SQLite class: Postgres gets Dagster's own event log
    config["storage"] = {"postgres": {"postgres_url": {"env": INSTANCE_URL_ENV}}}
    if shards:
        config.pop("run_launcher", None)  # DefaultRunLauncher: the run starts on its location's code server
        for limit in config["run_queue"]["tag_concurrency_limits"]:
            if limit["key"] == "familiar/queue":
                limit["value"] = {"applyLimitPerUniqueValue": True}  # each shard its own lanes
        if max_runtime_s > 0:
            config.setdefault("run_monitoring", {"enabled": True})["max_runtime_seconds"] = int(max_runtime_s)
    return config


WRITTEN_BY = "# Written by familiar "


def write_instance(home: Path, *, shards: bool, max_runtime_s: int = DEFAULT_MAX_RUNTIME_S) -> Path:
    """Write `home/dagster.yaml` for a Postgres instance; returns its path.

    Refuses (InstanceError) to replace a `dagster.yaml` it did not write: the shipped SQLite
    one in `dagster_home/`, or an operator's own.
    """
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if target.exists() and not target.read_text().startswith(WRITTEN_BY):
        raise InstanceError(f"{target} is not one familiar wrote; give the Postgres instance a DAGSTER_HOME of its own "
                            "(unset DAGSTER_HOME to use dagster_home/postgres)")
    header = (WRITTEN_BY + ("control-plane" if shards else "up --instance")
              + " (familiar_pipeline/instance.py): the shipped dagster_home/dagster.yaml with Postgres storage.\n"
              f"# The URL comes from ${INSTANCE_URL_ENV} in each process's environment, never from this file.\n")
    target.write_text(header + yaml.safe_dump(postgres_config(shards=shards, max_runtime_s=max_runtime_s), sort_keys=False))
    return target


def postgres_home(dagster_home: str | None) -> Path:
    """Where `familiar up --instance` keeps its instance config: $DAGSTER_HOME if set, else dagster_home/postgres."""
    return Path(dagster_home).expanduser().resolve() if dagster_home else REPO_ROOT / "dagster_home" / "postgres"


def instance_url_from(arg: str | None) -> str | None:
    """`--instance` if given, else $FAMILIAR_INSTANCE_URL, else None (the SQLite default)."""
    return arg or os.environ.get(INSTANCE_URL_ENV) or None
