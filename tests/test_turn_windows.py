"""turn_window_embeddings: context windows (one definition, index time and query time), the
projector (rebuild == incremental through new turns, edits, deletions and other channels), the
snapshot's precombined matrix, and retrieval reading it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from familiar_bot.prompt.retrieval import _dense_turns, top_rows
from familiar_pipeline.defs.resources import FamiliarData, LlmResource, build_runtime
from familiar_pipeline.models.embedders import HashEmbedder
from familiar_pipeline.projectors import turn_windows
from familiar_pipeline.projectors.registry import drop_projection
from familiar_pipeline.projectors.report import ProjectionReport
from familiar_pipeline.storage.snapshots import Snapshot, SnapshotReader
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog, context_windows

from .helpers import CountingEmbedder, append_chat, make_familiar

TOML = ('[providers.embedding]\nbackend = "hash"\ndim = 64\n'
        '[providers.memory]\nprojectors = ["turn_embedding", "turn_window_embedding"]\n'
        '[providers.memory.turn_window_embedding]\nbatch_size = 3\nspan = 1\n')
TABLE = turn_windows.TABLE


def run(root, embedder):
    rt = build_runtime(FamiliarData(data_root=str(root)), LlmResource(), "fam")
    rt.embedder = embedder
    report = ProjectionReport(turn_windows.PROJECTOR)
    try:
        turn_windows.run(rt, report)
    finally:
        rt.close()
    return report


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
        assert store.turn_embedding_count(emb.name, table=TABLE) == 0
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
        store.set_turn_embeddings("m", [(1, [1.0, 0.0]), (2, [0.0, 2.0]), (3, [1.0, 1.0])])
        store.set_turn_embeddings("m", [(2, [3.0, 0.0]), (1, [0.0, 1.0])], table=TABLE)
        from familiar_pipeline.storage.snapshots import publish_snapshot
        publish_snapshot(store.conn, paths.serving_dir, store_watermark={})
    reader = SnapshotReader(paths.serving_dir)
    ids, rows = reader.context_turn_matrix("m", 0.25)
    assert ids.tolist() == [1, 2, 3]
    assert np.allclose(rows, [[0.75, 0.25], [0.25, 0.75], [2 ** -0.5, 2 ** -0.5]])  # turn 3: no window, its own
    assert reader.context_turn_matrix("other", 0.25) is None
    assert Snapshot.empty().context_turn_matrix("m", 0.5) is None


def test_dense_turns_read_the_precombined_matrix_instead_of_query_time_windows():
    ids = np.array([7, 8, 9])
    own = np.eye(3, dtype=np.float32)
    blended = np.array([[0.5, 0.5, 0], [0, 1, 0], [0, 0.5, 0.5]], dtype=np.float32)
    asked = []
    snapshot = SimpleNamespace(turn_matrix=lambda model: (ids, own),
                               context_turn_matrix=lambda model, share: asked.append(share) or (ids, blended))
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
