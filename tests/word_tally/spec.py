"""The word tally's spec: its knobs, its asset, its table."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.engine.spec import TURNS, ProjectorSpec, knob

from .run import PROJECTOR, run
from .tables import WORD_TALLIES


@dataclass(frozen=True)
class WordTallyConfig:
    """[providers.memory.word_tally]"""

    batch_size: int = knob(5, minimum=1)  # turns per batch
    min_words: int = knob(1, minimum=1)  # a speaker's tally is kept from this many words in the batch


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="word_tallies",
    run=run,
    description="Words said per speaker per batch of `batch_size` turns (an example plugin projector with a table).",
    group="plugins",
    kinds={"duckdb"},
    trigger=TURNS,
    batch_knob="batch_size",
    needs_llm=False,
    knobs=WordTallyConfig,
    tables=(WORD_TALLIES,),
)
