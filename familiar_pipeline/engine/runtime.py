"""Everything a projection needs for one familiar, opened lazily and closed once.

A run holds the DuckDB write connection only while it needs it: `store()` opens
the file and keeps it open for the writes that follow (opening costs more than a
small write), and `close()` closes it. A model call keeps it only while the call
is quick: once a call has taken `MODEL_CALL_GRACE_S`, a timer closes the
connection, so a notebook can open `memory.duckdb` read-only while a run waits on
a slow model, and a fast one (a cached reply, a local model, the scripted model)
costs no reopen. The bot never touches the file (it reads the Parquet snapshot
that `publish()` writes).

The first `store()` also takes the familiar's writer lock (`WriterLock`), held
until `close()`: one writer per familiar, whichever run it is in.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.engine import registry
from familiar_pipeline.storage import corrupt
from familiar_pipeline.storage.fts import FtsIndex
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.snapshot_lag import snapshot_lag
from familiar_pipeline.storage.snapshots import (
    Manifest,
    SnapshotFormatError,
    publish_snapshot,
    published_manifests,
    read_manifest,
    served_tables,
)
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

log = logging.getLogger(__name__)

# A step runs each familiar through every selected projector, and a long catch-up
# commits batch after batch; publishing the snapshot after each write would cost more
# than the writes. Writes publish at most this often, counted from the runtime's start,
# so a familiar whose projectors finish sooner publishes once, at close(); a long
# catch-up still shows its progress to the bot every few seconds.
PUBLISH_INTERVAL_S = 5.0

# A model call that has not answered after this long gives up the write connection (see above).
MODEL_CALL_GRACE_S = 0.5

# How often a writer waiting for a familiar's lock tries again.
LOCK_POLL_S = 0.2


class NoModelConfigured(RuntimeError):
    """An LLM projector ran with no model set for the background slot."""


class FamiliarBusy(RuntimeError):
    """Another process holds the familiar's writer lock."""


