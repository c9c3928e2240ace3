"""Retrieval's evidence beyond the words: time in the cue, people in the cue, answers after questions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from familiar_pipeline.config import RetrievalConfig
from familiar_pipeline.projectors.turns_index.run import search_text
from familiar_pipeline.storage.fts import FtsIndex

from familiar_bot.prompt.assembly import AssemblyContext
from familiar_bot.prompt.retrieval.cue_people import Directory, PeopleCue, addressed, read_people
from familiar_bot.prompt.retrieval.cue_time import TimeCue, has_time_words, parse_time_cue
from familiar_bot.prompt.retrieval.turn_signals import (CueSignals, add_signals, credit_replies,
                                                        next_replies, window_id_ranges)
from tests.hostile import hostile_messages
from tests.test_assembly import BO, CASS, MIA, World, section

UTC = timezone.utc
LA = ZoneInfo("America/Los_Angeles")
NOW = datetime(2024, 3, 15, 3, 0, tzinfo=UTC)  # a Friday; still Thursday 14 March in Los Angeles


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()


# ----------------------------------------------------------------------------- time in the cue


def test_absolute_dates_become_local_day_windows():
    def windows(cue):
        return parse_time_cue(cue, NOW, UTC).windows

    assert windows("What did Calvin buy in March 2023?") == ((date(2023, 3, 1), date(2023, 4, 1)),)
    assert windows("Who did Maria have dinner with on May 3, 2023?") == ((date(2023, 5, 3), date(2023, 5, 4)),)
    assert windows("what about 1 February, 2023") == ((date(2023, 2, 1), date(2023, 2, 2)),)
    assert windows("the 2023-07-07 meetup") == ((date(2023, 7, 7), date(2023, 7, 8)),)
    assert windows("How many times in 2022?") == ((date(2022, 1, 1), date(2023, 1, 1)),)
    # "before DATE" widens to the two weeks up to it; the date is read once, not again as its month.
    assert windows("What did John do the week before August 3, 2023?") == ((date(2023, 7, 20), date(2023, 8, 4)),)
    assert windows("summer 2023") == ((date(2023, 6, 1), date(2023, 9, 1)),)
    # Without a year: that day or month of any year.
    assert parse_time_cue("When did she go camping in June?", NOW, UTC).yearly == ((6, None),)
    assert parse_time_cue("what happened on 7 July", NOW, UTC).yearly == ((7, 7),)


def test_words_that_are_not_times_name_no_time():
    for cue in ("May I ask something?", "plans for the summer", "jan 5 was weird", "what did you do recently",
                "the 99 problems", "a car for 2023 dollars"):
        assert not parse_time_cue(cue, NOW, UTC).dated, cue


def test_relative_times_are_days_in_display_tz():
    utc = parse_time_cue("what did we eat yesterday?", NOW, UTC)
    la = parse_time_cue("what did we eat yesterday?", NOW, LA)
    assert utc.windows == ((date(2024, 3, 14), date(2024, 3, 15)),)
    assert la.windows == ((date(2024, 3, 13), date(2024, 3, 14)),)  # it is still the 14th there
    assert parse_time_cue("I found it last week", NOW, UTC).windows == ((date(2024, 3, 4), date(2024, 3, 11)),)
    assert parse_time_cue("last weekend", NOW, UTC).windows == ((date(2024, 3, 9), date(2024, 3, 11)),)
    assert parse_time_cue("last month", NOW, UTC).windows == ((date(2024, 2, 1), date(2024, 3, 1)),)
    assert parse_time_cue("three days ago", NOW, UTC).windows == ((date(2024, 3, 11), date(2024, 3, 14)),)
    assert parse_time_cue("last Friday", NOW, UTC).windows == ((date(2024, 3, 8), date(2024, 3, 9)),)
    assert parse_time_cue("last summer", NOW, UTC).windows == ((date(2023, 6, 1), date(2023, 9, 1)),)
    assert parse_time_cue("what about last June", NOW, UTC).windows == ((date(2023, 6, 1), date(2023, 7, 1)),)


def test_a_turns_date_fits_the_window_by_precision_and_fades_after_it():
    day = parse_time_cue("on 3 June 2023", NOW, UTC)
    month = parse_time_cue("in March 2023", NOW, UTC)
    at = lambda *a: datetime(*a, 12, tzinfo=UTC)  # noqa: E731
    assert day.strength(at(2023, 6, 3), UTC, 14) == 1.0
    assert day.strength(at(2023, 6, 2), UTC, 14) == 0.0  # told before it happened: no
    assert 0 < day.strength(at(2023, 6, 10), UTC, 14) < day.strength(at(2023, 6, 5), UTC, 14) < 1.0
    assert day.strength(at(2023, 6, 30), UTC, 14) == 0.0
    assert month.strength(at(2023, 3, 20), UTC, 14) == pytest.approx((7 / 31) ** 0.5)
    assert month.strength(at(2023, 4, 18), UTC, 14) > 0  # a March event told in April
    # The turn's local day decides: 06:00 UTC on the 4th is still the 3rd in Los Angeles.
    late = datetime(2023, 6, 4, 6, 0, tzinfo=UTC)
    assert parse_time_cue("on 3 June 2023", NOW, LA).strength(late, LA, 0) == 1.0
    assert parse_time_cue("on 3 June 2023", NOW, UTC).strength(late, UTC, 0) == 0.0
    yearly = parse_time_cue("in June", NOW, UTC)
    assert yearly.strength(at(2019, 6, 9), UTC, 0) == yearly.strength(at(2023, 6, 9), UTC, 0) > 0


def test_asking_when_and_time_words():
    assert parse_time_cue("When did Jon open his studio?", NOW, UTC).asks_when
    assert parse_time_cue("what year did she move?", NOW, UTC).asks_when
    assert not parse_time_cue("where did Jon open his studio?", NOW, UTC).asks_when
    assert has_time_words("I went to the fair yesterday") and has_time_words("back in 2019")
    assert not has_time_words("I went to the fair")


def test_absurd_dates_and_hostile_text_never_raise():
    for cue in ("on 31 February 2023", "in 99999", "99999 years ago", "0 days ago", "200 years ago",
                "the week before 31 April 2023", "on 0 March 2023", "1900-13-45", "in 1066",
                "9" * 10_000 + " days ago", "last " * 5000, "\ud800 yesterday \udfff"):
        parse_time_cue(cue, NOW, LA)
    assert parse_time_cue("on 31 February 2023 and in 99999", NOW, UTC) == TimeCue(asks_when=False)
    for message in hostile_messages(60):
        parse_time_cue(message.content, NOW, LA)


# ----------------------------------------------------------------------------- people in the cue

DIRECTORY = Directory.build([
    ("d:1", "Melanie"), ("d:1", "mel_99"), ("d:2", "Calvin Reyes"), ("d:3", "Will"), ("d:4", "Gina"),
    ("d:5", "Jon"), ("d:6", "Max"), ("d:7", "Maxine"), ("d:8", "Jonathan"), ("d:9", "Jonas"),
])


def test_names_first_names_and_short_forms_name_their_accounts():
    assert read_people("Which event did Calvin attend in Boston?", DIRECTORY).actors == {"d:2"}
    assert read_people("what did calvin reyes buy", DIRECTORY).actors == {"d:2"}  # lowercase, whole name
    assert read_people("What did Mel and her kids paint?", DIRECTORY).actors == {"d:1"}  # a short form
    assert read_people("did mel_99 post it", DIRECTORY).actors == {"d:1"}  # a username
    assert not read_people("will you come tomorrow?", DIRECTORY)  # a common word, lowercase
    assert read_people("Did Will come?", DIRECTORY).actors == {"d:3"}
    assert read_people("How is Max?", DIRECTORY).actors == {"d:6"}  # whole names win over short forms
    assert read_people("Is Maxi here?", DIRECTORY).actors == {"d:7"}
    assert not read_people("Is Jona here?", DIRECTORY)  # a short form two people share names nobody


def test_possessive_names_are_what_is_talked_about_when_someone_else_talks():
    cue = read_people("What did Jon say about Gina's progress with her store?", DIRECTORY)
    assert cue.actors == {"d:5"} and cue.objects == {"d:4"}
    alone = read_people("What do Melanie's kids like?", DIRECTORY)
    assert alone.actors == {"d:1"} and not alone.objects  # the only person named is the one asked about


def test_a_turn_by_them_or_about_them_counts_one_addressed_to_them_does_not():
    cue = read_people("Which event did Calvin attend?", DIRECTORY)
    assert cue.relation("d:2", "I went to the gala", 0.5) == 1.0
    assert cue.relation("d:9", "I told Calvin about the gala", 0.5) == 0.5
    assert cue.relation("d:9", "Calvin's gala was fancy", 0.5) == 0.5
    assert cue.relation("d:9", "Calvin and I went to the gala", 0.5) == 0.5
    for addressing in ("Thanks, Calvin!", "Hey Calvin, how was Boston?", "Wow Calvin, that looks amazing",
                       "That's great, Calvin.", "Calvin, you rock", "aww thank you so much Calvin!"):
        assert cue.relation("d:9", addressing, 0.5) == 0.0, addressing
    assert cue.relation("d:9", "Dave went to a gala in Boston", 0.5) == 0.0


def test_discord_pings_count_as_names():
    directory = Directory.build([("discord:222", "Bo")])
    cue = read_people("what did Bo say", directory)
    assert cue.relation("discord:1", "I saw <@222> at the park", 0.5) == 0.5
    assert cue.relation("discord:1", "<@222> look at this", 0.5) == 0.0  # a ping to get their attention
    assert addressed("hi @Bo!", 4, 6) and not addressed("I asked Bo twice", 8, 10)
    assert cue.relation("discord:1", "@Bo look at this", 0.5) == 0.0
    assert cue.relation("discord:1", "I told @Bo about it", 0.5) == 0.5


def test_people_hostile_text_never_raises():
    for message in hostile_messages(60):
        cue = read_people(message.content, DIRECTORY)
        cue.relation("d:9", message.content, 0.5)
        read_people("Calvin", DIRECTORY).relation("d:9", message.content, 0.5)


# ----------------------------------------------------------------------------- answers after questions


@dataclass(frozen=True)
class T:
    id: int
    content: str
    author_key: str | None = "a"
    channel_id: int = 1
    role: str = "user"
    created_at: datetime = datetime(2024, 1, 1, tzinfo=UTC)


def test_the_reply_after_a_question_gets_its_credit():
    rows = {1: T(1, "where should we go?", "john"), 5: T(5, "a cat", "x")}
    fused = [{"turn_id": 1, "total": 2.0, "candidate_index": 0}, {"turn_id": 5, "total": 1.5, "candidate_index": 1}]
    out = credit_replies(fused, rows, lambda qs: {1: 2}, 0.8)
    added = next(f for f in out if f["turn_id"] == 2)
    assert added["total"] == pytest.approx(1.6) and added["reply_to"] == 1
    # A reply that already scores higher on its own keeps its own score.
    fused = [{"turn_id": 1, "total": 2.0, "candidate_index": 0}, {"turn_id": 2, "total": 1.9, "candidate_index": 1}]
    out = credit_replies(fused, {**rows, 2: T(2, "Rome!", "tim")}, lambda qs: {1: 2}, 0.8)
    assert next(f for f in out if f["turn_id"] == 2)["total"] == 1.9
    assert credit_replies(fused, rows, lambda qs: {1: 2}, 0.0) == fused
    statement = {1: T(1, "we went to Rome", "john")}
    assert credit_replies([{"turn_id": 1, "total": 2.0, "candidate_index": 0}], statement,
                          lambda qs: {1: 2}, 0.8) == [{"turn_id": 1, "total": 2.0, "candidate_index": 0}]


def test_a_reply_is_the_next_turn_by_someone_else_in_the_same_channel():
    turns = {1: T(1, "where to?", "john"), 2: T(2, "other room", "tim", channel_id=2),
             3: T(3, "Rome!", "tim"), 10: T(10, "anyone?", "john"), 11: T(11, "hello?", "john"),
             12: T(12, "here", "tim")}
    channel_of = lambda ids: {i: turns[i].channel_id for i in ids if i in turns}  # noqa: E731
    rows_of = lambda ids: [turns[i] for i in sorted(ids) if i in turns]  # noqa: E731
    assert next_replies([turns[1], turns[10]], channel_of, rows_of) == {1: 3}  # 10: the asker spoke next


def test_speaker_and_time_boosts_reorder_the_candidates():
    rows = {1: T(1, "the gala in Boston", "dave", created_at=datetime(2023, 3, 1, tzinfo=UTC)),
            2: T(2, "Thanks, Calvin! Boston!", "dave", created_at=datetime(2023, 3, 1, tzinfo=UTC)),
            3: T(3, "went to a show", "d:2", created_at=datetime(2023, 3, 4, tzinfo=UTC))}
    fused = [{"turn_id": i, "total": 2.0 - i / 10, "candidate_index": i} for i in (1, 2, 3)]
    people = read_people("Which event did Calvin attend on 4 March 2023?", DIRECTORY)
    when = parse_time_cue("Which event did Calvin attend on 4 March 2023?", NOW, UTC)
    knobs = RetrievalConfig(turn_speaker_weight=0.5, turn_mention_share=0.5, turn_time_weight=1.0)
    signals = CueSignals(people, when, UTC, knobs)
    out = add_signals([dict(f) for f in fused], rows, signals)
    assert [f["turn_id"] for f in out] == [3, 1, 2]
    assert out[0]["speaker"] == 1.0 and out[0]["time"] == 1.0 and out[2]["speaker"] == 0.0
    off = CueSignals(PeopleCue(), TimeCue(), UTC, RetrievalConfig(turn_speaker_weight=0.0, turn_time_weight=0.0))
    assert [f["turn_id"] for f in add_signals([dict(f) for f in fused], rows, off)] == [1, 2, 3]


# ----------------------------------------------------------------------------- through rag_context

QUIET = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "2"}
WORDS_ONLY = {"FAMILIAR__MEMORY__RETRIEVAL__TURN_SPEAKER_WEIGHT": "0",
              "FAMILIAR__MEMORY__RETRIEVAL__TURN_TIME_WEIGHT": "0",
              "FAMILIAR__MEMORY__RETRIEVAL__TURN_REPLY_CREDIT": "0"}


def ranked(world, cue, env=None, now=None):
    prompt = world.assembler({**QUIET, **(env or {})}).assemble(AssemblyContext("fam", 10, 1, "text", cue, now=now))
    assert not prompt.debug["errors"]
    return section(prompt, "rag_context").text, prompt.debug["rag"]["turns"]


def fill(world, n=2):
    """Turns for the recent window (two), then the turn index as the pipeline builds it ("speaker: text")."""
    for i in range(n):
        world.say(f"filler {i}", MIA)
    with FtsIndex(world.paths.fts_turns, writable=True) as index:
        index.rebuild((t.id, search_text(t)) for t in world.log.turns_after(0) if not t.deleted)


def test_a_named_person_ranks_their_turns_first_not_those_addressed_to_them(world):
    addressed_turn = world.say("Thanks, Cass! The Boston gala sounds fun", BO)
    other = world.say("the Boston gala was fancy", MIA)
    theirs = world.say("I went to a show in Boston", CASS)
    about = world.say("I told Cass about Boston", BO)
    fill(world)
    _, turns = ranked(world, "Which event did Cass attend in Boston?")
    by_id = {t["turn_id"]: t for t in turns}
    assert turns[0]["turn_id"] == theirs.id
    assert by_id[about.id]["speaker"] == 0.5 and by_id[addressed_turn.id]["speaker"] == 0.0
    assert by_id[other.id]["speaker"] == 0.0


def test_a_named_date_favours_the_turns_said_then(world):
    for day in (1, 3, 9):
        world.say(f"cooked a big soup, day {day}", BO, at=datetime(2026, 3, day, 18, 0, tzinfo=UTC))
    fill(world)
    _, turns = ranked(world, "what did Bo cook on 3 March 2026?")
    assert "day 3" in world.log.turns_by_ids([turns[0]["turn_id"]])[0].content and turns[0]["time"] == 1.0


def test_yesterday_is_the_day_before_the_cue_in_display_tz(world):
    a = world.say("soup one", BO, at=datetime(2026, 3, 8, 20, 0, tzinfo=UTC))  # 8 March in both zones
    b = world.say("soup two", BO, at=datetime(2026, 3, 9, 6, 0, tzinfo=UTC))  # 9 March UTC, 8 March LA
    c = world.say("soup three", BO, at=datetime(2026, 3, 9, 20, 0, tzinfo=UTC))  # 9 March in both
    fill(world)
    now = datetime(2026, 3, 10, 6, 30, tzinfo=UTC)  # 9 March, 23:30 in Los Angeles
    exact = {"FAMILIAR__MEMORY__RETRIEVAL__TURN_TIME_SLACK_DAYS": "0"}
    _, utc = ranked(world, "what soup yesterday", exact, now=now)
    _, la = ranked(world, "what soup yesterday", {**exact, "FAMILIAR__DISPLAY_TZ": '"America/Los_Angeles"'}, now=now)
    assert {t["turn_id"]: t["time"] for t in utc} == {a.id: 0.0, b.id: 1.0, c.id: 1.0}
    assert {t["turn_id"]: t["time"] for t in la} == {a.id: 1.0, b.id: 1.0, c.id: 0.0}


def test_the_answer_after_a_matching_question_is_retrieved(world):
    question = world.say("which city should we visit this spring?", CASS)
    answer = world.say("Lisbon, no doubt", BO)
    fill(world)
    text, words = ranked(world, "which city did they pick to visit", WORDS_ONLY)
    assert answer.id not in [t["turn_id"] for t in words]
    _, turns = ranked(world, "which city did they pick to visit",
                      {"FAMILIAR__MEMORY__RETRIEVAL__TURN_SPEAKER_WEIGHT": "0"})
    credited = next(t for t in turns if t["turn_id"] == answer.id)
    assert credited["reply_to"] == question.id


def test_window_ids_are_found_by_bisecting_the_turn_log(world):
    start = datetime(2026, 1, 1, 12, tzinfo=UTC)
    ids = [world.say(f"day {i}", at=start + timedelta(days=i)).id for i in range(10)]
    ranges = window_id_ranges(world.log, [(date(2026, 1, 4), date(2026, 1, 6))], UTC, 0)
    assert ranges == [(ids[3], ids[4])]
    assert window_id_ranges(world.log, [(date(2026, 1, 4), date(2026, 1, 6))], UTC, 2) == [(ids[3], ids[6])]
    assert window_id_ranges(world.log, [(date(2030, 1, 1), date(2030, 2, 1))], UTC, 0) == []


def test_names_known_reads_profiles_nicks_and_display_names_incrementally(world):
    world.log.upsert_guild_nick(CASS[0], 1, "Cassie")
    world.say("hi", ("discord:999", "Zed"))
    latest, names = world.log.names_known()
    assert {(CASS[0], "Cass"), (CASS[0], "cass"), (CASS[0], "Cassie"), ("discord:999", "Zed")} <= set(names)
    world.say("hello", ("discord:999", "Zeddy"))
    newer, more = world.log.names_known(latest, profiles=False)
    assert newer == latest + 1 and more == [("discord:999", "Zeddy")]


def test_hostile_cues_never_fail_a_reply(world):
    world.say("Cass went to Boston yesterday?", CASS)
    world.say("Thanks, Cass!", BO)
    fill(world)
    assembler = world.assembler(QUIET)
    for message in hostile_messages(40, huge_every=4):
        prompt = assembler.assemble(AssemblyContext("fam", 10, 1, "text", message.content))
        assert not prompt.debug["errors"], (message.index, message.family)
    for cue in ("on 31 February 2023 Cass", "99999999999 years ago", "in 99999", "Cass " * 3000):
        assert not assembler.assemble(AssemblyContext("fam", 10, 1, "text", cue)).debug["errors"]


def test_context_now_must_be_aware():
    with pytest.raises(TypeError, match="aware datetime"):
        AssemblyContext("fam", 10, now=datetime(2026, 1, 1))


@pytest.mark.parametrize("knob, value", [("TURN_MENTION_SHARE", "1.5"), ("TURN_REPLY_CREDIT", "-0.1"),
                                         ("TURN_SPEAKER_WEIGHT", "-1"), ("TURN_TIME_SLACK_DAYS", "1000"),
                                         ("TURN_NEIGHBOUR_HITS", "-2"), ("TURN_WHEN_SHARE", "2")])
def test_signal_knobs_are_validated(world, knob, value):
    from familiar_pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=knob.lower()):
        world.config({f"FAMILIAR__MEMORY__RETRIEVAL__{knob}": value})
