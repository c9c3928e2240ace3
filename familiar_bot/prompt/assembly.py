"""Prompt assembly: layers of memory composed into one system prompt plus chat history.

Each layer renders one section from the serving snapshot, the full-text readers
and the turn log (never ``memory.duckdb``, which a pipeline run may hold). A
layer also says, cheaply, what its output depends on (``invalidation_key``); the
assembler memoises builds by ``(layer name, key)`` in a bounded LRU, so a stable
section (character card, summary, ...) is rendered once and reused until its
inputs change. The default order runs most-stable first so a provider's prompt
cache keeps the longest possible prefix; ``[channels.<id>].prompt_layers``
reorders or disables layers for one channel.

``recent_history`` is special: it becomes chat messages rather than system-prompt
text, and is never cached. ``rag_context`` excludes the turns it already shows.
Which layers there are, in which order, and where each one's debug block lands come
from their specs (``prompt/layers/<name>.py: SPEC``, registered in `layers.registry`).

A layer that raises is logged and contributes nothing (its error is in
``debug["errors"]``): one broken section must never cost a reply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.storage.paths import FamiliarPaths

from familiar_bot.prompt import scoping
from familiar_bot.prompt.layers import registry
from familiar_bot.prompt.layers.stack import default_layers
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.prompt.tokens import estimate_tokens, message_tokens
from familiar_bot.prompt.types import AssembledPrompt, AssemblyContext, HistoryLayer, Layer, Message, Section

if TYPE_CHECKING:
    from familiar_pipeline.models.embedders import Embedder

log = logging.getLogger(__name__)

__all__ = [
    "AssembledPrompt",
    "Assembler",
    "AssemblyContext",
    "HistoryLayer",
    "Layer",
    "MemoryView",
    "Message",
    "Section",
    "build_assembler",
    "render_sections",
]


def render_messages(messages: Sequence[Message]) -> str:
    """History as ``/context`` shows it: one block per message."""
    lines = []
    for m in messages:
        who = f"{m.role}({m.name})" if m.name else m.role
        lines.append(f"{who}: {m.content}")
    return "\n".join(lines)


class Assembler:
    """Composes layers into an :class:`AssembledPrompt`; safe to share between threads."""

    def __init__(self, memory: MemoryView, layers: Sequence[Layer], *, cache_size: int = 256):
        names = [layer.name for layer in layers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"two layers share the name(s) {', '.join(duplicates)}")
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.memory = memory
        self.layers = list(layers)
        self._by_name = {layer.name: layer for layer in self.layers}
        self.cache_size = cache_size
        self._cache: LRUCache = LRUCache(maxsize=max(cache_size, 1))  # cache_size 0: nothing is stored
        self._lock = threading.Lock()
        self.builds = 0  # layer builds run (cache misses), for tests and benchmarks

    # -- order ---------------------------------------------------------------

    def layer_order(self, ctx: AssemblyContext) -> list[Layer]:
        """The channel's ``prompt_layers`` (names this assembler has), else construction order."""
        if ctx.channel_id is None:
            return list(self.layers)
        wanted = self.memory.config.channel(ctx.channel_id).prompt_layers
        if tuple(wanted) == registry.layer_names():
            return list(self.layers)
        seen: set[str] = set()
        order = []
        for name in wanted:
            if name in self._by_name and name not in seen:
                seen.add(name)
                order.append(self._by_name[name])
        return order

    # -- cache ---------------------------------------------------------------

    def _cached(self, key: tuple[str, str]) -> tuple[str, dict | None] | None:
        with self._lock:
            return self._cache.get(key)

    def _store(self, key: tuple[str, str], value: tuple[str, dict | None]) -> None:
        if self.cache_size == 0:
            return
        with self._lock:
            self._cache[key] = value

    def cache_len(self) -> int:
        with self._lock:
            return len(self._cache)

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    # -- assembly ------------------------------------------------------------

    def assemble(self, ctx: AssemblyContext) -> AssembledPrompt:
        if ctx.familiar_id != self.memory.paths.familiar_id:
            raise ValueError(
                f"this assembler serves familiar {self.memory.paths.familiar_id!r}, "
                f"not {ctx.familiar_id!r}"
            )
        started = time.perf_counter()
        self.memory.refresh()
        memory = self.memory.pinned()  # one snapshot for every layer of this prompt
        texts: list[str] = []
        sections: list[Section] = []
        history: list[Message] = []
        debug: dict[str, Any] = {"order": [], "keys": {}, "timings_ms": {}, "errors": {},
                                 "snapshot_version": memory.snapshot.version}
        order = self.layer_order(ctx)
        self._prefetch(order, ctx, memory)
        for layer in order:
            debug["order"].append(layer.name)
            t0 = time.perf_counter()
            try:
                as_messages = getattr(layer, "messages", None)
                if as_messages is not None:
                    history = list(as_messages(ctx, memory))
                    sections.append(Section(layer.name, render_messages(history),
                                            sum(message_tokens(m.content, m.name) for m in history), False))
                    continue
                text, cached, layer_debug = self._build(layer, ctx, memory, debug)
            except Exception as exc:  # one broken layer must not cost the reply
                log.exception("prompt layer %s failed for %s", layer.name, ctx)
                debug["errors"][layer.name] = f"{type(exc).__name__}: {exc}"
                sections.append(Section(layer.name, "", 0, False))
                continue
            finally:
                debug["timings_ms"][layer.name] = round((time.perf_counter() - t0) * 1000, 3)
            if layer_debug is not None:
                debug[registry.debug_key(layer.name)] = layer_debug  # its spec's debug_key
            if text:
                texts.append(text)
            sections.append(Section(layer.name, text, estimate_tokens(text), cached))
        debug["scopes"] = scoping.report(ctx, memory, debug)
        debug["total_ms"] = round((time.perf_counter() - started) * 1000, 3)
        return AssembledPrompt("\n\n".join(texts), history, sections, debug)

    def _prefetch(self, order: list[Layer], ctx: AssemblyContext, memory: MemoryView) -> None:
        """Let each layer whose section is not cached start its slow off-thread work
        (``prefetch``) before any layer builds, so that work overlaps theirs. A
        failure here is left for the layer's own build to meet and report."""
        for layer in order:
            start = getattr(layer, "prefetch", None)
            if start is None:
                continue
            try:
                if self._cached((layer.name, str(layer.invalidation_key(ctx, memory)))) is None:
                    start(ctx, memory)
            except Exception:  # noqa: BLE001 - the build runs the same code and reports it
                log.debug("prefetch of layer %s failed", layer.name, exc_info=True)

    def _build(self, layer: Layer, ctx: AssemblyContext, memory: MemoryView,
               debug: dict) -> tuple[str, bool, dict | None]:
        key = (layer.name, str(layer.invalidation_key(ctx, memory)))
        debug["keys"][layer.name] = key[1]
        hit = self._cached(key)
        if hit is not None:
            return hit[0], True, hit[1]
        with_debug = getattr(layer, "build_with_debug", None)
        if with_debug is not None:
            text, layer_debug = with_debug(ctx, memory)
        else:
            text, layer_debug = layer.build(ctx, memory), None
        self.builds += 1
        self._store(key, (text, layer_debug))
        return text, False, layer_debug


