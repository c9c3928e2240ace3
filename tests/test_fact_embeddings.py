"""fact_embeddings: batches, model swaps, length mismatches, and the config switches."""

from __future__ import annotations

import numpy as np
import pytest

from familiar_pipeline.config import ConfigError, load_config
from familiar_pipeline.models.embedders import HashEmbedder
from familiar_pipeline.projectors.fact_embeddings import run as embeddings
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.fact_embeddings import tables as fact_vectors
from familiar_pipeline.projectors.supersede import tables as supersede_db

from .fact_helpers import CASS, add_facts, fact, run_projector
from .helpers import CountingEmbedder, make_familiar

TOML = '[providers.embedding]\nbackend = "hash"\ndim = 64\n[providers.memory]\nprojectors = ["fact_embedding"]\n'


def run(root, embedder, *, batch_size=None):
    paths = make_familiar(root, "fam", TOML + (f"[providers.memory.fact_embedding]\nbatch_size = {batch_size}\n" if batch_size else ""))
    return paths, run_projector(embeddings, root, model=embedder)


def seed(root, n):
    paths = make_familiar(root, "fam", TOML)
    return add_facts(paths, [fact(f"Cass fact number {i}.", CASS, turn=i) for i in range(1, n + 1)])


def test_embeds_in_batches_then_nothing(tmp_path):
    seed(tmp_path, 5)
    emb = CountingEmbedder(HashEmbedder(64))
    paths, report = run(tmp_path, emb, batch_size=2)
    assert [len(c) for c in emb.calls] == [2, 2, 1] and report.rows_written == 5
    assert report.watermark_after == {"fact_id": 5}
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        vectors = fact_vectors.embeddings_for(store, emb.name, [1, 2, 3, 4, 5])
    assert len(vectors) == 5 and all(len(v) == 64 for v in vectors.values())
    assert np.allclose(vectors[1], HashEmbedder(64).embed(["Cass fact number 1."])[0], atol=1e-6)
    emb2 = CountingEmbedder(HashEmbedder(64))
    _, report = run(tmp_path, emb2)
    assert emb2.calls == [] and report.status == "no-op"


def test_model_swap_accumulates_beside_the_old(tmp_path):
    seed(tmp_path, 3)
    run(tmp_path, HashEmbedder(64))
    paths, report = run(tmp_path, HashEmbedder(32))
    assert report.rows_written == 3
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        models = store.conn.execute("SELECT model, count(*) FROM fact_embeddings GROUP BY model ORDER BY model").fetchall()
        assert models == [("hash-v1-d32", 3), ("hash-v1-d64", 3)]
        assert {len(v) for v in fact_vectors.embeddings_for(store, "hash-v1-d32", [1, 2, 3]).values()} == {32}


def test_length_mismatch_writes_nothing(tmp_path):
    seed(tmp_path, 3)
    paths, report = run(tmp_path, CountingEmbedder(HashEmbedder(64), drop=1))
    assert report.rows_written == 0 and report.dropped["length_mismatch"] == 3
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert store.conn.execute("SELECT count(*) FROM fact_embeddings").fetchone()[0] == 0


def test_retired_facts_are_not_embedded(tmp_path):
    seed(tmp_path, 3)
    paths = make_familiar(tmp_path, "fam", TOML)
    with ProjectionStore(paths.memory_db) as store:
        supersede_db.supersede(store, [1], 2)
    emb = CountingEmbedder(HashEmbedder(64))
    run(tmp_path, emb)
    assert emb.calls == [["Cass fact number 2.", "Cass fact number 3."]]


def test_listing_it_with_the_embedder_off_fails_at_config_load(tmp_path):
    make_familiar(tmp_path, "fam", '[providers.memory]\nprojectors = ["fact_embedding"]\n')
    with pytest.raises(ConfigError) as err:
        load_config("fam", root=tmp_path)
    message = str(err.value)
    assert "[providers.embedding].backend" in message and "projectors" in message and "embedding_weight" in message
