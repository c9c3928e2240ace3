"""Everything a projection needs for one familiar, opened lazily and closed once.

A run holds the DuckDB write connection only while it writes: `store()` opens
the file, yields, and closes it, so a notebook can open `memory.duckdb`
read-only between batches and the bot never touches it (it reads the Parquet
snapshot that `publish()` writes after each write).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.fts import FtsIndex
from familiar_pipeline.paths import FamiliarPaths
from familiar_pipeline.snapshots import publish_snapshot
from familiar_pipeline.store import ProjectionStore
from familiar_pipeline.turns import TurnLog

log = logging.getLogger(__name__)


class NoModelConfigured(RuntimeError):
    """An LLM projector ran with no model set for the background slot."""


@dataclass
class FamiliarRuntime:
    paths: FamiliarPaths
    config: FamiliarConfig
    llm_client: object | None = None  # LlmClient for the background slot, None when not configured
    embedder: object | None = None
    _turn_log: TurnLog | None = field(default=None, init=False, repr=False)
    _indexes: dict[str, FtsIndex] = field(default_factory=dict, init=False, repr=False)

    @property
    def llm(self):
        if self.llm_client is None:
            raise NoModelConfigured(
                "no model configured for [llm.background]: set `model` under [llm.background] in "
                f"{self.paths.character_toml} (or FAMILIAR__LLM__BACKGROUND__MODEL), e.g. "
                '"openrouter/openai/gpt-4o-mini" or "ollama/llama3.1"'
            )
        return self.llm_client

    def turn_log(self) -> TurnLog:
        if self._turn_log is None:
            self._turn_log = TurnLog(self.paths.turns_db, readonly=True)
        return self._turn_log

    @contextmanager
    def store(self) -> Iterator[ProjectionStore]:
        self.paths.dir.mkdir(parents=True, exist_ok=True)
        store = ProjectionStore(self.paths.memory_db)
        try:
            yield store
        finally:
            store.close()

    def publish(self, store: ProjectionStore):
        """Publish the serving snapshot from an open store (call right after a write)."""
        return publish_snapshot(store.conn, self.paths.serving_dir, store_watermark=store_watermark(store))

    def fts_turns(self) -> FtsIndex:
        return self._index("turns")

    def fts_facts(self) -> FtsIndex:
        return self._index("facts")

    def _index(self, name: str) -> FtsIndex:
        if name not in self._indexes:
            path = self.paths.fts_turns if name == "turns" else self.paths.fts_facts
            self._indexes[name] = FtsIndex(path, writable=True)
        return self._indexes[name]

    def close(self) -> None:
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()
        if self._turn_log is not None:
            self._turn_log.close()
            self._turn_log = None


def store_watermark(store: ProjectionStore) -> dict:
    """What the snapshot is in step with: every projector's watermark and the newest fact id."""
    marks = {
        row[0]: {"turn_id": int(row[1] or 0), "fact_id": int(row[2] or 0), "change_seq": int(row[3] or 0)}
        for row in store.conn.execute(
            "SELECT projector, turn_id, fact_id, change_seq FROM watermarks ORDER BY projector"
        ).fetchall()
    }
    return {"projectors": marks, "latest_fact_id": store.latest_fact_id()}
