"""The bot's reader of one familiar's serving folder: the last good snapshot, refreshed cheaply.

``refresh()`` is cheap when nothing changed (one read of a small JSON file) and never
raises. Reads of a table (``projectors/<name>/reads.py``) take a reader or a snapshot;
for several reads that must agree with each other, take ``snap = reader.current()``
once and read from ``snap``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pyarrow as pa

from familiar_pipeline.storage.records import Watermark

from .manifest import MANIFEST_NAME, Manifest, SnapshotFormatError, read_manifest
from .snapshot import Snapshot, load_snapshot

logger = logging.getLogger(__name__)


class SnapshotReader:
    """The bot's view of one familiar's serving folder.

    ``refresh()`` is cheap when nothing changed (one read of a small JSON file)
    and never raises: a missing or corrupt manifest, or a file that vanished
    or is damaged, keeps the last good snapshot and logs one warning per
    distinct problem (``last_error`` holds it). The query helpers answer from
    the current :class:`Snapshot`; for several reads that must agree with each
    other, take ``snap = reader.current()`` once and query ``snap``.
    """

    def __init__(self, serving_dir: str | Path, *, retry_failed_after: float = 30.0):
        self.serving_dir = Path(serving_dir)
        self.retry_failed_after = retry_failed_after
        self.last_error: str | None = None
        self._snapshot = Snapshot.empty()
        self._refresh_lock = threading.Lock()
        # (version, published_at) of a snapshot that failed to load, and when:
        # not retried on every refresh, only after `retry_failed_after` seconds.
        self._failed: tuple[tuple[int, str], float] | None = None
        self.refresh()

    # -- loading ------------------------------------------------------------ #

    def refresh(self) -> bool:
        """Load the published snapshot if it changed; True when a new one was loaded."""
        with self._refresh_lock:
            try:
                return self._refresh_locked()
            except Exception as exc:  # the bot must keep answering from the last good one
                self._problem(f"unexpected error refreshing snapshot: {type(exc).__name__}: {exc}")
                return False

    def _refresh_locked(self) -> bool:
        manifest = self._read_manifest()
        if manifest is None:
            return False
        if self._is_current(manifest):
            self._recovered()
            return False
        key = (manifest.version, manifest.published_at)
        if self._failed and self._failed[0] == key:
            if time.monotonic() - self._failed[1] < self.retry_failed_after:
                return False
        for attempt in (1, 2):
            try:
                snapshot = load_snapshot(self.serving_dir, manifest)
            except (OSError, pa.ArrowException, SnapshotFormatError) as exc:
                message = f"cannot load snapshot v{manifest.version}: {type(exc).__name__}: {exc}"
                if attempt == 2:
                    self._failed = ((manifest.version, manifest.published_at), time.monotonic())
                    self._problem(message + f"; keeping v{self.version}")
                    return False
                # Usually a publisher replaced the manifest and collected the
                # files in between: the newer manifest names files that exist.
                newer = self._read_manifest()
                if newer is None or self._is_current(newer):
                    self._problem(message + f"; keeping v{self.version}")
                    return False
                manifest = newer
                continue
            self._snapshot = snapshot
            self._failed = None
            self._recovered()
            return True
        return False  # pragma: no cover - the loop always returns

    def _read_manifest(self) -> Manifest | None:
        try:
            manifest = read_manifest(self.serving_dir)
        except (OSError, SnapshotFormatError) as exc:
            self._problem(f"unreadable snapshot manifest: {exc}; keeping v{self.version}")
            return None
        if manifest is None and self.version:
            self._problem(f"{self.serving_dir / MANIFEST_NAME} is missing; keeping v{self.version}")
        return manifest

    def _is_current(self, manifest: Manifest) -> bool:
        current = self._snapshot.manifest
        return current is not None and (current.version, current.published_at) == (
            manifest.version,
            manifest.published_at,
        )

    def _recovered(self) -> None:
        if self.last_error is not None:
            logger.info("snapshot reader for %s is in step again at v%d", self.serving_dir, self.version)
            self.last_error = None

    def _problem(self, message: str) -> None:
        if message != self.last_error:
            logger.warning("snapshot reader for %s: %s", self.serving_dir, message)
        self.last_error = message

    # -- the current snapshot ---------------------------------------------- #

    def current(self) -> Snapshot:
        return self._snapshot

    @property
    def version(self) -> int:
        """0 until a snapshot was loaded."""
        return self._snapshot.version

    @property
    def manifest(self) -> Manifest | None:
        return self._snapshot.manifest

    def table(self, name: str) -> pa.Table:
        """A served table of the snapshot current at the call."""
        return self._snapshot.table(name)

    def watermark(self, projector: str) -> Watermark:
        return self._snapshot.watermark(projector)
