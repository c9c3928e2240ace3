"""Issue 33: the newer word wins (threads) and order questions spread over days (spread)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone

import numpy as np
import pytest

from familiar_bot.prompt.retrieval.render import NEWEST_FIRST_HEADER, TURNS_HEADER, owned_turn_lines, render
from familiar_bot.prompt.retrieval.spread import asks_for_many, asks_for_order, spread_days
from familiar_bot.prompt.retrieval.threads import asks_for_now, follow_threads, says_update

UTC = timezone.utc


@dataclass(frozen=True)
class T:
    id: int
    content: str
    author_key: str | None = "sam"
    channel_id: int = 1
    role: str = "user"
    created_at: datetime = datetime(2024, 1, 1, 12, tzinfo=UTC)
    author_display: str | None = "Sam"


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def ranked(*pairs):
    return [{"turn_id": tid, "total": total} for tid, total in pairs]


def order(out):
    return [f["turn_id"] for f in out]


# ----------------------------------------------------------------------------- threads

DEMO = unit(1, 0, 0)
DEMO_LATER = unit(0.9, 0.3, 0)  # cosine ~0.95 with DEMO
OTHER = unit(0, 0, 1)


def test_a_later_same_subject_turn_by_the_same_person_ranks_just_above_its_hit():
    rows = {1: T(1, "the demo is on the 7th"), 2: T(2, "lunch was great"), 3: T(3, "we pushed it to the 14th")}
    vectors = {1: DEMO, 2: OTHER, 3: DEMO_LATER}
    fused = ranked((1, 2.0), (2, 1.5), (3, 0.9))
    out = follow_threads(fused, rows, vectors, hits=1, threshold=0.6)
    assert order(out) == [3, 1, 2]
    assert out[0]["updates"] == 1 and 2.0 < out[0]["total"] <= 2.0 + 2e-3  # just above: no third turn's gap jumped
    assert order(fused) == [1, 2, 3] and "updates" not in fused[2]  # the input is not changed


@pytest.mark.parametrize("rows", [
    # someone else's later turn on the same subject ("my brother's demo is on the 9th")
    {1: T(1, "the demo is on the 7th"), 3: T(3, "my demo got moved to the 9th", author_key="bro")},
    # the familiar's own turns never update a person's
    {1: T(1, "the demo is on the 7th"), 3: T(3, "noted, moved to the 14th", author_key=None, role="assistant")},
])
def test_other_peoples_turns_do_not_update_a_persons_word(rows):
    out = follow_threads(ranked((1, 2.0), (3, 0.9)), rows, {1: DEMO, 3: DEMO_LATER}, hits=3, threshold=0.6)
    assert order(out) == [1, 3]


def test_only_later_and_close_turns_are_followed():
    rows = {1: T(1, "we pushed it to the 14th"), 5: T(5, "the demo is on the 7th"), 7: T(7, "lunch moved to noon")}
    # the matching turn is the later one: an earlier turn is never lifted above it
    assert order(follow_threads(ranked((5, 2.0), (1, 1.0)), rows, {1: DEMO_LATER, 5: DEMO},
                                hits=3, threshold=0.6)) == [5, 1]
    # a later turn on another subject stays where it is
    assert order(follow_threads(ranked((5, 2.0), (7, 1.0)), rows, {5: DEMO, 7: OTHER},
                                hits=3, threshold=0.6)) == [5, 7]
    # off, or without vectors: as ranked
    fused = ranked((5, 2.0), (7, 1.0))
    assert follow_threads(fused, rows, {5: DEMO, 7: DEMO_LATER}, hits=0, threshold=0.6) == fused
    assert order(follow_threads(fused, rows, {}, hits=3, threshold=0.6)) == [5, 7]


def test_a_chain_of_updates_ends_with_the_newest_on_top():
    rows = {1: T(1, "moving to Lisbon in May"), 4: T(4, "actually it's Montreal now"), 9: T(9, "Kyoto instead")}
    vectors = {1: unit(1, 0, 0), 4: unit(0.9, 0.4, 0), 9: unit(0.8, 0.6, 0.1)}
    out = follow_threads(ranked((1, 2.0), (4, 1.2), (9, 0.5)), rows, vectors, hits=3, threshold=0.6)
    assert order(out) == [9, 4, 1]


def test_only_a_later_turn_that_says_a_word_of_change_is_an_update():
    rows = {1: T(1, "the demo is on the 7th"), 3: T(3, "the demo went really well"), 4: T(4, "so we moved it to the 14th")}
    vectors = {1: unit(1, 0, 0), 3: unit(0.99, 0.1, 0), 4: unit(0.5, 0.85, 0)}  # cosines ~0.99 and ~0.5
    fused = ranked((1, 2.0), (3, 1.0), (4, 0.9))
    # news about the subject stays below; the update is close enough at 0.4, not at 0.6
    assert order(follow_threads(fused, rows, vectors, hits=3, threshold=0.4)) == [4, 1, 3]
    assert order(follow_threads(fused, rows, vectors, hits=3, threshold=0.6)) == [1, 3, 4]


def test_every_update_of_a_hit_is_lifted_newest_first():
    rows = {1: T(1, "the offsite is on the 14th"), 5: T(5, "they moved it to the 3rd"), 6: T(6, "lunch"),
            8: T(8, "bumped again, the 5th now")}
    vectors = {1: unit(1, 0, 0), 5: unit(0.8, 0.6, 0), 6: unit(0, 0, 1), 8: unit(0.7, 0, 0.7)}
    out = follow_threads(ranked((1, 2.0), (6, 1.9), (5, 1.0), (8, 0.8)), rows, vectors, hits=1, threshold=0.5)
    assert order(out) == [8, 5, 1, 6]
    assert out[0]["updates"] == 1 and out[1]["updates"] == 1


@pytest.mark.parametrize("text", [
    "we pushed it to the 14th", "switched to pytest", "Actually the meeting is at 3 now",
    "Heads up, the wedding got postponed to October", "We're doing Friday instead of Thursday",
    "They changed my shift to nights", "My new number is 555-0199", "The landlord raised the rent to 1,300",
    "I sold the Civic, driving a Mazda these days", "We're down to two cats since Milo went to my sister",
    "Turns out the party is at Jake's, not at the bar", "Never mind the 10th, it's on the 12th"])
def test_words_of_change(text):
    assert says_update(text)


@pytest.mark.parametrize("text", [
    "the demo is on the 7th", "The meeting went well", "I'm nervous about the wedding", "Rent is so expensive here",
    "The Civic needs new tyres", "What should I wear on the 12th?", "Jake's parties are always fun", ""])
def test_news_about_a_subject_is_not_a_change(text):
    assert not says_update(text)


@pytest.mark.parametrize("cue", [
    "When is the demo?", "what's my number?", "Hey, remind me of the rabbit's name", "which library am I using?",
    "What did I pick as the database for the side project?", "What amount did we settle on for the rent?",
    "what time does my flight leave?", "where do I work?", "how much is my rent?", "where's the party?",
    "What is Caroline's relationship status?"])
def test_questions_about_how_things_stand_now(cue):
    assert asks_for_now(cue)


@pytest.mark.parametrize("cue", [
    "What did Caroline research?", "when was the trip?", "how did the interview go?", "what happened at the meeting?",
    "what was my old address?", "where did we go last summer?", "who came to the party?", "I love my new flat", ""])
def test_questions_about_what_happened_are_not_followed(cue):
    assert not asks_for_now(cue)


# ----------------------------------------------------------------------------- spread

def test_an_order_question_spreads_the_best_candidates_over_days():
    day = {1: (1, date(2024, 1, 1)), 2: (1, date(2024, 1, 1)), 3: (1, date(2024, 1, 1)), 4: (1, date(2024, 1, 5)),
           5: (1, date(2024, 1, 9))}
    fused = ranked((1, 2.0), (2, 1.9), (3, 1.8), (4, 1.5), (5, 1.2), (6, 0.1))
    assert order(spread_days(fused, day, 0.5, depth=5)) == [1, 4, 2, 5, 3, 6]
    assert order(spread_days(fused, day, 0.5, depth=5, keep=2)) == [1, 2, 4, 5, 3, 6]
    # a small penalty only breaks near ties; none leaves the order as it is
    assert order(spread_days(fused, day, 0.05, depth=5)) == [1, 2, 3, 4, 5, 6]
    assert spread_days(fused, day, 0.0, depth=5) == fused
    # below the depth, and candidates without a day, are left as ranked
    assert order(spread_days(fused, day, 0.5, depth=2)) == [1, 2, 3, 4, 5, 6]
    assert order(spread_days(fused, {}, 0.5, depth=6)) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("cue", [
    "In what order did I bring up the leaky roof, the vet visit and the tax return?",
    "list every time I mentioned the gym", "What books has Melanie read?", "Which cities did they visit?",
    "What kinds of pottery does she make?", "How many times did John go hiking?", "what did both of them like",
    "What board games does he play?", "what new hobbies did she pick up?",
    "which did I mention first: the roof, the vet or the taxes?", "what have I said about my knee over time?",
    "give me a timeline of everything I told you about the garden"])
def test_cues_that_ask_for_many(cue):
    assert asks_for_many(cue)


@pytest.mark.parametrize("cue", [
    "When is the demo?", "What is Caroline's identity?", "What does she do for work?", "Where did Jon move?",
    "what was his answer", "What news did she share?", "Which class did she take?", "", "what's up",
    "What did James say?", "What does Jess think?", "When is the book club each week?",
    "what day do I have pottery every week?"])
def test_cues_that_ask_for_one_answer(cue):
    assert not asks_for_many(cue)


@pytest.mark.parametrize("cue", [
    "In what order did I bring up the leaky roof, the vet visit and the tax return?",
    "which did I mention first: the roof, the vet or the taxes?", "put these in the order I talked about them: a, b, c",
    "what was the sequence in which I mentioned a, b and c?", "did I talk about the roof before the vet?",
    "sort a, b and c by when I first told you about them", "list every time I mentioned the gym",
    "How often does John work out?", "what have I said about my knee over time?", "When did I talk about my brother?"])
def test_cues_that_ask_for_an_order_or_every_time(cue):
    assert asks_for_order(cue)


@pytest.mark.parametrize("cue", [
    # lists: spreading them cost LoCoMo 1.6 points any@10 (their evidence sits in one session)
    "What books has Melanie read?", "What items has Melanie bought?", "Which cities did they visit?",
    "How would I remove duplicates from a sequence?", "When is the book club each week?", "what's first on my list?",
    "When did Caroline go to the LGBTQ support group?", ""])
def test_cues_that_do_not_ask_for_an_order(cue):
    assert not asks_for_order(cue)


def test_only_a_cue_s_head_is_read_so_a_pasted_wall_of_text_is_not_a_list_question():
    """A 100 KB message without a comma once took seconds per reply here (an unbounded item pattern
    searched from every start): the cue is cut to its head and the items' lengths are bounded."""
    from familiar_bot.prompt.retrieval.spread import CUE_CHARS

    assert not asks_for_many("word " * 20_000 + "list every time")
    assert not asks_for_order("word " * 20_000 + "in what order") and asks_for_order("in what order " + "w " * 50_000)
    assert not asks_for_now("x" * CUE_CHARS + " when is it?") and asks_for_now("when is it? " + "w " * 50_000)
    assert asks_for_many("list every time " + "word " * 20_000)
    assert not asks_for_many("x" * CUE_CHARS + ", a, b and c")
    assert asks_for_many("y" * 30 + ", a, b and c"), "an item up to 60 characters still counts"


