"""The event log storage of `dagster_home`: Dagster's SQLite event log, cheaper per event.

A run over many familiars records one materialization per familiar and asset, and
a run over a range of them one planned materialization per asset at creation. With
Dagster's stock SQLite event log each event opens a new SQLAlchemy engine and
SQLite connection per shard (the run's own file and the cross-run index) and
commits with a full sync: ~20-35 ms per event here, about as much CPU as the
projection work itself in a run of twenty familiars. This subclass changes five
things and nothing in the schema or the files, so an instance can switch to it and
back at any time:

* one engine per shard kept for the process (the index and the latest
  `KEPT_RUN_SHARDS` runs; older ones are disposed), instead of one per statement;
* a table known to exist is not looked up again: Dagster asks whether the asset-check
  table exists before storing each check evaluation, on a new engine and connection
  each time (~1 ms; a run records one evaluation per familiar and check);
* ``PRAGMA synchronous=NORMAL`` on its connections: the files are in WAL mode
  already (Dagster sets it at creation), where NORMAL loses nothing on a process
  crash, only the last commits on a power cut (run history, not memory: every
  familiar's memory is in its own stores);
* one planned materialization per asset for a run over a partition range (its
  partitions as a subset), instead of one per partition, as Dagster's
  ``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS`` does. Dagster's caveat holds:
  a range run that fails does not mark its partitions failed; the projection step
  fails only when every familiar failed and reports each familiar's failure on its
  own partition's materialization anyway;
* a check evaluation of a run written to the index in one transaction, serialized once
  (Dagster inserts it, then updates the check's execution row in a second connection
  and serializes the event again): a run records one evaluation per familiar and check,
  so this is the most frequent event of a run after the materializations.

`dagster_home/dagster.yaml` selects it as ``event_log_storage``; without
``base_dir`` it uses Dagster's default place, ``$DAGSTER_HOME/history/runs``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, cast

import sqlalchemy as db
from dagster import AssetCheckEvaluation, DagsterEventType, DagsterInvariantViolationError, EventLogEntry, Field, StringSource

from familiar_pipeline.dagster_internals import (
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    AssetCheckExecutionRecordStatus,
    AssetCheckExecutionsTable,
    SqlEventLogStorageTable,
    SqliteEventLogStorage,
    create_engine,
)

# Run shards whose engines stay open besides the index: a run worker writes one; the
# webserver and daemon read a few at a time.
KEPT_RUN_SHARDS = 8


def _normal_sync(dbapi_connection, _record) -> None:
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


class FamiliarSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's SQLite event log with kept engines, NORMAL sync and one planned event per asset."""

    def __init__(self, base_dir: str | None = None, inst_data=None):
        if base_dir is None:
            home = os.environ.get("DAGSTER_HOME")
            if not home:
                raise ValueError("FamiliarSqliteEventLogStorage needs base_dir or DAGSTER_HOME set")
            base_dir = os.path.join(home, "history", "runs")
        self._engines: OrderedDict[str, db.engine.Engine] = OrderedDict()
        self._tables: set[str] = set()  # tables of the index shard seen to exist (none is ever dropped but by wipe)
        super().__init__(base_dir, inst_data=inst_data)

    @classmethod
    def config_type(cls):
        return {"base_dir": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> "FamiliarSqliteEventLogStorage":
        return cls(inst_data=inst_data, **config_value)

    @property
    def supports_partition_subset_in_asset_materialization_planned_events(self) -> bool:
        return True

    def _engine(self, shard: str) -> db.engine.Engine:
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        engine = create_engine(self.conn_string_for_shard(shard), connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        db.event.listen(engine, "connect", _normal_sync)
        self._engines[shard] = engine
        runs = [s for s in self._engines if s != INDEX_SHARD_NAME]
        for old in runs[: max(0, len(runs) - KEPT_RUN_SHARDS)]:
            self._engines.pop(old).dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[db.engine.Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def has_table(self, table_name: str) -> bool:
        # Dagster's own lookup (its own engine, no lock: it is asked inside open connections too).
        if table_name not in self._tables and super().has_table(table_name):
            self._tables.add(table_name)
        return table_name in self._tables

    def store_event(self, event: EventLogEntry) -> None:
        dagster_event = event.dagster_event
        if (dagster_event is None or dagster_event.event_type != DagsterEventType.ASSET_CHECK_EVALUATION
                or not event.run_id or not self.supports_asset_checks):
            super().store_event(event)
            return
        self._store_check_evaluation(event, cast(AssetCheckEvaluation, dagster_event.event_specific_data))

    def _store_check_evaluation(self, event: EventLogEntry, evaluation: AssetCheckEvaluation) -> None:
        """What Dagster's `store_event` does for a run's check evaluation, the index part in one transaction.

        The run's shard gets the event; the index gets it too, and the check's execution row for
        this run and partition (created by the planned event) takes its outcome, or is inserted
        when no planned row exists.
        """
        row = self._event_to_row(event)  # serializes the event, once
        with self.run_connection(event.run_id) as conn:
            conn.execute(SqlEventLogStorageTable.insert().values(**row))
        table = AssetCheckExecutionsTable
        outcome = {
            "execution_status": (AssetCheckExecutionRecordStatus.SUCCEEDED if evaluation.passed
                                 else AssetCheckExecutionRecordStatus.FAILED).value,
            "evaluation_event": row["event"],
            "evaluation_event_timestamp": row["timestamp"],
            "materialization_event_storage_id": (evaluation.target_materialization_data.storage_id
                                                 if evaluation.target_materialization_data else None),
            "partition": evaluation.partition,
        }
        key = {"asset_key": evaluation.asset_key.to_string(), "check_name": evaluation.check_name,
               "run_id": event.run_id}
        with self.index_connection() as conn:
            inserted = conn.execute(SqlEventLogStorageTable.insert().values(**row)).inserted_primary_key
            event_id = inserted[0] if inserted else None
            partition = (table.c.partition.is_(None) if evaluation.partition is None
                         else table.c.partition == evaluation.partition)
            updated = conn.execute(
                table.update()
                .where(db.and_(*(getattr(table.c, name) == value for name, value in key.items()), partition))
                .values(evaluation_event_storage_id=event_id, **outcome)).rowcount
            if updated == 0:
                conn.execute(table.insert().values(evaluation_event_storage_id=event_id, **key, **outcome))
        if updated > 1:
            raise DagsterInvariantViolationError(
                f"Updated {updated} rows for asset check evaluation {evaluation.asset_check_key} "
                "as a result of duplicate AssetCheckPlanned events.")

    def _dispose_engines(self) -> None:
        while self._engines:
            self._engines.popitem()[1].dispose()

    def delete_events(self, run_id: str) -> None:
        super().delete_events(run_id)
        with self._db_lock:
            engine = self._engines.pop(run_id, None)
            if engine is not None:
                engine.dispose()

    def wipe(self) -> None:
        with self._db_lock:  # the run files are deleted: no connection may outlive them
            self._dispose_engines()
        super().wipe()
        self._tables.clear()

    def dispose(self) -> None:
        with self._db_lock:
            self._dispose_engines()
        super().dispose()
