"""Fact embeddings (projector `fact_embedding`, opt-in): a vector per current fact for the active model.

There is no positional watermark: the work list is "current facts with no
vector under the active model's name", so adding facts, swapping models (new
rows accumulate beside the old; reads use only the active name) or deleting
vectors all converge through the same backfill. Each batch is one embed call;
when it returns a different number of vectors than texts, nothing of that batch
is written (a misaligned write would attach vectors to the wrong facts) and the
run stops. The watermark row records the highest fact id embedded, for display.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from familiar_pipeline.projectors.vectors import embed_all, embedder_or_skip

from .spec import PROJECTOR
from .tables import set_fact_embeddings, unembedded_facts

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    embedder = embedder_or_skip(rt, report, PROJECTOR)
    if embedder is None:
        return
    batch_size = rt.config.memory.fact_embedding.batch_size
    with rt.store() as store:
        before = store.get_watermark(PROJECTOR).fact_id
    report.watermark_before = {"fact_id": before}
    report.extra["model"] = embedder.name
    highest = before
    for _ in range(rt.config.pipeline.max_batches_per_run):
        with rt.store() as store:
            pending = unembedded_facts(store, embedder.name, batch_size)
        if not pending:
            break
        vectors = embed_all(embedder, [f.text for f in pending], report)
        if vectors is None:
            break
        highest = max(highest, max(f.id for f in pending))
        with rt.store() as store:
            with store.transaction():
                set_fact_embeddings(store, embedder.name, zip(pending, vectors))
                store.set_watermark(PROJECTOR, fact_id=highest)
            rt.publish(store)
        report.batches += 1
        report.rows_written += len(pending)
        if len(pending) < batch_size:
            break
    report.watermark_after = {"fact_id": highest}
    report.extra["dim"] = embedder.dim
    if report.batches == 0 and not report.dropped:
        report.no_op(f"every current fact has a vector for {embedder.name}")
