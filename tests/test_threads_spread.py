"""Issue 33: the newer word wins (threads) and list questions spread over days (spread)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone

import numpy as np
import pytest

from familiar_bot.prompt.retrieval import NEWEST_FIRST_HEADER, TURNS_HEADER, owned_turn_lines, render
from familiar_bot.prompt.spread import asks_for_many, spread_days
from familiar_bot.prompt.threads import follow_threads, says_update

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
    assert out[0]["updates"] == 1 and out[0]["total"] == pytest.approx(2.0 + 1e-3)
    assert order(fused) == [1, 2, 3] and "updates" not in fused[2]  # the input is not changed


@pytest.mark.parametrize("rows", [
    # someone else's later turn on the same subject ("my brother's demo is on the 9th")
    {1: T(1, "the demo is on the 7th"), 3: T(3, "my demo is on the 9th", author_key="bro")},
    # the familiar's own turns never update a person's
    {1: T(1, "the demo is on the 7th"), 3: T(3, "noted, the 14th", author_key=None, role="assistant")},
])
def test_other_peoples_turns_do_not_update_a_persons_word(rows):
    out = follow_threads(ranked((1, 2.0), (3, 0.9)), rows, {1: DEMO, 3: DEMO_LATER}, hits=3, threshold=0.6)
    assert order(out) == [1, 3]


def test_only_later_and_close_turns_are_followed():
    rows = {1: T(1, "we pushed it to the 14th"), 5: T(5, "the demo is on the 7th"), 7: T(7, "lunch")}
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


def test_a_word_of_change_brings_a_looser_match_into_the_thread():
    rows = {1: T(1, "the demo is on the 7th"), 3: T(3, "so we moved it to the 14th")}
    vectors = {1: unit(1, 0, 0), 3: unit(0.5, 0.85, 0)}  # cosine ~0.5
    fused = ranked((1, 2.0), (3, 0.9))
    assert order(follow_threads(fused, rows, vectors, hits=3, threshold=0.6)) == [1, 3]
    assert order(follow_threads(fused, rows, vectors, hits=3, threshold=0.6, update_bonus=0.2)) == [3, 1]
    assert says_update("we pushed it to the 14th") and says_update("switched to pytest")
    assert not says_update("the demo is on the 7th")


# ----------------------------------------------------------------------------- spread

def test_a_list_question_spreads_the_best_candidates_over_days():
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
    "What did James say?", "What does Jess think?"])
def test_cues_that_ask_for_one_answer(cue):
    assert not asks_for_many(cue)


def test_only_a_cue_s_head_is_read_so_a_pasted_wall_of_text_is_not_a_list_question():
    """A 100 KB message without a comma once took seconds per reply here (an unbounded item pattern
    searched from every start): the cue is cut to its head and the items' lengths are bounded."""
    from familiar_bot.prompt.spread import CUE_CHARS

    assert not asks_for_many("word " * 20_000 + "list every time")
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
