"""What one projection run did, in a shape Dagster metadata can show."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProjectionReport:
    """Counts and watermarks of one materialization.

    `status` is one of: "ok" (something was processed), "no-op" (nothing new),
    "disabled" (not in [providers.memory].projectors), "skipped" (e.g. no LLM
    configured; `reason` says which setting to change).
    """

    projector: str
    status: str = "ok"
    reason: str = ""
    turns_read: int = 0
    batches: int = 0
    rows_written: int = 0
    rows_suppressed: int = 0
    dropped: Counter = field(default_factory=Counter)
    watermark_before: dict[str, int] = field(default_factory=dict)
    watermark_after: dict[str, int] = field(default_factory=dict)
    preview: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.perf_counter)
    llm_seconds: float = 0.0

    def no_op(self, reason: str) -> None:
        """Nothing new to process: say why (the run's summary line and metadata show it)."""
        self.status, self.reason = "no-op", reason

    def drop(self, reason: str, n: int = 1) -> None:
        if n:
            self.dropped[reason] += n

    @property
    def duration_s(self) -> float:
        return time.perf_counter() - self.started_at

    def summary_line(self) -> str:
        if self.status != "ok":
            return f"{self.projector}: {self.status}" + (f" ({self.reason})" if self.reason else "")
        return (
            f"{self.projector}: read {self.turns_read} turns in {self.batches} batch(es), wrote "
            f"{self.rows_written}, suppressed {self.rows_suppressed}, dropped {sum(self.dropped.values())}"
        )
