"""Which turns' text is due to go: what the purge takes and the turn sensor asks a run for; and which
projections have yet to follow the turn log's changes, which the purge waits for and the sensor runs.

It reads the turn log and the specs it is handed, and imports neither the engine nor a projector:
the engine's schedule and run loop call it, so it sits below them.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Iterable, Iterator

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.storage.turns import TurnChange, TurnLog

if TYPE_CHECKING:
    from familiar_pipeline.engine.spec import ProjectorSpec


def due_turns(turn_log: TurnLog, config: FamiliarConfig, now: datetime | None = None) -> list[int]:
    """Turns whose text is due to go: those of pending erasures (and the familiar's replies to them),
    messages deleted longer ago than `deleted_retention_hours`, and (setting "opt_out") what forgotten
    people said since, and the familiar's replies to it, as old."""
    privacy = config.memory.privacy
    before = (now or datetime.now(timezone.utc)) - timedelta(hours=privacy.deleted_retention_hours)
    ids = set(turn_log.unpurged_deleted(deleted_before=before))
    if privacy.after_forget == "opt_out":
        ids |= set(turn_log.said_after_forgotten(created_before=before))
    return sorted(ids)


def due_prior_texts(turn_log: TurnLog, config: FamiliarConfig, now: datetime | None = None,
                    limit: int | None = None) -> list[TurnChange]:
    """Edits whose earlier text is due to go: edited longer ago than `edited_retention_hours`, and the
    redactions of pending erasures (their earlier text holds the erased words)."""
    before = (now or datetime.now(timezone.utc)) - timedelta(hours=config.memory.privacy.edited_retention_hours)
    return turn_log.prior_texts_due(edited_before=before, limit=limit)


def purge_due(turn_log: TurnLog, config: FamiliarConfig, now: datetime | None = None) -> bool:
    """Whether a run has something to purge (the turn sensor asks, so the purge needs no new turn)."""
    return (bool(turn_log.erasures(pending_only=True)) or bool(due_turns(turn_log, config, now))
            or bool(due_prior_texts(turn_log, config, now, limit=1)))


def changed_read(specs: Iterable[ProjectorSpec], turn_log: TurnLog, marks: dict, latest_change: int) -> Iterator[str]:
    """Of `specs`, the projectors that follow changes (`spec.follows_turn_changes`) with an edit or
    deletion, past their `change_seq`, of a turn they have already read. One that only touched turns
    not read yet waits: the batch that reads them reads them as they are now."""
    for spec in specs:
        if not spec.follows_turn_changes:
            continue
        mark = marks.get(spec.name, {})
        seq, upto = int(mark.get("change_seq", 0)), int(mark.get("turn_id", 0))
        if latest_change > seq:
            first = turn_log.first_changed_turn(seq)
            if first is not None and first <= upto:
                yield spec.name
