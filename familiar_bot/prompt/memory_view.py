"""Everything prompt layers read, behind one object that refreshes cheaply.

The bot is a pure reader of memory (docs/architecture.md §3): projections come from the
Parquet serving snapshot, search from the tantivy folders, and the only live
database it touches is its own turn log. ``refresh()`` runs before each
assembly; it costs a read of the small manifest and two ``stat`` calls when
nothing changed, and it never raises, so a pipeline run publishing, committing,
or crashing half-way never fails a reply: the last good view stays in use.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from cachetools import LRUCache

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.storage.fts import FtsIndex
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.snapshots import SnapshotReader
from familiar_pipeline.storage.turns import Turn, TurnLog

from familiar_bot.prompt.retrieval.cue_people import Directory
from familiar_bot.prompt.layers.common import Labels, content_hash

log = logging.getLogger(__name__)

_MEMO_SIZE = 64
_BULK_SIZE = 4096  # rendered history messages: a few windows' worth
_SLIDE_BATCH = 256  # more new turns than this (across channels) since the last read: re-read the window
PROFILE_NAMES_EVERY_S = 30.0  # how often the participants' profile names and nicknames are re-read


class FtsReader:
    """A read-only full-text index that may not exist yet.

    The bot never creates an index folder (a pipeline run owns it); until the
    first commit lands every search returns []. ``refresh()`` reloads only when
    tantivy's ``meta.json`` changed, so an idle index costs one ``stat``.
    ``generation`` is what cache keys use to notice a new commit.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.index: FtsIndex | None = None
        self.generation: tuple = ("absent",)
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self.refresh()

    def _meta_stamp(self) -> tuple | None:
        try:
            st = (self.path / "meta.json").stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self) -> bool:
        """Move to the newest commit if there is one; True when something changed. Never raises."""
        with self._lock:
            try:
                stamp = self._meta_stamp()
                if stamp is None or stamp == self.generation:
                    return False
                if self.index is None:
                    self.index = FtsIndex(self.path)
                else:
                    self.index.reload()
                self.generation = stamp
                self.last_error = None
                return True
            except Exception as exc:  # keep serving the last commit we could load
                message = f"{type(exc).__name__}: {exc}"
                if message != self.last_error:
                    log.warning("full-text reader %s: %s", self.path, message)
                self.last_error = message
                return False

    def reload(self) -> None:
        self.refresh()

    def search(self, query: str, limit: int, *, max_id: int | None = None) -> list[tuple[int, float]]:
        index = self.index
        if index is None:
            return []
        return index.search(query, limit, max_id=max_id)

    def doc_count(self) -> int:
        index = self.index
        return 0 if index is None else index.doc_count()

    def close(self) -> None:
        with self._lock:
            if self.index is not None:
                self.index.close()
                self.index = None


