"""The kernel's own record: a projector's watermark.

Every other record (a fact, a dossier, a reflection, ...) is declared with its table in
its projector's folder (``projectors/<name>/tables.py``), and the store and the
serving snapshot hand out those same records, so the pipeline, the bot and the CLI
never see two shapes of one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Watermark:
    """How far one projector has read; all zeros (and no time) when it never ran."""

    projector: str
    turn_id: int = 0
    fact_id: int = 0
    change_seq: int = 0
    updated_at: datetime | None = None
