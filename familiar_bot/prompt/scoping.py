"""Which memory a reply may read: its own scope, plus the scopes the operator joined to it.

A reply's scope is :func:`~familiar_pipeline.storage.scopes.turn_scope` of where it is
said (``guild:<id>`` in a server, ``channel:<id>`` elsewhere); ``[memory.scopes]``
groups add scopes on purpose (:meth:`ScopesConfig.visible`). Every derived row a layer
reads (facts, dossiers, summaries, reflections, quoted turns, turn vectors) is kept only
when its ``scope`` is visible; rows scoped ``familiar`` (built across scopes, or before
scopes existed) are visible only when a group lists ``familiar``. Authored canon
(character card, lorebook) and the persona are not derived rows and are read everywhere.

The filters are applied in the candidate steps (before ranking and the token cut), so
a scope with few rows still fills its sections from its own rows; what a filter needs
per snapshot (row masks, id arrays) is built once per (snapshot, visible scopes).
Each section counts the rows its scope excluded (counts only) for ``/context``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.storage.scopes import FAMILIAR_WIDE, PERSON

from familiar_bot.prompt.layers import registry

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext


def reply_scope(ctx: AssemblyContext) -> str:
    """The scope a reply here is said in; ``familiar`` for a context with no channel (no transport makes one)."""
    if ctx.guild_id is None and ctx.channel_id is None:
        return FAMILIAR_WIDE
    if ctx.guild_id is not None:
        return f"guild:{int(ctx.guild_id)}"
    return f"channel:{int(ctx.channel_id)}"  # type: ignore[arg-type]  # not None: checked above


# How many of a DM's latest turns decide who it is with.
DM_WINDOW = 50


def dm_person(ctx: AssemblyContext, memory: MemoryView) -> str | None:
    """The one person of a conversation outside any server (a DM): the only author of its
    latest turns; None in a server, or where several people (a group DM) or nobody spoke."""
    if ctx.guild_id is not None or ctx.channel_id is None:
        return None
    authors = {t.author_key for t in memory.channel_window(ctx.channel_id, DM_WINDOW)
               if t.role == "user" and t.author_key}
    return authors.pop() if len(authors) == 1 else None


def visible_scopes(ctx: AssemblyContext, memory: MemoryView) -> tuple[str, ...]:
    """The reply's scope first, then the scopes ``[memory.scopes]`` joins to it, then (in a DM,
    with ``dm_sees_person``) ``person:<key>``: what the DM's person said in any scope."""
    scopes = memory.config.memory.scopes
    visible = scopes.visible(reply_scope(ctx))
    if scopes.dm_sees_person:
        person = memory.per_assembly(("dm-person", ctx.channel_id), lambda: dm_person(ctx, memory))
        if person is not None:
            visible = (*visible, PERSON + person)
    return visible


def scope_key(ctx: AssemblyContext, memory: MemoryView) -> str:
    """For invalidation keys: changes whenever the visible scopes do."""
    return "sc" + ",".join(visible_scopes(ctx, memory))


def scope_mask(table: pa.Table, visible: tuple[str, ...]) -> pa.ChunkedArray | pa.Array:
    """Arrow mask of the rows of ``table`` whose ``scope`` is visible (a NULL scope is not)."""
    return pc.fill_null(pc.is_in(table["scope"], value_set=pa.array(visible, pa.string())), False)


def visible_row_ids(snapshot: Any, table: str, visible: tuple[str, ...], id_column: str = "id") -> np.ndarray:
    """Sorted ids of ``table``'s visible rows, built once per snapshot and visible scopes."""
    snap = snapshot.current()

    def build() -> np.ndarray:
        rows = snap.table(table)
        ids = pc.filter(rows[id_column], scope_mask(rows, visible)).to_numpy()
        return np.unique(np.asarray(ids, dtype=np.int64))

    return snap.cached(("scope-ids", table, id_column, visible), build)


def visible_fact_ids(memory: MemoryView, visible: tuple[str, ...]) -> np.ndarray:
    """Sorted ids of the facts a reply reading ``visible`` may use: those of its scopes, and for
    a joined person (``person:<key>``) the facts whose every source turn that person said."""
    ids = visible_row_ids(memory.snapshot, "facts", visible)
    people = tuple(v for v in visible if v.startswith(PERSON))
    if not people:
        return ids
    said = memory.scope_turn_ids(people)
    snap = memory.snapshot.current()

    def build() -> np.ndarray:
        table = snap.table("facts")
        sources = table["source_turn_ids"].combine_chunks()
        parents = pc.list_parent_indices(sources).to_numpy()
        inside = keep_ids(pc.list_flatten(sources).to_numpy(), said).astype(np.int64)
        total = np.bincount(parents, minlength=table.num_rows)
        theirs = np.bincount(parents, weights=inside, minlength=table.num_rows)
        ok = (total > 0) & (theirs == total)
        return np.unique(np.asarray(table["id"].to_numpy(), dtype=np.int64)[ok])

    extra = memory.memo(("person-fact-ids", memory.snapshot.version, people, len(said)), build)
    return np.union1d(ids, extra)


def keep_ids(ids: np.ndarray | list[int], allowed: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``ids`` are in the sorted array ``allowed`` (a binary search)."""
    want = np.asarray(ids, dtype=np.int64)
    if len(allowed) == 0 or len(want) == 0:
        return np.zeros(len(want), dtype=bool)
    at = np.minimum(np.searchsorted(allowed, want), len(allowed) - 1)
    return allowed[at] == want


def report(ctx: AssemblyContext, memory: MemoryView, debug: dict[str, Any]) -> dict[str, Any]:
    """The debug block ``/context`` shows: the scopes read, and per section how many rows
    of other scopes were left out (counts only). The sections are the layers whose spec says
    ``scoped``, in stack order, each read from its debug block (``scope_excluded``, or per part
    of its ``scope_parts``: ``rag_context`` as facts and turns)."""
    excluded: dict[str, int] = {}
    for spec in registry.scoped():
        found = debug.get(spec.debug_key)
        if not isinstance(found, dict):
            continue
        if spec.scope_parts:
            for part in spec.scope_parts:
                if f"scope_excluded_{part}" in found:
                    excluded[f"{spec.name} {part}"] = int(found[f"scope_excluded_{part}"])
        elif "scope_excluded" in found:
            excluded[spec.name] = int(found["scope_excluded"])
    return {"reply": reply_scope(ctx), "visible": list(visible_scopes(ctx, memory)),
            "excluded": excluded, "excluded_total": sum(excluded.values())}


def render_report(scopes: dict[str, Any]) -> list[str]:
    """``/context`` and ``familiar prompt`` lines for :func:`report`'s block."""
    reply, visible = scopes["reply"], scopes["visible"]
    joined = [s for s in visible if s != reply]
    people = [s[len(PERSON):] for s in joined if s.startswith(PERSON)]
    joined = [s for s in joined if not s.startswith(PERSON)]
    lines = [f"=== scopes: this reply reads {reply}"
             + (f" and, joined by [memory.scopes], {', '.join(joined)}" if joined else "" if people else " only")
             + (f" and what {', '.join(people)} said anywhere (dm_sees_person)" if people else "") + " ==="]
    parts = ", ".join(f"{name} {n}" for name, n in scopes["excluded"].items())
    lines.append(f"rows of other scopes left out: {scopes['excluded_total']}"
                 + (f" ({parts})" if parts else ""))
    return lines
