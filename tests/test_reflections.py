"""reflections: positional windows, citation filtering, the always-advancing watermark, channel scope."""

from __future__ import annotations

import pytest

from familiar_pipeline.testing.fake_llm import FakeLLM
from familiar_pipeline.projectors.reflections import run as reflections
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

from .fact_helpers import CASS, add_facts, fact, familiar, run_projector
from .helpers import FAKE_MODEL_TOML, append_chat

# Reflections alone: no extractor or supersession to wait for.
TOML = FAKE_MODEL_TOML + '\n[providers.memory]\nprojectors = ["reflection"]\n'


def calls(fake):
    return [c for c in fake.calls if "reflections" in c["messages"][0]["content"]]


def rows(paths):
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return reflection_db.recent_reflections(store, limit=100)[::-1], store.get_watermark(reflections.PROJECTOR)


def setup(tmp_path, turns=25, toml=TOML, facts=4):
    paths = familiar(tmp_path, toml=toml)
    append_chat(paths, turns)
    add_facts(paths, [fact(f"Cass fact {i}.", CASS, turn=i) for i in range(1, facts + 1)])
    return paths


def test_below_threshold_no_call(tmp_path, fake_llm):
    paths = setup(tmp_path, turns=5)
    assert run_projector(reflections, tmp_path).status == "no-op"
    assert calls(fake_llm) == [] and rows(paths)[0] == []


def test_valid_reply_is_kept_with_its_citations(tmp_path, fake_llm):
    paths = setup(tmp_path)
    fake_llm.script(lambda m: [{"text": "Cass keeps circling back to moving.", "cited_turn_ids": [1, 4, 999], "cited_fact_ids": [2, 77]}])
    report = run_projector(reflections, tmp_path)
    (row,), mark = rows(paths)
    assert row.cited_turn_ids == (1, 4) and row.cited_fact_ids == (2,)
    assert (row.last_turn_id, row.last_fact_id) == (20, 4) and (mark.turn_id, mark.fact_id) == (20, 4)
    assert row.channel_id == 10 and report.dropped["invalid_citations"] == 1
    prompt = calls(fake_llm)[0]["messages"][1]["content"]
    assert prompt.count("\n- id=") >= 20 and '- id=4: "Cass fact 4."' in prompt
    n = len(calls(fake_llm))
    run_projector(reflections, tmp_path)
    assert len(calls(fake_llm)) == n, "no second call until a full new window arrived"
    append_chat(paths, 20, start=25)
    run_projector(reflections, tmp_path)
    assert len(calls(fake_llm)) == n + 1


def test_items_filtered_and_capped(tmp_path, fake_llm):
    paths = setup(tmp_path)
    fake_llm.script(lambda m: [
        {"text": "A.", "cited_turn_ids": [1]},
        {"text": "   ", "cited_turn_ids": [2]},
        {"text": "Uncited.", "cited_turn_ids": [], "cited_fact_ids": []},
        {"text": "Only bad ids.", "cited_turn_ids": [500], "cited_fact_ids": [500]},
        "not an object",
        {"text": "B.", "cited_fact_ids": [3]},
        {"text": "C.", "cited_turn_ids": ["5"]},
        {"text": "D, over the cap.", "cited_turn_ids": [6]},
    ])
    report = run_projector(reflections, tmp_path)
    kept, _ = rows(paths)
    assert [r.text for r in kept] == ["A.", "B.", "C."], "max_reflections_per_tick=3 enforced in code"
    assert report.dropped["uncited"] == 2 and report.dropped["empty_text"] == 1
    assert report.dropped["malformed_items"] == 1 and report.dropped["over_max_reflections"] == 1


@pytest.mark.parametrize("reply", [[], "garbage {", FakeLLM.error("auth")], ids=["empty", "garbage", "exception"])
def test_watermark_always_advances(tmp_path, fake_llm, reply):
    paths = setup(tmp_path)
    fake_llm.script(lambda m: reply)
    run_projector(reflections, tmp_path)
    kept, mark = rows(paths)
    assert kept == [] and mark.turn_id == 20
    append_chat(paths, 5, start=25)
    n = len(calls(fake_llm))
    run_projector(reflections, tmp_path)
    assert len(calls(fake_llm)) == n, "the window is never re-sent"


def test_prompt_shows_only_the_newest_turns_of_a_window(tmp_path, fake_llm):
    toml = TOML + "\n[providers.memory.reflection]\nturns_threshold = 100\nmax_turns_per_tick = 50\n"
    setup(tmp_path, turns=100, toml=toml, facts=0)
    run_projector(reflections, tmp_path)
    prompt = calls(fake_llm)[0]["messages"][1]["content"]
    ids = [int(line[5:].split()[0]) for line in prompt.splitlines() if line.startswith("- id=")]
    assert ids == list(range(51, 101))


def test_cross_channel_window_is_channel_agnostic(tmp_path, fake_llm):
    paths = familiar(tmp_path, toml=TOML)
    append_chat(paths, 10, channel_id=1)
    append_chat(paths, 10, start=10, channel_id=2)
    fake_llm.script(lambda m: [{"text": "Both rooms argue about the trip.", "cited_turn_ids": [3, 15]}])
    run_projector(reflections, tmp_path)
    (row,), _ = rows(paths)
    assert row.channel_id is None


def test_waits_for_facts_then_shows_facts_current_at_the_window(tmp_path, fake_llm):
    toml = FAKE_MODEL_TOML + '\n[providers.memory]\nprojectors = ["rich_note", "fact_supersede", "reflection"]\n'
    paths = setup(tmp_path, toml=toml, facts=0)
    report = run_projector(reflections, tmp_path)
    assert report.status == "no-op" and "facts" in report.reason and calls(fake_llm) == []
    add_facts(paths, [fact("Cass lives in Berlin.", CASS, turn=3), fact("Cass moved to Lisbon.", CASS, turn=12),
                      fact("Cass moved to Oslo.", CASS, turn=22)], rich_note_turn=20)
    with ProjectionStore(paths.memory_db) as store:
        supersede_db.supersede(store, [1], 2)
        supersede_db.supersede(store, [2], 3)  # retired by a fact from after the window: still current at its end
        store.set_watermark("fact_supersede", fact_id=3)
    run_projector(reflections, tmp_path)
    facts_shown = calls(fake_llm)[0]["messages"][1]["content"].split("Recent facts (id, text):")[1]
    assert facts_shown.strip().splitlines() == ['- id=2: "Cass moved to Lisbon."']
