"""Where extraction batches end: a pure function of the turn log (and, for the newest turns, of how long it has been quiet).

A batch is a run of consecutive turns by id that ends at `batch_size` turns, or
early at a quiet gap: before a turn that came `quiet_s` or more after the one
before it, or, for the newest turns, once the log has been quiet that long (see
`close_batch`). Where a batch ends is computed from the turns' own timestamps, so an
incremental build and a rebuild from scratch cut the same batches, and a familiar
that goes quiet still gets its last messages extracted. The dossiers step through
the same batches afterwards (`processed_batch`); the sensor asks `batch_closed`.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from familiar_pipeline.storage.turns import Turn, TurnLog

if TYPE_CHECKING:
    from .spec import RichNoteConfig

# A trailing batch closes for quiet only this much after `quiet_s`: a turn appended after
# the cut may carry a timestamp up to this much older than its append (Discord stamps a
# message when its server receives it), and it must still be `quiet_s` after the batch's
# last turn for a rebuild to cut at the same place.
CLOCK_SLACK_S = 2.0


def close_batch(turns: Sequence[Turn], *, batch_size: int, quiet_s: float, quiet_for_s: float) -> list[Turn]:
    """The closed batch at the head of `turns` (the turns after the watermark, oldest first), or [].

    A batch ends at `batch_size` turns, or before the first turn that came `quiet_s` or
    more after the turn before it. If neither happens within the turns there are, they
    are the newest in the log, and they close only when the log has been quiet for
    `quiet_s` (+ CLOCK_SLACK_S) seconds (`quiet_for_s`). That last rule reads the clock,
    yet a rebuild cuts the same batches: a turn appended after such a cut is stamped
    later than the cut, so the gap rule ends the batch before it. `quiet_s` 0 turns the
    quiet rules off.
    """
    head = list(turns[:batch_size])
    if quiet_s > 0:
        for i in range(1, len(head)):
            if (head[i].created_at - head[i - 1].created_at).total_seconds() >= quiet_s:
                return head[:i]
    if len(head) >= batch_size:
        return head
    if head and quiet_s > 0 and quiet_for_s >= quiet_s + CLOCK_SLACK_S:
        return head
    return []


def log_written_at(turns_db: Path) -> datetime:
    """When the turn log file (or its write-ahead log) was last written, as aware UTC.

    An import appends turns stamped long ago; the log's own write time keeps its
    newest turns from looking quiet while the import is still going.
    """
    times = [0.0]
    for path in (turns_db, turns_db.with_name(turns_db.name + "-wal")):
        try:
            times.append(os.stat(path).st_mtime)
        except OSError:
            pass
    return datetime.fromtimestamp(max(times), timezone.utc)


def next_batch(turn_log: TurnLog, after_id: int, batch_size: int, quiet_s: float = 0, *,
               now: datetime | None = None) -> list[Turn]:
    """The next closed batch after the watermark (see `close_batch`), or [] while it is still open."""
    # The clock is read before the turns, so a turn the read misses is stamped after `now`.
    now = now or datetime.now(timezone.utc)
    turns = turn_log.turns_after(after_id, limit=batch_size)
    quiet_for = 0.0
    if turns and len(turns) < batch_size and quiet_s > 0:
        last_write = max(turns[-1].created_at, log_written_at(Path(turn_log.path)))
        quiet_for = (now - last_write).total_seconds()
    return close_batch(turns, batch_size=batch_size, quiet_s=quiet_s, quiet_for_s=quiet_for)


def processed_batch(turn_log: TurnLog, after_id: int, upto_id: int, knobs: RichNoteConfig) -> list[Turn]:
    """The batch after `after_id` as the extractor cut it, if it ends at or before its watermark `upto_id`; else [].

    For projectors that step through the extraction batches afterwards (dossiers): the
    watermark always sits on a batch end, so turns up to it that are neither a full
    batch nor cut by a gap end there for quiet.
    """
    head = [t for t in turn_log.turns_after(after_id, limit=knobs.batch_size) if t.id <= upto_id]
    return close_batch(head, batch_size=knobs.batch_size, quiet_s=knobs.quiet_s, quiet_for_s=float("inf"))


def batch_closed(turn_log: TurnLog, knobs: RichNoteConfig, after_id: int, now: datetime) -> bool:
    """For the sensor: a batch shorter than `batch_size` is closed (at a quiet gap) and due."""
    return bool(next_batch(turn_log, after_id, knobs.batch_size, knobs.quiet_s, now=now))
