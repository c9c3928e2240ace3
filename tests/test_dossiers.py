"""people_dossiers: compounding per-subject dossiers, the ego record, empty replies, rebuild after supersession."""

from __future__ import annotations


from familiar_pipeline.projectors.dossiers import run as dossiers
from familiar_pipeline.projectors.supersede import run as supersede
from familiar_pipeline.projectors.dossiers import prompt as dossier_prompt
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

from .fact_helpers import BO, CASS, add_facts, fact, familiar, run_projector
from .helpers import FAKE_MODEL_TOML, append_chat

# One turn per extraction batch and a fold per batch, so each fact's turn is its own dossier step.
TOML = ('aliases = ["Sapphire"]\n' + FAKE_MODEL_TOML + "\n[providers.memory.rich_note]\nbatch_size = 1\n"
        "\n[providers.memory.people_dossier]\nbatches_per_fold = 1\n")
EGO = Subject("ego:fam", "Sapphire")


def dossier_calls(fake):
    return [c for c in fake.calls if "dossier" in c["messages"][0]["content"] or "self-record" in c["messages"][0]["content"]]


def setup(tmp_path, drafts, turns=None):
    paths = familiar(tmp_path, toml=TOML)
    append_chat(paths, turns or max(max(d.source_turn_ids) for d in drafts))
    add_facts(paths, drafts, rich_note_turn=turns or max(max(d.source_turn_ids) for d in drafts))
    with ProjectionStore(paths.memory_db) as store:  # supersession has judged them
        store.set_watermark(supersede.PROJECTOR, fact_id=facts_db.latest_fact_id(store))
    return paths


def dossier(paths, key):
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return dossier_db.get_dossier(store, key)


def test_new_subject_then_nothing_new_then_incremental(tmp_path, fake_llm):
    paths = setup(tmp_path, [fact("Cass lives in Berlin.", CASS, turn=1)], turns=1)
    run_projector(dossiers, tmp_path)
    first = dossier(paths, "discord:111")
    assert first.last_fact_id == 1 and "Berlin" in first.dossier_text
    calls = len(fake_llm.calls)
    assert run_projector(dossiers, tmp_path).status == "no-op" and len(fake_llm.calls) == calls
    append_chat(paths, 1, start=1)
    add_facts(paths, [fact("Cass is moving to Toronto next year.", CASS, turn=2)], rich_note_turn=2)
    with ProjectionStore(paths.memory_db) as store:
        store.set_watermark(supersede.PROJECTOR, fact_id=2)
    run_projector(dossiers, tmp_path)
    prompt = dossier_calls(fake_llm)[-1]["messages"][1]["content"]
    assert "Previous dossier:" in prompt and first.dossier_text in prompt and "Toronto" in prompt
    assert "Berlin." not in prompt.split("New facts:")[1], "only facts newer than last_fact_id are folded"
    assert dossier(paths, "discord:111").last_fact_id == 2


def test_two_subjects_get_their_own_dossiers(tmp_path, fake_llm):
    paths = setup(tmp_path, [fact("Cass lives in Berlin.", CASS, turn=1), fact("Bo keeps bees.", BO, turn=1)])
    run_projector(dossiers, tmp_path)
    assert "Berlin" in dossier(paths, "discord:111").dossier_text
    assert "bees" in dossier(paths, "discord:222").dossier_text and "Berlin" not in dossier(paths, "discord:222").dossier_text


def test_blank_reply_never_overwrites(tmp_path, fake_llm):
    paths = setup(tmp_path, [fact("Cass lives in Berlin.", CASS, turn=1), fact("Cass keeps bees.", CASS, turn=2)])
    with ProjectionStore(paths.memory_db) as store:
        dossier_db.put_dossier(store, "discord:111", "keep me", 1)
        store.set_watermark(dossiers.PROJECTOR, turn_id=1, fact_id=1)
    fake_llm.script(lambda messages: "   ")
    report = run_projector(dossiers, tmp_path)
    kept = dossier(paths, "discord:111")
    assert (kept.dossier_text, kept.last_fact_id) == ("keep me", 1) and report.dropped["empty_reply"] == 1


