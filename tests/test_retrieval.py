"""Retrieval: fusion arithmetic, the embedding paths, turn exclusion, neighbours, rendering."""

from __future__ import annotations
from familiar_pipeline.projectors.vectors import set_vectors
from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS
from familiar_pipeline.projectors.fact_embeddings import tables as fact_vectors
from familiar_pipeline.projectors.supersede import tables as supersede_db

import logging
import threading
from datetime import datetime, timezone

import numpy as np
import pytest

from familiar_bot.prompt.assembly import Assembler
from familiar_bot.prompt.layers.rag_context import RagContextLayer
from familiar_bot.prompt.retrieval.ranking import Weights, fuse_facts
from familiar_bot.prompt.retrieval.render import GROUP_SLACK_TOKENS, fit_by_rank, render
from familiar_bot.prompt.tokens import estimate_tokens
from tests.test_assembly import CASS, World, ctx, section

EMBED_ON = {"FAMILIAR__PROVIDERS__EMBEDDING__BACKEND": '"hash"',
            "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS": '["rich_note", "fact_embedding"]'}


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()


class CountingEmbedder:
    """Embeds every text as a fixed unit vector and counts calls."""

    name = "test-emb"
    dim = 3

    def __init__(self, vector=(1.0, 0.0, 0.0)):
        self.vector = np.asarray(vector, dtype=np.float32)
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        return np.tile(self.vector, (len(texts), 1))


def rag(world, cue, env=None, embedder=None, **kw):
    prompt = world.assembler(env, embedder=embedder).assemble(ctx(cue, **kw))
    return section(prompt, "rag_context").text, prompt.debug.get("rag", {})


# ----------------------------------------------------------------------------- fusion (pure)


def test_fusion_arithmetic_and_neutral_midpoints():
    candidates = [(30, 4.0, 10), (10, 2.0, None), (20, 1.0, 5)]  # BM25 order
    sims = {30: 0.0, 20: 1.0}  # fact 10 has no vector
    scored = fuse_facts(candidates, sims, Weights(bm25=1.0, recency=2.0, importance=3.0, embedding=4.0))
    by_id = {s["fact_id"]: s for s in scored}
    assert by_id[30]["bm25"] == 1.0 and by_id[10]["bm25"] == pytest.approx(1 / 3) and by_id[20]["bm25"] == 0.0
    assert (by_id[10]["recency"], by_id[20]["recency"], by_id[30]["recency"]) == (0.0, 0.5, 1.0)
    assert (by_id[30]["importance"], by_id[10]["importance"], by_id[20]["importance"]) == (1.0, 0.5, 0.5)
    assert (by_id[30]["embedding"], by_id[10]["embedding"], by_id[20]["embedding"]) == (0.5, 0.5, 1.0)
    assert by_id[30]["total"] == pytest.approx(1 + 2 * 1.0 + 3 * 1.0 + 4 * 0.5)
    assert by_id[10]["total"] == pytest.approx(1 / 3 + 0 + 3 * 0.5 + 4 * 0.5)
    assert by_id[20]["total"] == pytest.approx(0 + 2 * 0.5 + 3 * 0.5 + 4 * 1.0)
    assert [s["fact_id"] for s in scored] == [30, 20, 10]


def test_fusion_degenerate_batches_and_ties():
    single = fuse_facts([(5, 3.3, None)], {}, Weights(1, 1, 1, 1))[0]
    assert (single["bm25"], single["recency"], single["importance"], single["embedding"]) == (1.0, 1.0, 0.5, 0.5)
    tied = fuse_facts([(1, 2.0, 5), (2, 2.0, 5), (3, 2.0, 5)], {}, Weights(bm25=1.0))
    assert [s["fact_id"] for s in tied] == [1, 2, 3]  # equal totals keep the BM25 order
    assert all(s["bm25"] == 1.0 for s in tied)
    assert fuse_facts([], {}, Weights()) == []


