"""fact_supersessions: every new fact evaluated oldest first, only shown priors retired, decisions logged."""

from __future__ import annotations

import json

import pytest

from familiar_pipeline.projectors.supersede import run as supersede
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.testing.scripted import careful_model
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

from .fact_helpers import BO, CASS, MIA, add_facts, fact, familiar, run_projector

SYSTEM_PHRASE = "superseded_ids"


def supersede_calls(fake):
    return [c for c in fake.calls if SYSTEM_PHRASE in c["messages"][0]["content"]]


def state(paths):
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        facts = {f.id: f for f in facts_db.facts_by_ids(store, facts_db.all_fact_ids(store))}
        decisions = store.conn.execute(
            "SELECT new_fact_id, subject_key, shown_prior_ids, retired_ids, skipped FROM supersede_decisions ORDER BY id"
        ).fetchall()
        mark = store.get_watermark(supersede.PROJECTOR).fact_id
    return facts, decisions, mark


def test_new_fact_retires_the_prior_it_replaces(tmp_path, fake_llm):
    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS), fact("Cass moved to Lisbon.", CASS, turn=2)])
    report = run_projector(supersede, tmp_path)
    facts, decisions, mark = state(paths)
    assert facts[1].superseded_by == 2 and facts[1].superseded_at is not None
    assert facts[2].current and mark == 2 and report.rows_written == 1
    assert decisions == [(2, "discord:111", [1], [1], "[]")]
    prompt = supersede_calls(fake_llm)[0]["messages"][1]["content"]
    assert 'NEW fact (id=2): "Cass moved to Lisbon."' in prompt and '- id=1: "Cass lives in Berlin."' in prompt


@pytest.mark.parametrize(
    "reply, dropped",
    [
        ({"superseded_ids": []}, None),
        ({"superseded_ids": [9999]}, "ids_not_shown"),
        ({"superseded_ids": [2]}, "ids_not_shown"),  # the new fact itself
        ("definitely not json", "malformed_reply"),
        ({"retire": [1]}, "malformed_reply"),
    ],
)
def test_bad_or_empty_answers_retire_nothing_and_advance(tmp_path, fake_llm, reply, dropped):
    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS), fact("Cass moved to Lisbon.", CASS, turn=2)])
    fake_llm.script(lambda messages: reply)
    report = run_projector(supersede, tmp_path)
    facts, decisions, mark = state(paths)
    assert all(f.current for f in facts.values())
    assert mark == 2 and decisions == [(2, "discord:111", [1], [], "[]")]
    if dropped:
        assert report.dropped[dropped] >= 1


def test_nothing_new_makes_no_call(tmp_path, fake_llm):
    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS), fact("Cass moved to Lisbon.", CASS, turn=2)])
    run_projector(supersede, tmp_path)
    calls = len(fake_llm.calls)
    report = run_projector(supersede, tmp_path)
    assert len(fake_llm.calls) == calls and report.status == "no-op"


def test_subjectless_and_first_facts_make_no_call(tmp_path, fake_llm):
    paths = familiar(tmp_path)
    add_facts(paths, [fact("It rained all week."), fact("The server moved to Discord."), fact("Cass lives in Berlin.", CASS)])
    report = run_projector(supersede, tmp_path)
    assert supersede_calls(fake_llm) == []
    assert report.dropped["no_subjects"] == 2 and state(paths)[2] == 3


def test_watermark_is_stored_and_every_new_fact_is_evaluated(tmp_path, fake_llm):
    """Every fact past the stored watermark is evaluated, not only the newest few, and a restart resumes there."""
    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS)])
    run_projector(supersede, tmp_path)
    cities = ["Paris", "Rome", "Oslo", "Riga", "Kyiv", "Porto", "Turin", "Bergen", "Lyon", "Graz", "Bonn", "Kiel"]
    add_facts(paths, [fact(f"Cass moved to {c}.", CASS, turn=i + 2) for i, c in enumerate(cities)])
    run_projector(supersede, tmp_path)  # a fresh runtime: the watermark comes from the store
    facts, decisions, mark = state(paths)
    assert [d[0] for d in decisions] == list(range(2, 14)) and mark == 13
    assert [f.id for f in facts.values() if f.current] == [13]
    assert all(facts[i].superseded_by == i + 1 for i in range(1, 13))


