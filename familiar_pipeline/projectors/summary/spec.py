"""The rolling summary's spec: its knobs, its asset and its table."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import TURNS, ProjectorSpec, knob

from .tables import SUMMARIES

PROJECTOR = "rolling_summary"  # the projector's name: in [providers.memory].projectors, its knob table, its watermark row


@dataclass(frozen=True)
class RollingSummaryConfig:
    """[providers.memory.rolling_summary]"""

    # 20: one summary per two of the old 10-turn windows halves its calls (10 -> 5 per 100 turns).
    turns_threshold: int = knob(20, minimum=1)
    backfill_cap: int = knob(200, minimum=1)
    # An edited or deleted turn this many of its scope's windows back or fewer is folded out
    # exactly (the summary folded again from the first window: the cached windows are free,
    # one call per window from the changed one on); an older one costs one redaction call.
    refold_windows_max: int = knob(8, minimum=0)


SPEC = ProjectorSpec(
    name=PROJECTOR,
    run="familiar_pipeline.projectors.summary.run:run",
    description="""The compounding summary of the conversation: the prior summary with each window of `turns_threshold` new turns folded in.

    Shown to the model as "Conversation so far". An empty model reply keeps the old summary and watermark.
    """,
    group="synthesis",
    kinds={"duckdb", "llm"},
    trigger=TURNS,
    follows_changes=True,
    batch_knob="turns_threshold",
    knobs=RollingSummaryConfig,
    tables=(SUMMARIES,),
    scripted="familiar_pipeline.projectors.summary.scripted:answer",
)