def test_render_budget_facts_first_and_no_orphan_date_header():
    facts = [f"- fact {i} " + "x" * 40 for i in range(5)]
    turns = [("date", "2026-05-01:"), ("turn", "> [1:00PM A]: " + "y" * 80)]
    text = render(facts, turns, 40)
    assert "## Possibly relevant facts" in text and "earlier turns" not in text and "2026-05-01" not in text
    assert sum(estimate_tokens(line) for line in text.splitlines() if not line.startswith("##")) <= 40
    only_turns = render([], turns, 200)
    assert only_turns.startswith("## Possibly relevant earlier turns\n\n2026-05-01:\n> [1:00PM A]")


# ----------------------------------------------------------------------------- facts through the layer


def test_importance_and_current_facts_only(world):
    low = world.fact("Strawberry jam is fine", importance=1)
    high = world.fact("Strawberry fields forever", importance=10)
    retired = world.fact("Strawberry is Cass's favourite fruit", subjects=[CASS], importance=10)
    supersede_db.supersede(world.store, [retired.id], None)
    world.sync()
    env = {"FAMILIAR__BUDGET__TEXT__MAX_RAG_FACTS": "1", "FAMILIAR__MEMORY__RETRIEVAL__IMPORTANCE_WEIGHT": "5"}
    text, debug = rag(world, "strawberry", env)
    assert "Strawberry fields forever" in text and "jam" not in text and "favourite" not in text
    assert [c["fact_id"] for c in debug["facts"]] == [high.id, low.id]
    assert debug["facts"][0]["selected"] and not debug["facts"][1]["selected"]


def test_retired_facts_crowding_the_top_trigger_a_deeper_fetch(world):
    for i in range(12):
        f = world.fact(f"kiwi kiwi kiwi note {i}")
        supersede_db.supersede(world.store, [f.id], None)
    keep = world.fact("a kiwi once")
    world.sync()
    env = {"FAMILIAR__BUDGET__TEXT__MAX_RAG_FACTS": "1", "FAMILIAR__MEMORY__RETRIEVAL__FACT_OVERFETCH": "2"}
    text, debug = rag(world, "kiwi", env)
    assert "a kiwi once" in text and [c["fact_id"] for c in debug["facts"]] == [keep.id]


def test_embedding_rerank_prefers_aligned_vector(world):
    a = world.fact("Orthogonal pancake fact")
    b = world.fact("Aligned pancake fact")
    fact_vectors.set_fact_embedding(world.store, a.id, "test-emb", [0.0, 1.0, 0.0])
    fact_vectors.set_fact_embedding(world.store, b.id, "test-emb", [1.0, 0.0, 0.0])
    fact_vectors.set_fact_embedding(world.store, a.id, "other-model", [1.0, 0.0, 0.0])  # never read
    world.sync()
    embedder = CountingEmbedder()
    env = {**EMBED_ON, "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "5",
           "FAMILIAR__BUDGET__TEXT__MAX_RAG_FACTS": "1"}
    text, debug = rag(world, "pancake", env, embedder)
    assert "Aligned pancake fact" in text and "Orthogonal" not in text
    assert embedder.calls == 1 and debug["embedded_cue"] is True
    scores = {c["fact_id"]: c["embedding"] for c in debug["facts"]}
    assert scores == {b.id: pytest.approx(1.0), a.id: pytest.approx(0.5)}


def test_facts_and_turns_share_one_embedding_of_the_cue(world):
    a = world.fact("Pancake fact")
    fact_vectors.set_fact_embedding(world.store, a.id, "test-emb", [1.0, 0.0, 0.0])
    turn = world.say("pancakes again this morning", channel=11)  # not in the reply channel's history
    set_vectors(world.store, TURN_EMBEDDINGS, "test-emb", [(turn.id, [1.0, 0.0, 0.0])])
    world.sync()
    embedder = CountingEmbedder()
    env = {**EMBED_ON, "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "5",
           "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS": '["rich_note", "fact_embedding", "turn_embedding"]'}
    text, debug = rag(world, "pancake", env, embedder)
    assert debug["embedded_cue"] is True and any(t["cosine"] is not None for t in debug["turns"])
    assert embedder.calls == 1