def test_subjectless_facts_make_no_call(tmp_path, fake_llm):
    setup(tmp_path, [fact("It rained all week.", turn=1)])
    run_projector(dossiers, tmp_path)
    assert dossier_calls(fake_llm) == []


def test_ego_record_filters_and_orders_by_importance(tmp_path, fake_llm):
    paths = setup(tmp_path, [
        fact("Sapphire values honesty.", EGO, importance=5),
        fact("Sapphire guards her autonomy.", EGO, importance=9),
        fact("Sapphire felt bored for a moment.", EGO, importance=2),
        fact("Sapphire prefers short answers.", EGO, importance=7),
        fact("Sapphire likes the rain.", EGO),
    ])
    run_projector(dossiers, tmp_path)
    call = dossier_calls(fake_llm)[-1]
    system, user = call["messages"][0]["content"], call["messages"][1]["content"]
    assert ("opinion" in system or "stance" in system) and "weight higher-importance" in system
    assert "drop transient feelings" not in system and "Sapphire" in user and "ego:fam" not in user
    lines = [line for line in user.splitlines() if line.startswith("- ")]
    assert lines == [
        '- (importance 9) "Sapphire guards her autonomy."',
        '- (importance 7) "Sapphire prefers short answers."',
        '- (importance 5) "Sapphire values honesty."',
        '- "Sapphire likes the rain."',
    ]
    record = dossier(paths, "ego:fam")
    assert "(importance" not in record.dossier_text and "bored" not in record.dossier_text
    assert record.last_fact_id == 5


def test_ego_texture_only_keeps_text_and_advances(tmp_path, fake_llm):
    paths = setup(tmp_path, [fact("Sapphire guards her autonomy.", EGO, turn=1, importance=9),
                             fact("Sapphire sighed.", EGO, turn=2, importance=2)])
    run_projector(dossiers, tmp_path)
    assert len(dossier_calls(fake_llm)) == 1
    record = dossier(paths, "ego:fam")
    assert record.last_fact_id == 2 and "sighed" not in record.dossier_text


def test_person_prompt_has_no_importance_tags(tmp_path, fake_llm):
    setup(tmp_path, [fact("Bo keeps bees.", BO, importance=2)])
    run_projector(dossiers, tmp_path)
    call = dossier_calls(fake_llm)[-1]
    assert '- "Bo keeps bees."' in call["messages"][1]["content"]
    assert "weight higher-importance" not in call["messages"][0]["content"]
    assert dossier_prompt.parse_reply("(importance 8) Sapphire is kind.", ego=True) == "Sapphire is kind."


def test_supersession_drops_the_dossier_and_it_rebuilds_clean(tmp_path, fake_llm):
    paths = setup(tmp_path, [fact("Cass lives in Berlin.", CASS, turn=1), fact("Cass loves hiking.", CASS, turn=2)])
    run_projector(dossiers, tmp_path)
    assert "Berlin" in dossier(paths, "discord:111").dossier_text
    append_chat(paths, 1, start=2)
    add_facts(paths, [fact("Cass moved to Lisbon.", CASS, turn=3)], rich_note_turn=3)
    run_projector(supersede, tmp_path)
    assert dossier(paths, "discord:111") is None, "supersede() dropped the poisoned dossier"
    run_projector(dossiers, tmp_path)
    prompt = dossier_calls(fake_llm)[-1]["messages"][1]["content"]
    assert "Previous dossier" not in prompt and "Berlin" not in prompt
    assert "Lisbon" in prompt and "hiking" in prompt
    rebuilt = dossier(paths, "discord:111")
    assert "Berlin" not in rebuilt.dossier_text and rebuilt.last_fact_id == 3


