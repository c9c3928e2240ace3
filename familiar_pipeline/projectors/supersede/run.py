"""Fact supersession (projector `fact_supersede`): newer facts retire the earlier facts they contradict.

Every fact with an id past the watermark is evaluated, oldest first; the
watermark lives in memory.duckdb and is written with the retirements, so a
restart or a crash never skips a fact. (A watermark held in process memory and
primed to the newest fact at start would silently skip every fact written while
the process was down.)

The new facts one extraction batch wrote (one write, one scope) are judged in
one model call (at most `new_facts_per_call` facts per call), whoever they are
about: the prompt holds one section per subject. Within its section each new fact
may retire the newest `priors_max` current facts about that subject with a
*smaller* id (earlier new facts of the section included): a fact can only be
retired by a newer one, and never by one about someone else or said in another
scope (a call holds one scope's facts, and each section's pool only that scope's
current facts). What may be retired is decided in code, not by the model: only ids
shown in that fact's own section and in its own pool, never the new fact itself.
One call per batch rather than one per subject and batch halves the calls of a
chat between two people (issue 51).
Retirement uses the existing-id form of `ProjectionStore.supersede` (nothing
minted; an already-retired prior lands in `skipped`), which also drops the
affected subjects' dossiers so they rebuild clean. Every judged (new fact,
subject) leaves a row in `supersede_decisions` saying what was shown and what
was retired.

Bad output retires nothing and the watermark still advances. A failed model
call (provider down, retries exhausted) stops the run after committing what was
decided, and the next run resumes at the first unevaluated fact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from familiar_pipeline.models.llm import llm_sources
from familiar_pipeline.projectors.facts.store import facts_for_subjects, facts_in_range, latest_fact_id, source_turns
from familiar_pipeline.projectors.facts.tables import Fact

from . import prompt
from .spec import PROJECTOR
from .tables import record_supersede_decisions, supersede

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime


# Facts evaluated between two writes: each write is one short transaction plus a snapshot publish.
FACTS_PER_WRITE = 50


@dataclass
class Decision:
    new_fact_id: int
    subject_key: str
    shown: list[int]
    retire: list[int]
    model: str | None
    scope: str  # the new fact's: where what it retires was decided


def select_priors(new: Fact, key: str, candidates: list[Fact], retired: set[int], priors_max: int) -> list[Fact]:
    """The newest `priors_max` facts about `key` that were current when `new` arrived.

    Candidates must be facts naming `key`; kept are those of the new fact's own scope
    (a fact in one scope never retires a fact in another) with a smaller id,
    not retired (in the store or earlier in this run), and not already over in
    world time when the new fact began.
    """
    kept = [
        f
        for f in candidates
        if f.id < new.id
        and f.id not in retired
        and f.superseded_at is None
        and f.scope == new.scope
        and key in f.subject_keys
        and not (f.valid_to is not None and new.valid_from is not None and f.valid_to <= new.valid_from)
    ]
    return kept[-priors_max:]


@dataclass
class Group:
    """New facts about one subject judged in one call: a section of the prompt."""

    key: str
    label: str
    facts: list[Fact]  # the subject's new facts of this call, ascending by id
    candidates: list[Fact]  # every fact naming `key` up to the chunk's end (select_priors filters)


def whole_writes(facts: list[Fact], limit: int) -> list[Fact]:
    """The first `limit` facts, extended to the end of the write (same `created_at`) the last one belongs to."""
    end = min(limit, len(facts))
    while 0 < end < len(facts) and facts[end].created_at == facts[end - 1].created_at:
        end += 1
    return facts[:end]


def plan_calls(chunk: list[Fact], by_subject: dict[str, list[Fact]], per_call: int) -> list[list[Group]]:
    """The calls that judge the chunk, in order: each the current new facts of one write and scope, in runs
    of `per_call` facts, as one section (`Group`) per subject they name.

    Which of them decide, and what the prompt shows, is settled right before each
    call (`evaluate`), after the retirements of the calls before it. Calls never
    span two writes (facts of one extraction batch share their `created_at`, and a
    chunk never splits a write), so the calls, and with them every prompt, depend
    only on the logs: a rebuild asks exactly what the incremental runs asked,
    whatever the runs' boundaries were.
    """
    written: dict[object, list[Fact]] = {}  # facts written together (one extraction batch), per scope
    for f in chunk:
        if f.superseded_at is None and f.subjects:
            written.setdefault((f.created_at, f.scope), []).append(f)
    calls: list[list[Group]] = []
    for facts in written.values():
        for i in range(0, len(facts), per_call):
            run_facts = facts[i : i + per_call]
            groups = []
            for key in dict.fromkeys(k for f in run_facts for k in f.subject_keys):
                mine = [f for f in run_facts if key in f.subject_keys]
                label = next(s.display_at_write for s in mine[-1].subjects if s.canonical_key == key)
                groups.append(Group(key, label, mine, by_subject.get(key, [])))
            calls.append(sorted(groups, key=lambda g: (g.facts[0].id, g.facts[0].subject_keys.index(g.key))))
    return sorted(calls, key=lambda call: min(f.id for g in call for f in g.facts))


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    knobs = rt.config.memory.fact_supersede
    with rt.store() as store:
        watermark = store.get_watermark(PROJECTOR).fact_id
        latest = latest_fact_id(store)
    report.watermark_before = {"fact_id": watermark}
    evaluated = 0
    failure: Exception | None = None
    for _ in range(rt.config.pipeline.max_batches_per_run):
        if watermark >= latest or failure is not None:
            break
        with rt.store() as store:
            chunk = whole_writes(facts_in_range(store, watermark, latest), FACTS_PER_WRITE)
            keys = sorted({k for f in chunk for k in f.subject_keys})
            upto = chunk[-1].id if chunk else watermark
            # Every status, then filtered in select_priors: world-time expiry is judged
            # against the new fact's valid_from, never the wall clock, so a rebuild sees the same priors.
            by_subject = facts_for_subjects(store, keys, after_id=0, upto_id=upto)
        for new in chunk:
            if new.superseded_at is not None:
                report.drop("new_fact_already_retired")
            elif not new.subjects:
                report.drop("no_subjects")
        retired: set[int] = set()
        calls = plan_calls(chunk, by_subject, knobs.new_facts_per_call)
        decisions: list[Decision] = []
        undecided = {f.id for call in calls for g in call for f in g.facts}
        for call in calls:
            try:
                decisions.extend(evaluate(rt, report, call, retired, knobs.priors_max))
            except Exception as exc:  # the model call failed for good: keep what was decided
                failure = exc
                break
            undecided -= {f.id for g in call for f in g.facts}
        # Facts are done in id order up to the first one still waiting for its call.
        first_open = min(undecided, default=None) if failure is not None else None
        done = [f for f in chunk if first_open is None or f.id < first_open]
        done_upto = done[-1].id if done else watermark
        # Logged in the order one call per fact would have logged them.
        order = {f.id: f.subject_keys for f in chunk}
        decisions = sorted((d for d in decisions if d.new_fact_id <= done_upto),
                           key=lambda d: (d.new_fact_id, order[d.new_fact_id].index(d.subject_key)))
        evaluated += len(done)
        if done_upto > watermark or decisions:
            apply(rt, report, decisions, done_upto)
            watermark = done_upto
    report.batches = evaluated
    report.extra["facts_evaluated"] = evaluated
    report.watermark_after = {"fact_id": watermark}
    if failure is not None:
        report.drop("llm_error")
        raise failure
    if evaluated == 0:
        report.no_op("no new facts")


def evaluate(rt: FamiliarRuntime, report: ProjectionReport, call: list[Group], retired: set[int],
             priors_max: int) -> list[Decision]:
    """One call for the deciders of every section, then each section in order, each decider in id order,
    retires only from its own pool among the ids its section showed; marks `retired`.

    A decider is a new fact with at least one candidate now. Its pool is taken
    after the earlier deciders' retirements, as `select_priors` gives it: the
    ids a one-call-per-fact judge would have been shown, so batching never
    changes which ids may retire. No decider, no call.
    """
    sections: list[tuple[Group, list[Fact], dict[int, Fact]]] = []
    for group in call:
        deciders = [f for f in group.facts if select_priors(f, group.key, group.candidates, retired, priors_max)]
        if not deciders:
            continue
        wide = priors_max + len(deciders) - 1  # earlier deciders may retire some of a later one's priors
        shown = {f.id: f for d in deciders for f in select_priors(d, group.key, group.candidates, retired, wide)}
        sections.append((group, deciders, shown))
    if not sections:
        return []
    ids = {d.id for _, deciders, _ in sections for d in deciders}
    messages = prompt.build_messages([
        prompt.Section(group.key, group.label, [(d.id, d.text) for d in deciders],
                       [(i, shown[i].text) for i in sorted(shown) if i not in {d.id for d in deciders}])
        for group, deciders, shown in sections
    ])
    seen = {f.id: f for _, deciders, shown in sections for f in [*deciders, *shown.values()]}
    # rests on the turns every fact shown (new and prior) was extracted from
    with llm_sources(turns=source_turns(list(seen.values()))):
        reply = rt.llm.complete(messages, json_schema=prompt.REPLY_SCHEMA)
    report.llm_seconds += reply.latency_s
    named, malformed = prompt.parse_reply(reply.text, sorted(ids))
    report.drop("malformed_reply", malformed)
    report.drop("unknown_new_ids", len(set(named) - ids))
    decisions = []
    refused: dict[int, set[int]] = {}  # per decider: named ids no section of it could retire
    for group, deciders, shown in sections:
        for new in deciders:
            pool = select_priors(new, group.key, group.candidates, retired, priors_max)
            if not pool:
                continue  # everything it could retire was retired by an earlier decider
            here = {f.id for f in pool if f.id in shown} - {new.id}
            wanted = [i for i in named.get(new.id, []) if i not in retired]  # retired earlier is no error
            keep = [i for i in wanted if i in here]
            refused[new.id] = {i for i in wanted if i not in here} & refused.get(new.id, set(wanted))
            retired.update(keep)
            decisions.append(Decision(new.id, group.key, [f.id for f in pool], keep, reply.model or None, new.scope))
    report.drop("ids_not_shown", sum(len(named_ids) for named_ids in refused.values()))
    return decisions


def apply(rt: FamiliarRuntime, report: ProjectionReport, decisions: list[Decision], watermark: int) -> None:
    """Retire, log every decision and move the watermark, in one transaction."""
    with rt.store() as store:
        with store.transaction():
            log = []  # written together after the retirements, in the same order (ids from one sequence)
            for d in decisions:
                result = supersede(store, d.retire, d.new_fact_id) if d.retire else None
                done = list(result.superseded) if result else []
                skipped = list(result.skipped) if result else []
                log.append(dict(new_fact_id=d.new_fact_id, subject_key=d.subject_key, shown_prior_ids=d.shown,
                                retired_ids=done, skipped=skipped, model=d.model, scope=d.scope))
                report.rows_written += len(done)
                report.drop("already_retired_skipped", len(skipped))
                if done:
                    report.preview.append({"new_fact": d.new_fact_id, "subject": d.subject_key, "retired": ", ".join(map(str, done))})
                if result and result.dropped_dossiers:
                    report.extra.setdefault("dossiers_dropped", []).extend(result.dropped_dossiers)
            record_supersede_decisions(store, log)
            store.set_watermark(PROJECTOR, fact_id=watermark)
        rt.publish(store)
    report.extra["decisions"] = report.extra.get("decisions", 0) + len(decisions)
