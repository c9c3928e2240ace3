"""turn_embeddings: the projector (batches, edits, deletes, model swaps), schema v3, the snapshot
matrix, hybrid fusion, and the config and sensor switches."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from familiar_bot.prompt.retrieval.ranking import RRF_K, fuse_turns, rrf_turns
from familiar_bot.prompt.retrieval.turn_vectors import _dense_turns
from familiar_pipeline.projectors.vectors import set_vectors, vector_count, vectors_for
from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS
from familiar_pipeline.storage import store_schema
from familiar_pipeline.config import ConfigError, load_config
from familiar_pipeline.models.embedders import HashEmbedder
from familiar_pipeline.projectors.turn_embeddings import run as turn_embeddings
from familiar_pipeline.engine.registry import drop_projection
from familiar_pipeline.engine.report import ProjectionReport
from familiar_pipeline.engine.schedule import FamiliarState, due_assets
from familiar_pipeline.storage.snapshots import Snapshot, SnapshotReader
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog
from familiar_pipeline.projectors.turn_embeddings import tables as turn_vectors

from .fact_helpers import run_projector
from .helpers import CountingEmbedder, append_chat, make_familiar

TOML = ('[providers.embedding]\nbackend = "hash"\ndim = 64\n'
        '[providers.memory]\nprojectors = ["turn_embedding"]\n'
        '[providers.memory.turn_embedding]\nbatch_size = 4\n')



def vector_snapshot(ids, matrix, *, model="e", context=None):
    """A served snapshot whose turn vectors under ``model`` are the rows of ``matrix`` (``context``:
    precombined matrices by (model, share))."""
    table = pa.table({"turn_id": pa.array(ids, pa.int64()), "model": pa.array([model] * len(ids), pa.string()),
                      "dim": pa.array([matrix.shape[1]] * len(ids), pa.int32()),
                      "vector": pa.array(matrix.tolist(), pa.list_(pa.float32())),
                      "created_at": pa.array([None] * len(ids), pa.timestamp("us", tz="UTC")),
                      "scope": pa.array(["familiar"] * len(ids), pa.string())})
    return Snapshot(None, {"turn_embeddings": table}, context=context)

def run(root, embedder, *, rebuild=False):
    return run_projector(turn_embeddings, root, model=embedder, rebuild=rebuild)


def vectors(paths, model, ids):
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return vectors_for(store, TURN_EMBEDDINGS, model, ids)


def test_embeds_new_turns_in_batches_with_the_speaker_then_nothing(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    turns = append_chat(paths, 10)
    emb = CountingEmbedder(HashEmbedder(64))
    report = run(tmp_path, emb)
    assert [len(c) for c in emb.calls] == [4, 4, 2] and report.rows_written == 10
    assert emb.calls[0][0] == f"Cass: {turns[0].content}"
    assert report.watermark_after["turn_id"] == turns[-1].id
    stored = vectors(paths, emb.name, [t.id for t in turns])
    assert len(stored) == 10
    assert np.allclose(stored[turns[1].id], HashEmbedder(64).embed([f"Bo: {turns[1].content}"])[0], atol=1e-6)
    again = CountingEmbedder(HashEmbedder(64))
    assert run(tmp_path, again).status == "no-op" and again.calls == []


def test_edits_are_re_embedded_and_deletions_lose_their_vectors(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    turns = append_chat(paths, 5)
    run(tmp_path, HashEmbedder(64))
    with TurnLog(paths.turns_db) as log:
        log.record_edit(turn_id=turns[1].id, new_content="I now live in Oslo")
        log.record_deletion(turn_id=turns[2].id)
    emb = CountingEmbedder(HashEmbedder(64))
    report = run(tmp_path, emb)
    assert emb.calls == [["Bo: I now live in Oslo"]] and report.extra["removed"] == 1
    stored = vectors(paths, emb.name, [t.id for t in turns])
    assert turns[2].id not in stored and len(stored) == 4
    assert np.allclose(stored[turns[1].id], HashEmbedder(64).embed(["Bo: I now live in Oslo"])[0], atol=1e-6)


def test_a_model_swap_re_embeds_everything_beside_the_old_rows(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    turns = append_chat(paths, 3)
    run(tmp_path, HashEmbedder(64))
    report = run(tmp_path, HashEmbedder(32))
    assert report.rows_written == 3 and "restarted" in report.extra
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert vector_count(store, TURN_EMBEDDINGS, "hash-v1-d64") == vector_count(store, TURN_EMBEDDINGS, "hash-v1-d32") == 3
        store_ids = [t.id for t in turns]
    assert {len(v) for v in vectors(paths, "hash-v1-d32", store_ids).values()} == {32}


def test_a_length_mismatch_writes_nothing(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    append_chat(paths, 3)
    report = run(tmp_path, CountingEmbedder(HashEmbedder(64), drop=1))
    assert report.rows_written == 0 and report.dropped["length_mismatch"] == 3
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert vector_count(store, TURN_EMBEDDINGS, "hash-v1-d64") == 0
        assert store.get_watermark("turn_embedding").turn_id == 0


def test_no_embedder_skips_with_the_reason(tmp_path):
    make_familiar(tmp_path, "fam", TOML)
    report = run(tmp_path, None)
    assert report.status == "skipped" and "backend" in report.reason


def test_the_snapshot_serves_a_normalised_matrix_of_the_active_model(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    turns = append_chat(paths, 6)
    run(tmp_path, HashEmbedder(64))
    reader = SnapshotReader(paths.serving_dir)
    ids, matrix = turn_vectors.turn_matrix(reader, "hash-v1-d64")
    assert sorted(ids.tolist()) == [t.id for t in turns] and matrix.shape == (6, 64)
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    assert turn_vectors.turn_matrix(reader, "other")[0].size == 0


def test_turn_vectors_are_checked_before_anything_is_written(tmp_path):
    path = tmp_path / "memory.duckdb"
    with ProjectionStore(path) as store:
        assert store.schema_version == store_schema.SCHEMA_VERSION
        assert set_vectors(store, TURN_EMBEDDINGS, "m", [(1, [0.5, 0.5])]) == 1
    with pytest.raises(TypeError):
        with ProjectionStore(path) as store:
            set_vectors(store, TURN_EMBEDDINGS, "m", [(2, "not numbers")])


def test_drop_projection_removes_every_turn_vector(tmp_path):
    with ProjectionStore(tmp_path / "m.duckdb") as store:
        set_vectors(store, TURN_EMBEDDINGS, "a", [(1, [1.0]), (2, [2.0])])
        store.set_watermark("turn_embedding", turn_id=2)
        drop_projection(store, "turn_embedding")
        assert vector_count(store, TURN_EMBEDDINGS, "a") == 0 and store.get_watermark("turn_embedding").turn_id == 0


# ----------------------------------------------------------------------------- fusion and dense search


def test_fuse_turns_min_max_over_the_union():
    bm25 = {1: 10.0, 2: 5.0}
    cos = {2: 0.9, 3: 0.5, 1: 0.1}
    scored = fuse_turns(bm25, cos, 1.0, 1.5, [1, 2, 3])
    by_id = {s["turn_id"]: s for s in scored}
    assert by_id[1]["total"] == pytest.approx(1.0 + 0.0)
    assert by_id[2]["total"] == pytest.approx(0.0 + 1.5)
    assert by_id[3]["total"] == pytest.approx(0.0 + 1.5 * 0.5)  # not a BM25 hit: 0 on that signal
    assert [s["turn_id"] for s in scored] == [2, 1, 3]
    assert [s["turn_id"] for s in fuse_turns(bm25, {}, 1.0, 1.5, [1, 2])] == [1, 2]  # BM25 alone keeps its order


def test_rrf_sums_weighted_reciprocal_ranks():
    scored = rrf_turns({1: 10.0, 2: 5.0}, {2: 0.9, 3: 0.5}, 1.0, 2.0, [1, 2, 3])
    by_id = {s["turn_id"]: s["total"] for s in scored}
    assert by_id[1] == pytest.approx(1 / (RRF_K + 1))
    assert by_id[2] == pytest.approx(1 / (RRF_K + 2) + 2 / (RRF_K + 1))
    assert by_id[3] == pytest.approx(2 / (RRF_K + 2))
    assert [s["turn_id"] for s in scored] == [2, 3, 1]


def test_dense_turns_needs_the_projector_the_weight_and_vectors(tmp_path):
    ids = np.array([7, 8, 9])
    matrix = np.eye(3, dtype=np.float32)
    snapshot = vector_snapshot(ids, matrix)
    embedder = SimpleNamespace(name="e", dim=3, embed=lambda texts: [np.array([0.0, 2.0, 0.1], dtype=np.float32)])

    def memory(weight, projectors=("turn_embedding",)):
        retrieval = SimpleNamespace(turn_embedding_weight=weight, turn_context=0.0, turn_vector_search_rows=0)
        mem = SimpleNamespace(is_active=lambda p: p in projectors)
        config = SimpleNamespace(memory=SimpleNamespace(retrieval=retrieval, is_active=mem.is_active))
        return SimpleNamespace(config=config, embedder=embedder, snapshot=snapshot,
                               cue_vector=lambda cue: embedder.embed([cue])[0], warn_once=lambda *a: None)

    found = _dense_turns("cue", memory(1.0), 2, [])
    assert set(found) == {8, 9} and found[8] == pytest.approx(2 / np.linalg.norm([0, 2, 0.1]), rel=1e-5)
    # A BM25 hit outside the nearest turns gets its own cosine, not a made-up neutral one.
    with_hit = _dense_turns("cue", memory(1.0), 2, [7, 42])
    assert set(with_hit) == {7, 8, 9} and with_hit[7] == pytest.approx(0.0, abs=1e-6)
    assert _dense_turns("cue", memory(0.0), 2, [7]) == {}
    assert _dense_turns("cue", memory(1.0, projectors=()), 2, [7]) == {}


def test_dense_turns_blend_each_cosine_with_its_context_window():
    ids = np.array([7, 8, 9])
    matrix = np.eye(3, dtype=np.float32)
    snapshot = vector_snapshot(ids, matrix)
    embedder = SimpleNamespace(name="e", dim=3, embed=lambda texts: [np.array([0.0, 1.0, 0.0], dtype=np.float32)])

    def memory(share):
        retrieval = SimpleNamespace(turn_embedding_weight=1.0, turn_context=share, turn_vector_search_rows=0,
                                    turn_passage_weight=1.0)  # every projector active; no passage vector served
        config = SimpleNamespace(memory=SimpleNamespace(retrieval=retrieval, is_active=lambda p: True))
        return SimpleNamespace(config=config, embedder=embedder, snapshot=snapshot,
                               cue_vector=lambda cue: embedder.embed([cue])[0], warn_once=lambda *a: None)

    # Turn 7 says nothing like the cue (cosine 0) but sits right before turn 8 (cosine 1).
    windows = lambda candidates: {7: [7, 8], 8: [7, 8, 9], 9: [8, 9], 42: [42]}  # noqa: E731
    blended = _dense_turns("cue", memory(0.5), 3, [], windows)
    assert blended[7] == pytest.approx(0.5 * 0.0 + 0.5 * 0.5)
    assert blended[8] == pytest.approx(0.5 * 1.0 + 0.5 * (1 / 3))
    assert blended[9] == pytest.approx(0.25)
    assert _dense_turns("cue", memory(0.0), 3, [], windows) == {7: 0.0, 8: pytest.approx(1.0), 9: 0.0}


def test_context_windows_stay_in_the_channel_and_skip_deleted_and_excluded_turns(tmp_path):
    from familiar_bot.prompt.retrieval.turns import _same_channel_windows
    from familiar_pipeline.storage.turns import TurnLog

    with TurnLog(tmp_path / "turns.db") as log:
        for i, channel in enumerate([10, 20, 10, 10, 10, 10, 10], start=1):
            log.append_turn(channel_id=channel, role="user", author_key="discord:1", content=f"line {i}")
        log.record_deletion(turn_id=3)
        windows = _same_channel_windows(log, 2, frozenset({6}))
        assert windows([4]) == {4: [1, 4, 5, 7]}
        assert windows([2]) == {2: [2]}
        assert windows([3]) == {}  # a deleted turn has no window
        assert log.live_channels([1, 2, 3, 99]) == {1: 10, 2: 20}


# ----------------------------------------------------------------------------- switches


def test_turn_embedding_with_the_embedder_off_is_a_config_error(tmp_path):
    make_familiar(tmp_path, "fam", '[providers.memory]\nprojectors = ["turn_embedding"]\n')
    with pytest.raises(ConfigError, match='lists "turn_embedding" but \\[providers.embedding\\].backend = "off"'):
        load_config("fam", root=tmp_path)


def test_the_sensor_sends_turn_embeddings_with_the_index_when_active(tmp_path):
    make_familiar(tmp_path, "fam", TOML)
    config = load_config("fam", root=tmp_path)
    behind = FamiliarState(latest_turn_id=5, latest_change_seq=0, latest_turn_age_s=10**6, snapshot_version=1,
                           watermarks={})
    assert due_assets(config, behind)[:2] == ["turns_fts", "turn_embeddings"]
    make_familiar(tmp_path, "off", "")
    assert "turn_embeddings" not in due_assets(load_config("off", root=tmp_path), behind)


def test_without_an_embedder_both_embedding_projectors_skip_naming_the_settings():
    from types import SimpleNamespace

    from familiar_pipeline.projectors.fact_embeddings import run as embeddings
    from familiar_pipeline.projectors.turn_embeddings import run as turn_embeddings

    for module in (embeddings, turn_embeddings):
        report = ProjectionReport(module.PROJECTOR)
        module.run(SimpleNamespace(embedder=None), report)
        assert report.status == "skipped"
        assert "[providers.embedding].backend" in report.reason and f"list {module.PROJECTOR} in" in report.reason


def test_turn_scores_search_the_newest_rows_and_score_older_ones_on_demand():
    from familiar_bot.prompt.retrieval.turn_vectors import TurnScores

    ids = np.array([2, 5, 9, 14])
    matrix = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.5, 0.5]], dtype=np.float32)
    cue = np.array([1.0, 0.0], dtype=np.float32)
    full = TurnScores(ids, matrix, cue, 0, matrix @ cue, False)
    assert full.nearest(2) == pytest.approx({2: 1.0, 5: 0.9})
    assert full.of([14, 3, 2, 99]) == pytest.approx({14: 0.5, 2: 1.0})
    assert full.of([1, 20]) == {} and full.of([]) == {}
    # Only the newest two rows searched: turn 2, the best match, is found only when named.
    tail = TurnScores(ids, matrix, cue, 2, matrix[2:] @ cue, False)
    assert tail.nearest(1) == pytest.approx({14: 0.5})
    assert tail.of([2, 9, 2]) == pytest.approx({2: 1.0, 9: 0.0})
