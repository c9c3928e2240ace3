"""The types prompt assembly and its layers share: context, messages, sections, the layer protocols.

They live below both `familiar_bot.prompt.assembly` and the layers, so the
layers can build `Message`s without importing the assembler that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from familiar_pipeline.config import BUDGET_TIERS

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView


@dataclass(frozen=True)
class AssemblyContext:
    """Who is being answered, where, and to what (``cue`` is the new message)."""

    familiar_id: str
    channel_id: int | None
    guild_id: int | None = None
    tier: str = "text"  # a budget tier: "text", "voice" or "background"
    cue: str = ""
    # When the cue was said (aware); None: now. "Yesterday" in the cue is the day before it.
    now: datetime | None = None
    # The turn a reply answers: the history ends with it and shows no one's later turn (the
    # familiar's own replies to earlier turns are shown after the turn each answers). Lines typed
    # while an earlier reply was composed are recorded at once, so without this a reply would see
    # (and answer) them instead of its own message. None (`/context`, `familiar prompt`): the
    # channel as it stands.
    answering: int | None = None

    def __post_init__(self) -> None:
        for name in ("channel_id", "guild_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"AssemblyContext.{name} must be an int or None, got {value!r}")
        if self.tier not in BUDGET_TIERS:
            raise ValueError(
                f"unknown prompt tier {self.tier!r}; valid tiers: {', '.join(BUDGET_TIERS)}"
            )
        if self.answering is not None and (isinstance(self.answering, bool) or not isinstance(self.answering, int)):
            raise TypeError(f"AssemblyContext.answering must be a turn id or None, got {self.answering!r}")
        if not isinstance(self.cue, str):
            raise TypeError(f"AssemblyContext.cue must be a str, got {type(self.cue).__name__}")
        if self.now is not None and (not isinstance(self.now, datetime) or self.now.utcoffset() is None):
            raise TypeError(f"AssemblyContext.now must be an aware datetime or None, got {self.now!r}")


@dataclass(frozen=True)
class Message:
    """One chat message for the LLM; ``name`` is an API-safe speaker id for user turns."""

    role: str
    content: str
    name: str | None = None


@dataclass(frozen=True)
class Section:
    """One layer's contribution, as ``/context`` shows it."""

    name: str
    text: str
    tokens: int
    cached: bool


@dataclass(frozen=True)
class AssembledPrompt:
    system_prompt: str
    history: list[Message]
    sections: list[Section]
    debug: dict = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.sections)


@runtime_checkable
class Layer(Protocol):
    """A named section of the system prompt.

    ``build`` returns the section text ("" to opt out); ``invalidation_key`` is
    cheap and changes whenever ``build``'s output could. A layer may also offer
    ``build_with_debug(ctx, memory) -> (text, dict)``; the dict is cached with
    the text and lands in ``AssembledPrompt.debug`` under its spec's ``debug_key`` (its name unless
    the spec says otherwise). A layer may
    offer ``prefetch(ctx, memory)``: called before any layer builds when its
    section is not cached, to start slow work on another thread that its build
    joins later (``rag_context`` starts the cue's embedding there).
    """

    name: str

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str: ...

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str: ...


@runtime_checkable
class HistoryLayer(Layer, Protocol):
    """A layer that contributes chat messages instead of system-prompt text."""

    def messages(self, ctx: AssemblyContext, memory: MemoryView) -> list[Message]: ...
