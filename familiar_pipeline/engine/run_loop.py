"""The projection step's run loop, without Dagster: each familiar of a run through the selected projectors.

`run_familiars` walks the step's work order (`schedule.WorkOrder`: two passes, a busy familiar
requeued, blocked followers, yielding to a waiting run) and yields what each familiar's visit
produced (`FamiliarPass`); `project_familiar` is one visit: one writer lock, one store connection,
each projector (`run_projector`) followed by its invariant checks, the erasure purge at the end of
the familiar's last pass, one snapshot publish, then the kernel's checks. `defs/assets.py` builds
the work order and the checks, opens the runtimes through its resources, and reports each pass as
Dagster materializations and check evaluations.

What the loop needs from the Dagster side comes in through two small protocols: `InlineCheck` (a
check it evaluates on the familiar's open runtime and whose result may hold back followers) and
`OpenRuntime` (the familiar's runtime, its config loaded), so it imports nothing above the engine
(the erasure purge it runs last sits below it and is handed the registered specs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Protocol

from familiar_pipeline.engine import registry
from familiar_pipeline.engine.report import ProjectionReport
from familiar_pipeline.engine.runtime import FamiliarBusy, FamiliarRuntime, NoModelConfigured
from familiar_pipeline.engine.schedule import WorkOrder, hold_followers
from familiar_pipeline.engine.spec import ProjectorSpec
from familiar_pipeline.erasure.purge import purge
from familiar_pipeline.models.llm import LlmUsage

# The kind of a check evaluated right after its asset's projector (a projector's invariant); any
# other kind is the kernel's, evaluated once per familiar after the publish.
INVARIANT = "invariant"


class InlineCheck(Protocol):
    """A check the loop evaluates on a familiar's open runtime (`defs.checks.MemoryCheck`)."""

    @property
    def name(self) -> str: ...

    @property
    def asset(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def key(self) -> Hashable: ...

    def evaluate(self, runtime: Any, familiar_id: str) -> Any: ...

    def holds_back(self, result: Any) -> bool:
        """Whether this result holds back what is built on the asset for the familiar (a failed blocking check)."""
        ...


class OpenRuntime(Protocol):
    """The familiar's runtime with its effective config loaded; `needs_embedder`: a projector of the pass embeds."""

    def __call__(self, familiar_id: str, *, needs_embedder: bool) -> FamiliarRuntime: ...


@dataclass
class ProjectorResult:
    """One projector's run over one familiar, as its asset's materialization shows it: its report, its
    effective knobs, and its time and model usage taken when it finished (the step goes on after it);
    `extra`: what the step adds to it (the purge's figures)."""

    report: ProjectionReport
    knobs: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)  # `LlmUsage.as_metadata()` of its own model calls
    duration_s: float = 0.0
    extra: dict = field(default_factory=dict)


@dataclass
class FamiliarPass:
    """What one familiar's part of a step produced: per asset its result, or its error, and the checks' results."""

    results: dict[str, ProjectorResult] = field(default_factory=dict)
    failed: dict[str, Exception] = field(default_factory=dict)  # asset -> what its projector raised
    checks: dict[Any, Any] = field(default_factory=dict)  # check key -> its result
    published: bool = False  # a snapshot was published for the familiar (its manifest changed)


def run_projector(spec: ProjectorSpec, runtime: Any, cfg: Any, *, rebuild: bool) -> ProjectorResult:
    """One projector over one familiar's open runtime: drop first on `rebuild`, run; its result."""
    knobs_obj = cfg.memory.knobs(spec.name) if not spec.always_on else None
    knobs = dataclasses.asdict(knobs_obj) if dataclasses.is_dataclass(knobs_obj) and not isinstance(knobs_obj, type) else {}
    knobs["max_batches_per_run"] = cfg.pipeline.max_batches_per_run
    report = ProjectionReport(spec.name)
    usage = None
    if not spec.always_on and spec.name not in cfg.memory.projectors:
        report.status = "disabled"
        report.reason = f"'{spec.name}' is not listed in [providers.memory].projectors"
    elif spec.needs_llm and runtime.llm_client is None:
        report.status = "skipped"
        try:
            _ = runtime.llm  # raises NoModelConfigured, whose message names the setting to change
        except NoModelConfigured as exc:
            report.reason = str(exc)
    else:
        if spec.needs_llm:  # this projector's calls and tokens, apart from the others' in the step
            usage = runtime.llm_client.usage = LlmUsage()
        if rebuild and not (spec.needs_embedder and runtime.embedder is None):
            with runtime.store() as store:
                registry.drop_projection(store, spec.name)
        run = spec.load_run()
        assert run is not None, f"projector {spec.name!r} has a factory of its own, not the step's shell"
        run(runtime, report, rebuild=rebuild)
    return ProjectorResult(report, knobs, usage.as_metadata() if usage is not None else {}, report.duration_s)


