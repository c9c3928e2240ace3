"""What ``/context`` shows besides the prompt itself: the sections with their token counts, and memory's footer.

The prompt shows only current facts; the footer (:func:`retired_facts_report`) is where
supersession shows: how many facts memory holds, and the newest retired ones with what
replaced them, only for the scopes the reply read.
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from familiar_pipeline.projectors.facts.reads import facts_by_ids

from familiar_bot.prompt.assembly import render_sections
from familiar_bot.prompt.scoping import scope_mask


def context_report(prompt: Any, memory: Any) -> str:
    """The ``/context`` report of an assembled ``prompt``: which layers said what, with token counts,
    then the footer of ``memory`` (the assembler's memory view, if it has one)."""
    report = render_sections(prompt)
    snapshot = getattr(memory, "snapshot", None)
    # The footer quotes fact text: only the scopes this reply read (another scope's, never).
    visible = tuple(prompt.debug.get("scopes", {}).get("visible", ()))
    return report + ("\n\n" + retired_facts_report(snapshot, visible=visible) if snapshot is not None else "")


def retired_facts_report(snapshot, limit: int = 5, visible: tuple[str, ...] | None = None) -> str:
    """How many facts memory holds, and the newest retired ones with what replaced them.

    The prompt shows only current facts; this is where `/context` shows supersession at work.
    With ``visible`` (the reply's scopes), only those scopes' facts are counted and quoted.
    """
    try:
        facts = snapshot.table("facts")
    except (KeyError, OSError, ValueError):
        return "=== memory: no facts published yet ==="
    where = ""
    if visible is not None:
        facts = facts.filter(scope_mask(facts, visible))
        where = f" in {', '.join(visible) or 'no scope'}"
    retired = facts.filter(pc.is_valid(facts["superseded_at"]))
    lines = [f"=== memory{where}: {facts.num_rows - retired.num_rows} current facts, {retired.num_rows} retired ==="]
    rows = retired.to_pylist()[-limit:]
    by_id = {f.id: f for f in facts_by_ids(snapshot, [r["superseded_by"] for r in rows if r["superseded_by"]])
             if visible is None or f.scope in visible}
    for row in reversed(rows):
        newer = by_id.get(row["superseded_by"])
        lines.append(f"retired #{row['id']} {row['text']!r}"
                     + (f" <- replaced by #{newer.id} {newer.text!r}" if newer else ""))
    return "\n".join(lines)
