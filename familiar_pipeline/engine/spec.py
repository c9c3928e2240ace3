"""What a projector declares about itself, once: its `ProjectorSpec`.

Every projector lives in one folder, ``projectors/<name>/``: its spec (``spec.py``, with
its knobs), its run logic, its prompt with the reply model that is both the schema and
the parser, its table declarations (``tables.py``) with their SQL, its invariants and its
answers for the scripted offline model. The registry, the Dagster asset factory, the
turn sensor, backfill, config loading (knob tables), the store (its tables), the
snapshot publisher and the scripted model read the spec, so a new projector is its own
folder plus one line in `builtin.BUILTIN_SPECS` (or one `register_projector` call from a
plugin), and a bot layer if the prompt shows it (docs/architecture.md §2).

A spec names its run logic rather than importing it: each of its code hooks (``run``,
``scripted``, ``batch_closed``, ``search_rows``, ``forget_person``) may be
``"package.module:attribute"``, imported on first use (`ProjectorSpec.load_run` and the
like). The built-ins name those that live beside their run logic, so a spec module imports
only light things (its knobs, its table declarations and store helpers, names) and
registering every spec, which loading a config does, imports no extraction code, no prompt
and no model client (tests/test_projector_specs.py, tests/test_architecture.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Callable, Protocol

from familiar_pipeline.config.knobs import NoKnobs, knob
from familiar_pipeline.storage.snapshots import ContextMatrix
from familiar_pipeline.storage.tables import Table

if TYPE_CHECKING:
    from familiar_pipeline.config import FamiliarConfig
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime
    from familiar_pipeline.storage.store import ProjectionStore
    from familiar_pipeline.storage.turns import TurnLog

__all__ = ["FACTS", "TRIGGERS", "TURNS", "TURN_INDEX", "DropRule", "Invariant", "NoKnobs", "ProjectorRun",
           "ProjectorSpec", "Scripted", "invariant", "knob", "named"]


class ProjectorRun(Protocol):
    """What a projector does for one familiar: process what is new past its watermark, report it."""

    def __call__(self, rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None: ...


# The scripted offline model's answer to this projector's prompt (None: not this projector's prompt).
Scripted = Callable[[list[dict[str, Any]]], "str | None"]

# A hook named by where it lives: "package.module:attribute" (the attribute may be dotted).
_NAMED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def named(target: str) -> Any:
    """The object ``target`` ("package.module:attribute") names, its module imported now (Python
    imports a module once: a later call is a dictionary look-up)."""
    module, _, attribute = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


@dataclass(frozen=True)
class Invariant:
    """A rule the projector's rows must keep, checked after every run (a Dagster asset check).

    ``find(store, turn_log, familiar_id)`` lists the violations (empty: the rule holds);
    ``what`` says what each item is. A ``blocking`` invariant that fails holds back what
    is built on the asset for that familiar.
    """

    name: str
    description: str
    find: Callable[["ProjectionStore", "TurnLog", str], list[Any]]
    what: str = ""
    blocking: bool = False

    def __call__(self, store: ProjectionStore, turn_log: TurnLog, familiar_id: str = "") -> list[Any]:
        return self.find(store, turn_log, familiar_id)


def invariant(name: str, description: str, *, what: str = "", blocking: bool = False
              ) -> Callable[[Callable[..., list[Any]]], Invariant]:
    """Declare the function below as an :class:`Invariant` (it stays callable as before)."""
    def declare(find: Callable[..., list[Any]]) -> Invariant:
        return Invariant(name, description, find, what, blocking)
    return declare


# When the turn-watermark sensor requests a projector's asset.
TURNS = "turns"  # when `batch_knob` (a knob naming a turn count) new turns wait past its watermark
TURN_INDEX = "turn_index"  # with the turn index: when turns changed and the log is quiet, or anything else is due
FACTS = "facts"  # in the same run as `facts`; automation re-runs it whenever its inputs change
TRIGGERS = (TURNS, TURN_INDEX, FACTS, None)  # None: only on request (UI, backfill, a plugin's own schedule)


@dataclass(frozen=True)
class DropRule:
    """What `drop_projection` deletes so a projection rebuilds from turns.

    The spec's own `tables` are emptied (dependants first) and their sequences restarted
    at 1, or, when given here, `tables` and `sequences`; the projector's own watermark row
    always goes. `before` runs first, in the same transaction, for what is not a whole
    table. `cascade` also drops, first, every projector that reads this one's asset
    (transitively): nothing built on deleted rows survives.
    """

    tables: tuple[str, ...] | None = None
    sequences: tuple[str, ...] | None = None
    before: Callable[[ProjectionStore], None] | None = None
    cascade: bool = False


# The hooks a spec may name instead of passing (imported on first use).
_NAMED_HOOKS = ("run", "scripted", "batch_closed", "search_rows", "forget_person")


@dataclass(frozen=True)
class ProjectorSpec:
    """One projector, declared once.

    `name` is the projector's name in `[providers.memory].projectors`, its knob
    table and its watermark row; `asset` is its Dagster asset's name (what the UI
    and the CLI show). `run(runtime, report, *, rebuild)` does the work; the asset
    drops the projection first when asked to rebuild. `description`, written like
    a docstring, is the asset's description in the UI. `inputs` are the asset
    names it reads (`turns` or other projectors' assets); they become the asset's
    deps. `soft_inputs` are deps too (lineage, run order, a rebuild's cascade), but a
    failure of one does not hold the projector back: it reads what is there and builds
    the rest from turns (standing wishes keep pinning the heuristic's wishes while the
    model behind the facts is down). A plugin with its own Dagster asset passes `factory` (a zero-argument
    callable returning the asset or a list of assets) instead of `run`.
    `batch_closed(turn_log, knobs, after_id, now) -> bool` tells the sensor that a
    batch shorter than `batch_knob` is complete anyway (facts close one at a quiet gap).
    `tables` are the tables it writes (declared in its folder; the store creates and
    migrates them, the snapshot publishes them, a rebuild empties them); `invariants`
    are checked after each run; `scripted` answers its prompt in the scripted offline
    model; `snapshot_check` adds the check that the bot's snapshot is in step with the store;
    `matrices(config)` names vector tables each publish precombines (``snapshots.vectors``).
    `follows_changes`: its run follows the turn log's edits and deletions past its watermark's
    `change_seq`, so the sensor requests it as soon as the log has changes past that.
    `search_index` names the full-text index it keeps (`"turns"` or `"facts"`) and `search_rows(rt, store)`
    gives every row it holds, from the canonical sources: an erasure rebuilds the index from them, so no
    segment keeps a purged word. `forget_person(store, key, scope)` removes the rows *about* a forgotten
    person (in `scope`, None: everywhere) that do not rest on their own turns (facts others' words taught,
    their dossier); the turn ids the removed rows rested on. Both are called by `familiar_pipeline.erasure`.

    `run`, `scripted`, `batch_closed`, `search_rows` and `forget_person` may each be a callable or its
    name ("package.module:attribute", see the module's docstring), imported on first use: callers go
    through `load_run`, `load_scripted`, `load_batch_closed`, `load_search_rows` and
    `load_forget_person`, never the field.
    """

    name: str
    asset: str = ""
    run: ProjectorRun | str | None = None
    description: str = ""
    group: str = "projections"
    kinds: AbstractSet[str] = frozenset({"duckdb"})  # any set of names; stored as a frozenset
    inputs: tuple[str, ...] = ("turns",)
    soft_inputs: tuple[str, ...] = ()
    trigger: str | None = None
    batch_knob: str | None = None
    batch_closed: Callable[..., bool] | str | None = None
    needs_llm: bool = True
    needs_embedder: bool = False
    always_on: bool = False
    knobs: type = NoKnobs
    drop: DropRule = DropRule()
    factory: Callable[..., Any] | None = None
    tables: tuple[Table, ...] = ()
    invariants: tuple[Invariant, ...] = ()
    scripted: Scripted | str | None = None
    snapshot_check: bool = True
    matrices: Callable[[FamiliarConfig], ContextMatrix | None] | None = None
    follows_changes: bool = False
    search_index: str | None = None
    search_rows: Callable[..., Any] | str | None = None
    forget_person: Callable[..., set[int]] | str | None = None

    @property
    def reads(self) -> tuple[str, ...]:
        """Every asset it reads: its inputs, then its soft inputs (the asset's deps)."""
        return self.inputs + tuple(i for i in self.soft_inputs if i not in self.inputs)

    @property
    def follows_turn_changes(self) -> bool:
        """Requested as soon as the turn log changes under what it read: `follows_changes` on a
        turn-driven projector (what `erasure.due.changed_read` looks at, without the trigger names)."""
        return self.follows_changes and self.trigger == TURNS

    def __post_init__(self) -> None:
        if not self.asset:
            object.__setattr__(self, "asset", self.name)
        object.__setattr__(self, "kinds", frozenset(self.kinds))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "soft_inputs", tuple(self.soft_inputs))
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "invariants", tuple(self.invariants))
        if self.trigger not in TRIGGERS:
            raise ValueError(f"projector {self.name!r}: trigger {self.trigger!r} is not one of {TRIGGERS}")
        if self.factory is not None and not callable(self.factory):
            raise TypeError(f"projector {self.name!r}: factory must be callable or None")
        for hook in _NAMED_HOOKS:
            value = getattr(self, hook)
            if isinstance(value, str):
                if not _NAMED.match(value):
                    raise ValueError(f"projector {self.name!r}: {hook} {value!r} is not 'package.module:attribute'")
            elif value is not None and not callable(value):
                raise TypeError(f"projector {self.name!r}: {hook} must be callable, a 'package.module:attribute' name or None")
        if not (isinstance(self.knobs, type) and dataclasses.is_dataclass(self.knobs)):
            raise TypeError(f"projector {self.name!r}: knobs must be a dataclass")
        if (self.search_index is None) != (self.search_rows is None):
            raise ValueError(f"projector {self.name!r}: search_index and search_rows go together")
        if self.trigger == TURNS and self.batch_knob not in {f.name for f in dataclasses.fields(self.knobs)}:
            raise ValueError(f"projector {self.name!r}: a turn-triggered projector names its batch_knob")

    def _load(self, hook: str) -> Any:
        """The hook's callable (None when absent), its module imported now when the spec names it."""
        value = getattr(self, hook)
        if not isinstance(value, str):
            return value
        try:
            found = named(value)
        except (ImportError, AttributeError) as exc:
            raise ImportError(f"projector {self.name!r}: its {hook} {value!r} does not import: {exc}") from exc
        if not callable(found):
            raise TypeError(f"projector {self.name!r}: its {hook} {value!r} is not callable")
        return found

    def load_run(self) -> ProjectorRun | None:
        """What the step runs for one familiar (None: a plugin with an asset `factory` of its own)."""
        run: ProjectorRun | None = self._load("run")
        return run

    def load_scripted(self) -> Scripted | None:
        """The scripted offline model's answerer for this projector's prompt, if it has one."""
        scripted: Scripted | None = self._load("scripted")
        return scripted

    def load_batch_closed(self) -> Callable[..., bool] | None:
        """Whether a batch shorter than `batch_knob` is complete anyway, if the projector can tell."""
        closed: Callable[..., bool] | None = self._load("batch_closed")
        return closed

    def load_search_rows(self) -> Callable[..., Any] | None:
        """Every row of the full-text index it keeps, from the canonical sources (`search_index`)."""
        rows: Callable[..., Any] | None = self._load("search_rows")
        return rows

    def load_forget_person(self) -> Callable[..., set[int]] | None:
        """What removes the rows about a forgotten person that rest on others' turns, if it keeps any."""
        forget: Callable[..., set[int]] | None = self._load("forget_person")
        return forget

    def load_hooks(self) -> None:
        """Import every hook the spec names now: a preload before forking runs, or a check that each resolves."""
        for hook in _NAMED_HOOKS:
            self._load(hook)

    @property
    def has_knobs(self) -> bool:
        return bool(dataclasses.fields(self.knobs))

    @property
    def dropped_tables(self) -> tuple[str, ...]:
        """What a rebuild empties, dependants first (its drop rule, else its own tables)."""
        if self.drop.tables is not None:
            return self.drop.tables
        return tuple(t.name for t in reversed(self.tables))

    @property
    def dropped_sequences(self) -> tuple[str, ...]:
        if self.drop.sequences is not None:
            return self.drop.sequences
        return tuple(t.sequence for t in self.tables if t.sequence)
