"""The responder's turn-log writes: applied at once, or kept in order in the spool while the log cannot take them.

A turn log that cannot take a write (disk full, I/O error) raises ``TurnLogUnavailable``;
the write is then kept in the responder's :class:`~familiar_bot.responder.spool.Spool` and the
caller gets :class:`Deferred`, with the notice for the channel (kept, or refused because the
spool is full). While anything waits, every new write waits behind it, so the log gets every
write in order; a retry loop drains the spool with backoff from the running event loop, and
at exit what still waits is written out for ``familiar import``.

Apart from the reply flow (:mod:`~familiar_bot.responder.flow`) because every write of the
responder goes through it (messages, replies, edits, deletions, profiles) and an erasure
waits for what it holds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLogUnavailable

from familiar_bot.responder.notices import refused_notice, spooled_notice
from familiar_bot.responder.spool import Spool, SpooledWrite, retry_delays

if TYPE_CHECKING:
    from familiar_bot.responder.flow import ResponderStats

log = logging.getLogger(__name__)


class Deferred(Exception):
    """A write went to the spool (`kept`) or was refused because the spool is full."""

    def __init__(self, kept: bool, notice: str):
        super().__init__(notice)
        self.kept, self.notice = kept, notice


class TurnWrites:
    """One responder's write path (used from one event loop); counts into the responder's ``stats``."""

    def __init__(self, paths: FamiliarPaths, stats: "ResponderStats") -> None:
        self.paths = paths
        self.stats = stats
        self.spool = Spool()
        self._drain_task: asyncio.Task | None = None

    @property
    def familiar_id(self) -> str:
        return self.paths.familiar_id

    def write(self, what: str, apply, *, size: int, export: dict | None = None):
        """Apply a turn-log write now, or keep it in the spool (raises `Deferred`) while the log cannot take it.

        While earlier writes wait, this one waits behind them, so the log gets every write in order.
        """
        if len(self.spool) and not self.spool.flush():
            return self._defer(SpooledWrite(what, apply, size, export), self.spool.last_error)
        try:
            return apply()
        except TurnLogUnavailable as exc:
            return self._defer(SpooledWrite(what, apply, size, export), str(exc))

    def _defer(self, write: SpooledWrite, why: str | None):
        if not self.spool.add(write):
            self.stats.refused += 1
            log.error("familiar %s: %s REFUSED: the turn log cannot take writes (%s) and the spool is full "
                      "(%d writes waiting)", self.familiar_id, write.what, why, len(self.spool))
            raise Deferred(False, refused_notice(len(self.spool)))
        self.stats.spooled += 1
        log.warning("familiar %s: %s kept in the spool (%d waiting): %s", self.familiar_id, write.what,
                    len(self.spool), why)
        self._keep_draining()
        raise Deferred(True, spooled_notice(len(self.spool)))

    def _keep_draining(self) -> None:
        """Retry the spool with backoff until it is empty (from the running event loop, if any)."""
        if self._drain_task is not None and not self._drain_task.done():
            return
        try:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())
        except RuntimeError:  # no loop (a synchronous caller): the next write flushes it
            self._drain_task = None

    async def _drain(self) -> None:
        for delay in retry_delays():
            await asyncio.sleep(delay)
            if self.flush():
                return

    def flush(self) -> bool:
        """Store what the spool holds, in order; True when nothing is left waiting."""
        if not len(self.spool):
            return True
        before = self.spool.stored
        done = self.spool.flush()
        if self.spool.stored > before:
            log.warning("familiar %s: the turn log takes writes again: %d kept write(s) stored, %d waiting",
                        self.familiar_id, self.spool.stored - before, len(self.spool))
        return done

    def close(self) -> None:
        """At exit: a last flush, then what still waits is written out for `familiar import`, loudly."""
        if self._drain_task is not None:
            self._drain_task.cancel()
        if self.flush():
            return
        waiting = len(self.spool)
        dumped = self.spool.dump(self.paths.dir)
        log.error("familiar %s: %d write(s) could not be stored before exit%s", self.familiar_id, waiting,
                  f"; their messages are in {dumped}: `familiar import --familiar {self.familiar_id} {dumped}` "
                  "stores them" if dumped else "")
