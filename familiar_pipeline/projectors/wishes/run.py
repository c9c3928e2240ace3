"""Standing wishes (projector `standing_wish`): detect wishes in people's turns, keep the newest per point.

Like the turn index it needs no model and follows the turn log exactly: the watermark is
(last turn id read, last change seq applied, last fact id read). New turns are read in batches of
``batch_size``; each person's turn (not the familiar's, not a deleted one) is run through
``detect.detect`` and its wishes stored with the turn as their provenance. An edited or
deleted turn loses its wishes and an edited one is read again. After each write the
(person, scope, point) groups it touched are retired again from their rows
(``tables.retire``), so the newest wish on a point is the current one whatever order
the turns were read or changed in, and a rebuild builds the same rows.

Where the extractor runs (`facts`, which this projector reads and runs after), a fact of
kind "wish" adds the wish it names, as the sentence of the person's own turn that says it
(`fact_drafts`), unless the heuristic already found that point in that turn. It rests on
the turn like any other wish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from familiar_pipeline.projectors.facts.store import latest_fact_id, wish_facts_after
from familiar_pipeline.projectors.facts.tables import Fact
from familiar_pipeline.storage.scopes import turn_scope
from familiar_pipeline.storage.turns import Turn

from .detect import detect, said_in
from .spec import PROJECTOR
from .tables import WishDraft, delete_resting_on, insert_wishes, retire, said_points

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime


def drafts(turns: Iterable[Turn], max_chars: int) -> list[WishDraft]:
    """The wishes people stated in these turns (the familiar's own turns and deleted ones say none)."""
    out = []
    for turn in turns:
        if turn.deleted or turn.role != "user" or not turn.author_key or not turn.content.strip():
            continue
        for wish in detect(turn.content, limit=max_chars):
            out.append(WishDraft(turn.author_key, wish.point, wish.text, turn.id, turn.channel_id,
                                 turn.created_at, turn_scope(turn)))
    return out


def fact_drafts(facts: Iterable[Fact], turns: dict[int, Turn], max_chars: int) -> list[WishDraft]:
    """The wishes the extractor found (facts of kind "wish"), each as the sentence of its person's
    own turn that says it (`detect.said_in`); a fact whose person said no such sentence gives none."""
    out = []
    for fact in facts:
        if len(fact.subject_keys) != 1:
            continue
        person = fact.subject_keys[0]
        for turn_id in fact.source_turn_ids:
            turn = turns.get(turn_id)
            if turn is None or turn.deleted or turn.role != "user" or turn.author_key != person:
                continue
            wish = said_in(turn.content, fact.text, limit=max_chars)
            if wish is not None:
                out.append(WishDraft(person, wish.point, wish.text, turn.id, turn.channel_id, turn.created_at,
                                     turn_scope(turn)))
                break
    return out


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    knobs = rt.config.memory.standing_wish
    turn_log = rt.turn_log()
    with rt.store() as store:
        mark = store.get_watermark(PROJECTOR)
    turn_wm, change_wm = mark.turn_id, mark.change_seq
    report.watermark_before = {"turn_id": turn_wm, "change_seq": change_wm}
    latest_change = turn_log.latest_change_seq()
    if turn_wm == 0:
        change_wm = latest_change  # every turn is read below with its current text
    removed = retired = 0

    def write(found: list[WishDraft], gone: list[int], position: int, seq: int) -> None:
        nonlocal removed, retired
        with rt.store() as store:
            with store.transaction():
                groups = delete_resting_on(store, gone)
                removed += len(groups)
                ids = insert_wishes(store, found)
                retired += retire(store, [*groups, *((d.person_key, d.scope, d.point) for d in found)])
                store.set_watermark(PROJECTOR, turn_id=position, change_seq=seq)
            if found or groups:
                report.rows_written += len(ids)
                report.preview.extend({"wish": i, "turn": d.turn_id, "point": d.point.split(":")[0]}
                                      for i, d in zip(ids, found))
            rt.publish(store)

    for _ in range(rt.config.pipeline.max_batches_per_run):
        chunk = turn_log.turns_after(turn_wm, limit=knobs.batch_size)
        if not chunk:
            break
        report.turns_read += len(chunk)
        report.batches += 1
        turn_wm = chunk[-1].id
        write(drafts(chunk, knobs.max_chars), [], turn_wm, change_wm)

    if change_wm < latest_change:
        changed = sorted({c.turn_id for c in turn_log.changes_after(change_wm)
                          if c.seq <= latest_change and c.turn_id <= turn_wm})
        change_wm = latest_change
        write(drafts(turn_log.turns_by_ids(changed), knobs.max_chars), changed, turn_wm, change_wm)
        report.extra["changed_turns"] = len(changed)

    # Wishes the extractor found, where it runs (facts of kind "wish", after this watermark's fact id):
    # read after the turns, so a turn edited above has lost its old wishes before its new facts add theirs.
    fact_wm = mark.fact_id
    with rt.store() as store:
        latest_fact = latest_fact_id(store)
        wish_facts = wish_facts_after(store, fact_wm) if latest_fact > fact_wm else []
    if latest_fact > fact_wm:
        turns = {t.id: t for t in turn_log.turns_by_ids(sorted({i for f in wish_facts for i in f.source_turn_ids}))}
        found = fact_drafts(wish_facts, turns, knobs.max_chars)
        with rt.store() as store:
            said = said_points(store, [d.turn_id for d in found])
        fresh = [d for d in found if (d.person_key, d.turn_id, d.point) not in said]  # the heuristic's already
        with rt.store() as store:
            with store.transaction():
                ids = insert_wishes(store, fresh)
                retired += retire(store, [(d.person_key, d.scope, d.point) for d in fresh])
                store.set_watermark(PROJECTOR, fact_id=latest_fact)
            rt.publish(store)
        report.rows_written += len(ids)
        report.preview.extend({"wish": i, "turn": d.turn_id, "point": d.point.split(":")[0], "from": "facts"}
                              for i, d in zip(ids, fresh))
        report.extra["wish_facts"] = len(wish_facts)
        report.extra["from_facts"] = len(ids)
        fact_wm = latest_fact

    report.watermark_after = {"turn_id": turn_wm, "change_seq": change_wm, "fact_id": fact_wm}
    report.extra["removed"] = removed
    report.extra["retired"] = retired
    if report.batches == 0 and not report.extra.get("changed_turns") and "wish_facts" not in report.extra:
        report.no_op("no new or changed turns")
