"""What config validates against that other layers define: projectors (names, knob tables) and embedding backends.

Config sits at the bottom of the pipeline's imports: it never imports a projector or a
model. Those register here instead, from above:

* `engine.registry.register_projector` records each projector's name, its knob
  dataclass and whether `[providers.memory].projectors` may list it;
* `models.embedders.register_embedder` adds a backend to the built-in ones below.

A process that loads a config before anything registered (a notebook, the bot) gets
the built-in projectors through the ``familiar.projectors`` entry points of the
installed package (pyproject.toml), the standard way a lower layer discovers what is
installed above it; a plugin package may declare its own there as well.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from importlib.metadata import entry_points
from typing import Any

ENTRY_POINT_GROUP = "familiar.projectors"

# The embedding backends models.embedders implements (it checks it implements exactly these).
BUILTIN_EMBEDDING_BACKENDS = ("fastembed", "hash", "off")


@dataclass(frozen=True)
class ProjectorEntry:
    name: str
    knobs: type
    selectable: bool  # may be listed in [providers.memory].projectors (always-on ones are not)
    needs_embedder: bool = False

    @property
    def has_knobs(self) -> bool:
        return bool(fields(self.knobs))


_lock = threading.RLock()
_projectors: dict[str, ProjectorEntry] = {}
_backends: set[str] = set(BUILTIN_EMBEDDING_BACKENDS)
_discovered = False


def register_projector(name: str, knobs: type, *, selectable: bool = True, needs_embedder: bool = False) -> None:
    """Record (or replace) a projector config must know about."""
    with _lock:
        _projectors[name] = ProjectorEntry(name, knobs, selectable, needs_embedder)


def unregister_projector(name: str) -> None:
    with _lock:
        _projectors.pop(name, None)


def register_embedding_backend(name: str) -> None:
    with _lock:
        _backends.add(name)


def unregister_embedding_backend(name: str) -> None:
    with _lock:
        if name not in BUILTIN_EMBEDDING_BACKENDS:
            _backends.discard(name)


def discover() -> None:
    """Load the installed projector entry points once (each registers what it provides), the
    built-ins first. The engine's registry asks too: it sits below the projectors as well."""
    global _discovered
    with _lock:
        if _discovered:
            return
        _discovered = True
        for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name != "builtin"):
            point.load()


def projectors() -> dict[str, ProjectorEntry]:
    """Every registered projector, in registration order."""
    discover()
    with _lock:
        return dict(_projectors)


def selectable_projectors() -> tuple[str, ...]:
    """The names valid in `[providers.memory].projectors`, sorted."""
    return tuple(sorted(name for name, entry in projectors().items() if entry.selectable))


def knob_class(name: str) -> type | None:
    """The knob dataclass of projector `name`, None when it has none; ValueError when unknown."""
    entry = projectors().get(name)
    if entry is None:
        raise ValueError(f"unknown memory projector {name!r}; valid: {', '.join(selectable_projectors())}")
    return entry.knobs if entry.has_knobs else None


def default_knobs() -> dict[str, Any]:
    """Each projector's knob dataclass with its defaults, for projectors that have knobs."""
    return {name: entry.knobs() for name, entry in projectors().items() if entry.has_knobs}


def embedding_backends() -> tuple[str, ...]:
    """Every valid `[providers.embedding].backend`, sorted, ``off`` included."""
    with _lock:
        return tuple(sorted(_backends))