# ----------------------------------------------------------------------------- rendering

class NameLabels:
    """The two calls ``owned_turn_lines`` makes of a ``Labels``."""

    def for_turn(self, turn) -> str:
        return turn.author_display or "familiar"

    def rewrite_mentions(self, text: str) -> str:
        return text


def test_a_followed_thread_is_shown_newest_day_first_with_its_dates():
    turns = [T(1, "the demo is on the 7th", created_at=datetime(2024, 3, 1, 9, tzinfo=UTC)),
             T(2, "good luck with it", author_key="fam", created_at=datetime(2024, 3, 1, 9, 1, tzinfo=UTC)),
             T(3, "we pushed it to the 14th", created_at=datetime(2024, 3, 5, 9, tzinfo=UTC))]
    labels = NameLabels()
    in_time = [line for kind, line, _ in owned_turn_lines(turns, labels, UTC) if kind == "date"]
    assert in_time == ["2024-03-01:", "2024-03-05:"]
    newest = owned_turn_lines(turns, labels, UTC, newest_first=True)
    assert [line for kind, line, _ in newest if kind == "date"] == ["2024-03-05:", "2024-03-01:"]
    assert [tid for _, _, tid in newest if tid is not None] == [3, 1, 2]  # each day still in time order
    text = render([], [(k, line) for k, line, _ in newest], 500, NEWEST_FIRST_HEADER)
    assert text.startswith(NEWEST_FIRST_HEADER) and text.index("14th") < text.index("7th")
    assert render([], [(k, line) for k, line, _ in newest], 500).startswith(TURNS_HEADER + "\n")


