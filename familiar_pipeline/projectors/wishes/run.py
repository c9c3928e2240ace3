"""Standing wishes (projector `standing_wish`): detect wishes in people's turns, keep the newest per point.

Like the turn index it needs no model and follows the turn log exactly: the watermark is
(last turn id read, last change seq applied). New turns are read in batches of
``batch_size``; each person's turn (not the familiar's, not a deleted one) is run through
``detect.detect`` and its wishes stored with the turn as their provenance. An edited or
deleted turn loses its wishes and an edited one is read again. After each write the
(person, scope, point) groups it touched are retired again from their rows
(``tables.retire``), so the newest wish on a point is the current one whatever order
the turns were read or changed in, and a rebuild builds the same rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from familiar_pipeline.storage.scopes import turn_scope
from familiar_pipeline.storage.turns import Turn

from .detect import detect
from .tables import WishDraft, delete_resting_on, insert_wishes, retire

if TYPE_CHECKING:
    from familiar_pipeline.projectors.report import ProjectionReport
    from familiar_pipeline.projectors.runtime import FamiliarRuntime

PROJECTOR = "standing_wish"


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

    report.watermark_after = {"turn_id": turn_wm, "change_seq": change_wm}
    report.extra["removed"] = removed
    report.extra["retired"] = retired
    if report.batches == 0 and not report.extra.get("changed_turns"):
        report.no_op("no new or changed turns")
