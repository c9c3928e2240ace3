"""The registered prompt layers: the built-ins (`stack.BUILTIN_LAYERS`) and any a plugin adds.

`register_layer(spec)` records a `LayerSpec` here and tells config its name, position and
budget keys (`familiar_pipeline.config.catalogue.register_layer`); the order is config's
(`catalogue.layer_names`: by position, then registration), so the stack, ``/context`` and
``prompt_layers`` validation agree. The built-ins come in through the ``familiar.layers``
entry point (pyproject.toml), which `stack` names: config discovers them that way in any
process, this registry asks config to, and nothing here imports a layer.
"""

from __future__ import annotations

import threading

from familiar_pipeline.config import catalogue

from familiar_bot.prompt.layers.spec import LayerSpec

_lock = threading.RLock()
_specs: dict[str, LayerSpec] = {}
# (config's order, the specs in it), kept while config's order is the same tuple: read on every reply.
_ordered: tuple[tuple[str, ...], tuple[LayerSpec, ...]] | None = None


def register_layer(spec: LayerSpec) -> None:
    """Record (or replace) a prompt layer: in the default stack at its position, known to config."""
    global _ordered
    if not isinstance(spec, LayerSpec):
        raise TypeError(f"register_layer takes a LayerSpec, got {type(spec).__name__}")
    with _lock:
        previous = _specs.get(spec.name)
        _specs[spec.name] = spec  # before config names it: a reader never meets a name without its spec
        try:
            catalogue.register_layer(spec.name, position=spec.position, budget=spec.budget)
        except Exception:
            if previous is None:
                _specs.pop(spec.name, None)
            else:
                _specs[spec.name] = previous
            raise
        _ordered = None


def unregister_layer(name: str) -> None:
    global _ordered
    with _lock:
        catalogue.unregister_layer(name)
        _specs.pop(name, None)
        _ordered = None


def layer_specs() -> tuple[LayerSpec, ...]:
    """Every registered layer's spec, in the default stack's order (config's `layer_names`)."""
    global _ordered
    names = catalogue.layer_names()  # discovers the installed layers first
    cached = _ordered
    if cached is not None and cached[0] is names:
        return cached[1]
    with _lock:
        if _ordered is None or _ordered[0] is not names:
            _ordered = (names, tuple(_specs[n] for n in names if n in _specs))
        return _ordered[1]


def layer_names() -> tuple[str, ...]:
    """The layers' names in the default order (what ``LAYER_NAMES`` was)."""
    return tuple(spec.name for spec in layer_specs())


def get_layer(name: str) -> LayerSpec:
    for spec in layer_specs():
        if spec.name == name:
            return spec
    raise KeyError(f"unknown prompt layer {name!r}; registered: {', '.join(layer_names())}")


def debug_key(name: str) -> str:
    """Where layer `name`'s debug block lands in ``AssembledPrompt.debug`` (its name unless its spec says)."""
    spec = _specs.get(name)
    if spec is None:
        layer_specs()  # discover, once
        spec = _specs.get(name)
    return spec.debug_key if spec is not None else name


def debug_keys() -> dict[str, str]:
    """Each layer's debug key, by layer name (only those that differ from the name: ``rag_context``'s is ``rag``)."""
    return {s.name: s.debug_key for s in layer_specs() if s.debug_key != s.name}


def scoped() -> tuple[LayerSpec, ...]:
    """The layers that read derived rows by scope, in stack order: ``/context`` counts what each left out."""
    return tuple(s for s in layer_specs() if s.scoped)


def held_parts() -> tuple[LayerSpec, ...]:
    """The layers with a part in what ``/memory`` lists and exports about a person, in stack order."""
    return tuple(s for s in layer_specs() if s.held is not None)
