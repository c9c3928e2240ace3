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

from .manifest import MANIFEST_NAME, Manifest, SnapshotFormatError, published_manifests, read_manifest
from .snapshot import Snapshot, load_snapshot

logger = logging.getLogger(__name__)


class SnapshotReader:
    """The bot's view of one familiar's serving folder.

    ``refresh()`` is cheap when nothing changed (one read of a small JSON file)
    and never raises: a missing or corrupt manifest, or a file that vanished
    or is damaged, keeps the last good snapshot and logs one warning per
    distinct problem (``last_error`` holds it); a reader that has none yet (just
    started) serves the newest whole snapshot still on disk, the previous version. The query helpers answer from
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
        self._fell_back_at: float | None = None  # when the manifest copies were last looked at
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
        manifest, problem = self._read_manifest()
        if manifest is not None:
            if self._is_current(manifest):
                self._recovered()
                return False
            if self._failed_recently(manifest):
                return False
            problem = self._load(manifest)
            if problem is None:
                self._failed = None
                return True
            # Usually a publisher replaced the manifest and collected the files in between:
            # the newer manifest names files that exist.
            newer, _ = self._read_manifest()
            if newer is not None and not self._is_current(newer) and newer != manifest:
                manifest, problem = newer, self._load(newer)
                if problem is None:
                    self._failed = None
                    return True
            self._failed = ((manifest.version, manifest.published_at), time.monotonic())
        # manifest.json is missing, unreadable or names a damaged file: serve the newest
        # whole snapshot of those still on disk (the previous version's), if newer than ours.
        fallback = self._fall_back(problem)
        if fallback is None and problem is not None:
            self._problem(f"{problem}; keeping v{self.version}")
        return fallback is not None

    def _load(self, manifest: Manifest) -> str | None:
        """Load the snapshot `manifest` names and serve it; None on success, else what went wrong."""
        try:
            snapshot = load_snapshot(self.serving_dir, manifest)
        except (OSError, pa.ArrowException, SnapshotFormatError) as exc:
            return f"cannot load snapshot v{manifest.version}: {type(exc).__name__}: {exc}"
        self._snapshot = snapshot
        self._recovered()
        return None

    def _failed_recently(self, manifest: Manifest) -> bool:
        """A snapshot that failed to load is tried again only after `retry_failed_after` seconds."""
        return (self._failed is not None and self._failed[0] == (manifest.version, manifest.published_at)
                and time.monotonic() - self._failed[1] < self.retry_failed_after)

    def _fall_back(self, problem: str | None) -> Manifest | None:
        """Serve the newest whole snapshot newer than the current one, from the versions' manifest
        copies (`published_manifests`); the folder is looked at again after `retry_failed_after` s."""
        if self._fell_back_at is not None and time.monotonic() - self._fell_back_at < self.retry_failed_after:
            return None
        self._fell_back_at = time.monotonic()
        for manifest in published_manifests(self.serving_dir, every_copy=True).manifests:
            if manifest.version <= self.version:
                break
            if self._load(manifest) is None:
                self._problem(f"{problem or MANIFEST_NAME + ' is missing'}; serving v{manifest.version}, "
                              "the newest whole snapshot on disk, until a run publishes again")
                return manifest
        return None

    def _read_manifest(self) -> tuple[Manifest | None, str | None]:
        """manifest.json's manifest (None: missing or unreadable) and what is wrong with it."""
        try:
            manifest = read_manifest(self.serving_dir)
        except (OSError, SnapshotFormatError) as exc:
            return None, f"unreadable snapshot manifest: {exc}"
        if manifest is None and self.version:
            return None, f"{self.serving_dir / MANIFEST_NAME} is missing"
        return manifest, None

    def _is_current(self, manifest: Manifest) -> bool:
        current = self._snapshot.manifest
        return current is not None and (current.version, current.published_at) == (
            manifest.version,
            manifest.published_at,
        )

    def _recovered(self) -> None:
        self._fell_back_at = None
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
