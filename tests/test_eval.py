"""`familiar eval locomo` end to end on a tiny LoCoMo-format fixture, plus its scoring rules.

The fixture is written here, never taken from the licensed LoCoMo file.
"""

from __future__ import annotations

import json

import pytest

from familiar_bot.app.cli.main import main
from familiar_bot.app.eval import evaluation, locomo

TURNS_1 = [
    ("Ana", "I finally bought a cello last week and the teacher is great"),
    ("Ben", "Nice! I went kayaking on the river near Porto"),
    ("Ana", "My sister Lucia is moving to Montreal in autumn"),
    ("Ben", "I adopted a grey greyhound named Biscuit"),
]
TURNS_2 = [
    ("Ana", "The orchestra audition went badly, my bow slipped"),
    ("Ben", "Biscuit ate my running shoes this morning"),
    ("Ana", "Lucia found a flat in Montreal near the old port"),
    ("Ben", "I signed up for a marathon in Lisbon next spring"),
    ("Ana", "Good luck with the training, Ben"),
    ("Ben", "Thanks, I will need it"),
]


def fixture() -> list[dict]:
    def session(turns, n):
        return [{"speaker": s, "dia_id": f"D{n}:{i + 1}", "text": t} for i, (s, t) in enumerate(turns)]

    return [{
        "sample_id": "tiny-1",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": session(TURNS_1, 1),
            "session_2_date_time": "10:15 am on 3 June, 2023", "session_2": session(TURNS_2, 2),
        },
        "observation": {
            "session_1_observation": {
                "Ana": [["Ana bought a cello and likes her teacher.", "D1:1"]],
                "Ben": [["Ben has a greyhound named Biscuit.", "D1:4"]],
            },
            "session_2_observation": {
                "Ben": [["Ben will run a marathon in Lisbon.", ["D2:4"]]],
            },
        },
        "qa": [
            {"question": "What instrument did Ana buy, a cello?", "answer": "a cello", "evidence": ["D1:1"],
             "category": 4},
            {"question": "Where is Lucia moving, Montreal?", "answer": "Montreal", "evidence": ["D1:3; D2:3"],
             "category": 1},
            {"question": "When is the Lisbon marathon?", "answer": 2024, "evidence": ["D2:4", "D:9:9"], "category": 2},
            {"question": "What did the greyhound Biscuit eat?", "answer": "shoes", "evidence": ["D2:9"],
             "category": 3},  # no such turn
            {"question": "Did Ben play the cello?", "evidence": ["D1:1"], "category": 5},  # adversarial: not scored
        ],
    }]


def test_parse_evidence_splits_packed_ids_and_counts_bad_ones():
    assert evaluation.parse_evidence(["D8:6; D9:17", "D1:2", "D:11:26", 7]) == (["D8:6", "D9:17", "D1:2"], 2)


def test_score_question_any_all_session_and_rendered():
    units = [frozenset({5}), frozenset({1, 2}), frozenset({9})]
    scores = evaluation.score_question(units, gold={2, 9}, gold_sessions={2}, session_of_turn={1: 1, 2: 1, 5: 1, 9: 2},
                                       shown={9})
    assert scores["any@1"] == 0.0 and scores["any@5"] == 1.0
    assert scores["all@1"] == 0.0 and scores["all@5"] == 1.0
    assert scores["session_any@5"] == 1.0
    assert scores["rendered_recall"] == 1.0 and scores["rendered_all"] == 0.0


def test_ranked_units_alternate_turns_and_facts():
    debug = {"turns": [{"turn_id": 3}, {"turn_id": 4}, {"turn_id": 8}], "facts": [{"fact_id": 1}]}
    assert evaluation.ranked_units(debug, {1: (6, 7)}) == [frozenset({3}), frozenset({6, 7}), frozenset({4}), frozenset({8})]


