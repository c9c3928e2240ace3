"""benchmarks/updates.py (issue 33): the scripted chats are deterministic and valid, and a quick run reports."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from familiar_bot.app.eval import updates_chats as gen
from familiar_bot.app.eval import evaluation
from familiar_bot.app.eval.updates import (_reusable, import_chat, newest_above_older, rank_of, turn_only_projectors,
                                       wish_turns)
from familiar_pipeline.engine import registry
from familiar_pipeline.engine.spec import ProjectorSpec

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ("newest_above_older", "wishes_in_prompt", "ordering_any@10")


def _shape(chats):
    return [([(t.dia_id, t.role, t.text, t.at, t.tag) for t in c.turns], c.probes, c.asked_at) for c in chats]


def test_the_generator_is_deterministic_from_its_seed():
    assert _shape(gen.generate(7, 3)) == _shape(gen.generate(7, 3))
    assert _shape(gen.generate(7, 3)) != _shape(gen.generate(8, 3))
    # a chat does not depend on how many others are generated with it
    assert _shape(gen.generate(7, 3)[:2]) == _shape(gen.generate(7, 2))


@pytest.mark.parametrize("seed", [33, 1, 2024])
def test_every_chat_is_valid_and_plants_every_kind(seed):
    chats = gen.generate(seed, 4)
    for chat in chats:
        assert gen.problems(chat) == [], chat.id
        kinds = {p.kind for p in chat.probes}
        assert kinds == set(gen.KINDS)
        assert 650 <= len(chat.turns) <= 900 and chat.sessions >= 50
        roles = {t.role for t in chat.turns}
        assert roles == {"user", "assistant"}
        sessions_days = {t.at.date() for t in chat.turns}
        assert len(sessions_days) >= chat.sessions  # sessions are days apart
    for chat in gen.generate(seed, 2, **gen.QUICK):
        assert gen.problems(chat) == [], chat.id


def test_evidence_exists_is_the_persons_own_and_distractors_never_count():
    for chat in gen.generate(33, 4):
        by_id = {t.dia_id: t for t in chat.turns}
        distractors = {d for p in chat.probes for d in p.distractors}
        assert distractors, "look-alikes are planted"
        for probe in chat.probes:
            for dia in (*probe.evidence, *probe.older):
                turn = by_id[dia]  # exists
                assert turn.role == "user"
                assert dia not in distractors
                assert turn.tag.endswith(probe.id)
            if probe.kind in ("wish", "preference"):
                (dia,) = probe.evidence
                text = by_id[dia].text
                assert not gen.quoted(text) and "?" not in text, text
            if probe.kind == "update":
                times = [by_id[d].at for d in (*probe.older, *probe.evidence)]
                assert times == sorted(times) and len(probe.older) in (1, 2)
            if probe.kind == "ordering":
                assert len({by_id[d].session for d in probe.evidence}) >= 3  # spread over sessions
        # quoted wishes, someone else's words and questions are planted, and none is evidence
        lookalikes = [by_id[d].text for d in distractors]
        assert any(gen.quoted(t) for t in lookalikes) or any("?" in t for t in lookalikes)


def test_standing_wishes_are_said_before_the_recent_history_window():
    """At the default size a wish is older than the last 240 turns: the 200-turn history does not show it."""
    for chat in gen.generate(33, 4):
        position = {t.dia_id: i for i, t in enumerate(chat.turns)}
        for probe in chat.probes:
            if probe.kind in ("wish", "preference"):
                assert len(chat.turns) - position[probe.evidence[0]] > 240


def test_the_banks_are_varied():
    asks = [a for sc in gen.UPDATE_SCENARIOS for a in sc["ask"]]
    states = [a for sc in gen.UPDATE_SCENARIOS for a in sc["state"]]
    moves = [a for sc in gen.UPDATE_SCENARIOS for a in sc["update"]]
    for bank in (asks, states, moves, [s for w in gen.WISHES for s in w["say"]],
                 [s for w in gen.WISHES for s in w["ask"]], [s for w in gen.PREFERENCES for s in w["say"]],
                 [s for w in gen.PREFERENCES for s in w["ask"]], gen.ORDER_ASK + gen.RECURRING_ASK,
                 gen.WISH_DISTRACTORS, gen.FILLER):
        assert len(set(bank)) >= 10
    assert gen.vocabulary(gen.generate(33, 4)) > 800


def test_newest_above_older_counts_a_missing_turn_as_infinitely_far():
    units = [frozenset([5]), frozenset([9]), frozenset([2])]
    assert rank_of(units, 9) == 2 and rank_of(units, 4) == math.inf
    assert newest_above_older(1, [2, 3])
    assert not newest_above_older(3, [2])
    assert newest_above_older(4, [math.inf])  # the old one is not in the ranking
    assert not newest_above_older(math.inf, [2])
    assert not newest_above_older(math.inf, [math.inf])  # both missing: not above


def test_a_wishes_section_counts_through_the_turns_it_cites():
    assert wish_turns({}) == set()
    assert wish_turns({"wishes": {"wish_ids": [1], "turn_ids": [12, 40], "tokens": 30}}) == {12, 40}
    assert wish_turns({"wishes": "not a dict"}) == set()


def test_a_model_free_projector_of_the_turns_is_built_too(tmp_path):
    """Besides the turn index and vectors, a heuristic projector that always runs (the standing wishes) is
    turned on and materialized with them; one that needs a model or facts is not."""
    assert [s.name for s in turn_only_projectors(tmp_path)] == ["standing_wish"]
    registry.register_projector(ProjectorSpec(name="bench_heuristic", run=lambda *a, **k: None, needs_llm=False,
                                              always_on=True))
    registry.register_projector(ProjectorSpec(name="bench_modelled", run=lambda *a, **k: None, always_on=True))
    try:
        assert [s.name for s in turn_only_projectors(tmp_path)] == ["standing_wish", "bench_heuristic"]
    finally:
        registry.unregister_projector("bench_heuristic")
        registry.unregister_projector("bench_modelled")


def test_the_import_records_the_familiar_as_the_responder_does_and_reuse_checks_the_chat(tmp_path):
    chat, other = gen.generate(5, 2, **gen.QUICK)
    turns = import_chat(chat, tmp_path, embedder="hash", model_path=None, extra_projectors=[])
    assert [(t.role, t.content, t.created_at) for t in turns] == [(t.role, t.text, t.at) for t in chat.turns]
    assert {t.author_key for t in turns if t.role == "assistant"} == {f"ego:{chat.id}"}
    assert {t.author_key for t in turns if t.role == "user"} == {chat.person_key}
    toml = evaluation.familiar_toml("hash", None)
    assert [t.id for t in _reusable(chat, tmp_path, toml) or []] == [t.id for t in turns]
    assert _reusable(chat, tmp_path, evaluation.familiar_toml("off", None)) is None  # another config
    renamed = gen.Chat(chat.id, chat.person_key, chat.person_name, other.turns, chat.probes, chat.asked_at)
    assert _reusable(renamed, tmp_path, toml) is None  # other turns


def test_a_quick_run_ends_with_one_json_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAMILIAR", "DAGSTER"))}
    env.update(DAGSTER_HOME=str(tmp_path / "dagster_home"), HF_HUB_OFFLINE="1", NO_PROXY="*",
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    (tmp_path / "dagster_home").mkdir()
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "updates.py"), "--quick", "--chats", "1",
                           "--embedder", "hash", "--workdir", str(tmp_path / "data"), "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    last = json.loads(lines[-1])
    for key in (*HEADLINE, "seed", "elapsed_s", "chats"):
        assert key in last
    for kind in gen.KINDS:
        assert last[f"{kind}_n"] > 0
        assert 0 <= last[f"{kind}_any@10"] <= 100 and 0 <= last[f"{kind}_rendered"] <= 100
    for key in HEADLINE:
        assert 0 <= last[key] <= 100
    assert last["seed"] == 33 and last["chats"] == 1 and last["quick"] is True
    assert "| update |" in done.stdout and "| ordering |" in done.stdout
    assert json.loads((out / "updates.json").read_text())["headline"] == last
    assert (out / "updates.md").read_text().strip() in done.stdout
