"""People dossiers (projector `people_dossier`): one compounding dossier per subject, the familiar included.

The dossier advances `batches_per_fold` extraction batches at a time: it walks
the same turn batches the fact extractor cut (`facts.processed_batch`), up to the
extractor's watermark, and at every `batches_per_fold`-th batch end T (counted from
the dossier watermark, itself such a step), or sooner at a batch the quiet rules cut
short, folds, for every subject those batches touched, that subject's facts past its
own `last_fact_id` up to the fact
horizon at T (see `horizon`). A subject with a fact retired in that step is
rebuilt from all its facts current at that point, with no prior text: the
incremental "prior + new facts" fold never un-bakes a retired fact, which is
why `supersede()` deletes those dossiers. Because each step depends only on the
logs, an incremental build and a rebuild send the same prompts.

The familiar's own record (`ego:<id>`) has its own prompt, keeps only facts with
importance >= 5 or unknown, ordered by importance (unknown ranks as 5). When a
step brings it only low-importance texture, the prior text is kept and its
`last_fact_id` advances. An empty model reply writes nothing and moves nothing
for that subject; its facts are folded again at the next step.

The walk waits for supersession (when `fact_supersede` is active) so it never
folds a step whose retirements have not been decided yet. Supersession may run
ahead, though, and its retirements delete dossiers at once; so a subject that
already has a retirement recorded past the current step is left alone until
that step, where it is rebuilt from scratch anyway. This keeps the end state
independent of how far supersession had run when each step was folded.
A subject whose fold got an empty reply is folded again at its next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from familiar_pipeline.models.llm import llm_sources
from familiar_pipeline.projectors.facts.batches import processed_batch
from familiar_pipeline.projectors.facts.store import (
    fact_horizon,
    fact_ids_existing,
    fact_ids_for_subject,
    facts_by_ids,
    facts_in_range,
    facts_retired_between,
    latest_fact_id,
    source_turns,
    source_turns_of,
)
from familiar_pipeline.projectors.facts.tables import Fact
from familiar_pipeline.projectors.horizon import current_at
from familiar_pipeline.projectors.prompting import MAX_PROSE_CHARS
from familiar_pipeline.storage.identity import is_ego_key
from familiar_pipeline.storage.records import Watermark
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import Turn, TurnLog, as_they_were

from . import prompt
from .spec import PROJECTOR
from .tables import DOSSIERS, delete_dossier_rows, get_dossier, put_dossier

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime

EGO_MIN_IMPORTANCE = 5


@dataclass(frozen=True)
class Step:
    turn_id: int  # end of the extraction batch
    horizon: int  # fact horizon at that turn


@dataclass
class Plan:
    """What one subject needs at one step, read while the store was open."""

    key: str
    label: str
    prior_text: str | None
    facts: list[Fact]  # the facts to fold, ascending by id (before the ego filter)
    rebuild: bool
    last_fact_id: int  # what last_fact_id becomes when the fold succeeds
    sources: tuple[int, ...] = ()  # every fact the dossier then rests on (its provenance)
    scope: str = ""  # where those facts were said
    prior_turns: frozenset[int] = frozenset()  # the turns the prior text rests on (its facts')
    prior_incomplete: bool = False  # some fact of the prior text is gone: its turns are unknown


def ego_selection(facts: list[Fact]) -> list[Fact]:
    """Facts worth the always-injected self-record: importance >= 5 or unknown, most important first."""
    kept = [f for f in facts if f.importance is None or f.importance >= EGO_MIN_IMPORTANCE]
    return sorted(kept, key=lambda f: -(f.importance if f.importance is not None else EGO_MIN_IMPORTANCE))


def plan_subject(store: ProjectionStore, key: str, scope: str, step: Step, *, invalidated: bool,
                 ego_label: str) -> Plan | None:
    """What the dossier of `key` in `scope` needs at `step`: only that scope's facts are folded into it."""
    prior = get_dossier(store, key, scope)
    rebuild = invalidated or prior is None
    after = 0 if rebuild or prior is None else prior.last_fact_id
    ids = fact_ids_for_subject(store, key, after_id=after, upto_id=step.horizon)
    facts = [f for f in facts_by_ids(store, ids) if f.scope == scope and current_at(f, step.horizon)]
    if not facts and not (rebuild and prior is not None):
        return None
    label = ego_label if is_ego_key(key) else _label(facts, key)
    kept = () if rebuild or prior is None else prior.source_fact_ids
    prior_turns, whole = source_turns_of(store, kept)
    return Plan(key, label, None if rebuild or prior is None else prior.dossier_text, facts, rebuild,
                max([after, *ids]), tuple(dict.fromkeys([*kept, *(f.id for f in facts)])), scope,
                frozenset(prior_turns), not whole)


