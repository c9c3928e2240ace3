"""Substance (issue 29): a short pleasantry or a question no longer fills the top of the ranking."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest

from familiar_bot.prompt.retrieval.substance import TOKEN_CAP, content_tokens, rerank_by_substance, substance
from tests.hostile import hostile_messages
from tests.test_assembly import BO, CASS
from tests.test_retrieval_signals import fill, ranked, world  # noqa: F401  (the fixture)


@dataclass(frozen=True)
class T:
    id: int
    content: str


def cands(*pairs):
    return [{"turn_id": tid, "total": total} for tid, total in pairs]


def ids(out):
    return [f["turn_id"] for f in out]


ROWS = {1: T(1, "Thanks, Mel!"),
        2: T(2, "Cool! What did it look like?"),
        3: T(3, "The kids loved the dinosaur exhibit at the museum, especially the bones"),
        4: T(4, "We went camping by the lake and roasted marshmallows")}


def test_a_pleasantry_and_a_question_give_way_to_a_turn_with_content():
    fused = cands((1, 2.0), (2, 1.95), (3, 1.9), (4, 1.0))
    out = rerank_by_substance(fused, ROWS, depth=10, length_weight=0.2, question_weight=0.05)
    assert ids(out) == [3, 1, 2, 4]  # the exhibit turn's seven content words beat the two of "Thanks, Mel!"
    assert out[0]["substance"] == pytest.approx(0.2 * math.log1p(content_tokens(ROWS[3].content)), abs=1e-4)
    # the substance term is written in the best total's units; the question pays its penalty
    assert out[2]["total"] == pytest.approx(1.95 + 2.0 * (0.2 * math.log1p(content_tokens(ROWS[2].content)) - 0.05))
    assert ids(fused) == [1, 2, 3, 4] and "substance" not in fused[0] and fused[0]["total"] == 2.0  # not changed


def test_a_far_better_match_stays_first_and_only_the_head_is_reordered():
    fused = cands((1, 3.0), (3, 1.0), (2, 0.9), (4, 0.8))
    out = rerank_by_substance(fused, ROWS, depth=2, length_weight=0.2, question_weight=0.05)
    # "Thanks, Mel!" keeps first place at three times the others' score; below the depth nothing moves
    assert ids(out) == [1, 3, 2, 4] and out[2] is fused[2] and "substance" not in out[3]


@pytest.mark.parametrize("depth, length, question, totals", [
    (0, 0.2, 0.05, (2.0, 1.9)),  # off by depth
    (10, 0.0, 0.0, (2.0, 1.9)),  # off by weights
    (10, 0.2, 0.05, (0.0, 0.0)),  # nothing matched: no scale to write a term in
])
def test_off_or_nothing_to_scale_leaves_the_order(depth, length, question, totals):
    fused = cands((1, totals[0]), (3, totals[1]))
    assert rerank_by_substance(fused, ROWS, depth, length, question) is fused


def test_a_candidate_without_a_row_keeps_its_total():
    out = rerank_by_substance(cands((99, 2.0), (1, 1.0)), ROWS, 10, 0.2, 0.05)
    assert out[0]["turn_id"] == 99 and out[0]["total"] == 2.0 and "substance" not in out[0]


def test_length_counts_content_words_up_to_a_cap_and_a_paste_costs_no_more_than_its_head():
    assert content_tokens("Thanks, Mel!") == 2  # "thanks", "mel": no stopword
    assert content_tokens("") == 0
    words = " ".join(f"word{i}" for i in range(5000))
    assert content_tokens(words) == TOKEN_CAP
    assert substance(words, 0.2, 0.05) == pytest.approx(0.2 * math.log1p(TOKEN_CAP))
    paste = "zq " * 1_000_000  # 3 MB
    started = time.perf_counter()
    content_tokens(paste)
    assert time.perf_counter() - started < 1.0  # generous: the head (4,000 chars) is all that is read


def test_hostile_text_never_raises():
    for message in hostile_messages(60, huge_every=5):
        score = substance(message.content, 0.2, 0.05)
        assert math.isfinite(score), (message.index, message.family)
    assert substance("\ud800 lone surrogate?", 0.2, 0.05) < 0.2 * math.log1p(3)


QUIET_WORDS = {"FAMILIAR__MEMORY__RETRIEVAL__TURN_TIME_WEIGHT": "0"}


def test_the_knobs_reach_the_reply_path(world):  # noqa: F811
    thanks = [world.say(t, CASS) for t in ("Kids, right?", "Ha, the kids!", "Thanks Bo, kids are kids")]
    answer = world.say("My kids love the dinosaur exhibit and hiking in the forest near the lake", CASS)
    world.say("Sounds lovely, I like it", BO)
    fill(world)
    cue = "What do Cass's kids like?"
    _, off = ranked(world, cue, {**QUIET_WORDS, "FAMILIAR__MEMORY__RETRIEVAL__TURN_SUBSTANCE_DEPTH": "0"})
    # words alone: the named person's short turns match "kids" best (BM25 favours short turns)
    assert off[0]["turn_id"] in {t.id for t in thanks} and off[-1]["turn_id"] == answer.id
    assert all("substance" not in t for t in off)
    _, shipped = ranked(world, cue, QUIET_WORDS)
    assert {t["turn_id"] for t in shipped} == {t["turn_id"] for t in off} and all("substance" in t for t in shipped)
    assert next(t for t in shipped if t["turn_id"] == thanks[0].id)["substance"] < 0.2 * math.log1p(2)  # asks
    _, strong = ranked(world, cue, {**QUIET_WORDS, "FAMILIAR__MEMORY__RETRIEVAL__TURN_SUBSTANCE_LENGTH": "1.0"})
    assert strong[0]["turn_id"] == answer.id


@pytest.mark.parametrize("knob, value", [("TURN_SUBSTANCE_LENGTH", "-0.1"), ("TURN_SUBSTANCE_QUESTION", "-1"),
                                         ("TURN_SUBSTANCE_DEPTH", "-5")])
def test_substance_knobs_are_validated(world, knob, value):  # noqa: F811
    from familiar_pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=knob.lower()):
        world.config({f"FAMILIAR__MEMORY__RETRIEVAL__{knob}": value})
