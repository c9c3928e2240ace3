"""What config validates against that other layers define: projectors (names, knob tables),
prompt layers (names, order, budget keys) and embedding backends.

Config sits at the bottom of the pipeline's imports: it never imports a projector, a
model or the bot. Those register here instead, from above:

* `engine.registry.register_projector` records each projector's name, its knob
  dataclass and whether `[providers.memory].projectors` may list it;
* the bot's `prompt.layers.registry.register_layer` records each prompt layer's name,
  its place in the default stack and its ``[budget.<tier>]`` keys (`register_layer`
  below): what `[channels.<id>].prompt_layers` may list, the default order
  (`layer_names`, once `LAYER_NAMES`) and the fields of `TierBudget`;
* `models.embedders.register_embedder` adds a backend to the built-in ones below.

A process that loads a config before anything registered (a notebook, the bot, a
pipeline run) gets the built-in projectors through the ``familiar.projectors`` entry
points of the installed package (pyproject.toml), and the built-in prompt layers
through the ``familiar.layers`` ones, the standard way a lower layer discovers what is
installed above it; a plugin package may declare its own there as well.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, fields
from importlib.metadata import entry_points
from typing import Any

from familiar_pipeline.config.knobs import BudgetKnob

ENTRY_POINT_GROUP = "familiar.projectors"
LAYER_ENTRY_POINT_GROUP = "familiar.layers"
_LAYER_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

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


@dataclass(frozen=True)
class LayerEntry:
    """What config knows of a prompt layer: its name, its place in the default stack
    (lower first; ties keep registration order) and its ``[budget.<tier>]`` keys."""

    name: str
    position: int
    budget: tuple[BudgetKnob, ...] = ()


_lock = threading.RLock()
_projectors: dict[str, ProjectorEntry] = {}
_backends: set[str] = set(BUILTIN_EMBEDDING_BACKENDS)
_discovered = False
_layers: dict[str, LayerEntry] = {}
_layers_discovered = False
_layer_order: tuple[tuple[LayerEntry, ...], tuple[str, ...]] | None = None  # in stack order, and their names


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


def register_layer(name: str, *, position: int, budget: tuple[BudgetKnob, ...] = ()) -> None:
    """Record (or replace) a prompt layer config must know about: a name `[channels.<id>].prompt_layers`
    may list, its place in the default order, and the `[budget.<tier>]` keys it reads (no two layers
    declare the same key)."""
    global _layer_order
    if not _LAYER_NAME.fullmatch(name):
        raise ValueError(f"prompt layer {name!r}: expected a lower-case name such as \"standing_wishes\"")
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"prompt layer {name!r}: position must be an integer, got {position!r}")
    budget = tuple(budget)
    if not all(isinstance(k, BudgetKnob) for k in budget):
        raise TypeError(f"prompt layer {name!r}: budget must hold BudgetKnob declarations")
    with _lock:
        mine = [k.name for k in budget]
        taken = {k.name: other.name for other in _layers.values() if other.name != name for k in other.budget}
        clash = sorted({k for k in mine if k in taken or mine.count(k) > 1})
        if clash:
            owners = ", ".join(f"{k!r} (declared by {taken.get(k, name)!r})" for k in clash)
            raise ValueError(f"prompt layer {name!r}: budget key {owners} is declared twice")
        _layers[name] = LayerEntry(name, position, budget)
        _layer_order = None


def unregister_layer(name: str) -> None:
    global _layer_order
    with _lock:
        _layers.pop(name, None)
        _layer_order = None


def discover_layers() -> None:
    """Load the installed prompt layer entry points once (each registers what it provides), the
    built-ins first: a config names the layers of the bot, which sits above config."""
    global _layers_discovered
    with _lock:
        if _layers_discovered:
            return
        _layers_discovered = True
        for point in sorted(entry_points(group=LAYER_ENTRY_POINT_GROUP), key=lambda p: p.name != "builtin"):
            point.load()


def layers() -> tuple[LayerEntry, ...]:
    """Every registered prompt layer, in the default stack's order (position, then registration)."""
    return _ordered_layers()[0]


def _ordered_layers() -> tuple[tuple[LayerEntry, ...], tuple[str, ...]]:
    """The layers in stack order and their names, kept until a layer registers or goes (read on
    every reply: without the lock once found)."""
    global _layer_order
    cached = _layer_order
    if cached is not None and _layers_discovered:
        return cached
    discover_layers()
    with _lock:
        if _layer_order is None:
            ranked = tuple(entry for _, entry in sorted(enumerate(_layers.values()),
                                                        key=lambda item: (item[1].position, item[0])))
            _layer_order = (ranked, tuple(entry.name for entry in ranked))
        return _layer_order


def layer_names() -> tuple[str, ...]:
    """The prompt layers in their default order, most stable first (prompt-cache friendly): the
    names `[channels.<id>].prompt_layers` may list, and its default."""
    return _ordered_layers()[1]


def budget_knobs() -> tuple[BudgetKnob, ...]:
    """Every `[budget.<tier>]` key, the layers' declarations in stack order: `TierBudget`'s fields."""
    return tuple(k for entry in layers() for k in entry.budget)


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