def change_weight(facts: list[Fact]) -> int:
    """How much unfolded facts change a dossier: their importance summed, an unknown one counting as
    `EGO_MIN_IMPORTANCE` (the middle of the 1-10 scale)."""
    return sum(f.importance if f.importance is not None else EGO_MIN_IMPORTANCE for f in facts)


def _label(facts: list[Fact], key: str) -> str:
    for fact in reversed(facts):
        for subject in fact.subjects:
            if subject.canonical_key == key and subject.display_at_write.strip():
                return subject.display_at_write
    return key


def steps_pending(rt: FamiliarRuntime, store: ProjectionStore, watermark_turn: int, watermark_fact: int) -> list[Step]:
    """Extraction-batch ends past the watermark that are ready to fold, oldest first."""
    cfg = rt.config
    rich = store.get_watermark("rich_note").turn_id
    supersede_ready = store.get_watermark("fact_supersede").fact_id if cfg.memory.is_active("fact_supersede") else None
    per_fold = cfg.memory.people_dossier.batches_per_fold
    turn_log = rt.turn_log()
    steps: list[Step] = []
    after, horizon, walked = watermark_turn, watermark_fact, 0
    while len(steps) < cfg.pipeline.max_batches_per_run:
        batch = processed_batch(turn_log, after, rich, cfg.memory.rich_note)
        if not batch:
            break
        after, walked = batch[-1].id, walked + 1
        horizon = max(horizon, fact_horizon(store, batch[-1].id))
        # A fold every `batches_per_fold` batches (fewer calls), and at every batch the quiet
        # rules cut short (the talk paused: fold now, not when more talk comes). Both follow
        # from the turns alone, so a rebuild folds at the same steps.
        if walked % per_fold and len(batch) >= cfg.memory.rich_note.batch_size:
            continue
        if supersede_ready is not None and supersede_ready < horizon:
            break
        steps.append(Step(batch[-1].id, horizon))
        walked = 0  # count from this step, as the next run will from its watermark
    return steps


def fold(rt: FamiliarRuntime, report: ProjectionReport, plan: Plan, max_facts: int) -> str | None:
    """The new dossier text, or None when the model gave nothing (or there was nothing worth folding)."""
    ego = is_ego_key(plan.key)
    text = plan.prior_text
    # What `text` rests on, for the response cache: the prior's facts' turns, then each folded chunk's.
    # A prior fact that is gone leaves only a bound: every fact rests on turns the log holds.
    rests_on = set(plan.prior_turns)
    upto = rt.turn_log().latest_id() if plan.prior_incomplete else None
    chunks = [plan.facts[i : i + max_facts] for i in range(0, len(plan.facts), max_facts)]
    folded_any = False
    for chunk in chunks:
        selected = ego_selection(chunk) if ego else chunk
        if not selected:
            report.drop("ego_texture_only")
            continue
        lines = [
            prompt.fact_line(f.text, f.importance, ego=ego, until=f.valid_to.date().isoformat() if f.valid_to else None)
            for f in selected
        ]
        messages = prompt.build_messages(label=plan.label, subject_key=plan.key, prior_text=text, fact_lines=lines, ego=ego)
        rests_on |= source_turns(selected)
        with llm_sources(turns=rests_on, upto=upto):
            reply = rt.llm.complete(messages)
        report.llm_seconds += reply.latency_s
        new_text = prompt.parse_reply(reply.text, ego=ego)
        if len(new_text) > MAX_PROSE_CHARS:
            report.drop("oversized_reply")  # the prior dossier stands
            return None
        if not new_text:
            report.drop("empty_reply")
            return None
        text, folded_any = new_text, True
    if not folded_any and not text:
        return None
    return text


