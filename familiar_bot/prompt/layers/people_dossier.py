"""``people_dossier``: what the familiar knows about the people in this conversation.

Order: the familiar's own dossier (``ego:<id>``) always first and outside the
people cap, then the people of the channel's recent window, newest first: each
turn's author, then the people it mentions. Mentions come from the turn log
(pings the bot recorded) and from facts whose ``source_turn_ids`` include the
turn (the extractor resolved who a turn was about; the pipeline never writes
``turns.db``). Only people with a dossier count toward ``max_dossier_people``;
``dossier_tokens`` caps the whole section.

Dossiers are read from the reply's visible scopes only (:mod:`familiar_bot.prompt.scoping`),
the familiar's own included: a person's dossier of another scope is counted as excluded,
never shown. With scopes joined, a person's dossiers of each visible scope are shown
together, the reply's own scope's first.

Dossier prose is LLM output derived from user text and names are user-chosen:
header lines in the prose are escaped and names are collapsed to one line.

``/memory`` shows a person their dossier of the scopes where they ask (its start; the export
holds it whole): ``SPEC.held``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.projectors.dossiers.tables import DOSSIERS
from familiar_pipeline.storage.identity import ego_key, is_ego_key

from familiar_bot.prompt.layers.common import neutralise_headers, one_line
from familiar_bot.prompt.layers.recent_history import window_size
from familiar_bot.prompt.layers.spec import BudgetKnob, HeldPart, LayerSpec
from familiar_bot.prompt.scoping import scope_key, scope_mask, visible_scopes
from familiar_bot.prompt.tokens import cap_blocks

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext

HEADER = "## People in this conversation"
BIO_CHARS = 240


def source_index(snapshot: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(turn ids, fact rows)`` sorted by turn id: every (source turn, fact) pair of the snapshot.

    Built once per published snapshot, so each reply looks up its window with a
    binary search instead of scanning every fact's sources.
    """
    facts = snapshot.table("facts")
    if facts.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    sources = facts["source_turn_ids"]
    flat = pc.list_flatten(sources).to_numpy(zero_copy_only=False).astype(np.int64)
    rows = pc.list_parent_indices(sources).to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(flat, kind="stable")
    return flat[order], rows[order]


def fact_mentions(snapshot: Any, turn_ids: Iterable[int],
                  index: tuple[np.ndarray, np.ndarray] | None = None) -> dict[int, list[str]]:
    """``{turn_id: subject keys}`` from facts citing those turns."""
    turn_ids_sorted, rows = index if index is not None else source_index(snapshot)
    wanted = np.asarray(sorted(set(turn_ids)), dtype=np.int64)
    if wanted.size == 0 or turn_ids_sorted.size == 0:
        return {}
    lo = np.searchsorted(turn_ids_sorted, wanted, side="left")
    hi = np.searchsorted(turn_ids_sorted, wanted, side="right")
    pairs = [(int(t), int(r)) for t, a, b in zip(wanted, lo, hi) for r in rows[a:b]]
    if not pairs:
        return {}
    subjects = snapshot.table("facts")["subjects"].take(pa.array([r for _, r in pairs], pa.int64())).to_pylist()
    found: dict[int, list[str]] = {}
    for (turn_id, _), subs in zip(pairs, subjects):
        keys = found.setdefault(turn_id, [])
        for s in subs or []:
            if s["canonical_key"] not in keys:
                keys.append(s["canonical_key"])
    return found


def candidate_keys(ctx: AssemblyContext, memory: MemoryView) -> list[str]:
    """People of the channel window, most recent first (authors, then mentions), ego excluded."""
    if ctx.channel_id is None:
        return []
    size = window_size(ctx, memory)
    turns = memory.channel_window(ctx.channel_id, size)
    ids = [t.id for t in turns]
    token = memory.window_token(ctx.channel_id)
    logged = memory.memo(("mentions", ctx.channel_id, size, token),
                         lambda: memory.turn_log.mentions_for_turns(ids))
    snapshot = memory.snapshot
    index = memory.memo(("source-index", snapshot.version), lambda: source_index(snapshot))
    derived = fact_mentions(snapshot, ids, index)
    seen: dict[str, None] = {}
    for t in reversed(turns):
        keys = ([t.author_key] if t.author_key and t.role != "assistant" else [])
        keys += logged.get(t.id, []) + sorted(derived.get(t.id, []))
        for key in keys:
            if key and not is_ego_key(key) and key not in seen:
                seen[key] = None
    return list(seen)