def _warm_world(world):
    """A fact and a turn with vectors under ``test-emb``, and the settings that rank by both."""
    a = world.fact("Pancake fact")
    fact_vectors.set_fact_embedding(world.store, a.id, "test-emb", [1.0, 0.0, 0.0])
    turn = world.say("pancakes again this morning", channel=11)
    set_vectors(world.store, TURN_EMBEDDINGS, "test-emb", [(turn.id, [1.0, 0.0, 0.0])])
    world.sync()
    return {**EMBED_ON, "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "5",
            "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS": '["rich_note", "fact_embedding", "turn_embedding"]'}


def test_cue_embedding_runs_on_the_worker_while_the_searches_run(world):
    env = _warm_world(world)
    started = threading.Event()
    seen: dict = {}

    class SlowEmbedder(CountingEmbedder):
        def embed(self, texts):
            seen["thread"] = threading.current_thread().name
            started.set()
            return super().embed(texts)

    embedder = SlowEmbedder()
    assembler = world.assembler(env, embedder=embedder)
    search = assembler.memory.fts_facts.search

    def search_after_the_embedding_started(query, limit, **kw):
        # On the calling thread, before any cosine is needed: the model call is already under way.
        seen.setdefault("started_before_search", started.wait(5))
        return search(query, limit, **kw)

    assembler.memory.fts_facts.search = search_after_the_embedding_started
    prompt = assembler.assemble(ctx("pancake"))
    debug = prompt.debug["rag"]
    assert seen == {"thread": seen["thread"], "started_before_search": True}
    assert seen["thread"].startswith("familiar-cue") and embedder.calls == 1
    assert debug["embedded_cue"] is True and any(t["cosine"] is not None for t in debug["turns"])
    assembler.memory.close()


def test_an_error_of_the_worker_surfaces_as_without_it_and_is_not_remembered(world):
    env = _warm_world(world)

    class Broken(CountingEmbedder):
        fail = True

        def embed(self, texts):
            if self.fail:
                self.calls += 1
                raise RuntimeError("model file vanished")
            return super().embed(texts)

    class NoPrefetch(RagContextLayer):
        prefetch = None  # the layer as it was: the cue embedded on the calling thread

    errors, results = [], []
    for layer in (RagContextLayer(), NoPrefetch()):
        embedder = Broken()
        memory = world.assembler(env, embedder=embedder).memory
        assembler = Assembler(memory, [layer])
        prompt = assembler.assemble(ctx("pancake"))
        errors.append(prompt.debug["errors"])
        assert section(prompt, "rag_context").text == "" and embedder.calls == 1
        embedder.fail = False  # the next reply tries again: a failed call is not memoised
        prompt = assembler.assemble(ctx("pancake"))
        assert prompt.debug["errors"] == {} and "Pancake fact" in section(prompt, "rag_context").text
        assert embedder.calls == 2
        results.append((section(prompt, "rag_context").text, prompt.debug["rag"]))
        memory.close()
    assert errors[0] == errors[1] == {"rag_context": "RuntimeError: model file vanished"}
    assert results[0] == results[1]  # the same ranking, scores and section either way


def test_the_cue_worker_is_one_thread_and_ends_with_the_view(world):
    env = _warm_world(world)
    before = set(threading.enumerate())
    embedder = CountingEmbedder()
    assembler = world.assembler(env, embedder=embedder)
    for i in range(12):
        assembler.assemble(ctx(f"pancake number {i}"))
    workers = [t for t in set(threading.enumerate()) - before if t.name.startswith("familiar-cue")]
    assert embedder.calls == 12 and len(workers) == 1
    assembler.memory.close()
    workers[0].join(5)
    assert not workers[0].is_alive() and set(threading.enumerate()) <= before
    assembler.memory.prefetch_cue_vector("after close")  # a closed view embeds on the caller instead
    assert assembler.memory.cue_vector("after close").shape == (3,) and embedder.calls == 13