def test_waits_for_supersession(tmp_path, fake_llm):
    paths = setup(tmp_path, [fact("Cass lives in Berlin.", CASS, turn=1)])
    with ProjectionStore(paths.memory_db) as store:
        store.set_watermark(supersede.PROJECTOR, fact_id=0)
    report = run_projector(dossiers, tmp_path)
    assert report.status == "no-op" and "supersession" in report.reason and dossier_calls(fake_llm) == []


def test_folds_every_batches_per_fold_batches(tmp_path, fake_llm):
    """Folding every N batches: one call per person per N batches, and the trailing batches wait."""
    paths = setup(tmp_path, [fact(f"Cass likes band {i}.", CASS, turn=i) for i in range(1, 8)], turns=7)
    paths.character_toml.write_text(paths.character_toml.read_text().replace("batches_per_fold = 1", "batches_per_fold = 3"))
    report = run_projector(dossiers, tmp_path)
    assert len(dossier_calls(fake_llm)) == 2 and report.batches == 2
    assert dossier(paths, "discord:111").last_fact_id == 6, "turn 7 waits for two more batches"
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        assert store.get_watermark(dossiers.PROJECTOR).turn_id == 6


def test_an_existing_dossier_waits_until_what_changed_weighs_fold_min_weight(tmp_path, fake_llm):
    """A new person's dossier is written at once; after that, small facts wait (no call) until their
    importance adds up to `fold_min_weight`, and then every waiting fact is folded in one call. A retired
    fact rebuilds the dossier at once, whatever it weighs."""
    paths = setup(tmp_path, [fact("Cass lives in Berlin.", CASS, turn=1)], turns=1)
    paths.character_toml.write_text(paths.character_toml.read_text() + "fold_min_weight = 12\n")
    run_projector(dossiers, tmp_path)
    assert len(dossier_calls(fake_llm)) == 1 and dossier(paths, "discord:111").last_fact_id == 1
    append_chat(paths, 2, start=1)
    add_facts(paths, [fact("Cass likes tea.", CASS, turn=2, importance=3),
                      fact("Cass likes jazz.", CASS, turn=3, importance=4)], rich_note_turn=3)
    with ProjectionStore(paths.memory_db) as store:
        store.set_watermark(supersede.PROJECTOR, fact_id=3)
    report = run_projector(dossiers, tmp_path)
    assert len(dossier_calls(fake_llm)) == 1, "3 + 4 < 12: no call"
    assert report.extra["folds_waiting"] == 2 and dossier(paths, "discord:111").last_fact_id == 1
    append_chat(paths, 1, start=3)
    add_facts(paths, [fact("Cass keeps bees.", CASS, turn=4, importance=5)], rich_note_turn=4)
    with ProjectionStore(paths.memory_db) as store:
        store.set_watermark(supersede.PROJECTOR, fact_id=4)
    run_projector(dossiers, tmp_path)
    assert len(dossier_calls(fake_llm)) == 2, "3 + 4 + 5 >= 12: one call"
    prompt = dossier_calls(fake_llm)[-1]["messages"][1]["content"].split("New facts:")[1]
    assert all(word in prompt for word in ("tea", "jazz", "bees")) and "Berlin" not in prompt
    assert dossier(paths, "discord:111").last_fact_id == 4
    # A small fact that retires one: the dossier still holds the retired fact, so it is rebuilt now.
    append_chat(paths, 1, start=4)
    add_facts(paths, [fact("Cass moved to Lisbon.", CASS, turn=5, importance=2)], rich_note_turn=5)
    with ProjectionStore(paths.memory_db) as store:
        supersede_db.supersede(store, [1], 5)
        store.set_watermark(supersede.PROJECTOR, fact_id=5)
    run_projector(dossiers, tmp_path)
    assert len(dossier_calls(fake_llm)) == 3 and "Lisbon" in dossier(paths, "discord:111").dossier_text
