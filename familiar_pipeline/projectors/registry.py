"""The projector registry: which memory projections exist, by name.

`[providers.memory].projectors` in character.toml names projectors; config
loading checks those names against this registry so a typo fails at load time
with the valid names listed, instead of silently projecting nothing. A
projector's `factory` is the Dagster asset (or asset factory) it contributes to
the Definitions; it is wired in later, so here it is any callable or None.

A third-party projector calls `register_projector` at import time. Its name then
becomes valid in `projectors`, and a `[providers.memory.<name>]` table of its own
knobs is accepted (passed through untyped, see `MemoryConfig.extra_knobs`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

# Names become TOML table names, Dagster asset names and log labels, so keep
# them to one lowercase identifier.
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class UnknownProjectorError(LookupError):
    """Raised for a projector name that nobody registered."""


@dataclass(frozen=True)
class ProjectorSpec:
    name: str
    factory: Callable[..., Any] | None = None
    description: str = ""
    needs_llm: bool = True


_PROJECTORS: dict[str, ProjectorSpec] = {}


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"invalid projector name {name!r}: use a lowercase identifier "
            "(a-z, 0-9, '_', starting with a letter)"
        )
    return name


def register_projector(
    name: str,
    factory: Callable[..., Any] | None = None,
    *,
    description: str = "",
    needs_llm: bool = True,
) -> ProjectorSpec:
    """Register (or replace) a projector under `name`; returns its spec."""
    _check_name(name)
    if factory is not None and not callable(factory):
        raise TypeError(f"projector {name!r}: factory must be callable or None")
    spec = ProjectorSpec(name=name, factory=factory, description=description, needs_llm=needs_llm)
    _PROJECTORS[name] = spec
    return spec


def known_projectors() -> tuple[str, ...]:
    return tuple(sorted(_PROJECTORS))


def get_projector(name: str) -> ProjectorSpec:
    try:
        return _PROJECTORS[name]
    except (KeyError, TypeError):
        raise UnknownProjectorError(
            f"unknown memory projector {name!r}; valid: {', '.join(known_projectors())}"
        ) from None


# The default active set, in the order the reference ran them.
DEFAULT_PROJECTORS: tuple[str, ...] = (
    "rolling_summary",
    "rich_note",
    "fact_supersede",
    "people_dossier",
    "reflection",
)

register_projector(
    "rolling_summary",
    description="one compounding summary of the turns the familiar attended to",
)
register_projector(
    "rich_note",
    description="atomic, attributed facts extracted from fixed-size batches of turns",
)
register_projector(
    "fact_supersede",
    description="retires facts that newer facts about the same subject make outdated",
)
register_projector(
    "people_dossier",
    description="one incrementally rebuilt dossier per person (and the familiar itself)",
)
register_projector(
    "reflection",
    description="higher-order syntheses over recent turns and facts, with citations",
)
register_projector(
    "fact_embedding",
    description="opt-in: a vector per current fact for the active embedding model",
    needs_llm=False,
)

register_projector(
    "turn_embedding",
    description="opt-in: a vector per live turn for the active embedding model (hybrid turn retrieval)",
    needs_llm=False,
)

BUILTIN_PROJECTORS: tuple[str, ...] = DEFAULT_PROJECTORS + ("fact_embedding", "turn_embedding")