@pytest.mark.parametrize("embedder", ["off", "hash"])
def test_eval_locomo_end_to_end(tmp_path, capsys, embedder):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    out = tmp_path / "out"
    code = main(["eval", "locomo", "--data", str(data), "--embedder", embedder, "--out", str(out),
                 "--workdir", str(tmp_path / "work")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| overall | 3 |" in printed and "skipped 2 unusable evidence ids and 1 questions" in printed
    results = json.loads((out / "results.json").read_text())
    overall = results["overall"]
    for key in ("n", "any@1", "any@5", "any@10", "any@20", "any@50", "all@10", "session_any@5",
                "rendered_recall", "rendered_tokens_mean", "latency_ms_p50", "latency_ms_p95"):
        assert key in overall
    assert overall["n"] == 3 and set(results["by_category"]) == {"single-hop", "multi-hop", "temporal"}
    # Every question shares a rare word with its evidence, and eight turns fit the text budget easily.
    assert overall["any@5"] == 100.0 and overall["rendered_recall"] == 100.0
    assert results["by_category"]["single-hop"]["any@1"] == 100.0
    assert 0 < overall["rendered_tokens_mean"] <= 2400
    # The headline mode: turns only, named in every output.
    assert results["setup"]["facts"] == "none" and results["setup"]["facts_loaded"] == 0
    assert "facts mode: none" in printed
    md = (out / "results.md").read_text()
    assert md.startswith("facts mode: none") and "| scope |" in md
    assert (out / "recall_at_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # matplotlib: dev dependency


def test_eval_refuses_a_missing_file_and_says_where_to_get_locomo(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(locomo.DATA_ENV, raising=False)
    for argv in (["--data", str(tmp_path / "nope.json")], []):
        assert main(["eval", "locomo", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "github.com/snap-research/locomo" in err and "CC BY-NC 4.0" in err
        assert ("no such file" in err) == bool(argv)


def test_locomo_path_from_the_argument_else_the_environment(tmp_path):
    given, from_env = tmp_path / "a.json", tmp_path / "b.json"
    given.write_text("[]")
    from_env.write_text("[]")
    env = {locomo.DATA_ENV: str(from_env)}
    assert locomo.locate(given, env=env) == given
    assert locomo.locate(None, env=env) == from_env
    with pytest.raises(locomo.LocomoMissing, match="FAMILIAR_LOCOMO"):
        locomo.locate(None, env={})


def test_eval_gold_facts_are_labelled_an_oracle(tmp_path, capsys):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    out = tmp_path / "out"
    assert main(["eval", "locomo", "--data", str(data), "--facts", "gold", "--out", str(out),
                 "--workdir", str(tmp_path / "work")]) == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["setup"]["facts"] == "gold" and results["setup"]["oracle_upper_bound"] is True
    assert results["setup"]["facts_loaded"] == 3
    assert "ORACLE UPPER BOUND" in printed and "ORACLE UPPER BOUND" in (out / "results.md").read_text()
    # Each observation points at its evidence turn, so the facts carry recall on their own.
    assert results["overall"]["facts_any@10"] > 0


def test_eval_imports_each_conversation_into_the_scope_its_questions_are_asked_in(tmp_path, capsys):
    """Scoping cannot move the LoCoMo figures: the imported turns, the facts and the replies
    of a conversation are all in one scope (a channel outside any server)."""
    from familiar_bot.app.eval.answer import with_question_scopes
    from familiar_bot.prompt.scoping import reply_scope, visible_scopes
    from familiar_bot.prompt.types import AssemblyContext
    from familiar_pipeline.config import load_config
    from familiar_pipeline.storage.scopes import turn_scope
    from familiar_pipeline.storage.snapshots import SnapshotReader
    from familiar_pipeline.storage.turns import TurnLog

    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    work = tmp_path / "work"
    assert main(["eval", "locomo", "--data", str(data), "--facts", "gold", "--out", str(tmp_path / "out"),
                 "--workdir", str(work)]) == 0
    capsys.readouterr()
    familiars = sorted(p.parent for p in work.rglob("character.toml") if p.parent.name.startswith("eval-"))
    assert familiars
    for folder in familiars:
        with TurnLog(folder / "turns.db", readonly=True) as log:
            assert {turn_scope(t) for t in log.turns_after(0)} == {evaluation.EVAL_SCOPE}
        facts = SnapshotReader(folder / "serving").current().table("facts")
        assert facts.num_rows and set(facts["scope"].to_pylist()) == {evaluation.EVAL_SCOPE}
        ctx = AssemblyContext(folder.name, evaluation.EVAL_CHANNEL, None, "text", "q")
        assert reply_scope(ctx) == evaluation.EVAL_SCOPE
    # --answer asks each question in its own DM channel, joined to the conversation's scope only.
    config = load_config(familiars[0].name, root=familiars[0].parent, env={})
    conv = type("Conv", (), {"questions": [type("Q", (), {"index": i})() for i in range(3)]})()
    joined = with_question_scopes(config, conv).memory.scopes
    memory = type("M", (), {"config": type("C", (), {"memory": type("MM", (), {"scopes": joined})()})()})()
    for i in range(3):
        asked = AssemblyContext(familiars[0].name, 1_000_000 + i, None, "text", "q")
        assert visible_scopes(asked, memory) == (f"channel:{1_000_000 + i}", evaluation.EVAL_SCOPE)


def test_eval_extracted_facts_run_the_facts_asset_with_the_background_model(tmp_path, capsys, monkeypatch, fake_llm):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    out = tmp_path / "out"
    assert main(["eval", "locomo", "--data", str(data), "--facts", "extracted", "--background-model", "fake/careful",
                 "--embedder", "hash", "--out", str(out), "--workdir", str(tmp_path / "work")]) == 0
    printed = capsys.readouterr().out
    setup = json.loads((out / "results.json").read_text())["setup"]
    assert setup["facts"] == "extracted" and "oracle_upper_bound" not in setup
    extraction = setup["extraction"]
    assert extraction["model"] == "fake/careful"
    # Ten turns make one full extraction batch (the shipped batch_size); the scripted model answered
    # the facts asset's real prompts: calls and tokens were counted.
    assert extraction["calls"] >= 1 and extraction["prompt_tokens"] > 0 and extraction["completion_tokens"] > 0
    assert setup["facts_loaded"] >= 1 and len(fake_llm.calls) >= extraction["calls"]
    assert "model fake/careful" in printed


def test_eval_extracted_needs_a_background_model(tmp_path, capsys):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    assert main(["eval", "locomo", "--data", str(data), "--facts", "extracted"]) != 0
    assert "needs --background-model" in capsys.readouterr().err


def test_eval_refuses_a_missing_file(tmp_path, capsys):
    assert main(["eval", "locomo", "--data", str(tmp_path / "nope.json")]) != 0
    assert "no such file" in capsys.readouterr().err


def eval_hash(tmp_path, *flags: str):
    """`familiar eval locomo` on the tiny fixture with the hash embedder and ``flags``; its --out folder."""
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    out = tmp_path / "out"
    assert main(["eval", "locomo", "--data", str(data), "--embedder", "hash", "--out", str(out), *flags,
                 "--workdir", str(tmp_path / "work")]) == 0
    return out


def test_sweep_measures_the_grid_then_variations_around_the_best(tmp_path, capsys):
    out = eval_hash(tmp_path, "--sweep")
    sweep = json.loads((out / "sweep.json").read_text())
    grid = len(evaluation.SWEEP_TURN_WEIGHTS) * len(evaluation.SWEEP_TURN_CONTEXT)
    assert len(sweep["rows"]) == grid + len(evaluation.sweep_variations())
    assert sweep["best"]["any@10"] == max(r["any@10"] for r in sweep["rows"])
    rrf = next(r for r in sweep["rows"] if r["label"].endswith("turn_fusion=rrf"))
    assert rrf["retrieval"]["turn_fusion"] == "rrf"
    assert "**(best)**" in (out / "sweep.md").read_text()
    # One conversation: nothing is left to tune on, so there is no rotation to report.
    assert sweep["rotation"] == {"rotations": [], "pooled_held_out": {}}


def test_held_out_rotation_tunes_on_the_others_and_scores_the_one_left_out():
    def rec(conv, hit):
        return {"conversation": conv, "category": 4, "any@10": float(hit), "any@5": float(hit),
                "rendered_tokens": 0, "latency_ms": 0.0, **{m: 0.0 for m in evaluation.METRICS
                                                             if m not in ("any@10", "any@5")}}
    # "a" wins on c1 and c2, "b" only on c3.
    records = {"a": [rec("c1", 1), rec("c2", 1), rec("c3", 0)], "b": [rec("c1", 0), rec("c2", 0), rec("c3", 1)]}
    rotation = evaluation.held_out_rotation(records)
    by_held = {r["held_out"]: r for r in rotation["rotations"]}
    assert by_held["c3"]["chosen"] == "a" and by_held["c3"]["held_out_any@10"] == 0.0
    assert by_held["c3"]["best_on_held_out"] == "b" and by_held["c3"]["best_on_held_out_any@10"] == 100.0
    assert by_held["c1"]["chosen"] == "a" and by_held["c1"]["tuned_any@10"] == 50.0
    assert rotation["pooled_held_out"]["any@10"] == round(100 * 2 / 3, 2)


def test_held_out_rotation_selects_on_the_sum_of_the_headline_targets():
    def rec(conv, hit, session):
        return {"conversation": conv, "category": 4, "rendered_tokens": 0, "latency_ms": 0.0,
                **{m: 0.0 for m in evaluation.METRICS}, "any@10": float(hit), "session_any@10": float(session)}
    # "a" has the better any@10 everywhere, "b" gives up a little of it for much more session recall.
    convs = ("c1", "c2", "c3")
    records = {"a": [rec(c, 1, 0) for c in convs] + [rec(c, 1, 0) for c in convs],
               "b": [rec(c, 1, 1) for c in convs] + [rec(c, 0, 1) for c in convs]}
    assert {r["chosen"] for r in evaluation.held_out_rotation(records)["rotations"]} == {"b"}
    assert {r["chosen"] for r in evaluation.held_out_rotation(records, ("any@10",))["rotations"]} == {"a"}


def test_token_f1_normalises_like_locomo():
    from familiar_bot.app.eval.answer import answer_tokens, token_f1

    assert answer_tokens("The cello, and a Bow!") == ["cello", "bow"]
    assert token_f1("a cello", "Cello.") == 1.0
    assert token_f1("she bought a cello", "cello") == pytest.approx(0.5)
    assert token_f1("a violin", "cello") == 0.0 and token_f1("", "cello") == 0.0


def test_judgement_parsing_reads_json_then_a_lone_label():
    from familiar_bot.app.eval.answer import parse_judgement

    assert parse_judgement('{"reason": "same instrument", "label": "correct"}') == ("CORRECT", "same instrument")
    assert parse_judgement('```json\n{"label": "WRONG", "reason": "another city"}\n```') == ("WRONG", "another city")
    assert parse_judgement("Both name Montreal. CORRECT")[0] == "CORRECT"
    assert parse_judgement("CORRECT or WRONG, hard to say")[0] is None  # both labels: unreadable
    assert parse_judgement("")[0] is None


def test_eval_answer_asks_the_bot_and_a_judge_and_a_rerun_is_free(tmp_path, capsys, fake_llm):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    out, cache = tmp_path / "out", tmp_path / "answers.sqlite"
    argv = ["eval", "locomo", "--data", str(data), "--out", str(out), "--workdir", str(tmp_path / "work"),
            "--answer", "--answer-model", "fake/answerer", "--judge-model", "fake/judge", "--answer-cache", str(cache)]
    assert main(argv[:-1] + [str(tmp_path / "other.sqlite"), "--questions", "2"]) == 0
    assert json.loads((out / "results.json").read_text())["answer"]["overall"]["n"] == 2
    fake_llm.calls.clear()
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    answer = json.loads((out / "results.json").read_text())["answer"]
    assert (answer["answer_model"], answer["judge_model"]) == ("fake/answerer", "fake/judge")
    overall = answer["overall"]
    assert overall["n"] == 3 and overall["answered"] == 3 and overall["judged"] == 3
    assert set(answer["by_category"]) == {"single-hop", "multi-hop", "temporal"}
    # The scripted answerer quotes the best-matching remembered line: the cello and Montreal turns are
    # retrieved and named; the gold answer "2024" is in no turn, so the judge says WRONG.
    labels = {q["category"]: q["label"] for q in answer["questions"]}
    assert labels == {4: "CORRECT", 1: "CORRECT", 2: "WRONG"}
    assert overall["j"] == pytest.approx(200 / 3, abs=0.01)
    f1 = {q["category"]: q["f1"] for q in answer["questions"]}
    assert f1[4] > 0 and f1[1] > 0 and f1[2] == 0.0
    assert overall["answer_prompt_tokens"] > 0 and overall["judge_prompt_tokens"] > 0
    assert all(q["reason"] for q in answer["questions"])
    assert "answers by fake/answerer, judged by fake/judge" in printed
    assert "| overall | 3 |" in (out / "results.md").read_text().split("answers by", 1)[1]
    # The licensed questions and gold answers stay out of the outputs.
    assert "What instrument did Ana buy" not in (out / "results.json").read_text()

    reply_calls = [c for c in fake_llm.calls if c.model == "fake/answerer"]
    judge_calls = [c for c in fake_llm.calls if c.model == "fake/judge"]
    assert len(reply_calls) == 3 and len(judge_calls) == 3
    # The bot's own prompt: system prompt with its layers and reply instructions, the question as the
    # asker's message in a channel of its own (nothing else in its history).
    first = reply_calls[0].messages
    assert "## Replying" in first[0]["content"] and "## Possibly relevant earlier turns" in first[0]["content"]
    assert "What instrument did Ana buy" in first[-1]["content"] and len(first) == 2
    assert 'Gold answer: "a cello"' in judge_calls[0].messages[-1]["content"]

    # Same data, same cache: no new call, nothing spent, the same figures.
    calls_before = len(fake_llm.calls)
    assert main(argv) == 0
    again = json.loads((out / "results.json").read_text())["answer"]
    assert len([c for c in fake_llm.calls[calls_before:] if c.model in ("fake/answerer", "fake/judge")]) == 0
    assert again["overall"]["cached_calls"] == 6 and again["overall"]["cost_usd"] == 0.0
    assert (again["overall"]["j"], again["overall"]["f1"]) == (overall["j"], overall["f1"])


def test_eval_answer_needs_an_answering_model_and_known_conversations(tmp_path, capsys):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    assert main(["eval", "locomo", "--data", str(data), "--answer"]) == 2
    err = capsys.readouterr().err
    assert "--answer needs an answering model" in err and err.count("\n") == 1
    assert main(["eval", "locomo", "--data", str(data), "--conversations", "3"]) == 2
    assert "no conversation 3" in capsys.readouterr().err
    assert main(["eval", "locomo", "--data", str(data), "--questions", "0"]) == 2
    assert "--questions must be at least 1" in capsys.readouterr().err


def test_eval_conversations_picks_a_subset_by_index_or_sample_id(tmp_path):
    two = fixture() + [{**fixture()[0], "sample_id": "tiny-2"}]
    data = tmp_path / "two.json"
    data.write_text(json.dumps(two))
    for only in (["1"], ["tiny-2"]):
        prepared = evaluation.prepare_all(data, tmp_path / "work", embedder="off", only=only)
        assert [p.sample_id for p in prepared] == ["tiny-2"]


def test_eval_turns_keeps_the_first_turns_and_the_questions_they_answer(tmp_path):
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(fixture()))
    conv, = evaluation.prepare_all(data, tmp_path / "work", embedder="off", max_turns=4)
    assert sorted(conv.turn_of) == ["D1:1", "D1:2", "D1:3", "D1:4"]
    # The cello question (D1:1) and the Montreal one (D1:3 of D1:3; D2:3) stay; the marathon's D2:4 is gone.
    assert [(q.category, q.evidence) for q in conv.questions] == [(4, ("D1:1",)), (1, ("D1:3",))]


def test_paired_bootstrap_gain_and_interval():
    from familiar_bot.app.eval.ablation import paired_bootstrap

    def recs(hits):
        return [{"conversation": "c", "question": i, "any@10": float(h)} for i, h in enumerate(hits)]

    base, better = recs([0] * 50 + [1] * 50), recs([1] * 80 + [0] * 0 + [1] * 20)
    gain = paired_bootstrap(base, better)
    assert gain["gain"] == 50.0 and 35 < gain["low"] < 50 < gain["high"] < 65
    same = paired_bootstrap(base, base)
    assert same == {"gain": 0.0, "low": 0.0, "high": 0.0}
    with pytest.raises(ValueError, match="same questions"):
        paired_bootstrap(base, list(reversed(better)))


def test_ablation_measures_each_change_against_the_ranking_before_it(tmp_path, capsys):
    from familiar_bot.app.eval import ablation

    out = eval_hash(tmp_path, "--ablation")
    result = json.loads((out / "ablation.json").read_text())
    labels = [r["label"] for r in result["rows"]]
    # Passage vectors are opt-in: without them the familiars have no passage rows and no row weighs them.
    assert labels == [label for label, _, _ in ablation.variants(passage_vectors=False)]
    assert not any("passage vectors" in label for label in labels)
    assert not list((tmp_path / "work").rglob("*")) or "turn_passage_embedding" not in "".join(
        p.read_text() for p in (tmp_path / "work").rglob("character.toml"))
    assert labels[0] == "before (all off)" and "shipped defaults" in labels
    before = result["rows"][0]
    assert before["retrieval"]["turn_speaker_weight"] == 0.0 and before["text_budget"] == {"max_rag_turns": 24}
    assert before["gain"]["any@10"] == {"gain": 0.0, "low": 0.0, "high": 0.0}
    assert "| shipped defaults |" in (out / "ablation.md").read_text()
    assert "paired bootstrap" in capsys.readouterr().out


def dm_fixture() -> list[dict]:
    """A person talking with an assistant (LongMemEval's genre), with a ``question_type`` per question."""
    turns = [("User", "I just adopted a rescue cat called Miso"),
             ("Assistant", "Congratulations! Here are some tips for a rescue cat's first weeks: a quiet room, "
                           "a litter box away from food, and patience."),
             ("User", "Which litter do you recommend?"),
             ("Assistant", "An unscented clumping clay litter is a safe start for most cats.")]
    session = [{"speaker": s, "dia_id": f"D1:{i + 1}", "text": t} for i, (s, t) in enumerate(turns)]
    return [{"sample_id": "dm-1",
             "conversation": {"speaker_a": "User", "speaker_b": "Assistant",
                              "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": session},
             "qa": [{"question": "What is my cat called?", "answer": "Miso", "evidence": ["D1:1"], "category": 4,
                     "question_type": "single-session-user"},
                    {"question": "Which litter did you recommend?", "answer": "clumping clay", "evidence": ["D1:4"],
                     "category": 4, "question_type": "single-session-assistant"}]}]


def test_familiar_speaker_imports_its_turns_as_the_familiars_replies(tmp_path, capsys):
    """--familiar-speaker writes that speaker's turns as the responder writes a DM reply (role assistant,
    the ego key, the reply to the person's turn before it); without it both speakers stay people."""
    from familiar_pipeline.storage.identity import ego_key
    from familiar_pipeline.storage.turns import TurnLog

    data = tmp_path / "dm.json"
    data.write_text(json.dumps(dm_fixture()))
    conv, = evaluation.prepare_all(data, tmp_path / "work", embedder="off", familiar_speaker="Assistant")
    with TurnLog(tmp_path / "work" / conv.familiar_id / "turns.db", readonly=True) as log:
        turns = log.turns_after(0)
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    assert [t.author_key for t in turns if t.role == "assistant"] == [ego_key(conv.familiar_id)] * 2
    assert [t.reply_to_turn_id for t in turns] == [None, turns[0].id, None, turns[2].id]
    assert [t.author_display for t in turns] == ["User", "Assistant", "User", "Assistant"]
    people, = evaluation.prepare_all(data, tmp_path / "work2", embedder="off")
    with TurnLog(tmp_path / "work2" / people.familiar_id / "turns.db", readonly=True) as log:
        assert {t.role for t in log.turns_after(0)} == {"user"}
    with pytest.raises(ValueError, match="no speaker 'Bot'"):
        evaluation.prepare_all(data, tmp_path / "work3", embedder="off", familiar_speaker="Bot")
    # The questions' own types are reported apart, beside LoCoMo's categories.
    out = tmp_path / "out"
    assert main(["eval", "locomo", "--data", str(data), "--familiar-speaker", "Assistant", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["by_type"]) == ["single-session-assistant", "single-session-user"]
    assert results["by_type"]["single-session-user"]["n"] == 1 and results["setup"]["familiar_speaker"] == "Assistant"
    assert "| type single-session-user |" in capsys.readouterr().out


def test_reuse_resumes_a_stopped_preparation_and_imports_anew_what_changed(tmp_path, capsys, monkeypatch):
    """--reuse keeps a familiar an earlier run left in --workdir for the same turns and config: a run
    stopped before its projections were built resumes them and scores exactly as a fresh run; a file
    or flag that changed is imported anew."""
    from familiar_pipeline.storage.turns import TurnLog

    data = tmp_path / "dm.json"
    data.write_text(json.dumps(dm_fixture()))
    fresh = evaluation.prepare_all(data, tmp_path / "fresh", embedder="hash", familiar_speaker="Assistant")
    expected = evaluation.evaluate(fresh)

    def stopped(*args, **kwargs):
        raise RuntimeError("stopped halfway")

    work = tmp_path / "work"
    monkeypatch.setattr(evaluation, "materialize_projections", stopped)
    with pytest.raises(RuntimeError, match="stopped halfway"):
        evaluation.prepare_all(data, work, embedder="hash", familiar_speaker="Assistant", reuse=True)
    monkeypatch.undo()
    lines: list[str] = []
    conv, = evaluation.prepare_all(data, work, embedder="hash", familiar_speaker="Assistant", reuse=True,
                                   progress=lines.append)
    assert conv.timings.get("reused") and any("reused the familiar" in line for line in lines)
    with TurnLog(work / conv.familiar_id / "turns.db", readonly=True) as log:
        assert log.latest_id() == 4  # kept, not appended again
    def scores(records):
        return [{k: v for k, v in r.items() if k != "latency_ms"} for r in records]

    assert scores(evaluation.evaluate([conv])) == scores(expected)
    # Another text, or another speaker read as the familiar, is another familiar: imported anew.
    changed = dm_fixture()
    changed[0]["conversation"]["session_1"][0]["text"] = "My cat is called Tofu"
    data.write_text(json.dumps(changed))
    again, = evaluation.prepare_all(data, work, embedder="hash", familiar_speaker="Assistant", reuse=True)
    assert not again.timings.get("reused")
    with TurnLog(work / again.familiar_id / "turns.db", readonly=True) as log:
        assert log.turns_after(0)[0].content == "My cat is called Tofu" and log.latest_id() == 4
    people, = evaluation.prepare_all(data, work, embedder="hash", reuse=True)
    assert not people.timings.get("reused")
    # The CLI says what --reuse needs.
    assert main(["eval", "locomo", "--data", str(data), "--reuse"]) == 2
    assert "--reuse needs --workdir" in capsys.readouterr().err


def test_passage_vectors_are_opt_in_for_the_evaluator(tmp_path, capsys):
    """`--passage-vectors` turns the projector on for the throwaway familiars (and the ablation weighs
    them); without an embedder it is refused in one line."""
    from familiar_bot.app.eval import ablation

    out = eval_hash(tmp_path, "--ablation", "--passage-vectors")
    tomls = "".join(p.read_text() for p in (tmp_path / "work").rglob("character.toml"))
    assert "turn_passage_embedding" in tomls
    labels = [r["label"] for r in json.loads((out / "ablation.json").read_text())["rows"]]
    assert labels == [label for label, _, _ in ablation.variants(passage_vectors=True)]
    assert "before + passage vectors" in labels and "shipped - passage vectors" in labels
    assert json.loads((out / "results.json").read_text())["setup"]["passage_vectors"] is True
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(fixture()))
    assert main(["eval", "locomo", "--data", str(data), "--passage-vectors"]) == 2
    assert "--passage-vectors needs an embedder" in capsys.readouterr().err
