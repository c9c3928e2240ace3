"""Knobs: dataclass fields whose metadata says which values are valid.

Every config section (`schema`) and every projector's knob dataclass declares its
fields with :func:`knob`; `validation` derives the pydantic schema from that metadata,
so each rule is written once. It lives at the bottom of the config package because
projectors declare knobs and config validates them: projectors import this module,
config never imports a projector (it finds their knob tables in its `catalogue`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


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