class WriterLock:
    """One writer per familiar: an exclusive, non-blocking `flock` on `<familiar>/memory.lock`.

    A run that serves many familiars carries no `dagster/partition` tag, so the run
    queue's one-run-per-partition limit does not cover it. DuckDB refuses a second
    process only while the file is open, and a projector closes the store between
    batches (its model calls happen with the store closed), so two runs could otherwise
    interleave one familiar's batches. The lock spans all of one familiar's work in a
    step and a second writer is refused at once (or after waiting, if it asks to wait);
    the kernel drops it when its process dies, so a crashed run never leaves a familiar
    locked.
    """

    def __init__(self, paths: FamiliarPaths):
        self.paths = paths
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock; held by another process: retry for up to `wait_s`, then FamiliarBusy."""
        if self._fd is not None:
            return
        self.paths.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.paths.writer_lock, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(min(LOCK_POLL_S, max(0.0, deadline - time.monotonic())))
                    continue
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                waited = f" (waited {wait_s:g} s)" if wait_s else ""
                raise FamiliarBusy(
                    f"familiar {self.paths.familiar_id!r} is being written by another process"
                    f"{f' (pid {holder})' if holder.isdigit() else ''} holding {self.paths.writer_lock}{waited}; "
                    "one writer per familiar, so this run leaves it to that one and a later run retries"
                ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "WriterLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class FamiliarRuntime:
    paths: FamiliarPaths
    config: FamiliarConfig
    llm_client: object | None = None  # LlmClient for the background slot, None when not configured
    embedder: object | None = None
    _turn_log: TurnLog | None = field(default=None, init=False, repr=False)
    _indexes: dict[str, FtsIndex] = field(default_factory=dict, init=False, repr=False)
    _unpublished: bool = field(default=False, init=False, repr=False)
    _last_publish: float = field(default_factory=lambda: time.monotonic(), init=False, repr=False)
    _writer: WriterLock | None = field(default=None, init=False, repr=False)
    _open_store: ProjectionStore | None = field(default=None, init=False, repr=False)
    _store_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _in_model_call: bool = field(default=False, init=False, repr=False)
    published_version: int = field(default=0, init=False)
    # What the run has planned for this familiar and not run yet (the step sets it as it goes):
    # each publish records it in the manifest, so a run that stops early leaves the rest to the
    # turn sensor (`schedule.due_assets`). None: not known (nothing recorded, nothing cleared).
    pending_assets: tuple[str, ...] | None = field(default=None, init=False)
    _published_pending: tuple[str, ...] | None = field(default=None, init=False, repr=False)
    _lag_checked: bool = field(default=False, init=False, repr=False)

    @property
    def llm(self):
        if self.llm_client is None:
            raise NoModelConfigured(
                "no model configured for [llm.background]: set `model` under [llm.background] in "
                f"{self.paths.character_toml} (or FAMILIAR__LLM__BACKGROUND__MODEL), e.g. "
                '"openrouter/openai/gpt-4o-mini" or "ollama/llama3.1"'
            )
        return _ReleasingClient(self, self.llm_client)

    @contextmanager
    def model_call(self) -> Iterator[None]:
        """Around a model call: past MODEL_CALL_GRACE_S, a timer closes the write connection."""
        with self._store_lock:
            self._in_model_call = True
        timer = threading.Timer(MODEL_CALL_GRACE_S, self._release_during_call)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            with self._store_lock:  # a close already under way finishes first
                self._in_model_call = False

    def _release_during_call(self) -> None:
        with self._store_lock:
            if self._in_model_call:
                self.release_store()

    def turn_log(self) -> TurnLog:
        if self._turn_log is None:
            # Memory is never built from what people forgotten on the "opt_out" setting say later.
            self._turn_log = TurnLog(self.paths.turns_db, readonly=True,
                                     hide_forgotten=self.config.memory.privacy.after_forget == "opt_out")
        return self._turn_log

    @contextmanager
    def store(self) -> Iterator[ProjectionStore]:
        """The store open for writing; the first call takes the writer lock (FamiliarBusy if held).

        The connection stays open for the next `store()` until a slow model call, an
        error inside the block (which discards it, uncommitted work with it) or `close()`.
        """
        self.hold_writer_lock()
        with self._store_lock:
            if self._open_store is None:
                self._open_store = self._open_store_file()
        try:
            yield self._open_store
        except BaseException as exc:
            self.release_store()
            if corrupt.is_corruption(exc):  # a query met a bad block: the next store() starts the rebuild
                self._move_aside(exc)
            raise

    def _open_store_file(self) -> ProjectionStore:
        """The store, opened for writing; one DuckDB cannot read is moved aside and an empty one opened."""
        try:
            return ProjectionStore(self.paths.memory_db, tables=registry.tables())
        except Exception as exc:
            if not corrupt.is_corruption(exc):
                raise
            self._move_aside(exc)
            return ProjectionStore(self.paths.memory_db, tables=registry.tables())

    def _move_aside(self, exc: BaseException) -> None:
        for index in self._indexes.values():  # their folder goes with the store (`corrupt.move_aside`)
            index.close()
        self._indexes.clear()
        corrupt.move_aside(self.paths, exc)

    def release_store(self) -> None:
        """Close the write connection if open (the writer lock stays until `close()`)."""
        if self._open_store is not None:
            store, self._open_store = self._open_store, None
            store.close()

    def hold_writer_lock(self, wait_s: float = 0.0) -> None:
        """Take the familiar's writer lock until `close()` (a no-op when already held)."""
        if self._writer is None:
            self._writer = WriterLock(self.paths)
        self._writer.acquire(wait_s)

    def publish(self, store: ProjectionStore, *, force: bool = False) -> None:
        """Publish the serving snapshot after a committed write (at most every PUBLISH_INTERVAL_S)."""
        if (not force and time.monotonic() - self._last_publish < PUBLISH_INTERVAL_S) or self._rebuild_holds(store):
            self._unpublished = True
            return
        manifest = publish_store(store, self.paths.serving_dir, self.config, pending_assets=self.pending_assets or ())
        self.published_version = manifest.version
        self._published_pending = manifest.pending_assets
        self._last_publish = time.monotonic()
        self._unpublished = False
        corrupt.rebuilt(self.paths)  # a no-op unless a rebuild was under way (and has now caught up)

    def _rebuild_holds(self, store: ProjectionStore) -> bool:
        """While a store moved aside is rebuilt (`storage.corrupt`), the last published snapshot stays
        served until every active projector has read as far into the turn log as it had."""
        if corrupt.rebuilding(self.paths) is None:
            return False
        published = published_manifests(self.paths.serving_dir)
        last = published.manifest or published.intact(self.paths.serving_dir)
        if last is None:
            return False
        active = [s.name for s in registry.specs() if s.always_on or s.name in self.config.memory.projectors]
        return not corrupt.caught_up(store.serving_watermark()["projectors"],
                                     last.store_watermark.get("projectors") or {}, active)

    def flush(self) -> None:
        """Publish what earlier writes left unpublished, a change in what is pending, or a store the
        published snapshot lags (an earlier run's publish failed: a full disk, a kill), even when
        this run wrote nothing: else the bot would stay behind until the next new turn."""
        if self._unpublished or self._pending_changed() or self._snapshot_lags():
            with self.store() as store:
                self.publish(store, force=True)

    def _snapshot_lags(self) -> bool:
        """Once per runtime (flush runs again at close): whether the manifest lags the store."""
        if self._lag_checked or self.published_version or not self.paths.memory_db.exists():
            return False  # this run's own publish is the newest, or there is nothing to publish
        self._lag_checked = True
        with self.store() as store:
            return snapshot_lag(store, self.paths.serving_dir) is not None

    def _pending_changed(self) -> bool:
        if self.pending_assets is None:
            return False
        published = self._published_pending
        if published is None:  # not published by this runtime: the manifest on disk
            try:
                manifest = read_manifest(self.paths.serving_dir)
            except SnapshotFormatError:
                return False  # a broken manifest is the snapshot check's to report; a write replaces it
            if manifest is None:
                return False  # nothing published yet: nothing to clear, and nothing was written
            published = manifest.pending_assets
        return published != self.pending_assets

    def search_index(self, name: str) -> FtsIndex:
        """The full-text index a projector keeps (`ProjectorSpec.search_index`): "turns" or "facts"."""
        if name not in ("turns", "facts"):
            raise ValueError(f"no full-text index {name!r}; there are 'turns' and 'facts'")
        return self._index(name)

    def fts_turns(self) -> FtsIndex:
        return self._index("turns")

    def fts_facts(self) -> FtsIndex:
        return self._index("facts")

    def _index(self, name: str) -> FtsIndex:
        if name not in self._indexes:
            self.hold_writer_lock()  # the full-text indexes are written with the store
            path = self.paths.fts_turns if name == "turns" else self.paths.fts_facts
            self._indexes[name] = FtsIndex(path, writable=True)
        return self._indexes[name]

    def close(self) -> None:
        try:
            self.flush()
        finally:
            try:
                self._close_handles()
                self.release_store()
            finally:
                if self._writer is not None:
                    self._writer.release()

    def _close_handles(self) -> None:
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()
        if self._turn_log is not None:
            self._turn_log.close()
            self._turn_log = None


def publish_store(store: ProjectionStore, serving_dir: Path, config: FamiliarConfig, *,
                  pending_assets: tuple[str, ...] = ()) -> Manifest:
    """Publish the store's committed tables (every registered projector's, and the watermarks) as the
    next serving snapshot, with the vector matrices the projectors ask for (`ProjectorSpec.matrices`)."""
    watermark = store.serving_watermark()  # before `conn`, which drops the store's copy of the watermarks
    matrices = next((m for spec in registry.specs() if spec.matrices is not None
                     and (m := spec.matrices(config)) is not None), None)
    return publish_snapshot(store.conn, serving_dir, store_watermark=watermark,
                            tables=served_tables(store.tables.values()), matrices=matrices,
                            pending_assets=pending_assets)


class _ReleasingClient:
    """The background model client as projectors see it: each `complete` runs inside `model_call`."""

    def __init__(self, runtime: FamiliarRuntime, client):
        self._runtime, self._client = runtime, client

    def complete(self, *args, **kwargs):
        with self._runtime.model_call():
            return self._client.complete(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._client, name)
