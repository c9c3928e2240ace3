"""What a projector declares about itself, once: its `ProjectorSpec`.

Every projector module ends with one ``SPEC``; the registry, the Dagster asset
factory, the turn sensor, backfill, config loading (knob tables) and
`registry.drop_projection` read it from there, so a new projector is its own
module plus one line in `registry.BUILTIN_SPECS` (or one `register_projector`
call from a plugin).

`knob` lives here rather than in `familiar_pipeline.config` because knob
dataclasses live in projector modules and config finds them through the
registry: defining it below both keeps imports pointing one way.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from familiar_pipeline.storage.store import ProjectionStore


def knob(default: Any, *, minimum: float | None = None, maximum: float | None = None,
         above: float | None = None, choices: Any = None, nonempty: bool = False,
         pattern: re.Pattern[str] | None = None, pattern_hint: str = "",
         hide_bad_value: bool = False) -> Any:
    """A dataclass field whose metadata says what values are valid.

    `above` is an exclusive lower bound; `choices` is a tuple or a zero-argument
    callable (for registries that grow at import time); `hide_bad_value` keeps a
    rejected value out of error messages (it may be a pasted secret).
    """
    meta = {"minimum": minimum, "maximum": maximum, "above": above, "choices": choices,
            "nonempty": nonempty, "pattern": pattern, "pattern_hint": pattern_hint,
            "hide_bad_value": hide_bad_value}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class NoKnobs:
    """The knobs of a projector that has none (its `[providers.memory.<name>]` table is not accepted)."""


# When the turn-watermark sensor requests a projector's asset.
TURNS = "turns"  # when `batch_knob` (a knob naming a turn count) new turns wait past its watermark
TURN_INDEX = "turn_index"  # with the turn index: when turns changed and the log is quiet, or anything else is due
FACTS = "facts"  # in the same run as `facts`; automation re-runs it whenever its inputs change
TRIGGERS = (TURNS, TURN_INDEX, FACTS, None)  # None: only on request (UI, backfill, a plugin's own schedule)


@dataclass(frozen=True)
class DropRule:
    """What `drop_projection` deletes so a projection rebuilds from turns.

    `tables` are emptied and `sequences` restarted at 1; the projector's own
    watermark row always goes. `before` runs first, in the same transaction, for
    what is not a whole table. `cascade` also drops, first, every projector that
    reads this one's asset (transitively): nothing built on deleted rows survives.
    """

    tables: tuple[str, ...] = ()
    sequences: tuple[str, ...] = ()
    before: Callable[[ProjectionStore], None] | None = None
    cascade: bool = False


@dataclass(frozen=True)
class ProjectorSpec:
    """One projector, declared once.

    `name` is the projector's name in `[providers.memory].projectors`, its knob
    table and its watermark row; `asset` is its Dagster asset's name (what the UI
    and the CLI show). `run(runtime, report, *, rebuild)` does the work; the asset
    drops the projection first when asked to rebuild. `description`, written like
    a docstring, is the asset's description in the UI. `inputs` are the asset
    names it reads (`turns` or other projectors' assets); they become the asset's
    deps. A plugin with its own Dagster asset passes `factory` (a zero-argument
    callable returning the asset or a list of assets) instead of `run`.
    `batch_closed(turn_log, knobs, after_id, now) -> bool` tells the sensor that a
    batch shorter than `batch_knob` is complete anyway (facts close one at a quiet gap).
    """

    name: str
    asset: str = ""
    run: Callable[..., None] | None = None
    description: str = ""
    group: str = "projections"
    kinds: frozenset[str] = frozenset({"duckdb"})
    inputs: tuple[str, ...] = ("turns",)
    trigger: str | None = None
    batch_knob: str | None = None
    batch_closed: Callable[..., bool] | None = None
    needs_llm: bool = True
    needs_embedder: bool = False
    always_on: bool = False
    knobs: type = NoKnobs
    drop: DropRule = DropRule()
    factory: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if not self.asset:
            object.__setattr__(self, "asset", self.name)
        object.__setattr__(self, "kinds", frozenset(self.kinds))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.trigger not in TRIGGERS:
            raise ValueError(f"projector {self.name!r}: trigger {self.trigger!r} is not one of {TRIGGERS}")
        if self.factory is not None and not callable(self.factory):
            raise TypeError(f"projector {self.name!r}: factory must be callable or None")
        if self.run is not None and not callable(self.run):
            raise TypeError(f"projector {self.name!r}: run must be callable or None")
        if not (isinstance(self.knobs, type) and dataclasses.is_dataclass(self.knobs)):
            raise TypeError(f"projector {self.name!r}: knobs must be a dataclass")
        if self.trigger == TURNS and self.batch_knob not in {f.name for f in dataclasses.fields(self.knobs)}:
            raise ValueError(f"projector {self.name!r}: a turn-triggered projector names its batch_knob")

    @property
    def has_knobs(self) -> bool:
        return bool(dataclasses.fields(self.knobs))
