"""What a prompt layer declares about itself, once: its `LayerSpec`.

Every layer lives in one module, ``prompt/layers/<name>.py``: the layer (its ``build`` and
``invalidation_key``) and, beside it, its ``SPEC``. What lists layers reads the specs
instead of naming them: the default stack and its order (`stack`), where each layer's
debug block lands (`registry.debug_key`, once ``assembly.DEBUG_KEYS``), which sections
count the rows their scope left out (`registry.scoped`, once ``scoping.SCOPED_SECTIONS``),
what ``/memory`` lists and exports (`familiar_bot.self_service`), and config: the names
``[channels.<id>].prompt_layers`` may list, their default order and the
``[budget.<tier>]`` keys with their defaults (config learns them through
`familiar_pipeline.config.catalogue.register_layer`, as it learns projectors). So a new
layer is its module plus one line in `stack.BUILTIN_LAYERS` (or one `register_layer`
call from a plugin); docs/architecture.md §2 has the worked example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from familiar_pipeline.config.knobs import BudgetKnob

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import Layer

__all__ = ["BudgetKnob", "HeldPart", "LayerSpec"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

# (memory, person key, the scopes a reply there reads) -> a value
PersonRead = Callable[["MemoryView", str, tuple[str, ...]], Any]


@dataclass(frozen=True)
class HeldPart:
    """What ``/memory`` lists, and ``/memory export`` holds, of a layer's rows about one person.

    `key` names the part in the export and in `self_service.Held` (``held.<key>``).
    `held(memory, person, visible)` reads what a reply there may use (what the layer would
    show); `lines(value)` renders that for the list (``[]`` for nothing); `export(memory,
    person, visible)` gives every row held there as JSON-ready values (retired ones too: they
    are still held). `memory` is pinned to one snapshot; `visible` is
    `scoping.visible_scopes` of the place asked from.
    """

    key: str
    held: PersonRead
    lines: Callable[[Any], list[str]]
    export: PersonRead


@dataclass(frozen=True)
class LayerSpec:
    """One prompt layer, declared once.

    `name` is the layer's name: its section in ``/context``, its key in the assembler's
    cache, what ``[channels.<id>].prompt_layers`` lists. `layer` makes it (its class: one
    instance per assembler; its ``name`` must equal the spec's). `position` places it in the
    default stack, lower first; the built-ins are 100 apart, most stable first (a provider's
    prompt cache reuses the start), and a new layer takes a number between its neighbours.
    `debug_key` is where its debug block (``build_with_debug``) lands in
    ``AssembledPrompt.debug`` (default: its name). `scoped`: it reads derived rows by scope
    (`familiar_bot.prompt.scoping`), and its debug block counts what the scope left out
    (``scope_excluded``), which ``/context`` reports; `scope_parts` counts it per part instead
    (``scope_excluded_<part>``: ``rag_context``'s facts and turns). `budget` declares its
    ``[budget.<tier>]`` keys with their default per tier (read as
    ``memory.config.budget_for(ctx.tier).<key>``). `held` says what ``/memory`` lists and
    exports of it about a person (None: nothing of its own).
    """

    name: str
    layer: Callable[[], Layer]
    position: int
    debug_key: str = ""
    scoped: bool = False
    scope_parts: tuple[str, ...] = ()
    budget: tuple[BudgetKnob, ...] = ()
    held: HeldPart | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"prompt layer {self.name!r}: expected a lower-case name such as \"standing_wishes\"")
        if not callable(self.layer):
            raise TypeError(f"prompt layer {self.name!r}: layer must be callable (the layer's class)")
        if isinstance(self.position, bool) or not isinstance(self.position, int):
            raise TypeError(f"prompt layer {self.name!r}: position must be an integer, got {self.position!r}")
        object.__setattr__(self, "debug_key", self.debug_key or self.name)
        object.__setattr__(self, "scope_parts", tuple(self.scope_parts))
        object.__setattr__(self, "budget", tuple(self.budget))
        if self.scope_parts:
            object.__setattr__(self, "scoped", True)
        if not all(isinstance(k, BudgetKnob) for k in self.budget):
            raise TypeError(f"prompt layer {self.name!r}: budget holds BudgetKnob declarations")
