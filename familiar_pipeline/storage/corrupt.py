"""A corrupt memory.duckdb: recognised, moved aside, and rebuilt from the turn log.

`memory.duckdb` holds only what the projectors derived from `turns.db` (the LLM cache
keeps the model's replies, so re-deriving costs no model call for an unchanged
prompt), so a store DuckDB cannot read is never patched: the run that finds it
(at open, or when a query meets a bad block) moves it aside with its WAL as
``memory.duckdb.corrupt-<UTC time>``, removes the full-text indexes built beside it
(their watermarks were in that store), writes the rebuild marker and logs one
warning line. The next store it opens is empty. While the marker is there:

* the turn sensor asks for every active projection of the familiar
  (`engine.schedule.due_assets`), and again with backoff if a run fails;
* runs publish no snapshot until the new store has caught up with the last
  published one (`caught_up`): the bot keeps serving that one, the last good;
* the run that catches up publishes and removes the marker (one info line).

The moved-aside file is left for the operator to inspect; it holds what the old
store held (message text included), so the ``memory_store_intact`` check warns in
the UI for as long as one is there (`moved_aside`), and erasing a person or a
message must reach it too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping

import duckdb

from familiar_pipeline.storage.paths import FamiliarPaths

log = logging.getLogger(__name__)

CORRUPT_INFIX = ".corrupt-"
MARKER_NAME = "memory.rebuild.json"

# What DuckDB says of a file it cannot read (measured with DuckDB 1.x: a garbage header, a file
# cut short, a bad block). Not a full disk, a held lock or a missing file: those pass.
_CORRUPTION = re.compile(
    r"not a valid DuckDB database file|Corrupt database file|does not match stored checksum"
    r"|Could not read enough bytes from file",
    re.IGNORECASE,
)


def is_corruption(exc: BaseException) -> bool:
    """Whether `exc` is DuckDB saying the store file itself is unreadable."""
    return isinstance(exc, duckdb.Error) and _CORRUPTION.search(str(exc)) is not None


def marker_path(paths: FamiliarPaths) -> Path:
    return paths.dir / MARKER_NAME


def moved_aside(paths: FamiliarPaths) -> list[Path]:
    """The familiar's moved-aside stores, oldest first (their WAL files not listed)."""
    if not paths.dir.is_dir():
        return []
    prefix = paths.memory_db.name + CORRUPT_INFIX
    return sorted(p for p in paths.dir.iterdir() if p.name.startswith(prefix) and not p.name.endswith(".wal"))


def move_aside(paths: FamiliarPaths, exc: BaseException) -> Path:
    """Move the corrupt store (and its WAL) aside, drop the indexes built with it, mark the rebuild."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = paths.memory_db.with_name(paths.memory_db.name + CORRUPT_INFIX + stamp)
    os.replace(paths.memory_db, target)
    wal = paths.memory_db.with_name(paths.memory_db.name + ".wal")
    if wal.exists():
        os.replace(wal, target.with_name(target.name + ".wal"))
    shutil.rmtree(paths.fts_dir, ignore_errors=True)
    reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    marker = {"moved_to": target.name, "reason": reason, "at": datetime.now(timezone.utc).isoformat()}
    temp = marker_path(paths).with_suffix(".tmp")
    temp.write_text(json.dumps(marker), encoding="utf-8")
    os.replace(temp, marker_path(paths))
    log.warning("memory.duckdb of familiar %r is corrupt (%s): moved aside to %s; rebuilding it from turns.db, "
                "serving the last published snapshot meanwhile", paths.familiar_id, reason, target)
    return target


def rebuilding(paths: FamiliarPaths) -> dict | None:
    """The rebuild marker's content while a rebuild is under way (None: none is)."""
    try:
        raw = marker_path(paths).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {"reason": "unreadable rebuild marker"}


def caught_up(store_marks: Mapping[str, Mapping], published_marks: Mapping[str, Mapping], active: Iterable[str]) -> bool:
    """Whether the rebuilt store has read, for each active projector, as far into the turn log as the
    last published snapshot had (its turn watermarks; fact ids are new in a rebuilt store)."""
    return all(int((store_marks.get(name) or {}).get("turn_id") or 0) >= int((published_marks.get(name) or {}).get("turn_id") or 0)
               for name in active)


def rebuilt(paths: FamiliarPaths) -> None:
    """The rebuild caught up and was published: the marker goes."""
    try:
        marker_path(paths).unlink()
    except FileNotFoundError:
        return
    log.info("memory.duckdb of familiar %r is rebuilt from turns.db and published", paths.familiar_id)