def test_cold_index_never_embeds_the_cue(world):
    world.fact("Waffles on Sunday")
    world.fact("Waffles are better than pancakes")
    world.sync()
    embedder = CountingEmbedder()
    env = {**EMBED_ON, "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "5"}
    text, debug = rag(world, "waffles", env, embedder)
    assert embedder.calls == 0 and debug["embedded_cue"] is False
    assert "Waffles on Sunday" in text and all(c["embedding"] == 0.5 for c in debug["facts"])


def test_mixed_batch_missing_vector_is_neutral_and_zero_weight_never_embeds(world):
    a = world.fact("Muffin recipe from Bo")
    world.fact("Muffin tin is missing")
    fact_vectors.set_fact_embedding(world.store, a.id, "test-emb", [1.0, 0.0, 0.0])
    world.sync()
    embedder = CountingEmbedder()
    _, debug = rag(world, "muffin", {**EMBED_ON, "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "1"}, embedder)
    assert sorted(c["embedding"] for c in debug["facts"]) == [0.5, pytest.approx(1.0)]
    embedder.calls = 0
    rag(world, "muffin", {**EMBED_ON, "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "0"}, embedder)
    assert embedder.calls == 0


def test_positive_weight_without_embedder_warns_once(world, caplog):
    world.fact("Bagels at nine")
    world.sync()
    assembler = world.assembler({**EMBED_ON, "FAMILIAR__MEMORY__RETRIEVAL__EMBEDDING_WEIGHT": "2"})
    with caplog.at_level(logging.WARNING):
        for cue in ("bagels", "bagels please"):
            prompt = assembler.assemble(ctx(cue))
            assert "Bagels at nine" in section(prompt, "rag_context").text
    assert sum("no embedder is configured" in r.message for r in caplog.records) == 1


def test_rename_annotation(world):
    world.fact("Cass likes pho.", subjects=[CASS])
    world.fact("Bo likes pho too.", subjects=[("discord:222", "Bobby")])
    world.fact("Someone likes pho a lot.")
    world.sync()
    text, _ = rag(world, "pho")
    assert "- Bo likes pho too. (Bobby is now known as Bo)" in text
    assert "- Cass likes pho.\n" in text + "\n" and "- Someone likes pho a lot." in text
    world.log.upsert_guild_nick("discord:111", 1, "peeks")
    text, _ = rag(world, "pho")
    assert "- Cass likes pho. (Cass is now known as peeks)" in text


# ----------------------------------------------------------------------------- turns


def test_recent_window_is_excluded_by_ids_not_arithmetic(world):
    for i in range(30):
        world.say(f"strawberry number {i}", platform_message_id=100 + i)
        world.say(f"strawberry elsewhere {i}", channel=20, platform_message_id=500 + i)
    world.index()
    env = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "20", "FAMILIAR__BUDGET__TEXT__MAX_RAG_TURNS": "60"}
    text, debug = rag(world, "strawberry", env)
    shown = {int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "strawberry number" in line}
    assert shown == set(range(10))
    # Channel 20's turns interleave with the window's ids, yet none of them is in the window.
    assert "strawberry elsewhere 29" in text
    assert debug["excluded_recent"] == 20


def test_turn_hits_bring_same_channel_neighbours_and_skip_deleted(world):
    world.say("warmup chatter A")
    world.say("noise in another room", channel=11)
    hit = world.say("the zeppelin plan is on")
    world.say("more noise", channel=11)
    world.say("follow up reply B")
    gone = world.say("zeppelin secret, deleted later")
    world.index()
    world.log.record_deletion(turn_id=gone.id)
    for _ in range(3):
        world.say("recent filler")
    env = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "3"}
    text, debug = rag(world, "zeppelin", env)
    assert [t["turn_id"] for t in debug["turns"]] == [hit.id]
    assert "warmup chatter A" in text and "follow up reply B" in text
    assert "noise" not in text and "secret" not in text


def test_turns_grouped_by_local_date_with_12h_clock_and_quoted_lines(world):
    world.say("my brain's dying", ("discord:9", "Peebo"), at=datetime(2026, 5, 3, 2, 29, tzinfo=timezone.utc))
    world.say("brain\n\nsecond para", None, role="assistant", at=datetime(2026, 5, 4, 15, 0, tzinfo=timezone.utc))
    for i in range(2):
        world.say(f"filler {i}", at=datetime(2026, 5, 5, 9, i, tzinfo=timezone.utc))
    world.index()
    env = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "2"}
    text, _ = rag(world, "brain", env)
    assert ("## Possibly relevant earlier turns\n\n2026-05-03:\n> [2:29AM Peebo]: my brain's dying\n\n"
            "2026-05-04:\n> [3:00PM Fam]: brain\n>\n> second para") in text
    la, _ = rag(world, "brain", {**env, "FAMILIAR__DISPLAY_TZ": '"America/Los_Angeles"'})
    assert "2026-05-02:\n> [7:29PM Peebo]: my brain's dying" in la


def test_dm_turns_stay_out_of_guild_channels_and_servers_out_of_dms(world):
    world.say("my secret diary entry about otters", channel=50, guild=None)
    world.say("otters are great", channel=60, guild=1)
    world.say("otters in another server", channel=70, guild=2)
    world.say("otters in another dm", channel=51, guild=None)
    for _ in range(2):
        world.say("filler")
    world.say("otters, said in the dm once more", channel=50, guild=None)
    world.index()
    env = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "2", "FAMILIAR__CHANNELS__50__HISTORY_WINDOW_SIZE": "1"}
    in_guild, debug = rag(world, "otters", env)
    assert "otters are great" in in_guild
    assert "diary" not in in_guild and "another" not in in_guild
    assert debug["scope_excluded_turns"] == 4  # the two DMs' three otter turns and the other server's
    in_dm, debug = rag(world, "otters", env, guild=None, channel=50)
    assert "diary" in in_dm  # the DM's own earlier turn
    assert "otters are great" not in in_dm and "another" not in in_dm  # strict: a DM reads itself only
    assert debug["scope_excluded_turns"] == 3


def test_hostile_query_syntax_and_empty_cue(world):
    world.fact("Cass's cat: Pixel")
    world.say("Pixel's \"zoomies\" AND (chaos)")
    for _ in range(2):
        world.say("filler")
    world.sync()
    env = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "2"}
    text, _ = rag(world, 'what\'s "pixel" doing? content:AND) OR (', env)
    assert "Cass's cat: Pixel" in text and "zoomies" in text
    assert rag(world, "   ")[0] == ""