class MemoryView:
    """One familiar's memory as the bot reads it.

    Attributes layers use: ``paths``, ``config``, ``embedder``, ``turn_log``,
    ``snapshot`` (a :class:`SnapshotReader`; in a pinned view, one immutable
    :class:`~familiar_pipeline.storage.snapshots.Snapshot` with the same query methods),
    ``fts_turns`` and ``fts_facts`` (:class:`FtsReader`).

    ``turn_log`` defaults to opening ``turns.db`` read-write (creating it), since
    the bot process is its one writer; pass the responder's own to share it.
    """

    def __init__(self, paths: FamiliarPaths, config: FamiliarConfig, *, embedder=None,
                 turn_log: TurnLog | None = None):
        if config.familiar_id != paths.familiar_id:
            raise ValueError(
                f"config is for familiar {config.familiar_id!r} but paths are for {paths.familiar_id!r}"
            )
        self.paths = paths
        self.config = config
        self.embedder = embedder
        self._owns_turn_log = turn_log is None
        self.turn_log = turn_log if turn_log is not None else TurnLog(paths.turns_db)
        self.snapshot: Any = SnapshotReader(paths.serving_dir)
        self.fts_turns = FtsReader(paths.fts_turns)
        self.fts_facts = FtsReader(paths.fts_facts)
        # Shared by pinned copies: derived values keyed by everything they depend on.
        # LRU caches; cachetools' are not thread-safe, so _memo_lock guards all three.
        self._memo: LRUCache = LRUCache(_MEMO_SIZE)
        self._memo_lock = threading.Lock()
        self._windows: LRUCache = LRUCache(_MEMO_SIZE)  # (channel, size) -> (token, turns)
        self._bulk: LRUCache = LRUCache(_BULK_SIZE)
        self._warned: set[str] = set()
        self._pin: dict | None = None  # per-assembly values, only in pinned views
        # One worker for the cue's model call (``prefetch_cue_vector``), shared by pinned
        # copies; its thread starts at the first prefetch and ends in ``close()``.
        self._cue_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="familiar-cue")
        # Names people are known by (retrieval's people in the cue): built up as turns arrive.
        self._names: dict = {"turn_id": 0, "profiles_at": None, "names": set(), "directory": Directory.build(())}
        # Turn ids said in each set of visible scopes, grown as turns arrive (``scope_turn_ids``).
        self._scope_ids: dict[tuple[str, ...], tuple[int, np.ndarray]] = {}

    def refresh(self) -> None:
        """Pick up a new snapshot or index commit; never raises."""
        for part in (self.snapshot, self.fts_turns, self.fts_facts):
            try:
                part.refresh()
            except Exception:  # the readers already swallow; this is belt and braces
                log.exception("refreshing %r failed; keeping the previous view", part)

    def pinned(self) -> "MemoryView":
        """A shallow copy whose ``snapshot`` is the current immutable one, so every
        layer of one assembly reads the same published state."""
        view = copy.copy(self)
        current = getattr(self.snapshot, "current", None)
        if current is not None:
            view.snapshot = current()
        view._pin = {}
        return view

    def per_assembly(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per pinned view (one assembly); every call when not pinned."""
        if self._pin is None:
            return compute()
        if key not in self._pin:
            self._pin[key] = compute()
        return self._pin[key]

    def labels(self, guild_id: int | None):
        """Speaker-name resolution shared by every layer of one assembly."""
        return self.per_assembly(("labels", guild_id), lambda: Labels(self, guild_id))

    # -- memo shared across assemblies and threads ---------------------------

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per ``key`` (keys must name every input), bounded LRU."""
        with self._memo_lock:
            if key in self._memo:
                return self._memo[key]
        value = compute()
        with self._memo_lock:
            self._memo[key] = value
        return value

    def _cue_key(self, cue: str) -> tuple:
        return ("cue-vec", self.embedder.name, content_hash(cue))

    def _embed_cue(self, cue: str) -> np.ndarray:
        return self.embedder.embed([cue])[0]

    def prefetch_cue_vector(self, cue: str) -> None:
        """Start the model call for ``cue`` on the view's worker thread; ``cue_vector`` joins it.

        The model's run (onnxruntime, which releases the GIL) then overlaps the layers
        and searches that do not need the vector (docs/benchmarks.md). An error is kept
        in the future and raised by ``cue_vector``, as if the call had run there; a
        prefetched vector nobody asks for costs only the background call.
        """
        if self.embedder is None or not cue:
            return
        key = self._cue_key(cue)
        with self._memo_lock:
            if key in self._memo:
                return
            try:
                self._memo[key] = self._cue_worker.submit(self._embed_cue, cue)
            except RuntimeError:  # closed: cue_vector embeds on the calling thread
                pass

    def cue_vector(self, cue: str) -> np.ndarray:
        """The embedder's vector of ``cue``: one model call per cue, however many retrievers ask it."""
        key = self._cue_key(cue)
        with self._memo_lock:
            value = self._memo.get(key)
        if value is None:
            return self.memo(key, lambda: self._embed_cue(cue))
        if not isinstance(value, Future):
            return value
        try:
            vector = value.result()
        except BaseException:
            with self._memo_lock:  # a failed call is not remembered: the next ask tries again
                if self._memo.get(key) is value:
                    del self._memo[key]
            raise
        with self._memo_lock:
            if self._memo.get(key) is value:
                self._memo[key] = vector
        return vector

    def memo_get(self, key: Hashable) -> Any:
        with self._memo_lock:
            return self._bulk.get(key)

    def memo_put(self, key: Hashable, value: Any, *, bulk: bool = True) -> None:
        """Store in the large LRU meant for many small per-item values (rendered messages)."""
        with self._memo_lock:
            self._bulk[key] = value

    def warn_once(self, tag: str, message: str, *args: Any) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning(message, *args)

    # -- the turn log --------------------------------------------------------

    def people_directory(self) -> Directory:
        """Every name each participant is known by (:meth:`TurnLog.names_known`), kept up to date.

        Display names are read incrementally (only turns newer than the last read);
        profile names and nicknames are re-read every ``PROFILE_NAMES_EVERY_S``. The
        directory is rebuilt only when a name was added, so a reply usually costs two
        small queries. Read once per assembly.
        """
        return self.per_assembly(("people",), self._update_people)

    def _update_people(self) -> Directory:
        state = self._names
        with self._memo_lock:
            after, read_at = state["turn_id"], state["profiles_at"]
        now = time.monotonic()
        profiles = read_at is None or now - read_at >= PROFILE_NAMES_EVERY_S
        latest, names = self.turn_log.names_known(after, profiles=profiles)
        with self._memo_lock:
            if profiles:
                state["profiles_at"] = now
            state["turn_id"] = max(state["turn_id"], latest)
            # Names only accumulate: a name someone had is still how others may ask about them.
            new = set(names) - state["names"]
            if new:
                state["names"] |= new
                state["directory"] = Directory.build(state["names"])
            return state["directory"]

    def scope_turn_ids(self, visible: tuple[str, ...]) -> np.ndarray:
        """Sorted ids of the turns said in the ``visible`` scopes (tombstones included).

        A turn's scope follows from the turn alone and never changes, so the array is
        kept per visible-scope set and grown by the turns newer than its last read:
        one indexed range query per assembly. Retrieval filters candidates with it
        before reading any row, so turns of other scopes never crowd a small scope out.
        """
        return self.per_assembly(("scope-ids", visible), lambda: self._grow_scope_ids(visible))

    def _grow_scope_ids(self, visible: tuple[str, ...]) -> np.ndarray:
        with self._memo_lock:
            upto, ids = self._scope_ids.get(visible, (0, np.zeros(0, dtype=np.int64)))
        latest = self.turn_log.latest_id()
        if latest <= upto:
            return ids
        found = self.turn_log.ids_in_scopes(visible, after_id=upto, upto_id=latest)
        if found:
            ids = np.concatenate([ids, np.fromiter(found, dtype=np.int64, count=len(found))])
        with self._memo_lock:
            known = self._scope_ids.get(visible)
            if known is None or known[0] < latest:
                self._scope_ids[visible] = (latest, ids)
        return ids

    def window_token(self, channel_id: int) -> tuple[int, int]:
        """Changes whenever the channel's recent window could: a new turn, an edit or a delete.

        Read once per assembly, so every layer of one prompt sees the same window."""
        return self.per_assembly(("token", channel_id), lambda: (
            self.turn_log.latest_id(channel_id), self.turn_log.latest_change_seq()))

    def channel_window(self, channel_id: int, size: int) -> tuple[Turn, ...]:
        """The channel's last ``size`` live turns, oldest first.

        Kept per channel and slid forward: when only new turns arrived since the
        last read (no edit or delete: the change seq is unchanged), just those
        are fetched instead of the whole window.
        """
        token = self.window_token(channel_id)
        key = (channel_id, size)
        with self._memo_lock:
            prev = self._windows.get(key)
        if prev is not None and prev[0] == token:
            return prev[1]
        turns = None
        if prev is not None and prev[0][1] == token[1] and token[0] > prev[0][0]:
            seen = max([prev[0][0]] + [t.id for t in prev[1][-1:]])
            batch = _SLIDE_BATCH
            newer = self.turn_log.turns_after(seen, limit=batch, include_deleted=False)
            if len(newer) < batch:  # complete: everything after `seen` is in hand
                fresh = tuple(t for t in newer if t.channel_id == channel_id and t.id <= token[0])
                turns = (prev[1] + fresh)[-size:]
        if turns is None:
            turns = tuple(self.turn_log.recent(channel_id, size))
        with self._memo_lock:
            self._windows[key] = (token, turns)
        return turns

    def close(self) -> None:
        self._cue_worker.shutdown(wait=True, cancel_futures=True)
        self.fts_turns.close()
        self.fts_facts.close()
        if self._owns_turn_log:
            self.turn_log.close()
