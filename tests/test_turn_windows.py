"""turn_window_embeddings: context windows (one definition, index time and query time), the
projector (rebuild == incremental through new turns, edits, deletions and other channels), the
snapshot's precombined matrix, and retrieval reading it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from familiar_bot.prompt.retrieval import turn_vectors as retrieval_module
from familiar_bot.prompt.retrieval.turn_vectors import _dense_turns, top_rows
from familiar_pipeline.projectors.vectors import set_vectors, vector_count
from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS
from familiar_pipeline.projectors.turn_windows.tables import TURN_WINDOW_EMBEDDINGS
from familiar_pipeline.models.embedders import HashEmbedder
from familiar_pipeline.projectors.turn_windows import run as turn_windows
from familiar_pipeline.projectors.turn_windows.tables import context_matrix
from familiar_pipeline.engine.registry import drop_projection
from familiar_pipeline.storage import snapshots as snapshots_module
from familiar_pipeline.storage.snapshots import (
    TURN_CONTEXT_SHARE,
    Snapshot,
    blend_context_rows,
    SnapshotPublishError,
    SnapshotReader,
    publish_snapshot,
    read_manifest,
)
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog, context_windows
from familiar_pipeline.projectors.turn_embeddings import tables as turn_vectors
from familiar_pipeline.projectors.turn_windows import tables as window_vectors

from .fact_helpers import run_projector
from .test_turn_embeddings import vector_snapshot
from .helpers import CountingEmbedder, append_chat, make_familiar

TOML = ('[providers.embedding]\nbackend = "hash"\ndim = 64\n'
        '[providers.memory]\nprojectors = ["turn_embedding", "turn_window_embedding"]\n'
        '[providers.memory.turn_window_embedding]\nbatch_size = 3\nspan = 1\n')
TABLE = TURN_WINDOW_EMBEDDINGS.name


def run(root, embedder):
    return run_projector(turn_windows, root, model=embedder)


def stored(paths, model="hash-v1-d64"):
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        rows = store.table_rows(TABLE)
    return {r[0]: list(r[3]) for r in rows if r[1] == model}


def test_context_windows_take_span_turns_each_side_in_the_same_channel():
    channel_of = {1: 10, 2: 20, 3: 10, 5: 10, 6: 10, 7: 20}
    assert context_windows(channel_of, [3, 7, 4], 1) == {3: [1, 3, 5], 7: [2, 7]}
    assert context_windows(channel_of, [5], 2) == {5: [1, 3, 5, 6]}


def test_window_text_is_the_speaker_lines_within_reach(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    turns = append_chat(paths, 4)
    append_chat(paths, 1, start=4, channel_id=99)  # another channel: never in a window here
    with TurnLog(paths.turns_db) as log:
        log.record_deletion(turn_id=turns[1].id)
        log.append_turn(channel_id=10, role="user", author_key="discord:9", content="   ")
        texts = turn_windows.window_texts(log, [turns[2].id, turns[1].id, 6], 1)
    # turn 2 is deleted: turn 3's window skips it; a deleted or blank turn has no window.
    lines = [f"{t.author_display}: {t.content}" for t in turns]
    assert texts == {turns[1].id: None, turns[2].id: "\n".join([lines[0], lines[2], lines[3]]), 6: None}


def test_incremental_runs_equal_a_rebuild(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    emb = HashEmbedder(64)
    turns = append_chat(paths, 4)
    run(tmp_path, emb)
    first = stored(paths)
    assert sorted(first) == [t.id for t in turns]
    # New turns (one in another channel) change the windows of the turns before them.
    more = append_chat(paths, 2, start=4) + append_chat(paths, 1, start=6, channel_id=20) + append_chat(paths, 2, start=7)
    counting = CountingEmbedder(emb)
    report = run(tmp_path, counting)
    assert report.rows_written > len(more)  # earlier windows within reach were re-embedded too
    assert stored(paths)[turns[-1].id] != first[turns[-1].id]  # turn 4's window gained turn 5
    with TurnLog(paths.turns_db) as log:
        log.record_edit(turn_id=turns[1].id, new_content="I moved to Oslo")
        log.record_deletion(turn_id=more[0].id)
    report = run(tmp_path, emb)
    assert report.extra["removed"] == 1
    incremental = stored(paths)
    assert more[0].id not in incremental
    assert run(tmp_path, CountingEmbedder(emb)).status == "no-op"

    with ProjectionStore(paths.memory_db) as store:
        drop_projection(store, turn_windows.PROJECTOR)
        assert vector_count(store, TURN_WINDOW_EMBEDDINGS, emb.name) == 0
    run(tmp_path, emb)
    rebuilt = stored(paths)
    assert sorted(rebuilt) == sorted(incremental)
    for tid in rebuilt:
        assert np.allclose(rebuilt[tid], incremental[tid], atol=1e-6), tid
    with TurnLog(paths.turns_db) as log:
        texts = turn_windows.window_texts(log, [turns[1].id], 1)
    assert "I moved to Oslo" in texts[turns[1].id]
    assert np.allclose(rebuilt[turns[1].id], emb.embed([texts[turns[1].id]])[0], atol=1e-6)


def test_a_model_swap_restarts_and_a_length_mismatch_writes_nothing(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    append_chat(paths, 3)
    bad = run(tmp_path, CountingEmbedder(HashEmbedder(64), drop=1))
    assert bad.rows_written == 0 and bad.dropped["length_mismatch"] == 3 and stored(paths) == {}
    run(tmp_path, HashEmbedder(64))
    swapped = run(tmp_path, HashEmbedder(32))
    assert "restarted" in swapped.extra and len(stored(paths, "hash-v1-d32")) == 3 == len(stored(paths))


def test_the_snapshot_precombines_turn_and_window_vectors(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    with ProjectionStore(paths.memory_db) as store:
        set_vectors(store, TURN_EMBEDDINGS, "m", [(1, [1.0, 0.0]), (2, [0.0, 2.0]), (3, [1.0, 1.0])])
        set_vectors(store, TURN_WINDOW_EMBEDDINGS, "m", [(2, [3.0, 0.0]), (1, [0.0, 1.0])])
        publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
    reader = SnapshotReader(paths.serving_dir)
    ids, rows = window_vectors.context_turn_matrix(reader, "m", 0.25)
    assert ids.tolist() == [1, 2, 3]
    assert np.allclose(rows, [[0.75, 0.25], [0.25, 0.75], [2 ** -0.5, 2 ** -0.5]])  # turn 3: no window, its own
    assert window_vectors.context_turn_matrix(reader, "other", 0.25) is None
    assert window_vectors.context_turn_matrix(Snapshot.empty(), "m", 0.5) is None


def _vector_store(paths):
    store = ProjectionStore(paths.memory_db)
    set_vectors(store, TURN_EMBEDDINGS, "m", [(1, [1.0, 0.0]), (2, [0.0, 2.0]), (3, [1.0, 1.0])])
    set_vectors(store, TURN_WINDOW_EMBEDDINGS, "m", [(2, [3.0, 0.0]), (1, [0.0, 1.0])])
    return store


def test_the_published_matrix_is_memory_mapped_and_equals_the_one_a_reader_builds(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    plain = tmp_path / "plain"
    with _vector_store(paths) as store:
        manifest = publish_snapshot(store.conn, paths.serving_dir, store_watermark={},
                                    matrices=context_matrix(TURN_CONTEXT_SHARE))
        publish_snapshot(store.conn, plain, store_watermark={})
    [entry] = manifest.matrices
    assert (entry.model, entry.share, entry.rows, entry.dim) == ("m", TURN_CONTEXT_SHARE, 3, 2)
    assert (paths.serving_dir / entry.file).is_file() and (paths.serving_dir / entry.ids_file).is_file()
    assert read_manifest(paths.serving_dir) == manifest  # the entry survives the JSON round trip

    reader, built = SnapshotReader(paths.serving_dir), SnapshotReader(plain)
    ids, rows = window_vectors.context_turn_matrix(reader, "m", TURN_CONTEXT_SHARE)
    assert isinstance(rows, np.memmap) and not isinstance(window_vectors.context_turn_matrix(built, "m", 0.5)[1], np.memmap)
    assert ids.tolist() == window_vectors.context_turn_matrix(built, "m", 0.5)[0].tolist()
    assert np.allclose(rows, window_vectors.context_turn_matrix(built, "m", 0.5)[1], atol=1e-7)
    # The turn vector tables are not read until asked; then they are the same rows.
    snap = reader.current()
    assert not dict.__contains__(snap._tables, "turn_embeddings") and "turn_embeddings" in snap.table_names()
    assert np.allclose(turn_vectors.turn_matrix(snap, "m")[1], turn_vectors.turn_matrix(built, "m")[1])
    assert snap.table("turn_window_embeddings").num_rows == 2
    # Another share than the published one is built from the tables, as before.
    assert np.allclose(window_vectors.context_turn_matrix(reader, "m", 0.25)[1], window_vectors.context_turn_matrix(built, "m", 0.25)[1])


def test_a_loaded_snapshot_keeps_its_matrix_and_tables_after_later_publishes_collect_the_files(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    with _vector_store(paths) as store:
        first = publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
        snap = SnapshotReader(paths.serving_dir).current()
        for _ in range(2):
            publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
    assert not (paths.serving_dir / first.matrices[0].file).exists()
    assert not (paths.serving_dir / first.tables["turn_embeddings"].file).exists()
    assert window_vectors.context_turn_matrix(snap, "m", 0.5)[0].tolist() == [1, 2, 3]
    assert float(np.asarray(window_vectors.context_turn_matrix(snap, "m", 0.5)[1]).sum()) > 0
    assert turn_vectors.turn_matrix(snap, "m")[0].tolist() == [1, 2, 3]  # read lazily from the open, unlinked file
    assert sorted(p.suffix for p in paths.serving_dir.glob("turn_context*")) == [".npy"] * 4  # two versions


def test_a_snapshot_published_before_the_matrix_still_serves_the_same_rows(tmp_path):
    import json

    paths = make_familiar(tmp_path, "fam", TOML)
    with _vector_store(paths) as store:
        publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
    expected = window_vectors.context_turn_matrix(SnapshotReader(paths.serving_dir), "m", 0.5)
    path = paths.serving_dir / "manifest.json"
    old = json.loads(path.read_text())
    for entry in old.pop("matrices"):  # what a publisher written before them left
        (paths.serving_dir / entry["file"]).unlink()
        (paths.serving_dir / entry["ids_file"]).unlink()
    path.write_text(json.dumps(old))
    reader = SnapshotReader(paths.serving_dir)
    ids, rows = window_vectors.context_turn_matrix(reader, "m", 0.5)
    assert reader.last_error is None and not isinstance(rows, np.memmap)
    assert ids.tolist() == expected[0].tolist() and np.allclose(rows, expected[1])


def test_a_damaged_matrix_keeps_the_last_good_snapshot(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    with _vector_store(paths) as store:
        publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
        reader = SnapshotReader(paths.serving_dir)
        set_vectors(store, TURN_EMBEDDINGS, "m", [(4, [0.0, 1.0])])
        second = publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
    (paths.serving_dir / second.matrices[0].file).write_bytes(b"not a matrix")
    assert reader.refresh() is False and reader.version == 1
    assert "not a readable matrix" in reader.last_error
    assert window_vectors.context_turn_matrix(reader, "m", 0.5)[0].tolist() == [1, 2, 3]


def test_a_failed_matrix_write_leaves_the_previous_snapshot_published(tmp_path, monkeypatch):
    paths = make_familiar(tmp_path, "fam", TOML)
    with _vector_store(paths) as store:
        publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
        before = sorted(p.name for p in paths.serving_dir.iterdir())

        def broken(*args, **kwargs):
            raise OSError("disk full")

        monkeypatch.setattr(snapshots_module.vectors.np, "save", broken)
        with pytest.raises(SnapshotPublishError, match="disk full"):
            publish_snapshot(store.conn, paths.serving_dir, store_watermark={}, matrices=context_matrix(TURN_CONTEXT_SHARE))
    assert sorted(p.name for p in paths.serving_dir.iterdir()) == before
    assert SnapshotReader(paths.serving_dir).version == 1


def test_blend_with_every_window_present_equals_the_row_by_row_blend():
    rng = np.random.default_rng(3)
    ids = np.array([2, 5, 9])
    own, windows = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    fast = blend_context_rows(ids, own, ids.copy(), windows, 0.3)  # the fast path: same ids
    slow = blend_context_rows(ids, own, np.array([2, 5, 9, 11]), np.vstack([windows, windows[:1]]), 0.3)
    assert fast.dtype == np.float32 and np.allclose(fast, 0.7 * own + 0.3 * windows) and np.allclose(fast, slow)
    assert blend_context_rows(ids, own, ids[:0], windows[:0], 0.3) is None


def test_the_published_share_is_the_shipped_turn_context():
    from familiar_pipeline.config.schema import RetrievalConfig

    assert RetrievalConfig().turn_context == TURN_CONTEXT_SHARE


def test_dense_turns_read_the_precombined_matrix_instead_of_query_time_windows(monkeypatch):
    ids = np.array([7, 8, 9])
    own = np.eye(3, dtype=np.float32)
    blended = np.array([[0.5, 0.5, 0], [0, 1, 0], [0, 0.5, 0.5]], dtype=np.float32)
    asked = []
    snapshot = vector_snapshot(ids, own, context={("e", 0.5): (ids, blended)})
    real_context = window_vectors.context_turn_matrix

    def counted(source, model, share):
        asked.append(share)
        return real_context(source, model, share)

    monkeypatch.setattr(retrieval_module, "context_turn_matrix", counted)
    embedder = SimpleNamespace(name="e", dim=3, embed=lambda texts: [np.array([0.0, 1.0, 0.0], dtype=np.float32)])

    def memory(share, projectors):
        retrieval = SimpleNamespace(turn_embedding_weight=1.0, turn_context=share, turn_vector_search_rows=2)
        config = SimpleNamespace(memory=SimpleNamespace(retrieval=retrieval, is_active=lambda p: p in projectors))
        return SimpleNamespace(config=config, embedder=embedder, snapshot=snapshot,
                               cue_vector=lambda cue: embedder.embed([cue])[0], warn_once=lambda *a: None)

    def windows(candidates):
        raise AssertionError("no query-time windows when window vectors are served")

    both = ("turn_embedding", "turn_window_embedding")
    # The newest 2 rows are searched; turn 7 comes in only when named (a BM25 hit).
    assert _dense_turns("cue", memory(0.5, both), 3, [], windows) == pytest.approx({8: 1.0, 9: 0.5})
    assert _dense_turns("cue", memory(0.5, both), 3, [7], windows) == pytest.approx({7: 0.5, 8: 1.0, 9: 0.5})
    assert asked == [0.5, 0.5]  # one per reply (no cache passed here)
    # Without the projector (or with no context share) the turn's own cosine, blended at query time.
    assert _dense_turns("cue", memory(0.0, both), 3, [7], windows) == pytest.approx({7: 0.0, 8: 1.0, 9: 0.0})
    query_time = _dense_turns("cue", memory(0.5, ("turn_embedding",)), 3, [7], lambda c: {t: [t] for t in c})
    assert query_time == pytest.approx({7: 0.0, 8: 1.0, 9: 0.0})


def test_top_rows_picks_the_highest_scores_without_sorting_everything():
    scores = np.array([0.1, 0.9, 0.3, 0.7, 0.5])
    assert sorted(top_rows(scores, 2).tolist()) == [1, 3]
    assert sorted(top_rows(scores, 9).tolist()) == [0, 1, 2, 3, 4]