def test_priors_are_older_same_subject_and_capped(tmp_path, fake_llm):
    paths = familiar(tmp_path)
    toml = (paths.character_toml.read_text() + "\n[providers.memory.fact_supersede]\npriors_max = 3\n")
    paths.character_toml.write_text(toml)
    add_facts(paths, [fact(f"Cass likes band {i}.", CASS, turn=i) for i in range(1, 6)] + [fact("Bo likes band 9.", BO)])
    run_projector(supersede, tmp_path)
    _, decisions, _ = state(paths)
    shown = {new: prior for new, key, prior, _, _ in decisions}
    assert shown[5] == [2, 3, 4], "newest priors_max, all older than the new fact"
    assert shown[2] == [1] and 6 not in shown, "Bo's first fact has no priors: Cass's facts are never offered"
    assert all(max(prior) < new for new, prior in shown.items())


def test_already_retired_prior_lands_in_skipped(tmp_path, fake_llm):
    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS), fact("Cass moved to Lisbon.", CASS, turn=2)])

    def retire_behind_its_back(messages):
        # Another writer (an operator's hand edit) retires the prior while the model thinks.
        with ProjectionStore(paths.memory_db) as store:
            supersede_db.supersede(store, [1], None)
        return careful_model(messages)

    fake_llm.script(retire_behind_its_back)
    report = run_projector(supersede, tmp_path)
    facts, decisions, _ = state(paths)
    assert facts[1].superseded_by is None, "the hand retire stands; nothing re-pointed"
    assert decisions[0][3] == [] and json.loads(decisions[0][4]) == [[1, "fact id=1 already superseded"]]
    assert report.dropped["already_retired_skipped"] == 1


def test_a_failed_call_keeps_progress_and_resumes(tmp_path, fake_llm):
    from familiar_pipeline.testing.fake_llm import FakeLLM
    from familiar_pipeline.models.llm import LlmError

    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS), fact("Cass moved to Lisbon.", CASS, turn=2),
                      fact("Bo lives in Oslo.", BO, turn=3), fact("Bo moved to Riga.", BO, turn=4)])
    fake_llm.script(lambda m: FakeLLM.error("auth") if "Bo moved" in m[-1]["content"] else careful_model(m))
    with pytest.raises(LlmError):
        run_projector(supersede, tmp_path)
    facts, _, mark = state(paths)
    assert mark == 3 and facts[1].superseded_by == 2 and facts[3].current
    fake_llm.script(careful_model)
    run_projector(supersede, tmp_path)
    facts, _, mark = state(paths)
    assert mark == 4 and facts[3].superseded_by == 4


def test_a_model_naming_everything_retires_only_what_it_was_shown(tmp_path, fake_llm):
    """Collateral retirement guard: other people's facts and newer facts are never retirable."""
    paths = familiar(tmp_path)
    add_facts(paths, [
        fact("Bo lives in Berlin.", BO), fact("Cass lives in Berlin.", CASS, turn=2), fact("Mia likes tea.", MIA, turn=3),
        fact("Cass moved to Lisbon.", CASS, turn=4), fact("Cass likes cats.", CASS, turn=5),
    ])
    # Only evaluate fact 4 this time: pretend 1-3 were evaluated already.
    with ProjectionStore(paths.memory_db) as store:
        store.set_watermark(supersede.PROJECTOR, fact_id=3)
    every_id = list(range(0, 50))
    fake_llm.script(lambda messages: {"decisions": [{"new_id": n, "superseded_ids": every_id} for n in every_id]})
    run_projector(supersede, tmp_path)
    facts, decisions, _ = state(paths)
    assert {i for i, f in facts.items() if not f.current} == {2, 4}, "Bo's and Mia's facts were never offered"
    assert facts[2].superseded_by == 4
    assert facts[4].superseded_by == 5, "fact 5 came after 4 retired 2: its only current Cass prior was 4"
    assert facts[1].current and facts[3].current
    for new_id, key, shown, retired, _ in decisions:
        assert set(retired) <= set(shown) and all(p < new_id for p in shown)
        assert all(key in facts[p].subject_keys for p in shown)


# --------------------------------------------------------------------------- the careful-model suite
# Each case: earlier facts (text, subject), then the new fact, and the texts a careful
# model retires. Run through the whole projector: prompts, parsing, rails and store.

