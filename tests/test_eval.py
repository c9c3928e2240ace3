"""`familiar eval locomo` end to end on a tiny LoCoMo-format fixture, plus its scoring rules.

The fixture is written here, never taken from the licensed LoCoMo file.
"""

from __future__ import annotations

import json

import pytest

from familiar_bot.cli.main import main
from familiar_bot.eval import evaluation, locomo

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
            {"question": "What instrument did Ana buy, a cello?", "evidence": ["D1:1"], "category": 4},
            {"question": "Where is Lucia moving, Montreal?", "evidence": ["D1:3; D2:3"], "category": 1},
            {"question": "When is the Lisbon marathon?", "evidence": ["D2:4", "D:9:9"], "category": 2},
            {"question": "What did the greyhound Biscuit eat?", "evidence": ["D2:9"], "category": 3},  # no such turn
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
    # Ten turns make one full extraction batch (the shipped batch_size); the scripted model answered the facts asset's real prompts: calls and tokens were counted.
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


def test_sweep_measures_the_grid_then_variations_around_the_best(tmp_path, capsys):
    data = tmp_path / "tiny-locomo.json"
    data.write_text(json.dumps(fixture()))
    out = tmp_path / "out"
    assert main(["eval", "locomo", "--data", str(data), "--embedder", "hash", "--out", str(out), "--sweep",
                 "--workdir", str(tmp_path / "work")]) == 0
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