def project_familiar(
    specs: list[ProjectorSpec],
    familiar_id: str,
    *,
    rebuild: bool,
    open_runtime: OpenRuntime,
    checks: tuple[InlineCheck, ...] = (),
    lock_wait_s: float = 0.0,
    blocked: dict[str, str] | None = None,
    later: tuple[str, ...] = (),
    dagster_home: Path | None = None,
) -> FamiliarPass:
    """One familiar through `specs` (dependency order) with one writer lock, one store connection, one publish.

    The writer lock is taken first (FamiliarBusy, after up to `lock_wait_s`, if another
    process holds it), so a familiar is either worked on whole or not opened. Each
    projector's invariants (`checks` on its asset) are checked right after it, on the
    same connection; a failed blocking check, or a projector that raised, holds back
    what is built on that asset for this familiar (reported "skipped: blocked ..."), as
    Dagster would between steps. `blocked` (asset -> why) carries that from an earlier
    pass over the familiar and is updated. The snapshot check runs after the publish.
    Each publish records what is still to run for the familiar (the specs after the one
    running, then `later`: the assets of the run's later passes) as the snapshot's
    pending assets, so a run that stops before them leaves them to the turn sensor.
    Erased and deleted turns due to go are purged from every file at the end of the familiar's
    last pass (`erasure.purge`, with every registered spec); the turn index's result (else the
    pass's first asset's) says what went (counts and ids), or carries the failure.
    `dagster_home`: the instance's folder, whose run storage and logs the purge scrubs.
    """
    out = FamiliarPass()
    blocked = {} if blocked is None else blocked  # asset -> why its projector does not run for this familiar
    if all(spec.asset in blocked for spec in specs):  # nothing to run: not opened
        for spec in specs:
            _skip_blocked(out, spec, blocked)
        return out
    runtime = open_runtime(familiar_id, needs_embedder=any(s.needs_embedder for s in specs))
    cfg = runtime.config
    try:
        runtime.hold_writer_lock(lock_wait_s)
        for i, spec in enumerate(specs):
            runtime.pending_assets = (*(s.asset for s in specs[i + 1:]), *later)
            if spec.asset in blocked:
                _skip_blocked(out, spec, blocked)
                continue
            try:
                out.results[spec.asset] = run_projector(spec, runtime, cfg, rebuild=rebuild)
            except Exception as exc:  # this familiar's followers of the asset wait; its other projectors run
                out.failed[spec.asset] = exc
                hold_followers(blocked, spec, f"blocked: {spec.asset} failed for this familiar ({type(exc).__name__})")
                continue
            for check in checks:
                if check.asset == spec.asset and check.kind == INVARIANT:
                    result = check.evaluate(runtime, familiar_id)
                    out.checks[check.key] = result
                    if check.holds_back(result):
                        hold_followers(blocked, spec, f"blocked: check {check.name} on {spec.asset} failed")
        runtime.pending_assets = later
        if out.results and not later and not out.failed:  # the familiar's last pass, whole
            # Its figures go on the turn index's result when in this pass, else on the first asset's.
            host = next((s.asset for s in specs if s.search_index == "turns" and s.asset in out.results),
                        next(iter(out.results)))
            try:
                erased = purge(runtime, registry.specs(), dagster_home=dagster_home)
            except Exception as exc:  # the erasure stays pending; the turn sensor asks again
                out.failed[host] = exc
                del out.results[host]
            else:
                if erased is not None:
                    out.results[host].extra.update(erased.metadata())
        runtime.flush()
        kernel: dict[str, Any] = {}  # the kernel's checks: one evaluation each, for all assets
        for check in checks:
            if check.kind != INVARIANT and check.asset in out.results:
                kernel[check.kind] = kernel.get(check.kind) or check.evaluate(runtime, familiar_id)
                out.checks[check.key] = kernel[check.kind]
    finally:
        runtime.close()
    out.published = bool(runtime.published_version)
    return out


def _skip_blocked(out: FamiliarPass, spec: ProjectorSpec, blocked: dict[str, str]) -> None:
    report = ProjectionReport(spec.name, status="skipped", reason=blocked[spec.asset])
    out.results[spec.asset] = ProjectorResult(report, duration_s=report.duration_s)


def run_familiars(
    order: WorkOrder,
    *,
    rebuild: bool,
    open_runtime: OpenRuntime,
    checks: tuple[InlineCheck, ...] = (),
    dagster_home: Path | None = None,
    note: Callable[[str], None] = lambda line: None,
) -> Iterator[tuple[str, FamiliarPass]]:
    """Every visit of the step's work order, each familiar's pass as it is done.

    A familiar whose writer lock another process holds goes back to the end of the order
    (`note` says so) and is waited for there; one that could not be opened at all (config,
    lock, storage) yields a pass with every asset of the visit failed, and its later passes
    are held back. A visit with nothing planned yields nothing.
    """
    for visit in order:
        familiar_id = visit.familiar_id
        outcome = None
        if visit.specs:
            try:
                outcome = project_familiar(visit.specs, familiar_id, rebuild=rebuild, open_runtime=open_runtime,
                                           checks=checks, lock_wait_s=visit.lock_wait_s, blocked=visit.blocked,
                                           later=visit.later, dagster_home=dagster_home)
            except Exception as exc:  # the familiar could not be opened at all (config, lock, storage)
                if isinstance(exc, FamiliarBusy) and order.busy(visit):
                    note(f"[{familiar_id}] another writer holds it; back to it at the end of this run")
                    continue
                outcome = FamiliarPass(failed={s.asset: exc for s in visit.specs})
                order.not_opened(visit, exc)
        order.done(visit, published=outcome is not None and outcome.published)
        if outcome is not None:
            yield familiar_id, outcome