C, B, M = CASS, BO, MIA
CASES = [
    # moves
    ("move", [("Cass lives in Berlin.", C)], ("Cass moved to Lisbon.", C), {"Cass lives in Berlin."}),
    ("move back", [("Cass lives in Lisbon.", C)], ("Cass moved back to Berlin.", C), {"Cass lives in Lisbon."}),
    ("move keeps other topics", [("Cass lives in Berlin.", C), ("Cass loves hiking.", C)],
     ("Cass relocated to Porto.", C), {"Cass lives in Berlin."}),
    ("same city restated", [("Cass lives in Berlin.", C)], ("Cass is based in Berlin.", C), set()),
    ("two current homes, one move", [("Cass lives in Berlin.", C), ("Cass has a flat in Lisbon.", C)],
     ("Cass moved to Tokyo.", C), {"Cass lives in Berlin."}),
    ("move of another person", [("Cass lives in Berlin.", C), ("Bo lives in Berlin.", B)],
     ("Bo moved to Oslo.", B), {"Bo lives in Berlin."}),
    # job changes
    ("new job", [("Cass works at the bakery.", C)], ("Cass now works at the library.", C), {"Cass works at the bakery."}),
    ("job title change", [("Bo works as a nurse.", B)], ("Bo works as a paramedic.", B), {"Bo works as a nurse."}),
    ("second job is additive", [("Cass works at the bakery.", C)], ("Cass also works at a cafe on weekends.", C), set()),
    ("quit the job", [("Mia works at the bank.", M), ("Mia loves jazz.", M)],
     ("Mia no longer works at the bank.", M), {"Mia works at the bank."}),
    ("quit a different job", [("Mia works at the bank.", M)], ("Mia no longer works at the museum.", M), set()),
    ("job does not touch home", [("Cass lives in Berlin.", C)], ("Cass works at the library.", C), set()),
    # preference flips
    ("loves to hates", [("Cass loves hiking.", C)], ("Cass now hates hiking.", C), {"Cass loves hiking."}),
    ("hates to loves", [("Bo hates jazz.", B)], ("Bo now loves jazz.", B), {"Bo hates jazz."}),
    ("dislike flipped", [("Mia dislikes sushi.", M)], ("Mia really enjoys sushi.", M), {"Mia dislikes sushi."}),
    ("stronger same polarity", [("Cass likes tea.", C)], ("Cass loves tea.", C), set()),
    ("other object coexists", [("Cass loves hiking.", C)], ("Cass hates running.", C), set()),
    ("flip only the matching preference", [("Cass loves hiking.", C), ("Cass loves tea.", C)],
     ("Cass hates hiking.", C), {"Cass loves hiking."}),
    # negations
    ("no longer eats", [("Cass eats meat.", C)], ("Cass no longer eats meat.", C), {"Cass eats meat."}),
    ("stopped playing", [("Bo plays chess.", B)],
     ("Bo stopped playing chess.", B), set()),  # "playing" is not "plays": a careful model is unsure
    ("doesn't like anymore", [("Mia likes horror films.", M)], ("Mia doesn't like horror films anymore.", M), {"Mia likes horror films."}),
    ("negation of another thing", [("Cass eats meat.", C)], ("Cass no longer eats sugar.", C), set()),
    ("diet change", [("Bo is vegetarian.", B)], ("Bo went vegan.", B), {"Bo is vegetarian."}),
    ("relationship change", [("Mia is dating Sam.", M)], ("Mia is married to Alex.", M), {"Mia is dating Sam."}),
    # additive facts never retire anything
    ("also likes", [("Cass likes coffee.", C)], ("Cass also likes tea.", C), set()),
    ("another pet", [("Bo owns a cat.", B)], ("Bo owns another cat.", B), set()),
    ("as well", [("Mia enjoys chess.", M)], ("Mia enjoys go as well.", M), set()),
    ("a hobby added", [("Cass loves hiking.", C), ("Cass works at the bakery.", C)], ("Cass started learning the cello.", C), set()),
    ("independent topic", [("Bo lives in Oslo.", B)], ("Bo is allergic to peanuts.", B), set()),
    # different people, same wording
    ("same words other person", [("Bo loves hiking.", B)], ("Cass now hates hiking.", C), set()),
    ("same city other person", [("Bo lives in Berlin.", B)], ("Cass moved to Lisbon.", C), set()),
    ("twins of wording", [("Bo works at the bakery.", B), ("Cass works at the bakery.", C)],
     ("Cass now works at the library.", C), {"Cass works at the bakery."}),
    ("shared fact, one subject moves", [("Cass and Bo live in Berlin.", (C, B))],
     ("Cass moved to Lisbon.", C), {"Cass and Bo live in Berlin."}),
    ("no priors at all", [], ("Cass moved to Lisbon.", C), set()),
]


