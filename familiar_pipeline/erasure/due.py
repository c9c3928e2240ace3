"""Which turns' text is due to go: what the purge takes and the turn sensor asks a run for."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.storage.turns import TurnLog


def due_turns(turn_log: TurnLog, config: FamiliarConfig, now: datetime | None = None) -> list[int]:
    """Turns whose text is due to go: those of pending erasures, messages deleted longer ago than
    `deleted_retention_hours`, and (setting "opt_out") what forgotten people said since, as old."""
    privacy = config.memory.privacy
    before = (now or datetime.now(timezone.utc)) - timedelta(hours=privacy.deleted_retention_hours)
    ids = set(turn_log.unpurged_deleted(deleted_before=before))
    if privacy.after_forget == "opt_out":
        ids |= set(turn_log.said_after_forgotten(created_before=before))
    return sorted(ids)


def purge_due(turn_log: TurnLog, config: FamiliarConfig, now: datetime | None = None) -> bool:
    """Whether a run has something to purge (the turn sensor asks, so the purge needs no new turn)."""
    return bool(turn_log.erasures(pending_only=True)) or bool(due_turns(turn_log, config, now))
