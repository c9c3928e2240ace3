"""``reflection``: higher-order observations, each with its evidence breadcrumbs.

A line reads ``- Crew morale dipped after Friday. [T#42, F#7]``; when any cited
fact has since been retired it gains `` (stale)``, so the model weighs it less.
The invalidation key includes the set of retired citations, not only the
newest reflection id: otherwise a ``(stale)`` flag would appear only after the
next reflection was written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from familiar_bot.prompt.layers.common import one_line
from familiar_bot.prompt.layers.spec import BudgetKnob, LayerSpec
from familiar_bot.prompt.scoping import scope_key, scope_mask, visible_scopes
from familiar_bot.prompt.tokens import cap_blocks
from familiar_pipeline.projectors.facts.reads import superseded_fact_ids
from familiar_pipeline.projectors.reflections.tables import REFLECTIONS, Reflection

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext

HEADER = "## Recent reflections"


def recent_visible(snapshot: Any, channel_id: int | None, limit: int,
                   visible: tuple[str, ...]) -> tuple[list[Reflection], int]:
    """Newest first: the channel's reflections plus channel-agnostic ones (every one with
    ``channel_id=None``), of the ``visible`` scopes only; and how many others of the
    channel's the scope excluded."""
    if limit <= 0:
        return [], 0
    snap = snapshot.current()
    table = snap.table("reflections")
    if channel_id is not None:
        channel = table["channel_id"]
        here = pc.equal(channel, pa.scalar(int(channel_id), pa.int64()))
        table = table.filter(pc.or_kleene(pc.is_null(channel), here))
    seen = table.filter(scope_mask(table, visible))
    newest = seen.slice(max(seen.num_rows - int(limit), 0))
    return snap.records(REFLECTIONS, newest)[::-1], table.num_rows - seen.num_rows


def _rows(ctx: AssemblyContext, memory: MemoryView) -> tuple[list[Reflection], set[int], int]:
    limit = memory.config.budget_for(ctx.tier).max_reflections
    snapshot = memory.snapshot
    visible = visible_scopes(ctx, memory)

    def compute() -> tuple[list[Reflection], set[int], int]:
        rows, excluded = recent_visible(snapshot, ctx.channel_id, limit, visible)
        cited = {f for r in rows for f in r.cited_fact_ids}
        return rows, (superseded_fact_ids(snapshot, cited) if cited else set()), excluded

    # A published snapshot never changes, so its version names these rows.
    return memory.memo(("reflections", snapshot.version, ctx.channel_id, limit, visible), compute)


def reflection_line(row: Reflection, stale: set[int]) -> str:
    """One ``Reflection`` as a bullet with its citations."""
    turns, facts = row.cited_turn_ids, row.cited_fact_ids
    line = f"- {one_line(row.text)}"
    crumbs = [f"T#{t}" for t in turns] + [f"F#{f}" for f in facts]
    if crumbs:
        line += f" [{', '.join(crumbs)}]"
    if any(f in stale for f in facts):
        line += " (stale)"
    return line


class ReflectionLayer:
    name = "reflection"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        budget = memory.config.budget_for(ctx.tier)
        rows, stale, excluded = _rows(ctx, memory)
        newest = rows[0].id if rows else 0
        stale_part = ",".join(str(f) for f in sorted(stale))
        return (f"ch{ctx.channel_id}|{scope_key(ctx, memory)}|x{excluded}|r{newest}|n{len(rows)}|stale{stale_part}"
                f"|cap{budget.max_reflections},{budget.reflection_tokens}")

    def build_with_debug(self, ctx: AssemblyContext, memory: MemoryView) -> tuple[str, dict[str, Any]]:
        rows, stale, excluded = _rows(ctx, memory)
        debug = {"scope_excluded": excluded}
        lines = [reflection_line(r, stale) for r in rows if one_line(r.text)]
        kept = cap_blocks(lines, memory.config.budget_for(ctx.tier).reflection_tokens)
        if not kept:
            return "", debug
        return HEADER + "\n\n" + "\n".join(kept), debug

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return self.build_with_debug(ctx, memory)[0]


SPEC = LayerSpec(
    name="reflection",
    layer=ReflectionLayer,
    position=600,
    scoped=True,
    budget=(BudgetKnob("reflection_tokens", voice=600, text=1600, background=4000),
            BudgetKnob("max_reflections", voice=6, text=10, background=16, tokens=False)),
)