# ----------------------------------------------------------------------------- through rag_context

class TextEmbedder:
    """The cue's vector by its words: the demo's subject, or anything else."""

    name = "test-emb"
    dim = 3

    def embed(self, texts):
        return np.stack([unit(1, 0, 0) if "demo" in t else unit(0, 0, 1) for t in texts])


def test_a_question_about_now_shows_the_update_above_the_old_word_and_a_past_question_does_not(tmp_path):
    from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS
    from familiar_pipeline.projectors.vectors import set_vectors
    from tests.test_assembly import CASS, MIA, World, ctx, section

    world = World(tmp_path)
    try:
        day = lambda n: datetime(2024, 3, n, 12, tzinfo=UTC)  # noqa: E731
        old = world.say("the demo is on the 7th", CASS, at=day(1))
        news = world.say("the demo slides are nearly done", CASS, at=day(2))
        others = [world.say(f"filler {i}", MIA, at=day(3)) for i in range(3)]
        new = world.say("we pushed it to the 14th", CASS, at=day(5))
        recent = [world.say(f"later {i}", MIA, at=day(6)) for i in range(2)]
        vectors = [(old.id, unit(1, 0, 0)), (news.id, unit(0.95, 0.3, 0)), (new.id, unit(0.6, 0.8, 0))]
        vectors += [(t.id, unit(0, 0, 1)) for t in others + recent]
        set_vectors(world.store, TURN_EMBEDDINGS, "test-emb", [(tid, v.tolist()) for tid, v in vectors])
        world.index()
        world.sync()
        env = {"FAMILIAR__PROVIDERS__EMBEDDING__BACKEND": '"hash"',
               "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS": '["rich_note", "turn_embedding"]',
               "FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "2",
               "FAMILIAR__MEMORY__RETRIEVAL__TURN_THREAD_HITS": "3",
               "FAMILIAR__MEMORY__RETRIEVAL__TURN_THREAD_SIMILARITY": "0.5"}
        assembler = world.assembler(env, embedder=TextEmbedder())

        def asked(cue):
            prompt = assembler.assemble(ctx(cue))
            assert not prompt.debug["errors"]
            return [t["turn_id"] for t in prompt.debug["rag"]["turns"]], section(prompt, "rag_context").text

        now_ids, now_text = asked("when is the demo?")
        assert now_ids.index(new.id) < now_ids.index(old.id) < now_ids.index(news.id)
        assert NEWEST_FIRST_HEADER in now_text and now_text.index("14th") < now_text.index("7th")
        then_ids, then_text = asked("what did I say about the demo?")
        assert then_ids.index(old.id) < then_ids.index(new.id)
        assert NEWEST_FIRST_HEADER not in then_text
        assembler.memory.close()
    finally:
        world.close()


def test_a_pasted_wall_of_text_is_read_only_at_its_head():
    """A change word is searched in a turn's first characters: a 100 KB candidate took ~0.1 s each."""
    from familiar_bot.prompt.retrieval.threads import UPDATE_CHARS

    assert says_update("moved it to Friday " + "word " * 20_000)
    assert not says_update("x" * UPDATE_CHARS + " moved it to Friday")
