"""The projector registry: every projector's `ProjectorSpec`, by name.

Built-ins and plugins register the same way, with `register_projector(SPEC)`.
`[providers.memory].projectors` in character.toml names projectors; config
loading checks those names against this registry, so a typo fails at load time
with the valid names listed, and validates each `[providers.memory.<name>]`
table against the spec's knob dataclass. The asset factory
(`familiar_pipeline.defs.assets`), the turn sensor, backfill and
`drop_projection` all read the specs registered here.

Registering also tells config (`config.catalogue`) the projector's name and knob
dataclass: config sits below the projectors and imports none of them. The engine
sits below them too: the built-ins (`familiar_pipeline.projectors.builtin`) are the
``familiar.projectors`` entry point (pyproject.toml), which this registry, like
config, loads on first use (`catalogue.discover`), before anything registers or is
read, so the built-ins come first and in their order in every process.

A plugin module (named in FAMILIAR_PLUGINS) calls `register_projector` at import
time. A spec with a `run` function gets the same asset shell as a built-in; a
plugin that brings its own Dagster asset passes `factory` instead (the older
`register_projector(name, factory)` form still works, its knob table then passes
through untyped, see `MemoryConfig.knobs`).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from familiar_pipeline.config import catalogue
from familiar_pipeline.engine.spec import ProjectorSpec
from familiar_pipeline.storage.paths import checked_name, did_you_mean
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage import tables as tables_module
from familiar_pipeline.storage.tables import Table

# Names become TOML table names, Dagster asset names and log labels, so keep
# them to one lowercase identifier.
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class UnknownProjectorError(LookupError, ValueError):
    """Raised for a projector (or asset) name that nobody registered."""


_PROJECTORS: dict[str, ProjectorSpec] = {}


def _registered() -> dict[str, ProjectorSpec]:
    """The registered specs, the installed entry points' (the built-ins) loaded first."""
    catalogue.discover()
    return _PROJECTORS


def _check_name(name: str) -> str:
    return checked_name(name, _NAME, "projector name", "use a lowercase identifier (a-z, 0-9, '_', starting with a letter)")


def register_projector(
    spec: ProjectorSpec | str,
    factory: Callable[..., Any] | None = None,
    *,
    description: str = "",
    needs_llm: bool = True,
) -> ProjectorSpec:
    """Register (or replace) a projector; returns its spec.

    Pass a `ProjectorSpec`, or (the older plugin form) a name and an asset
    `factory`, which registers a spec with no knobs, run or trigger of its own.
    """
    _registered()
    if not isinstance(spec, ProjectorSpec):
        _check_name(spec)
        spec = ProjectorSpec(name=spec, factory=factory, description=description, needs_llm=needs_llm)
    _check_name(spec.name)
    _check_name(spec.asset)
    clash = [s.name for s in _PROJECTORS.values() if s.name != spec.name and spec.asset in (s.name, s.asset)]
    clash += [s.name for s in _PROJECTORS.values() if s.name != spec.name and spec.name == s.asset]
    if clash:
        raise ValueError(f"projector {spec.name!r}: its name or asset {spec.asset!r} is taken by {clash[0]!r}")
    taken = {t.name: s.name for s in _PROJECTORS.values() if s.name != spec.name for t in s.tables}
    owned = [t.name for t in spec.tables if t.name in taken]
    if owned:
        raise ValueError(f"projector {spec.name!r}: table {owned[0]!r} belongs to {taken[owned[0]]!r}")
    _PROJECTORS[spec.name] = spec
    catalogue.register_projector(spec.name, spec.knobs, selectable=not spec.always_on,
                                 needs_embedder=spec.needs_embedder)
    return spec


def unregister_projector(name: str) -> None:
    """Forget a projector (a plugin unloading, tests cleaning up); config forgets it too."""
    spec = _registered().pop(name, None)
    if spec is not None:
        catalogue.unregister_projector(name)
        for table in spec.tables:
            tables_module.unregister(table.name)


def known_projectors() -> tuple[str, ...]:
    """The names valid in `[providers.memory].projectors` (every projector but the always-on ones)."""
    return tuple(sorted(name for name, spec in _registered().items() if not spec.always_on))


def specs() -> tuple[ProjectorSpec, ...]:
    """Every registered spec, always-on ones included, in registration order."""
    return tuple(_registered().values())


def get_projector(name: str) -> ProjectorSpec:
    """The spec registered under a projector name."""
    try:
        return _registered()[name]
    except (KeyError, TypeError):
        raise UnknownProjectorError(
            f"unknown memory projector {name!r}; valid: {', '.join(known_projectors())}"
        ) from None


def resolve(name: str) -> ProjectorSpec:
    """The spec for a projector name or an asset name (`rich_note` and `facts` are the same projector)."""
    if name in _registered():
        return _PROJECTORS[name]
    for spec in _PROJECTORS.values():
        if spec.asset == name:
            return spec
    names = sorted({n for s in _PROJECTORS.values() for n in (s.name, s.asset)})
    raise UnknownProjectorError(f"unknown projection {name!r}{did_you_mean(name, names)}; valid: {', '.join(names)}")


def dependants(name: str, *, soft: bool = True) -> list[ProjectorSpec]:
    """Projectors that read `name`'s asset, directly or through another; each before what it reads.

    ``soft`` False: only through their `inputs`, not their `soft_inputs` (who a failure holds back).
    """
    order: list[ProjectorSpec] = []
    seen = {name}

    def visit(asset: str) -> None:
        for spec in _PROJECTORS.values():
            if asset in (spec.reads if soft else spec.inputs) and spec.name not in seen:
                seen.add(spec.name)
                visit(spec.asset)
                order.append(spec)

    visit(get_projector(name).asset)
    return order


def drop_projection(store: ProjectionStore, name: str) -> None:
    """Delete one projection's rows and watermark so it rebuilds from turns, as its spec's `drop` says.

    A cascading rule (the facts) takes every projection built on it along, in one transaction.
    """
    spec = get_projector(name)
    chain = [*dependants(name), spec] if spec.drop.cascade else [spec]
    store.drop_rows(
        watermarks=[s.name for s in chain],
        tables=[t for s in chain for t in s.dropped_tables],
        sequences=[q for s in chain for q in s.dropped_sequences],
        before=[s.drop.before for s in chain if s.drop.before is not None],
    )


def tables() -> tuple[Table, ...]:
    """Every registered projector's tables: what a familiar's store holds and its snapshot serves."""
    return tuple(t for spec in _registered().values() for t in spec.tables)