def test_rag_budget_and_key(world):
    for i in range(20):
        world.fact(f"Lemon fact {i} " + "detail " * 30)
    world.sync()
    text, _ = rag(world, "lemon", {"FAMILIAR__BUDGET__TEXT__RAG_TOKENS": "60"})
    body = [line for line in text.splitlines() if line and not line.startswith("##")]
    assert 1 <= len(body) and sum(estimate_tokens(line) for line in body) <= 60
    memory = world.assembler().memory
    layer = RagContextLayer()
    key = layer.invalidation_key(ctx("lemon"), memory)
    assert layer.invalidation_key(ctx("lime"), memory) != key
    world.say("a new turn")
    assert layer.invalidation_key(ctx("lemon"), memory) != key


def test_fit_by_rank_keeps_whole_hit_groups_in_rank_order_within_the_budget():
    from types import SimpleNamespace

    def turn(i, words):
        return SimpleNamespace(id=i, author_display="Ana", content=" ".join(["word"] * words))

    late_hit, early_hit, middle_hit = turn(90, 40), turn(10, 40), turn(50, 40)
    shared = turn(11, 40)
    groups = [[late_hit], [early_hit, shared], [middle_hit, shared]]
    cost = estimate_tokens(f"> [12:00 pm Ana]: {late_hit.content}") + GROUP_SLACK_TOKENS
    # Room for two groups of one turn: the best hit is kept although it is the latest in time,
    # and the second group cannot come without its neighbour.
    assert set(fit_by_rank(groups, 2 * cost)) == {90}
    # A neighbour already shown costs nothing again.
    assert set(fit_by_rank(groups, 4 * cost)) == {90, 10, 11, 50}
    # The best group always comes, even when alone it is over the budget (the renderer truncates it).
    assert set(fit_by_rank(groups, 1)) == {90}
    assert set(fit_by_rank(groups, None)) == {90, 10, 11, 50}