def visible_dossiers(snapshot: Any, keys: Iterable[str], visible: tuple[str, ...]) -> tuple[dict[str, str], int]:
    """``{key: dossier text}`` from the ``visible`` scopes' dossiers of ``keys`` (a person's dossiers
    of several visible scopes joined, in ``visible`` order), and how many of their dossiers the
    scope excluded."""
    wanted = pa.array(sorted({str(k) for k in keys}), type=pa.string())
    if len(wanted) == 0:
        return {}, 0
    snap = snapshot.current()
    table = snap.table("people_dossiers")
    table = table.filter(pc.is_in(table["canonical_key"], value_set=wanted))
    seen = table.filter(scope_mask(table, visible))
    order = {scope: i for i, scope in enumerate(visible)}
    texts: dict[str, list[tuple[int, str]]] = {}
    for row in snap.records(DOSSIERS, seen):
        text = row.dossier_text.strip()
        if text:
            texts.setdefault(row.canonical_key, []).append((order.get(row.scope, len(order)), text))
    joined = {key: "\n\n".join(t for _, t in sorted(parts)) for key, parts in texts.items()}
    return joined, table.num_rows - seen.num_rows


def _profile_lines(memory: MemoryView, key: str) -> list[str]:
    person = memory.turn_log.participant(key)
    if person is None:
        return []
    lines = []
    meta = " · ".join(p for p in (f"@{one_line(person.username)}" if person.username else "",
                                  one_line(person.pronouns)) if p)
    if meta:
        lines.append(meta)
    bio = one_line(person.bio)
    if bio:
        lines.append("Bio: " + (bio if len(bio) <= BIO_CHARS else bio[: BIO_CHARS - 1] + "…"))
    return lines


class PeopleDossierLayer:
    name = "people_dossier"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        budget = memory.config.budget_for(ctx.tier)
        window = memory.window_token(ctx.channel_id) if ctx.channel_id is not None else None
        return (f"ch{ctx.channel_id}|g{ctx.guild_id}|{scope_key(ctx, memory)}|w{window}|s{memory.snapshot.version}"
                f"|cap{budget.max_dossier_people},{budget.dossier_tokens},{window_size(ctx, memory)}")

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return self.build_with_debug(ctx, memory)[0]

    def build_with_debug(self, ctx: AssemblyContext, memory: MemoryView) -> tuple[str, dict[str, Any]]:
        budget = memory.config.budget_for(ctx.tier)
        ego = ego_key(memory.config.familiar_id)
        people = candidate_keys(ctx, memory)
        dossiers, excluded = visible_dossiers(memory.snapshot, [ego, *people], visible_scopes(ctx, memory))
        debug = {"scope_excluded": excluded}
        labels = memory.labels(ctx.guild_id)
        blocks = []
        own = dossiers.get(ego, "")
        if own:
            blocks.append(f"### {labels.ego}\n\n{neutralise_headers(own)}")
        shown = 0
        for key in people:
            if shown >= budget.max_dossier_people:
                break
            text = dossiers.get(key, "")
            if not text:
                continue
            shown += 1
            head = "\n".join([f"### {labels(key)}", *_profile_lines(memory, key)])
            blocks.append(f"{head}\n\n{neutralise_headers(text)}")
        kept = cap_blocks(blocks, budget.dossier_tokens)
        if not kept:
            return "", debug
        return HEADER + "\n\n" + "\n\n".join(kept), debug


# --------------------------------------------------------------------------- /memory

DOSSIER_CHARS = 700  # of the dossier in /memory's list; the export holds it whole


def dossier_of(memory: MemoryView, person: str, visible: tuple[str, ...]) -> str:
    """The person's dossiers of the ``visible`` scopes, joined as the layer shows them ("" when none)."""
    try:
        texts, _excluded = visible_dossiers(memory.snapshot, [person], visible)
    except KeyError:  # no dossier projector in this snapshot
        return ""
    return texts.get(person, "")


def _lines(dossier: str) -> list[str]:
    if not dossier:
        return []
    text = one_line(dossier)
    return ["My notes on you: " + (text if len(text) <= DOSSIER_CHARS else text[:DOSSIER_CHARS - 1] + "…")]


def _export(memory: MemoryView, person: str, visible: tuple[str, ...]) -> str | None:
    return dossier_of(memory, person, visible) or None


SPEC = LayerSpec(
    name="people_dossier",
    layer=PeopleDossierLayer,
    position=700,
    scoped=True,
    budget=(BudgetKnob("dossier_tokens", voice=900, text=2400, background=8000),
            BudgetKnob("max_dossier_people", voice=16, text=24, background=32, tokens=False)),
    held=HeldPart("dossier", held=dossier_of, lines=_lines, export=_export),
)
