"""An example third-party projector, loaded through FAMILIAR_PLUGINS: words said per speaker.

It registers exactly as the built-ins do: one `ProjectorSpec` with its knobs, its
`run` function and its drop rule; the code location builds its asset with the same
shell as every built-in projector.
"""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.projectors.registry import register_projector
from familiar_pipeline.projectors.spec import DropRule, ProjectorSpec, knob


@dataclass(frozen=True)
class SpeakerWordsConfig:
    """[providers.memory.speaker_words]"""

    min_words: int = knob(1, minimum=1)


def run(rt, report, *, rebuild: bool = False) -> None:
    counts: dict[str, int] = {}
    for turn in rt.turn_log().turns_after(0):
        report.turns_read += 1
        counts[turn.label] = counts.get(turn.label, 0) + len(turn.content.split())
    minimum = rt.config.memory.speaker_words.min_words
    report.extra["counts"] = {who: n for who, n in counts.items() if n >= minimum}


SPEC = register_projector(ProjectorSpec(
    name="speaker_words",
    run=run,
    description="Words said per speaker (an example third-party projector).",
    group="plugins",
    kinds={"python"},
    needs_llm=False,
    knobs=SpeakerWordsConfig,
    drop=DropRule(),  # it keeps no rows: only its watermark
))
