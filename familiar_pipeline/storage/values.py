"""Input checks for store writes: every value is validated before any SQL runs.

A write that raises here has touched nothing, so bad input (a model's garbage, a
caller's bug) never dooms a surrounding transaction, and the error names the field.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


def as_int(value: Any, what: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def opt_int(value: Any, what: str) -> int | None:
    return None if value is None else as_int(value, what)


def ids(values: Iterable[Any] | None, what: str) -> tuple[int, ...]:
    """Distinct ids in first-seen order."""
    if values is None:
        return ()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a collection of integer ids, got {values!r}")
    return tuple(dict.fromkeys(as_int(v, f"{what} item") for v in values))


def text(value: Any, what: str) -> str:
    """A non-blank string (an empty text never overwrites memory)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{what} is empty")
    return value


def scope(value: Any) -> str:
    """A scope string (see `scopes`): ``kind:id`` or ``familiar``."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise ValueError(f"scope must be a non-blank string without spaces, got {value!r}")
    return value


def vector(model: Any, kind: str, key: int, values: Iterable[float]) -> list[float]:
    """The vector as floats; a one-line error for a bad model name or a non-numeric, empty or non-finite vector."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be a non-empty string, got {model!r}")
    try:
        floats = [float(x) for x in values]
    except (TypeError, ValueError):
        raise TypeError(f"the vector of {kind} {key} is not a sequence of numbers") from None
    if not floats:
        raise ValueError(f"the vector of {kind} {key} is empty")
    if not all(math.isfinite(x) for x in floats):
        raise ValueError(f"embedding of {kind} {key} under {model} holds NaN or infinity")
    return floats