def _case_subject(case_index: int, who) -> Subject:
    """Each case gets its own people, so one familiar can hold the whole suite."""
    return Subject(f"discord:{1000 + case_index}{who.canonical_key[-1]}", who.display_at_write)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Every case's priors then its new fact, in one familiar, judged in one projector run."""
    from familiar_pipeline.testing.fake_llm import install_fake_llm

    fake = install_fake_llm()
    fake.reset()
    fake.script(careful_model)
    root = tmp_path_factory.mktemp("suite")
    paths = familiar(root)
    drafts, new_ids, turn = [], {}, 0
    for index, (name, priors, new, _) in enumerate(CASES):
        for text, who in [*priors, new]:
            turn += 1
            people = who if isinstance(who, tuple) else (who,)
            drafts.append(fact(text, *(_case_subject(index, p) for p in people), turn=turn))
        new_ids[name] = len(drafts)
    add_facts(paths, drafts)
    run_projector(supersede, root)
    facts, decisions, mark = state(paths)
    return facts, decisions, mark, new_ids


@pytest.mark.parametrize("name, priors, new, expected", CASES, ids=[c[0] for c in CASES])
def test_careful_model_suite(suite, name, priors, new, expected):
    facts, decisions, mark, new_ids = suite
    new_id = new_ids[name]
    case_ids = range(new_id - len(priors), new_id + 1)
    retired = {facts[i].text for i in case_ids if not facts[i].current}
    assert retired == expected
    assert facts[new_id].current and mark == max(new_ids.values())
    assert all(facts[i].superseded_by == new_id for i in case_ids if not facts[i].current), "priors never retire each other here"
    offered = set()
    for decided_for, key, shown, retired_ids, _ in decisions:
        if decided_for != new_id:
            continue
        assert set(retired_ids) <= set(shown), "only offered ids are ever retired"
        assert all(p < decided_for and key in facts[p].subject_keys for p in shown)
        assert set(shown) <= set(case_ids), "no other case's people are ever offered"
        offered |= set(shown)
    assert {i for i in case_ids if not facts[i].current} <= offered


def test_suite_has_at_least_thirty_cases():
    assert len(CASES) >= 30


# --------------------------------------------------------------------------- batching


def test_new_facts_of_one_batch_share_a_call_of_at_most_new_facts_per_call(tmp_path, fake_llm):
    """The facts one write brought share a call whoever they are about (at most `new_facts_per_call`
    facts), not one call per fact or per person."""
    paths = familiar(tmp_path)
    paths.character_toml.write_text(paths.character_toml.read_text() + "\n[providers.memory.fact_supersede]\nnew_facts_per_call = 4\n")
    cities = ["Berlin", "Paris", "Rome", "Oslo", "Riga", "Kyiv", "Porto"]
    with ProjectionStore(paths.memory_db) as store:  # one write, as one extraction batch makes
        facts_db.append_facts(store, [fact(f"Cass moved to {c}.", CASS, turn=i + 1) for i, c in enumerate(cities)]
                           + [fact("Bo lives in Oslo.", BO, turn=20), fact("Bo moved to Riga.", BO, turn=21)])
    run_projector(supersede, tmp_path)
    calls = [c["messages"][1]["content"] for c in supersede_calls(fake_llm)]
    # Facts 1-4, 5-8 and 9: fact 1 and Bo's fact 8 have no prior, so they decide nothing where they are new.
    assert len(calls) == 3
    facts, decisions, mark = state(paths)
    assert [f.id for f in facts.values() if f.current] == [7, 9] and mark == 9
    assert all(facts[i].superseded_by == i + 1 for i in range(1, 7)) and facts[8].superseded_by == 9
    assert "- id=1:" in calls[0] and all(f"NEW fact (id={i})" in calls[0] for i in (2, 3, 4)) and "id=5" not in calls[0]
    assert calls[1].count("Person: ") == 1 and "NEW fact (id=8)" not in calls[1]
    assert calls[2].startswith('Person: "Bo"') and "- id=8:" in calls[2] and "Cass" not in calls[2]


