"""Fact supersession (projector `fact_supersede`): newer facts retire the earlier facts they contradict.

Every fact with an id past the watermark is evaluated, oldest first; the
watermark lives in memory.duckdb and is written with the retirements, so a
restart or a crash never skips a fact. (A watermark held in process memory and
primed to the newest fact at start would silently skip every fact written while
the process was down.)

For each subject of the new fact, the model is shown that subject's newest
`priors_max` current facts with a *smaller* id: a fact can only be retired by a
newer one, and never by one about someone else. What may be retired is decided
in code, not by the model: only ids that were shown, never the new fact itself.
Retirement uses the existing-id form of `ProjectionStore.supersede` (nothing
minted; an already-retired prior lands in `skipped`), which also drops the
affected subjects' dossiers so they rebuild clean. Every model call leaves a
row in `supersede_decisions` saying what was shown and what was retired.

Bad output retires nothing and the watermark still advances. A failed model
call (provider down, retries exhausted) stops the run after committing what was
decided, and the next run resumes at the first unevaluated fact.
"""

from __future__ import annotations

from dataclasses import dataclass

from familiar_pipeline.prompts import supersede as prompt
from familiar_pipeline.projectors.spec import FACTS, DropRule, ProjectorSpec, knob
from familiar_pipeline.storage.store import Fact, ProjectionStore


PROJECTOR = "fact_supersede"
# Facts evaluated between two writes: each write is one short transaction plus a snapshot publish.
FACTS_PER_WRITE = 50


@dataclass(frozen=True)
class FactSupersedeConfig:
    """[providers.memory.fact_supersede]"""

    priors_max: int = knob(20, minimum=1)


@dataclass
class Decision:
    new_fact_id: int
    subject_key: str
    shown: list[int]
    retire: list[int]
    model: str | None


def select_priors(new: Fact, key: str, candidates: list[Fact], retired: set[int], priors_max: int) -> list[Fact]:
    """The newest `priors_max` facts about `key` that were current when `new` arrived.

    Candidates must be facts naming `key`; kept are those with a smaller id,
    not retired (in the store or earlier in this run), and not already over in
    world time when the new fact began.
    """
    kept = [
        f
        for f in candidates
        if f.id < new.id
        and f.id not in retired
        and f.superseded_at is None
        and key in f.subject_keys
        and not (f.valid_to is not None and new.valid_from is not None and f.valid_to <= new.valid_from)
    ]
    return kept[-priors_max:]


def accepted_ids(named: list[int], shown: list[Fact], new_id: int) -> tuple[list[int], int]:
    """(ids that may be retired, how many named ids were refused): only shown ids, never the new fact."""
    allowed = {f.id for f in shown} - {new_id}
    keep = [i for i in named if i in allowed]
    return keep, len(named) - len(keep)


def run(rt, report, *, rebuild: bool = False) -> None:
    knobs = rt.config.memory.fact_supersede
    with rt.store() as store:
        watermark = store.get_watermark(PROJECTOR).fact_id
        latest = store.latest_fact_id()
    report.watermark_before = {"fact_id": watermark}
    evaluated = 0
    failure: Exception | None = None
    for _ in range(rt.config.pipeline.max_batches_per_run):
        if watermark >= latest or failure is not None:
            break
        with rt.store() as store:
            chunk = store.facts_in_range(watermark, latest)[:FACTS_PER_WRITE]
            keys = sorted({k for f in chunk for k in f.subject_keys})
            upto = chunk[-1].id if chunk else watermark
            # Every status, then filtered in select_priors: world-time expiry is judged
            # against the new fact's valid_from, never the wall clock, so a rebuild sees the same priors.
            by_subject = {k: store.facts_by_ids(store.fact_ids_for_subject(k, after_id=0, upto_id=upto)) for k in keys}
        decisions: list[Decision] = []
        retired: set[int] = set()
        done_upto = watermark
        for new in chunk:
            try:
                decisions.extend(evaluate(rt, report, new, by_subject, retired, knobs.priors_max))
            except Exception as exc:  # the model call failed for good: keep what was decided
                failure = exc
                break
            done_upto = new.id
            evaluated += 1
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
        report.status = "no-op"
        report.reason = "no new facts"


def evaluate(rt, report, new: Fact, by_subject: dict[str, list[Fact]], retired: set[int], priors_max: int) -> list[Decision]:
    """Ask, per subject of `new`, which shown priors it retires; marks them in `retired`."""
    if new.superseded_at is not None:
        report.drop("new_fact_already_retired")
        return []
    if not new.subjects:
        report.drop("no_subjects")
        return []
    decisions = []
    for subject in new.subjects:
        shown = select_priors(new, subject.canonical_key, by_subject.get(subject.canonical_key, []), retired, priors_max)
        if not shown:
            continue
        messages = prompt.build_messages(
            subject_key=subject.canonical_key,
            subject_label=subject.display_at_write,
            new_fact=(new.id, new.text),
            priors=[(f.id, f.text) for f in shown],
        )
        reply = rt.llm.complete(messages)
        report.llm_seconds += reply.latency_s
        named, malformed = prompt.parse_reply(reply.text)
        if malformed:
            report.drop("malformed_reply")
        keep, refused = accepted_ids(named, shown, new.id)
        report.drop("ids_not_shown", refused)
        retired.update(keep)
        decisions.append(Decision(new.id, subject.canonical_key, [f.id for f in shown], keep, reply.model or None))
    return decisions


def apply(rt, report, decisions: list[Decision], watermark: int) -> None:
    """Retire, log every decision and move the watermark, in one transaction."""
    with rt.store() as store:
        with store.transaction():
            for d in decisions:
                result = store.supersede(d.retire, d.new_fact_id) if d.retire else None
                done = list(result.superseded) if result else []
                skipped = list(result.skipped) if result else []
                store.record_supersede_decision(
                    new_fact_id=d.new_fact_id, subject_key=d.subject_key, shown_prior_ids=d.shown,
                    retired_ids=done, skipped=skipped, model=d.model,
                )
                report.rows_written += len(done)
                report.drop("already_retired_skipped", len(skipped))
                if done:
                    report.preview.append({"new_fact": d.new_fact_id, "subject": d.subject_key, "retired": ", ".join(map(str, done))})
                if result and result.dropped_dossiers:
                    report.extra.setdefault("dossiers_dropped", []).extend(result.dropped_dossiers)
            store.set_watermark(PROJECTOR, fact_id=watermark)
        rt.publish(store)
    report.extra["decisions"] = report.extra.get("decisions", 0) + len(decisions)


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="fact_supersessions",
    run=run,
    description="""Retires facts that a newer fact about the same person contradicts or replaces (projector `fact_supersede`).

    Every new fact is evaluated oldest first against the newest `priors_max` current facts about each of its
    subjects with a smaller id. Only ids shown to the model can be retired; nothing is deleted (facts get
    `superseded_at`/`superseded_by`); each model call is logged in `supersede_decisions`; the affected
    subjects' dossiers are dropped so they rebuild clean. The watermark (a fact id) advances even on bad output.
    """,
    group="facts",
    kinds={"duckdb", "llm"},
    inputs=("facts",),
    trigger=FACTS,
    knobs=FactSupersedeConfig,
    # Every retirement becomes current again; that changes what is current for those facts'
    # subjects, so their dossiers go, exactly as retiring them did.
    drop=DropRule(tables=("supersede_decisions",), sequences=("supersede_decisions_id_seq",),
                  before=ProjectionStore.unretire_all),
)
