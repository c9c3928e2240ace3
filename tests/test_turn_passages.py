"""turn_passage_embeddings (issue 48): a vector per passage of each long turn, one cut for index and
reply time, retrieval raising a long turn to its best passage's cosine and showing that passage, and
erasure taking the passage vectors along."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from familiar_bot.prompt.retrieval import passages
from familiar_bot.prompt.retrieval.turn_vectors import _dense_turns, _matched_passage, _turn_similarities
from familiar_pipeline.models.embedders import HashEmbedder
from familiar_pipeline.engine.registry import drop_projection
from familiar_pipeline.projectors.turn_passage_embeddings import run as turn_passages
from familiar_pipeline.projectors.turn_passage_embeddings.tables import TURN_PASSAGE_EMBEDDINGS, passage_matrix
from familiar_pipeline.projectors.vectors import vector_count
from familiar_pipeline.storage.passages import LONG_FACTOR, long_turn_spans, passage_spans
from familiar_pipeline.storage.snapshots import Snapshot, SnapshotReader
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .fact_helpers import run_projector
from .helpers import PEOPLE, CountingEmbedder, append_chat, make_familiar, sensor_driver

SIZE = 120
TOML = ('[providers.embedding]\nbackend = "hash"\ndim = 32\n'
        '[providers.memory]\nprojectors = ["turn_embedding", "turn_passage_embedding"]\n'
        f'[providers.memory.turn_passage_embedding]\nbatch_size = 3\npassage_chars = {SIZE}\n')
BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def long_text(topic: str, n: int = 4) -> str:
    """``n`` paragraphs of about 100 characters: cut into ``n`` passages of at most SIZE."""
    return "\n\n".join(f"Paragraph {i} about {topic}: " + "and then some more words follow here " * 2
                       for i in range(n))


def add_turn(paths, content: str, who=PEOPLE[0], minute: int = 0, channel: int = 10):
    with TurnLog(paths.turns_db) as log:
        log.upsert_participant(who[0], username=who[1].lower(), global_name=who[1])
        return log.append_turn(channel_id=channel, guild_id=1, role="user", author_key=who[0], author_display=who[1],
                               content=content, created_at=BASE + timedelta(minutes=minute))


def run(root, embedder, *, rebuild=False):
    return run_projector(turn_passages, root, model=embedder, rebuild=rebuild)


def rows(paths, model=None) -> dict[tuple[int, int], str]:
    """``{(turn id, passage): model}`` of every passage vector (of ``model`` when given)."""
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        found = store.sql("SELECT turn_id, passage, model FROM turn_passage_embeddings").fetchall()
    return {(t, p): m for t, p, m in found if model is None or m == model}


# --------------------------------------------------------------------------- the cut


def test_only_a_turn_longer_than_the_threshold_is_cut_and_the_renderer_cuts_it_the_same_way():
    text = long_text("gardens")
    assert len(long_turn_spans(text, SIZE)) == 4
    assert long_turn_spans(text[:int(SIZE * LONG_FACTOR)], SIZE) == [], "up to 1.5 passages stays whole"
    assert long_turn_spans("short", SIZE) == []
    assert long_turn_spans(text, SIZE) == passage_spans(text, SIZE)
    # the prompt's cutter is the pipeline's (one definition)
    assert passages.passage_spans is passage_spans


# --------------------------------------------------------------------------- the projector


def test_long_turns_get_a_vector_per_passage_short_ones_none_then_nothing(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    short = append_chat(paths, 2)
    long = add_turn(paths, long_text("the Berlin bakery job"), minute=10)
    emb = CountingEmbedder(HashEmbedder(32))
    report = run(tmp_path, emb)
    texts = [t for call in emb.calls for t in call]
    assert len(texts) == 4 and [len(c) for c in emb.calls] == [3, 1], "passages in batches of batch_size"
    assert texts[0] == "Cass: " + long.content[slice(*passage_spans(long.content, SIZE)[0])].strip()
    assert set(rows(paths)) == {(long.id, p) for p in range(4)} and report.rows_written == 4
    assert report.extra["long_turns"] == 1 and all(t.id not in {k[0] for k in rows(paths)} for t in short)
    assert report.watermark_after["turn_id"] == long.id
    again = CountingEmbedder(HashEmbedder(32))
    assert run(tmp_path, again).status == "no-op" and again.calls == []


def test_edits_re_cut_and_deletions_remove_every_passage_vector(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    a = add_turn(paths, long_text("a cat called Pixel"), minute=1)
    b = add_turn(paths, long_text("hiking in June"), minute=2)
    c = add_turn(paths, "a short one", minute=3)
    run(tmp_path, HashEmbedder(32))
    assert {k[0] for k in rows(paths)} == {a.id, b.id}
    with TurnLog(paths.turns_db) as log:
        log.record_edit(turn_id=a.id, new_content="now short")  # long -> short: its passages go
        log.record_deletion(turn_id=b.id)
        log.record_edit(turn_id=c.id, new_content=long_text("peanut allergies", 3))  # short -> long
    emb = CountingEmbedder(HashEmbedder(32))
    report = run(tmp_path, emb)
    assert set(rows(paths)) == {(c.id, p) for p in range(3)}
    assert report.extra["removed"] == 8 and [t for call in emb.calls for t in call][0].startswith("Cass: Paragraph 0 "
                                                                                                  "about peanut")


def test_a_model_swap_starts_over_beside_the_old_rows_and_a_mismatch_writes_nothing(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    turn = add_turn(paths, long_text("gardens"))
    run(tmp_path, HashEmbedder(32))
    report = run(tmp_path, HashEmbedder(16))
    assert "restarted" in report.extra and report.rows_written == 4
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert vector_count(store, TURN_PASSAGE_EMBEDDINGS, "hash-v1-d32") == 4
        assert vector_count(store, TURN_PASSAGE_EMBEDDINGS, "hash-v1-d16") == 4
    other = make_familiar(tmp_path / "b", "fam", TOML)
    add_turn(other, long_text("gardens"))
    bad = run(tmp_path / "b", CountingEmbedder(HashEmbedder(32), drop=1))
    assert bad.rows_written == 0 and bad.dropped["length_mismatch"] == 3 and rows(other) == {}
    with ProjectionStore(other.memory_db, read_only=True) as store:
        assert store.get_watermark(turn_passages.PROJECTOR).turn_id == 0
    assert turn.id > 0


def test_a_rebuild_drops_every_passage_vector(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    add_turn(paths, long_text("gardens"))
    run(tmp_path, HashEmbedder(32))
    with ProjectionStore(paths.memory_db) as store:
        drop_projection(store, turn_passages.PROJECTOR)
        assert vector_count(store, TURN_PASSAGE_EMBEDDINGS, "hash-v1-d32") == 0
        assert store.get_watermark(turn_passages.PROJECTOR).turn_id == 0


def test_the_snapshot_serves_the_passage_matrix_sorted_and_unit_length(tmp_path):
    paths = make_familiar(tmp_path, "fam", TOML)
    a = add_turn(paths, long_text("gardens"), minute=1)
    b = add_turn(paths, long_text("bakeries", 2), minute=2)
    run(tmp_path, HashEmbedder(32))
    found = passage_matrix(SnapshotReader(paths.serving_dir), "hash-v1-d32")
    assert found.turn_ids.tolist() == [a.id] * 4 + [b.id] * 2 and found.passages.tolist() == [0, 1, 2, 3, 0, 1]
    assert np.allclose(np.linalg.norm(found.matrix, axis=1), 1.0, atol=1e-5)
    assert passage_matrix(SnapshotReader(paths.serving_dir), "other").turn_ids.size == 0


# --------------------------------------------------------------------------- retrieval


def snapshot_of(turn_ids, turns, passage_rows, model="e"):
    """A served snapshot: turn vectors ``turns`` (rows of turn_ids) and passage rows ``(turn, passage, vector)``."""
    def table(columns, vectors):
        n = len(vectors)
        return pa.table({**columns, "model": pa.array([model] * n, pa.string()),
                         "dim": pa.array([len(vectors[0])] * n, pa.int32()),
                         "vector": pa.array([list(v) for v in vectors], pa.list_(pa.float32())),
                         "created_at": pa.array([None] * n, pa.timestamp("us", tz="UTC")),
                         "scope": pa.array(["familiar"] * n, pa.string())})
    own = table({"turn_id": pa.array(turn_ids, pa.int64())}, turns)
    parts = table({"turn_id": pa.array([r[0] for r in passage_rows], pa.int64()),
                   "passage": pa.array([r[1] for r in passage_rows], pa.int32())}, [r[2] for r in passage_rows])
    return Snapshot(None, {"turn_embeddings": own, "turn_passage_embeddings": parts})


# Three turns; the cue is the 3rd axis. Turn 9's own vector (its opening) is about the 1st axis,
# but its passage 1 (past its opening) is about the cue: only the passage vector finds it.
CUE = np.array([0.0, 0.0, 1.0], dtype=np.float32)
SNAP = snapshot_of([7, 8, 9], [[0, 1, 0], [0.6, 0, 0.8], [1, 0, 0]],
                   [(9, 0, [1, 0, 0]), (9, 1, [0, 0.1, 1]), (9, 2, [0, 1, 0]), (7, 0, [0, 1, 0]), (7, 1, [1, 0, 0])])


def memory(weight=1.0, projectors=("turn_embedding", "turn_passage_embedding"), snap=SNAP, search_rows=0):
    embedder = SimpleNamespace(name="e", dim=3, embed=lambda texts: [CUE])
    retrieval = SimpleNamespace(turn_embedding_weight=1.0, turn_context=0.0, turn_vector_search_rows=search_rows,
                                turn_passage_weight=weight, turn_passage_chars=SIZE)
    config = SimpleNamespace(memory=SimpleNamespace(retrieval=retrieval, is_active=lambda p: p in projectors,
                                                    knobs=lambda p: SimpleNamespace(passage_chars=SIZE)))
    return SimpleNamespace(config=config, embedder=embedder, snapshot=snap,
                           cue_vector=lambda cue: embedder.embed([cue])[0], warn_once=lambda *a: None)


def test_a_long_turn_is_found_by_the_passage_deep_in_it_that_its_own_vector_misses():
    deep = np.dot([0, 0.1, 1], CUE) / np.linalg.norm([0, 0.1, 1])
    found = _dense_turns("cue", memory(), 1, [])
    assert found == pytest.approx({9: deep}), "turn 9 ranks first by its 2nd passage"
    assert _dense_turns("cue", memory(), 3, []) == pytest.approx({9: deep, 8: 0.8, 7: 0.0})
    # off: no projector, or a zero weight: turn 9 is what its own vector says
    for off in (memory(projectors=("turn_embedding",)), memory(weight=0.0)):
        assert _dense_turns("cue", off, 3, []) == pytest.approx({9: 0.0, 8: 0.8, 7: 0.0})
    # a passage never lowers a turn: max(own, weight x passage)
    assert _dense_turns("cue", memory(weight=0.5), 3, []) == pytest.approx({9: deep / 2, 8: 0.8, 7: 0.0})


def test_an_older_turn_outside_the_searched_rows_gets_its_passages_scored_when_asked_for():
    """Only the newest ``turn_vector_search_rows`` turns' passages are scored at once (a reply's cost stays
    flat as the log grows); an older long turn named by BM25 has its passages scored on demand."""
    snap = snapshot_of([7, 8, 9], [[1, 0, 0], [0.6, 0, 0.8], [0, 1, 0]],
                       [(7, 0, [1, 0, 0]), (7, 1, [0, 0.1, 1]), (7, 2, [0, 1, 0]), (9, 0, [0, 1, 0]), (9, 1, [0, 1, 0])])
    deep = 1 / np.linalg.norm([0, 0.1, 1])
    mem = memory(snap=snap, search_rows=1)
    scores = _turn_similarities("cue", mem, mem.embedder)
    assert scores.passages is not None and not scores.passages.done[0] and scores.passages.done[2]
    assert scores.passages.turns == 2
    assert _dense_turns("cue", mem, 3, []) == pytest.approx({9: 0.0}), "the newest row only"
    assert _dense_turns("cue", mem, 3, [7]) == pytest.approx({9: 0.0, 7: deep}), "turn 7 by its 2nd passage"
    assert scores.of([7, 8]) == pytest.approx({7: deep, 8: 0.8}) and scores.passage_of(7) == 1


def test_the_scores_remember_which_passage_matched_and_what_it_raised():
    scores = _turn_similarities("cue", memory(), memory().embedder)
    assert scores.passage_of(9) == 1 and scores.passage_of(8) is None
    assert scores.passage_count() == 2
    assert scores.raised_by_passage([7, 8, 9]) == {9: 1}, "turn 7's best passage is no better than itself"


def test_the_matched_passage_is_shown_when_no_cue_word_picks_one():
    paragraphs = long_text("x").split("\n\n")
    paragraphs[1] = paragraphs[1].replace("words", "zebra")  # same length: the same cut
    text = "\n\n".join(paragraphs)
    turn = SimpleNamespace(id=9, content=text)
    scores = _turn_similarities("cue", memory(), memory().embedder)
    matched = _matched_passage(scores, memory())
    spans = passage_spans(text, SIZE)
    assert matched(turn) == spans[1] and "zebra" in text[slice(*spans[1])]
    shown = passages.passage_of(text, passages.cue_tokens("what animal was it"), SIZE, matched(turn))[0]
    assert "zebra" in shown, "no cue word anywhere: the passage the vectors found"
    assert "zebra" not in passages.passage_of(text, passages.cue_tokens("what animal was it"), SIZE)[0]
    # a cue word still picks its passage
    picked = passages.passage_of(text, passages.cue_tokens("paragraph 3"), SIZE, matched(turn))[0]
    assert "zebra" not in picked
    assert _matched_passage(None, memory())(turn) is None


# --------------------------------------------------------------------------- erasure


def test_erasing_a_person_or_a_message_removes_their_passage_vectors(tmp_path):
    root = tmp_path / "data"
    paths = make_familiar(root, extra_toml=TOML)
    cass = [add_turn(paths, long_text(f"Cass's secret plan {i}"), who=PEOPLE[0], minute=i) for i in range(2)]
    bo = [add_turn(paths, long_text(f"Bo's garden {i}"), who=PEOPLE[1], minute=10 + i) for i in range(2)]
    with dg.instance_for_test() as instance:
        tick = sensor_driver(instance, root, start=BASE.timestamp() + 10_000)
        assert {k[0] for k in rows(paths)} == {t.id for t in cass + bo}
        with TurnLog(paths.turns_db) as log:
            log.record_deletion(turn_id=bo[0].id)
        tick()
        assert {k[0] for k in rows(paths)} == {t.id for t in cass} | {bo[1].id}
        with TurnLog(paths.turns_db) as log:
            log.request_erasure(kind="person", target=PEOPLE[0][0], requested_by="discord:999")
        tick()
        assert {k[0] for k in rows(paths)} == {bo[1].id}, "Cass's passages are gone, Bo's other turn kept"
        served = passage_matrix(SnapshotReader(paths.serving_dir), "hash-v1-d32")
        assert set(served.turn_ids.tolist()) == {bo[1].id}
    assert Path(paths.memory_db).exists()


# --------------------------------------------------------------------------- through the assembler


class AxisEmbedder:
    """Deterministic 4-d vectors: a text naming a striped animal leans on the 3rd axis."""

    name, dim = "axes", 4

    def embed(self, texts):
        out = []
        for text in texts:
            v = [0.1, 0.1, 0.1, 0.1]
            if any(w in text.lower() for w in ("zebra", "striped")):
                v[2] += 1.0
            out.append(np.array(v, dtype=np.float32))
        return out


def test_through_the_assembler_a_long_turn_ranks_by_its_passage_which_is_shown_and_the_debug_says_so(tmp_path):
    from familiar_bot.prompt.assembly import render_sections
    from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS
    from familiar_pipeline.projectors.turn_passage_embeddings.run import set_passage_vectors
    from familiar_pipeline.projectors.vectors import set_vectors
    from tests.test_assembly import World, ctx, section

    toml = ('[providers.embedding]\nbackend = "hash"\n'
            '[providers.memory]\nprojectors = ["turn_embedding", "turn_passage_embedding"]\n')
    world = World(tmp_path, toml)
    try:
        said = [world.say(f"Short note number {i} about the weekend plans and groceries.") for i in range(8)]
        filler = "There were long queues at the entrance and the weather kept changing all afternoon. " * 4
        long = world.say("\n\n".join([filler, filler, "Near the pond we saw a zebra grazing quietly. " + filler, filler]))
        said += [world.say(f"Another short note {i} about the weekend.") for i in range(3)]
        spans = long_turn_spans(long.content, 600)
        deep = next(i for i, (a, b) in enumerate(spans) if "zebra" in long.content[a:b])
        assert deep > 0, "the matching passage lies past the reply's opening"
        # The long turn's own vector reads its opening only (as MiniLM's 256 word pieces would).
        set_vectors(world.store, TURN_EMBEDDINGS, "axes",
                    [(t.id, [0.0, 1.0, 0.3, 0.0], "guild:1") for t in said] + [(long.id, [1.0, 0, 0, 0], "guild:1")])
        set_passage_vectors(world.store, "axes", [(long.id, p, [0, 0, 1.0, 0] if p == deep else [1.0, 0, 0, 0],
                                                   "guild:1") for p in range(len(spans))])
        world.sync()
        small = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "1"}
        cue = "Which striped animal came up?"

        def ask(env):
            prompt = world.assembler({**small, **env}, embedder=AxisEmbedder()).assemble(ctx(cue))
            rag = prompt.debug["rag"]
            return prompt, rag, [t for t in rag["turns"] if t["turn_id"] == long.id][0]

        prompt, rag, mine = ask({})
        off_prompt, off_rag, off = ask({"FAMILIAR__MEMORY__RETRIEVAL__TURN_PASSAGE_WEIGHT": "0"})
        assert mine["cosine"] > off["cosine"] + 0.3, "its best passage raised it"
        assert mine["passage"] == deep and "passage" not in off
        assert rag["turn_passages"] == {"turns_with_vectors": 1, "ranked_by_passage": 1}
        assert off_rag["turn_passages"] == {"turns_with_vectors": 0, "ranked_by_passage": 0}
        assert "passage vectors: 1 long turns have them; 1 ranked turns" in render_sections(prompt)
        # no cue word in any passage: the passage the vectors matched is the one shown
        assert "zebra" in section(prompt, "rag_context").text
        assert long.id in off_rag["shown_turn_ids"] and "zebra" not in section(off_prompt, "rag_context").text
    finally:
        world.close()