# More changed messages than this since the dossiers last looked: rebuild instead of redacting.
REDACT_MAX_MESSAGES = 20


def removed_messages(turn_log: TurnLog, change_seq: int) -> tuple[list[tuple[Turn, str | None]], int]:
    """The turns changed past `change_seq` as they were (with the new text of an edit that stands), and the last seq."""
    changes = turn_log.changes_after(change_seq)
    if not changes:
        return [], change_seq
    now = {t.id: t for t in turn_log.turns_by_ids({c.turn_id for c in changes})}
    return as_they_were(changes, now), changes[-1].seq


def rebuild_stale(rt: FamiliarRuntime, report: ProjectionReport, mark: Watermark) -> int:
    """Take edited and deleted messages out of every dossier that folded a fact which is gone; how many.

    Such a dossier's text may still say what the removed fact said. A subject whose current
    facts fit one prompt is folded again from them, with no prior text (exactly what a rebuild
    writes); a longer one costs one call instead, which rewrites the dossier without the
    changed messages' words (a rebuild from every fact would cost one call per
    `max_facts_per_prompt` facts). When the model gives nothing, or no fact is left, the
    dossier is deleted rather than kept. The watermark's `change_seq` follows the turn log; a
    run with no change past it does not look (facts go only through changes, or a rebuild,
    which drops the dossiers too).
    """
    knobs = rt.config.memory.people_dossier
    removed, seq = removed_messages(rt.turn_log(), mark.change_seq)
    if seq == mark.change_seq:
        return 0
    with rt.store() as store:
        stale: list[tuple[str, str]] = [(key, scope) for key, scope in store.stale_keys(DOSSIERS)]
        if not stale:
            store.set_watermark(PROJECTOR, change_seq=seq)
            return 0
        step = Step(mark.turn_id, mark.fact_id)
        plans = {pair: plan_subject(store, *pair, step, invalidated=True, ego_label=rt.config.display_name)
                 for pair in stale}
        priors = {pair: get_dossier(store, *pair) for pair in stale}
        existing = set(fact_ids_existing(store, [i for p in priors.values() if p for i in p.source_fact_ids]))
        prior_turns = {pair: source_turns_of(store, p.source_fact_ids) for pair, p in priors.items() if p}
    writes: dict[tuple[str, str], tuple[str, tuple[int, ...], int]] = {}
    redacted = 0
    for pair in stale:
        key = pair[0]
        plan, prior = plans[pair], priors[pair]
        if plan is None or prior is None:
            continue
        if len(plan.facts) <= knobs.max_facts_per_prompt or not removed or len(removed) > REDACT_MAX_MESSAGES:
            text = fold(rt, report, plan, knobs.max_facts_per_prompt)
            if text:
                writes[pair] = (text, plan.sources, plan.last_fact_id)
            continue
        # rests on the record's facts' turns (a bound when some are gone, as they are here) and the changed turns
        turns, whole = prior_turns[pair]
        with llm_sources(turns=[*turns, *(t.id for t, _ in removed)],
                         upto=None if whole else rt.turn_log().latest_id()):
            reply = rt.llm.complete(prompt.build_redact_messages(label=plan.label, subject_key=key,
                                                                 text=prior.dossier_text, removed=removed))
        report.llm_seconds += reply.latency_s
        text = prompt.parse_reply(reply.text, ego=is_ego_key(key))
        if text and len(text) <= MAX_PROSE_CHARS:
            writes[pair] = (text, tuple(i for i in prior.source_fact_ids if i in existing), prior.last_fact_id)
            redacted += 1
        else:
            report.drop("empty_reply" if not text else "oversized_reply")
    with rt.store() as store:
        with store.transaction():
            delete_dossier_rows(store, [pair for pair in stale if pair not in writes])
            for (key, scope), (text, sources, last) in writes.items():
                put_dossier(store, key, text, last, source_fact_ids=sources, scope=scope)
            store.set_watermark(PROJECTOR, change_seq=seq)
        rt.publish(store)
    report.rows_written += len(writes)
    report.extra["stale_dossiers"] = (f"{len(stale)} folded a removed fact: {len(writes) - redacted} folded again, "
                                      f"{redacted} redacted, {len(stale) - len(writes)} deleted")
    return len(stale)


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    cfg = rt.config
    ego_label = cfg.display_name
    with rt.store() as store:
        mark = store.get_watermark(PROJECTOR)
        steps = steps_pending(rt, store, mark.turn_id, mark.fact_id)
    stale = 0 if rebuild else rebuild_stale(rt, report, mark)
    report.watermark_before = {"turn_id": mark.turn_id, "fact_id": mark.fact_id}
    previous = mark.fact_id
    for step in steps:
        with rt.store() as store:
            # one dossier per subject and scope: a fact folds only into its own scope's
            touched = {(k, f.scope) for f in facts_in_range(store, previous, step.horizon) for k in f.subject_keys}
            invalidated = {(k, f.scope) for f in facts_retired_between(store, previous, step.horizon)
                           for k in f.subject_keys}
            deferred = {(k, f.scope) for f in facts_retired_between(store, step.horizon, latest_fact_id(store))
                        for k in f.subject_keys}
            report.drop("deferred_until_rebuild", len((touched | invalidated) & deferred))
            plans = [
                p
                for key, scope in sorted((touched | invalidated) - deferred)
                if (p := plan_subject(store, key, scope, step, invalidated=(key, scope) in invalidated,
                                      ego_label=ego_label))
            ]
        # What changed decides the call: a new or rebuilt dossier folds now, an existing one once its
        # unfolded facts weigh enough; until then they wait (its last_fact_id stays) for a later step.
        due = [p for p in plans if p.rebuild or change_weight(p.facts) >= cfg.memory.people_dossier.fold_min_weight]
        if len(due) < len(plans):
            report.extra["folds_waiting"] = report.extra.get("folds_waiting", 0) + len(plans) - len(due)
            plans = due
        writes: dict[tuple[str, str], tuple[str, Plan]] = {}
        for plan in plans:
            text = fold(rt, report, plan, cfg.memory.people_dossier.max_facts_per_prompt)
            if text:
                writes[(plan.key, plan.scope)] = (text, plan)
        report.batches += 1
        with rt.store() as store:
            with store.transaction():
                # A rebuilt subject loses its old text even when the model gave nothing:
                # the old text still carries the retired facts.
                delete_dossier_rows(store, [(p.key, p.scope) for p in plans
                                            if p.rebuild and (p.key, p.scope) not in writes])
                for (key, scope), (text, plan) in writes.items():
                    put_dossier(store, key, text, plan.last_fact_id, source_fact_ids=plan.sources, scope=scope)
                store.set_watermark(PROJECTOR, turn_id=step.turn_id, fact_id=step.horizon)
            rt.publish(store)
        report.rows_written += len(writes)
        report.preview.extend({"subject": k, "scope": scope, "last_fact_id": v[1].last_fact_id, "chars": len(v[0])}
                              for (k, scope), v in writes.items())  # never the text
        previous = step.horizon
    last = steps[-1] if steps else None
    report.watermark_after = {"turn_id": last.turn_id if last else mark.turn_id, "fact_id": previous}
    if not steps and not stale:
        report.no_op("no new extraction batch (or supersession has not caught up)")
