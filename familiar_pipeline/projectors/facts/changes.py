"""Edited and deleted turns, followed into memory: what such a turn produced stops being remembered.

The turn log records every edit and deletion in `turn_changes`, numbered (`seq`). The fact
extractor keeps how far it has followed them as its watermark's `change_seq`; each run first
takes the changes past it. A changed turn the extractor has not reached yet needs nothing:
its batch will be read as it is now. For one it has already extracted:

* every fact citing it is removed, with its subjects, vectors, full-text entry and
  supersession decisions, even a fact that also cites other turns (its words may be the
  changed turn's). The facts it had retired are current again, and are judged anew by
  the next fact about their subject that supersession sees;
* reflections citing the turn or a removed fact are removed (they are not rewritten: the next
  window reflects again);
* an edited turn that still stands is extracted again, alone (one model call), so what it
  says now is remembered; a deleted one is not.

The removals go by the declared provenance (`ProjectionStore.remove_resting_on`), so this
module names no other projector's table. Rows whose projector follows changes itself notice
by their provenance: a dossier that folded a removed fact is rebuilt or redacted by the next
dossier run (`dossiers.run.rebuild_stale`), and the summary of the turn's scope is folded again
or redacted (`summary.run.refold_changed`). What differs from a rebuild (`familiar backfill
--rebuild`): it re-extracts the changed turn's whole batch, so a fact that also rested on other
turns of that batch can come back there; following changes costs one call per edited turn
here and none per deletion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import Turn, TurnLog

from .store import FactDraft


@dataclass
class Followed:
    """What following the changes did: which turns, which rows went, which turns to extract again."""

    change_seq: int
    turns: list[int] = field(default_factory=list)  # changed turns the extractor had already read
    facts_removed: list[int] = field(default_factory=list)
    facts_restored: list[int] = field(default_factory=list)  # retired by a removed fact: current again
    removed: dict[str, int] = field(default_factory=dict)  # rows deleted per table
    to_extract: list[Turn] = field(default_factory=list)  # edited turns that still stand


def pending_changes(turn_log: TurnLog, after_seq: int, extracted_upto: int) -> Followed:
    """The changes past `after_seq` to turns at or before `extracted_upto`, and the seq they run to."""
    changes = turn_log.changes_after(after_seq)
    followed = Followed(change_seq=changes[-1].seq if changes else after_seq)
    ids = sorted({c.turn_id for c in changes if c.turn_id <= extracted_upto})
    followed.turns = ids
    followed.to_extract = [t for t in turn_log.turns_by_ids(ids) if not t.deleted]
    return followed


def facts_citing(store: ProjectionStore, turn_ids: Iterable[int]) -> list[int]:
    """Ids of the facts whose source turns include any of `turn_ids`, ascending."""
    wanted = sorted(set(turn_ids))
    if not wanted:
        return []
    rows = store.sql("SELECT id FROM facts WHERE list_has_any(source_turn_ids, ?::BIGINT[]) ORDER BY id",
                     [wanted]).fetchall()
    return [int(r[0]) for r in rows]


def forget_changed(store: ProjectionStore, followed: Followed) -> Followed:
    """Remove what the changed turns produced, in one transaction; `followed`, filled in.

    The facts they retired are made current first (supersession's columns are the facts'
    own); then the kernel removes every row resting on the turns, through the declared
    provenance (`ProjectionStore.remove_resting_on`): the facts, and what was built on them.
    """
    with store.transaction():
        followed.facts_removed = facts_citing(store, followed.turns)
        if followed.facts_removed:
            followed.facts_restored = [int(r[0]) for r in store.sql(
                "UPDATE facts SET superseded_at = NULL, superseded_by = NULL "
                "WHERE superseded_by IN (SELECT unnest(?::BIGINT[])) "
                "AND NOT list_has_any(source_turn_ids, ?::BIGINT[]) RETURNING id",
                [followed.facts_removed, followed.turns]).fetchall()]
        followed.removed = store.remove_resting_on(followed.turns)
    return followed


def forget_subject(store: ProjectionStore, key: str, scope: str | None = None) -> set[int]:
    """Remove the facts about a forgotten person (in `scope`; None: every scope), whoever's words taught
    them, with everything built on them, in one transaction; the turns those facts rested on (so the
    cached replies that derived them go too).

    Their own turns' facts go by provenance like any deleted turn's (`forget_changed`); these are
    the facts about them that rest on other people's turns ("Ana's sister is a nurse", said by
    Ben). Ben's turn stays, it is his; what memory derived about Ana from it does not. The facts
    they had retired are current again, as when a changed turn's facts go.
    """
    where = "id IN (SELECT fact_id FROM fact_subjects WHERE canonical_key = ?)"
    params: list = [key]
    if scope is not None:
        where += " AND scope = ?"
        params.append(scope)
    with store.transaction():
        found = store.sql(f"SELECT id, source_turn_ids FROM facts WHERE {where} ORDER BY id", params).fetchall()
        ids = [int(r[0]) for r in found]
        if ids:
            store.sql("UPDATE facts SET superseded_at = NULL, superseded_by = NULL "
                      "WHERE superseded_by IN (SELECT unnest(?::BIGINT[])) AND id NOT IN (SELECT unnest(?::BIGINT[]))",
                      [ids, ids])
            store.sql("DELETE FROM facts WHERE id IN (SELECT unnest(?::BIGINT[]))", [ids])
            store.remove_resting_on([])  # what was built through them: subjects, vectors, decisions, reflections
    return {int(t) for r in found for t in (r[1] or ())}


def about_forgotten(draft: FactDraft, forgotten: Iterable[tuple[str, str, int]], after_forget: str) -> bool:
    """Whether a new fact is about a forgotten person (`TurnLog.forgotten_people`: key, scope or "*",
    the last turn when they were forgotten), so it is not kept: with "opt_out", any fact about them
    in that scope, whoever's words; with "new", one resting only on turns from before they were
    forgotten (a rebuild re-reading someone else's old message about them)."""
    keys = {s.canonical_key for s in draft.subjects}
    for key, scope, upto in forgotten:
        if key in keys and scope in ("*", draft.scope):
            if after_forget == "opt_out" or max(draft.source_turn_ids, default=0) <= upto:
                return True
    return False
