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

from dataclasses import dataclass

from familiar_pipeline.projectors.spec import FACTS, DropRule, ProjectorSpec, knob

PROJECTOR = "fact_embedding"


@dataclass(frozen=True)
class FactEmbeddingConfig:
    """[providers.memory.fact_embedding]"""

    batch_size: int = knob(32, minimum=1)


def embed_all(embedder, texts: list[str], report):
    """The texts' vectors, or None (counted as dropped) when the model returned another number
    of them: misaligned vectors would attach meaning to the wrong rows, so nothing is written."""
    vectors = embedder.embed(texts)
    if len(vectors) != len(texts):
        report.drop("length_mismatch", len(texts))
        report.extra["mismatch"] = f"{len(texts)} texts, {len(vectors)} vectors"
        return None
    return vectors


def embedder_or_skip(rt, report, projector: str):
    """The run's embedder, or None after marking the run skipped with the settings to change."""
    if rt.embedder is None:
        report.status = "skipped"
        report.reason = (
            'no embedder: set [providers.embedding].backend to a backend other than "off" '
            f"(and list {projector} in [providers.memory].projectors)"
        )
    return rt.embedder


def run(rt, report, *, rebuild: bool = False) -> None:
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
            pending = store.unembedded_facts(embedder.name, batch_size)
        if not pending:
            break
        vectors = embed_all(embedder, [f.text for f in pending], report)
        if vectors is None:
            break
        highest = max(highest, max(f.id for f in pending))
        with rt.store() as store:
            with store.transaction():
                for fact, vector in zip(pending, vectors):
                    store.set_fact_embedding(fact.id, embedder.name, vector)
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


SPEC = ProjectorSpec(
    name=PROJECTOR,
    asset="fact_embeddings",
    run=run,
    description="""Opt-in: a vector per current fact for the active embedding model (projector `fact_embedding`).

    Embeds, in batches of `batch_size`, every current fact lacking a vector under the active model's name;
    a model swap adds rows beside the old ones. Needs [providers.embedding].backend other than "off".
    """,
    group="facts",
    kinds={"duckdb"},
    inputs=("facts",),
    trigger=FACTS,
    needs_llm=False,
    needs_embedder=True,
    knobs=FactEmbeddingConfig,
    drop=DropRule(tables=("fact_embeddings",)),  # every vector, all models
)