def test_one_batch_about_two_people_is_one_call_with_a_section_each(tmp_path, fake_llm):
    """Two people's new facts from one batch: one call, a section per person, each section showing only
    that person's priors; a fact naming both is judged in both sections."""
    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS), fact("Bo lives in Oslo.", BO, turn=2),
                      fact("Cass and Bo love hiking.", CASS, BO, turn=3)])
    run_projector(supersede, tmp_path)
    before = len(supersede_calls(fake_llm))
    with ProjectionStore(paths.memory_db) as store:  # one extraction batch
        facts_db.append_facts(store, [fact("Cass moved to Lisbon.", CASS, turn=4), fact("Bo moved to Riga.", BO, turn=5),
                                      fact("Cass and Bo now hate hiking.", CASS, BO, turn=6)])
    run_projector(supersede, tmp_path)
    calls = supersede_calls(fake_llm)[before:]
    assert len(calls) == 1
    text = calls[0]["messages"][1]["content"]
    cass, bo = text.split('\n\nPerson: "Bo"')
    assert cass.startswith('Person: "Cass"') and "Berlin" in cass and "Oslo" not in cass and "Riga" not in cass
    assert "Oslo" in bo and "Berlin" not in bo and "Lisbon" not in bo
    assert "NEW fact (id=6)" in cass and "NEW fact (id=6)" in bo
    facts, decisions, _ = state(paths)
    assert facts[1].superseded_by == 4 and facts[2].superseded_by == 5 and facts[3].superseded_by == 6
    assert all(facts[i].current for i in (4, 5, 6))
    assert {(new, key) for new, key, *_ in decisions if new > 3} == {
        (4, CASS.canonical_key), (5, BO.canonical_key), (6, CASS.canonical_key), (6, BO.canonical_key)}


def test_an_id_shown_in_another_persons_section_is_not_retired(tmp_path, fake_llm):
    """The model sees both sections at once; a new fact may still retire only what its own section showed."""
    paths = familiar(tmp_path)
    add_facts(paths, [fact("Cass lives in Berlin.", CASS), fact("Bo lives in Oslo.", BO, turn=2)])
    run_projector(supersede, tmp_path)
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_facts(store, [fact("Cass likes tea.", CASS, turn=3), fact("Bo moved to Riga.", BO, turn=4)])
    fake_llm.script(lambda messages: {"decisions": [{"new_id": 4, "superseded_ids": [1, 2]},
                                                    {"new_id": 3, "superseded_ids": [2]}]})
    report = run_projector(supersede, tmp_path)
    facts, decisions, _ = state(paths)
    assert facts[1].current and facts[2].superseded_by == 4
    assert report.dropped["ids_not_shown"] == 2  # Cass's 1 named by Bo's fact, Bo's 2 by Cass's
    assert [(new, retired) for new, _key, _shown, retired, _ in decisions] == [(3, []), (4, [2])]


@pytest.mark.parametrize(
    "reply, dropped",
    [
        ({"superseded_ids": [1]}, "malformed_reply"),  # the flat one-fact form is ambiguous for two deciders
        ({"decisions": [{"new_id": 77, "superseded_ids": [1]}]}, "unknown_new_ids"),
        ({"decisions": [{"new_id": 3, "superseded_ids": [1, 2, 3]}]}, "ids_not_shown"),  # 3 itself
        ({"decisions": [{"superseded_ids": [1]}]}, "malformed_reply"),
    ],
)
def test_batched_replies_are_checked_per_decider(tmp_path, fake_llm, reply, dropped):
    paths = familiar(tmp_path)
    with ProjectionStore(paths.memory_db) as store:
        facts_db.append_facts(store, [fact("Cass lives in Berlin.", CASS), fact("Cass likes tea.", CASS, turn=2),
                            fact("Cass moved to Lisbon.", CASS, turn=3)])
    fake_llm.script(lambda messages: reply)
    report = run_projector(supersede, tmp_path)
    facts, decisions, mark = state(paths)
    assert report.dropped[dropped] >= 1 and mark == 3
    for new_id, _key, shown, retired, _ in decisions:
        assert set(retired) <= set(shown) and all(p < new_id for p in shown)
    assert facts[3].current


def test_parse_reply_shapes():
    from familiar_pipeline.projectors.supersede import prompt as prompt

    assert prompt.parse_reply('```json\n{"decisions": [{"new_id": "5", "superseded_ids": [1, "2"]}]}\n```', [5]) == ({5: [1, 2]}, 0)
    assert prompt.parse_reply('[{"new_id": 5, "superseded_ids": [1]}]', [5, 6]) == ({5: [1]}, 0)
    assert prompt.parse_reply('{"superseded_ids": [1]}', [5]) == ({5: [1]}, 0)
    assert prompt.parse_reply("", [5]) == ({}, 1)
