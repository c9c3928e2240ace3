"""Knobs: dataclass fields whose metadata says which values are valid.

Every config section (`schema`) and every projector's knob dataclass declares its
fields with :func:`knob`; `validation` derives the pydantic schema from that metadata,
so each rule is written once. It lives at the bottom of the config package because
projectors declare knobs and config validates them: projectors import this module,
config never imports a projector (it finds their knob tables in its `catalogue`).
Prompt layers declare their ``[budget.<tier>]`` keys the same way, as `BudgetKnob` declarations
in their ``LayerSpec`` (the bot's), which config learns through `catalogue.register_layer`.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable

_KNOB_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def knob(default: Any = MISSING, *, minimum: float | None = None, maximum: float | None = None,
         above: float | None = None, choices: Any = None, nonempty: bool = False,
         pattern: re.Pattern[str] | None = None, pattern_hint: str = "",
         hide_bad_value: bool = False, default_factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field whose metadata says what values are valid.

    `above` is an exclusive lower bound; `choices` is a tuple or a zero-argument
    callable (for registries that grow at import time); `hide_bad_value` keeps a
    rejected value out of error messages (it may be a pasted secret). `default_factory`
    instead of `default` for a default that is known only once things registered (the
    prompt layers a channel shows).
    """
    meta = {"minimum": minimum, "maximum": maximum, "above": above, "choices": choices,
            "nonempty": nonempty, "pattern": pattern, "pattern_hint": pattern_hint,
            "hide_bad_value": hide_bad_value}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BudgetKnob:
    """One ``[budget.<tier>]`` key a prompt layer reads: a whole number >= `minimum`, with its
    default for each tier (the voice tier's is also `TierBudget()`'s).

    `tokens`: it caps the section's tokens, and counts in `TierBudget.total_tokens`; else it
    caps something else (rows: ``max_rag_facts``). A layer declares its knobs in its
    ``LayerSpec.budget``; config validates, loads and renders them like every other key.
    """

    name: str
    voice: int
    text: int
    background: int
    minimum: int = 1
    tokens: bool = True

    def __post_init__(self) -> None:
        if not _KNOB_NAME.fullmatch(self.name):
            raise ValueError(f"budget knob {self.name!r}: expected a lower-case name such as \"notes_tokens\"")
        for tier in ("voice", "text", "background"):
            value = getattr(self, tier)
            if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
                raise ValueError(f"budget knob {self.name!r}: the {tier} default {value!r} is not an integer "
                                 f">= {self.minimum}")

    def default(self, tier: str) -> int:
        """Its default in budget tier `tier` ("voice", "text" or "background")."""
        return int(getattr(self, tier))


@dataclass(frozen=True)
class NoKnobs:
    """The knobs of a projector that has none (its `[providers.memory.<name>]` table is not accepted)."""
