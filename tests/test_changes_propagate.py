"""Edited and deleted turns stop being remembered, through the sensor (issue 26, item 3).

A familiar runs the whole graph with the scripted model, driven by the turn sensor as the
daemon drives it; then a message is deleted, or edited, and nothing but the next sensor tick
happens. What the turn produced (its facts and their vectors and full-text entries, the
dossier text and the scope's summary that folded it, reflections citing it) is gone from the
store and from what the bot reads (the published snapshot, an assembled prompt); an edit's new
words are extracted. The model calls it took are counted.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg
import pyarrow as pa
import pytest

from familiar_bot.prompt.assembly import Assembler
from familiar_bot.prompt.layers.stack import default_layers
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.prompt.types import AssemblyContext
from familiar_pipeline.config.loading import load_config
from familiar_pipeline.models.llm import ResponseCache
from familiar_pipeline.storage.fts import FtsIndex
from familiar_pipeline.storage.snapshots import SnapshotReader
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .fact_helpers import GRAPH_TOML
from .helpers import PEOPLE, cache_rows, file_bytes, sensor_driver

BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
GUILD, CHANNEL = 1, 10
SECRET, OLD, NEW = "zanzibar", "wombat", "quokka"
SECRET_TURN, EDITED_TURN = 10, 14  # the secret closes the first summary window and extraction batch
SERVED = ("facts", "fact_subjects", "people_dossiers", "summaries", "reflections", "supersede_decisions")


def line(i: int) -> str:
    if i == SECRET_TURN:
        return f"Keep this between us: my {SECRET} diagnosis came back today"
    if i == EDITED_TURN:
        return f"My favourite animal in the whole world is the {OLD} for sure"
    return f"Talking about the weather and the garden again today, item {i}"


@pytest.fixture
def familiar(tmp_path, fake_llm):
    from .helpers import make_familiar

    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML)
    with TurnLog(paths.turns_db) as log:
        for i in range(1, 41):
            key, name = PEOPLE[0] if i in (SECRET_TURN, EDITED_TURN) else PEOPLE[i % len(PEOPLE)]
            log.upsert_participant(key, username=name.lower(), global_name=name)
            log.append_turn(channel_id=CHANNEL, guild_id=GUILD, role="user", author_key=key, author_display=name,
                            content=line(i), created_at=BASE + timedelta(minutes=i))
    with dg.instance_for_test() as instance:
        tick = sensor_driver(instance, tmp_path, start=BASE.timestamp() + 10_000)
        yield tmp_path, paths, tick, fake_llm


def served_text(paths) -> str:
    """Every string the published snapshot serves, from the tables that hold words."""
    snap = SnapshotReader(paths.serving_dir).current()
    parts = []
    for name in SERVED:
        table = snap.table(name)
        for column in table.columns:
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                parts += [v for v in column.to_pylist() if v]
    return "\n".join(parts)


def stored_text(paths) -> str:
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        rows = [str(r) for name in SERVED for r in store.table_rows(name)]
    return "\n".join(rows)


def prompt_text(root, paths, cue: str) -> str:
    memory = MemoryView(paths, load_config("fam", root=root, env={}))
    try:
        prompt = Assembler(memory, default_layers()).assemble(AssemblyContext("fam", CHANNEL, GUILD, "text", cue))
    finally:
        memory.close()
    # the recent history shows turns themselves (a deleted one is left out there by the bot);
    # memory is the system prompt
    return prompt.system_prompt


def fact_rows(paths) -> list:
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return store.sql("SELECT id, text, source_turn_ids FROM facts ORDER BY id").fetchall()


def test_before_any_change_the_secret_is_remembered_everywhere(familiar):
    root, paths, _, _ = familiar
    served = served_text(paths)
    for place in ("facts", "people_dossiers", "summaries"):
        with ProjectionStore(paths.memory_db, read_only=True) as store:
            assert any(SECRET in str(r) for r in store.table_rows(place)), place
    assert SECRET in served
    assert SECRET in prompt_text(root, paths, f"what about the {SECRET}")
    assert [i for i, _ in FtsIndex(paths.fts_facts).search(SECRET, 5)]


def test_a_deleted_message_is_forgotten_by_the_next_sensor_tick(familiar):
    root, paths, tick, fake = familiar
    facts_before = fact_rows(paths)
    with TurnLog(paths.turns_db) as log:
        log.record_deletion(turn_id=SECRET_TURN)
    calls_before = len(fake.calls)
    done = tick()
    assert {"facts", "rolling_summary", "people_dossiers"} <= set(done), "the change alone made them due"
    assert SECRET not in stored_text(paths)
    assert SECRET not in served_text(paths)
    assert SECRET not in prompt_text(root, paths, f"what about the {SECRET}")
    assert FtsIndex(paths.fts_facts).search(SECRET, 5) == []
    after = fact_rows(paths)
    assert [f for f in facts_before if SECRET_TURN not in f[2]] == after, "only the deleted turn's facts went"
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        embedded = {r[0] for r in store.sql("SELECT fact_id FROM fact_embeddings").fetchall()}
        assert embedded <= {f[0] for f in after}, "no vector of a removed fact"
        cass = store.sql("SELECT dossier_text FROM people_dossiers WHERE canonical_key = ?", [PEOPLE[0][0]]).fetchone()
        assert cass is not None and "diagnosis" not in cass[0], "Cass's dossier was rebuilt without it"
    calls = fake.calls[calls_before:]
    assert not any("extract" in c.system.lower() and SECRET in c.user for c in calls)
    assert not tick(), "followed once: nothing is due afterwards"


def test_an_edited_message_is_remembered_as_it_reads_now(familiar):
    root, paths, tick, fake = familiar
    with TurnLog(paths.turns_db) as log:
        log.record_edit(turn_id=EDITED_TURN, new_content=f"My favourite animal in the whole world is the {NEW} now")
    done = tick()
    assert "facts" in done
    facts = fact_rows(paths)
    assert not any(OLD in f[1] for f in facts) and OLD not in served_text(paths)
    [edited] = [f for f in facts if NEW in f[1]]
    assert list(edited[2]) == [EDITED_TURN]
    assert [i for i, _ in FtsIndex(paths.fts_facts).search(NEW, 5)] == [edited[0]]
    assert NEW in prompt_text(root, paths, f"which animal, the {NEW}?")
    assert not tick()


def test_an_old_change_costs_one_redaction_call_instead_of_a_refold(familiar):
    """Past `refold_windows_max` windows back, the summary is rewritten once instead of folded again;
    a dossier whose facts take more than one prompt is rewritten once instead of rebuilt."""
    from familiar_pipeline.projectors.dossiers import prompt as dossier_prompt
    from familiar_pipeline.projectors.summary.prompt import REDACT_MARK, SYSTEM_MARK

    root, paths, tick, fake = familiar
    with paths.character_toml.open("a") as toml:
        toml.write("\n[providers.memory.rolling_summary]\nrefold_windows_max = 0\n"
                   "\n[providers.memory.people_dossier]\nmax_facts_per_prompt = 2\n")
    with TurnLog(paths.turns_db) as log:
        log.record_deletion(turn_id=SECRET_TURN)
    calls_before = len(fake.calls)
    tick()
    summary_calls = [c for c in fake.calls[calls_before:] if SYSTEM_MARK in c.system or REDACT_MARK in c.system]
    assert [REDACT_MARK in c.system for c in summary_calls] == [True], "one call, a redaction"
    assert SECRET in summary_calls[0].user, "it is shown what to take out"
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        [(text,)] = store.sql("SELECT summary_text FROM summaries").fetchall()
    assert SECRET not in text and "Through turn" in text, "the rest of the summary stands"
    dossier_calls = [c for c in fake.calls[calls_before:]
                     if "dossier" in c.system or dossier_prompt.REDACT_MARK in c.system]
    assert [dossier_prompt.REDACT_MARK in c.system for c in dossier_calls] == [True], "Cass's: one redaction"
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        [(dossier, sources)] = store.sql("SELECT dossier_text, source_fact_ids FROM people_dossiers "
                                         "WHERE canonical_key = ?", [PEOPLE[0][0]]).fetchall()
        assert set(sources) <= {r[0] for r in store.sql("SELECT id FROM facts").fetchall()}
    assert SECRET not in dossier and "Cass said" in dossier, "the rest of the dossier stands"
    assert SECRET not in served_text(paths)
    # the redactions' cached replies declare what they rest on, like every other; the run's purge
    # (retention 0) erased every cached reply the deleted turn was shown in, and the bytes
    cache_path = paths.llm_cache
    rows = cache_rows(cache_path)
    assert rows and all(turns or upto for _, turns, upto in rows.values())
    assert not any(SECRET_TURN in turns or (upto or 0) >= SECRET_TURN for _, turns, upto in rows.values())
    assert not any(SECRET in text for text, _, _ in rows.values())
    assert SECRET.encode() not in file_bytes(cache_path)
    assert ResponseCache(cache_path).forget_resting_on([SECRET_TURN]) == 0, "nothing left to forget"


# --------------------------------------------------------------------------- the generic removal, directly


def test_the_kernel_removes_what_rests_on_a_turn_through_the_declared_provenance():
    from familiar_pipeline.projectors.dossiers.tables import DOSSIERS, put_dossier
    from familiar_pipeline.projectors.facts.changes import Followed, forget_changed

    from .fact_helpers import populate_every_table

    with ProjectionStore(None) as store:
        a, b, c = populate_every_table(store)  # a (turn 1) retired by b (turn 2); c (turn 3)
        put_dossier(store, "discord:1", "Cass likes coffee now.", b.id, source_fact_ids=[a.id, b.id])
        followed = forget_changed(store, Followed(change_seq=1, turns=[2]))
        assert followed.facts_removed == [b.id] and followed.facts_restored == [a.id]
        assert followed.removed == {"facts": 1, "fact_subjects": 1, "supersede_decisions": 1, "fact_embeddings": 1,
                                    "wishes": 1}, "the wish said in turn 2 goes with it"
        assert store.sql("SELECT id, superseded_at FROM facts ORDER BY id").fetchall() == [(a.id, None), (c.id, None)]
        assert store.stale_keys(DOSSIERS) == [("discord:1", "familiar")], "left to its projector, which rebuilds it"
        assert store.count(store.table("reflections")) == 1, "it cites turn 1 and fact a, both still there"

        followed = forget_changed(store, Followed(change_seq=2, turns=[1]))
        assert followed.removed == {"facts": 1, "fact_subjects": 1, "reflections": 1}
        assert store.count(store.table("turn_embeddings")) == 1, "turn vectors follow changes in their own run"
