"""Writes the turn log could not take yet, kept in order until it can.

When the disk under the turn log is full (or it reports an I/O error, or is locked),
`TurnLog` raises `TurnLogUnavailable` and nothing is written. Dropping the message
would lose it for good, so the responder keeps the write here instead and tells the
channel it did. The spool is:

* **ordered**: while it holds anything, every new write joins the end of it, so the
  log receives messages, edits and deletions in the order they happened, each with
  the time it happened (stamped when it was spooled);
* **bounded**: at most `max_items` writes and `max_bytes` of text, so a disk that
  stays full cannot exhaust the bot's memory; past that a message is refused, loudly
  (a notice in the channel and an error in the log), rather than kept;
* **drained** by `flush`, which the responder calls before every write and a retry
  loop calls with backoff while anything waits, so memory catches up as soon as the
  disk has room, without waiting for someone to speak;
* **kept at exit**: `dump` writes what is still waiting as `familiar import` lines
  (or, when even that cannot be written, prints them on stderr), so a bot stopped
  while the disk is full loses nothing either.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from familiar_pipeline.storage.turns import TurnLogUnavailable

log = logging.getLogger(__name__)

MAX_ITEMS = 1000
MAX_BYTES = 8 * 1024 * 1024
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


@dataclass(frozen=True)
class SpooledWrite:
    """One write the turn log refused for now: what it is, and how to apply it later."""

    what: str  # for logs: "message in channel 1", "edit of message 42", ...
    apply: Callable[[], Any]  # performs the write; raises TurnLogUnavailable while it cannot
    size: int  # bytes of text it holds (counts against max_bytes)
    export: dict | None = None  # the `familiar import` line of a turn, for `dump`


class Spool:
    """A bounded, ordered queue of refused writes (one per responder; used from one event loop)."""

    def __init__(self, *, max_items: int = MAX_ITEMS, max_bytes: int = MAX_BYTES):
        self.max_items, self.max_bytes = max_items, max_bytes
        self._writes: deque[SpooledWrite] = deque()
        self._bytes = 0
        self.stored = 0  # writes applied after waiting here
        self.refused = 0  # writes refused because the spool was full
        self.last_error: str | None = None

    def __len__(self) -> int:
        return len(self._writes)

    def has_room(self, size: int) -> bool:
        return len(self._writes) < self.max_items and self._bytes + size <= self.max_bytes

    def add(self, write: SpooledWrite) -> bool:
        """Keep `write` at the end; False (and nothing kept) when the spool is full."""
        if not self.has_room(write.size):
            self.refused += 1
            return False
        self._writes.append(write)
        self._bytes += write.size
        return True

    def flush(self) -> bool:
        """Apply waiting writes in order until one is refused again; True when none is left.

        A write that now fails for another reason (a `TurnLogError` other than
        unavailability, which a spooled write should not meet) is logged and dropped, so
        one bad write cannot hold every later one back forever.
        """
        while self._writes:
            write = self._writes[0]
            try:
                write.apply()
            except TurnLogUnavailable as exc:
                self.last_error = str(exc)
                return False
            except Exception:  # noqa: BLE001 - see the docstring
                log.exception("a spooled write (%s) failed for good and was dropped", write.what)
            else:
                self.stored += 1
            self._writes.popleft()
            self._bytes -= write.size
        return True

    def dump(self, folder: Path) -> Path | None:
        """Write what still waits as `familiar import` JSON lines into `folder`; None if nothing waits.

        Edits, deletions and profile updates have no import line: they are logged one by one.
        When the file cannot be written (the disk is still full), the lines go to stderr.
        """
        if not self._writes:
            return None
        lines = [json.dumps(w.export, ensure_ascii=False) for w in self._writes if w.export is not None]
        for write in self._writes:
            if write.export is None:
                log.error("not stored (the turn log stayed unavailable): %s", write.what)
        if not lines:
            return None
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = folder / f"spooled-{stamp}.jsonl"
        try:
            target.write_text("\n".join(lines) + "\n", encoding="utf-8")
            return target
        except OSError as exc:
            print(f"error: {len(lines)} message(s) could not be stored ({exc.strerror or exc}); "
                  "their `familiar import` lines follow:", file=sys.stderr)
            for line in lines:
                print(line, file=sys.stderr)
            return None


def retry_delays(first: float = RETRY_FIRST_S, cap: float = RETRY_MAX_S):
    """1 s, 2 s, 4 s, ... up to `cap`: how long the retry loop waits between attempts."""
    delay = first
    while True:
        yield delay
        delay = min(cap, delay * 2)


def import_line(*, speaker: str, text: str, at: datetime, channel: int, user_id: str | None) -> dict:
    """A turn as one `familiar import` line (docs/running.md, "Import a transcript")."""
    line = {"speaker": speaker, "text": text, "timestamp": at.astimezone(timezone.utc).isoformat(), "channel": channel}
    if user_id:
        line["user_id"] = user_id
    return line
