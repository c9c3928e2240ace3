"""Which turns' text is due to go: what the purge takes and the turn sensor asks a run for."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.storage.turns import TurnChange, TurnLog


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