def build_assembler(paths: FamiliarPaths, config: FamiliarConfig, *, embedder: Embedder | None = None,
                    cache_size: int = 256, memory: MemoryView | None = None) -> Assembler:
    """The default layers in the default order over a fresh :class:`MemoryView`."""
    memory = memory or MemoryView(paths, config, embedder=embedder)
    return Assembler(memory, default_layers(), cache_size=cache_size)


def render_sections(prompt: AssembledPrompt) -> str:
    """The ``/context`` report: every section with its token count, then how facts ranked."""
    out = []
    total = 0
    for s in prompt.sections:
        total += s.tokens
        flag = ", cached" if s.cached else ""
        out.append(f"=== {s.name}: {s.tokens} tokens{flag} ===")
        error = prompt.debug.get("errors", {}).get(s.name)
        if error:
            out.append(f"(failed: {error})")
        out.append(s.text if s.text else "(empty)")
        out.append("")
    out.append(f"=== total: {total} tokens over {len(prompt.sections)} sections ===")
    scopes = prompt.debug.get("scopes")
    if scopes:
        out.append("")
        out.extend(scoping.render_report(scopes))
    rag = prompt.debug.get("rag")
    genre = (rag or {}).get("turn_genre")
    if genre:  # which kind of talk the turns were ranked for (prompt/retrieval/genre.py)
        out.append("")
        out.append(f"turn genre: {genre.get('genre')} (the familiar's replies {100 * genre.get('familiar_share', 0):.0f}% "
                   f"of the newest {genre.get('turns', 0)} turns here, {genre.get('familiar_chars', 0)} characters on "
                   f"average against the people's {genre.get('people_chars', 0)})")
    passages = (rag or {}).get("turn_passages")
    if passages and passages.get("turns_with_vectors"):  # long turns found by a passage (turn_passage_embedding)
        out.append("")
        out.append(f"passage vectors: {passages['turns_with_vectors']} long turns have them; "
                   f"{passages.get('ranked_by_passage', 0)} ranked turns were raised by their best passage")
    if rag and rag.get("facts"):
        out.append("")
        out.append("fact ranking (signals normalised within the batch; total = weighted sum):")
        w = rag.get("weights", {})
        out.append("weights: " + ", ".join(f"{k}={v:g}" for k, v in w.items()))
        out.append(f"{'':2}{'id':>6} {'bm25':>5} {'rec':>5} {'imp':>5} {'emb':>5} {'total':>6}  text")
        for c in rag["facts"]:
            mark = "*" if c.get("selected") else " "
            text = " ".join(c.get("text", "").split())
            text = text if len(text) <= 60 else text[:59] + "…"
            out.append(
                f"{mark} {c['fact_id']:>6} {c['bm25']:5.2f} {c['recency']:5.2f} {c['importance']:5.2f} "
                f"{c['embedding']:5.2f} {c['total']:6.3f}  {text}"
            )
        out.append("(* = in the prompt)")
    return "\n".join(out)
