"""The DuckDB projection store: dedup, validity and supersession rules, schema versions, notebook views."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import date, datetime, timedelta, timezone

import duckdb
import pytest

from familiar_pipeline.projectors.builtin import BUILTIN_PROJECTORS as PROJECTIONS
from familiar_pipeline.engine.registry import drop_projection
from familiar_pipeline.storage.times import as_utc
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.fact_embeddings import tables as fact_vectors
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.summary import tables as summary_db
from familiar_pipeline.projectors.supersede import tables as supersede_db
from familiar_pipeline.storage.store import ProjectionStore, ReadOnlyStoreError, SchemaVersionError, StoreError
from familiar_pipeline.projectors.facts.tables import Fact, Subject
from familiar_pipeline.projectors.facts.store import FactDraft, clamp_importance, normalize_fact_text
from familiar_pipeline.storage.records import Watermark

from .fact_helpers import populate_every_table

UTC = timezone.utc
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
CASS = Subject("discord:1", "Cass")
ARIA = Subject("discord:2", "Aria")
COR = Subject("discord:11", "Cor")


@pytest.fixture
def store():
    s = ProjectionStore(None)
    yield s
    s.close()


def add(store, text, *subjects, now=T0, **kw):
    fact, inserted = facts_db.append_fact(store, FactDraft(text, subjects=subjects, **kw), now=now)
    return fact


def fact_count(store) -> int:
    return len(facts_db.all_fact_ids(store))


# ------------------------------------------------------------------ normalisation


@pytest.mark.parametrize(
    "variant",
    [
        "Postbirb Prime is called Cor.",
        '  "postbirb   prime is called cor"  ',
        "Postbirb Prime is called 'Cor'.",
        "Postbirb Prime is called “Cor”.",
        "Postbirb Prime is called ‘Cor’!",
        "POSTBIRB PRIME\tIS CALLED\nCOR?!",
        "(Postbirb Prime is called Cor…)",
        "Postbirb Prime is called « Cor ».",
    ],
)
def test_normalisation_catches_case_spacing_quotes_and_edge_punctuation(variant):
    assert normalize_fact_text(variant) == "postbirb prime is called cor"


def test_normalisation_keeps_internal_punctuation_and_paraphrases_apart():
    assert normalize_fact_text("Cor likes a.b") != normalize_fact_text("Cor likes ab")
    assert normalize_fact_text("Cor's cat") == normalize_fact_text("Cor’s cat") == "cors cat"
    assert normalize_fact_text("goes by Cor") != normalize_fact_text("is called Cor")


def test_normalisation_treats_composed_and_decomposed_accents_alike():
    assert normalize_fact_text("Cass likes caf\u00e9") == normalize_fact_text("Cass likes cafe\u0301")


# ------------------------------------------------------------------ append and dedup


def test_append_round_trips_every_field(store):
    fact, inserted = facts_db.append_fact(store,
        FactDraft(
            "Cass adopted a cat.", source_turn_ids=[7, 9, 11], subjects=[CASS, ARIA],
            channel_id=1, importance=9, valid_from="2025-05-01T08:00:00+02:00",
        ),
        now=T0,
    )
    assert inserted and fact.id > 0 and fact.current
    (read,) = facts_db.facts_by_ids(store, [fact.id])
    assert read == fact
    assert read.source_turn_ids == (7, 9, 11)
    assert read.subjects == (CASS, ARIA)
    assert read.valid_from == datetime(2025, 5, 1, 6, 0, tzinfo=UTC)
    assert read.created_at == T0 and read.valid_to is None and read.superseded_by is None


def test_defaults_no_subjects_no_importance_valid_from_now(store):
    fact = add(store, "It rained.")
    assert fact.subjects == () and fact.importance is None and fact.valid_from == T0


@pytest.mark.parametrize(
    "given, stored",
    [(None, None), (9, 9), (0, 1), (42, 10), (-3, 1), (7.9, 7), ("8", 8), (True, None), (False, None)],
)
def test_importance_is_clamped_and_booleans_are_unknown(store, given, stored):
    assert add(store, f"Fact with importance {given!r}", importance=given).importance == stored


def test_dedup_returns_the_existing_fact_for_cor_variants(store):
    first = add(store, "Postbirb Prime is called Cor.", CASS, source_turn_ids=[1])
    for variant in ['  "postbirb   prime is called cor"  ', "Postbirb Prime is called 'Cor'.", "Postbirb Prime is called “Cor”."]:
        again, inserted = facts_db.append_fact(store,
            FactDraft(variant, subjects=[Subject("discord:1", "Cassidy")], source_turn_ids=[99], importance=3),
            now=T0 + timedelta(days=1),
        )
        assert not inserted and again == first  # untouched: sources, importance, display not merged
    assert fact_count(store) == 1


def test_dedup_key_is_text_and_exact_subject_set(store):
    keyed = add(store, "Likes tea.", CASS, ARIA)
    assert facts_db.append_fact(store, FactDraft("likes tea", subjects=[ARIA, CASS]), now=T0)[1] is False
    assert add(store, "Likes tea.").id != keyed.id  # subjectless vs keyed
    assert add(store, "Likes tea.", CASS).id != keyed.id  # partial overlap
    assert add(store, "Likes coffee.", CASS, ARIA).id != keyed.id  # different text
    assert facts_db.append_fact(store, FactDraft("Likes tea!"), now=T0)[1] is False  # subjectless twin of the subjectless one
    assert fact_count(store) == 4


def test_superseded_or_expired_twins_do_not_block_and_valid_to_bypasses(store):
    old = add(store, "Cass lives in Paris.", CASS)
    supersede_db.supersede(store, [old.id], None, now=T0)
    restated = add(store, "Cass lives in Paris.", CASS)
    assert restated.id != old.id

    bounded = add(store, "Cass is on holiday.", CASS, valid_to=T0 + timedelta(days=2))
    assert bounded.id not in (old.id, restated.id)
    later = T0 + timedelta(days=3)
    assert add(store, "Cass is on holiday.", CASS, now=later).id != bounded.id  # expired twin
    assert add(store, "Cass lives in Paris.", CASS, valid_to=T0 + timedelta(days=9)).id != restated.id
    forced, inserted = facts_db.append_fact(store, FactDraft("Cass lives in Paris.", subjects=[CASS]), now=T0, dedup=False)
    assert inserted and forced.id != restated.id


def test_dedup_probe_is_an_index_lookup(store):
    """Dedup must not scan every fact (every extracted fact probes it). DuckDB answers this probe from the ART index."""
    store.sql(
        "INSERT INTO facts SELECT nextval('facts_id_seq'), NULL, 'f'||i, 'f'||i, '', 'f'||i||chr(10), "
        "[], NULL, now(), NULL, NULL, now(), NULL, 'familiar', 'fact' FROM range(5000) t(i)"
    )
    plan = store.sql(
        "EXPLAIN ANALYZE SELECT id, superseded_at::TIMESTAMP, valid_to::TIMESTAMP FROM facts WHERE dedup_key = ?",
        ["f42\n"],
    ).fetchall()[0][1]
    assert "Index Scan" in plan
    assert facts_db.append_fact(store, FactDraft("F42."), now=T0)[1] is False


@pytest.mark.parametrize(
    "draft, error",
    [
        (FactDraft(""), ValueError),
        (FactDraft("  ...  "), ValueError),
        (FactDraft(None), TypeError),
        (FactDraft("x", subjects=[("discord:1", "Cass")]), TypeError),
        (FactDraft("x", source_turn_ids=["3"]), TypeError),
        (FactDraft("x", source_turn_ids=[True]), TypeError),
        (FactDraft("x", channel_id=True), TypeError),
        (FactDraft("x", importance="very"), ValueError),
        (FactDraft("x", valid_to="next tuesday"), ValueError),
        (FactDraft("x", valid_from=T0, valid_to=T0 - timedelta(days=1)), ValueError),
        (FactDraft("x", valid_to=T0 - timedelta(days=1)), ValueError),  # before the defaulted valid_from
    ],
)
def test_bad_drafts_raise_and_write_nothing(store, draft, error):
    with pytest.raises(error):
        facts_db.append_fact(store, draft, now=T0)
    assert fact_count(store) == 0


def test_bad_subject_keys_are_refused_at_construction():
    for key in ("Cass", "discord:", "discord 1:2", "", None):
        with pytest.raises((ValueError, TypeError)):
            Subject(key, "Cass")
    assert Subject("ego:sapphire", "Sapphire").canonical_key == "ego:sapphire"


def test_time_inputs_normalise_to_utc():
    assert as_utc("2025-03-01T10:00:00-05:00") == datetime(2025, 3, 1, 15, tzinfo=UTC)
    assert as_utc("2025-03-01T15:00:00Z") == datetime(2025, 3, 1, 15, tzinfo=UTC)
    assert as_utc(datetime(2025, 3, 1, 15)) == datetime(2025, 3, 1, 15, tzinfo=UTC)  # naive is UTC
    assert as_utc(date(2025, 3, 1)) == datetime(2025, 3, 1, tzinfo=UTC)
    assert as_utc("2025-03-01") == datetime(2025, 3, 1, tzinfo=UTC)
    with pytest.raises(TypeError):
        as_utc(1740841200)


def test_clamp_importance_rejects_non_numbers():
    assert clamp_importance(3.0) == 3
    for bad in (float("nan"), "high", [5]):
        with pytest.raises(ValueError):
            clamp_importance(bad)


def test_negative_offset_valid_to_compares_as_an_instant(store):
    # 10:00-05:00 is 15:00 UTC. As strings it sorts before "14:00+00:00": a store
    # comparing offset text would expire such facts early.
    fact = add(store, "Cass is at the dentist.", CASS, valid_from="2025-03-01T09:00:00-05:00",
               valid_to="2025-03-01T10:00:00-05:00", now=datetime(2025, 3, 1, 13, tzinfo=UTC))
    assert fact.valid_to == datetime(2025, 3, 1, 15, tzinfo=UTC)
    assert [f.id for f in facts_db.current_facts(store, now="2025-03-01T14:00:00+00:00")] == [fact.id]
    assert facts_db.current_facts(store, now="2025-03-01T15:00:00+00:00") == []
    assert [f.id for f in facts_db.recent_facts(store, 5, as_of="2025-03-01T09:30:00-05:00")] == [fact.id]


# ------------------------------------------------------------------ supersede


def test_existing_fact_form_points_old_at_new_and_mints_nothing(store):
    old = add(store, "Alice loves hiking.", CASS)
    new = add(store, "Alice now hates hiking.", CASS)
    later = T0 + timedelta(hours=1)
    result = supersede_db.supersede(store, [old.id], new.id, now=later)
    assert result.minted is None and result.superseded == (old.id,) and result.skipped == ()
    assert facts_db.latest_fact_id(store) == new.id
    (retired,) = facts_db.facts_by_ids(store, [old.id])
    assert retired.superseded_by == new.id and retired.superseded_at == later and not retired.current
    assert [f.id for f in facts_db.recent_facts(store, 10)] == [new.id]
    assert [f.id for f in facts_db.recent_facts(store, 10, include_superseded=True)] == [new.id, old.id]
    assert [f.id for f in facts_db.ancestors_of(store, new.id)] == [old.id]
    assert facts_db.superseded_fact_ids(store, [old.id, new.id, 999]) == {old.id}
    assert facts_db.superseded_fact_ids(store, []) == set()


def test_existing_form_accepts_a_fact_and_records_stale_ids(store):
    a, b, new = add(store, "a", CASS), add(store, "b", CASS), add(store, "c", CASS)
    supersede_db.supersede(store, [a.id], new, now=T0)
    result = supersede_db.supersede(store, [a.id, 404, b.id, new.id], new, now=T0)
    assert result.superseded == (b.id,)
    assert result.skipped == (
        (a.id, f"fact id={a.id} already superseded"),
        (404, "unknown fact id=404"),
        (new.id, f"fact id={new.id} cannot supersede itself"),
    )


def test_existing_form_refuses_unknown_or_retired_replacements(store):
    a, b, c = add(store, "a"), add(store, "b"), add(store, "c")
    with pytest.raises(ValueError, match="does not exist"):
        supersede_db.supersede(store, [a.id], 999)
    supersede_db.supersede(store, [b.id], c.id)
    result = supersede_db.supersede(store, [c.id, a.id], b.id)  # b is retired: c -> b would close a cycle
    assert result.superseded == () and [i for i, _ in result.skipped] == [c.id, a.id]
    assert facts_db.superseded_fact_ids(store, [a.id, b.id, c.id]) == {b.id}


def test_retire_form_is_per_id_not_atomic(store):
    a, b = add(store, "a", CASS), add(store, "b", ARIA)
    supersede_db.supersede(store, [a.id], None)
    result = supersede_db.supersede(store, [a.id, 77, b.id], None, now=T0)
    assert result.minted is None and result.superseded == (b.id,)
    assert result.skipped == ((a.id, f"fact id={a.id} already superseded"), (77, "unknown fact id=77"))
    (retired,) = facts_db.facts_by_ids(store, [b.id])
    assert retired.superseded_at == T0 and retired.superseded_by is None
    assert facts_db.current_facts(store) == []


def test_merge_mints_one_fact_with_union_provenance(store):
    a = add(store, "Cass has a cat.", CASS, source_turn_ids=[1, 2])
    b = add(store, "Cass's cat is grey.", CASS, source_turn_ids=[2, 3])
    c = add(store, "Cass has a cat.", CASS, ARIA, source_turn_ids=[4])
    result = supersede_db.supersede(store,
        [a.id, b.id, c.id], FactDraft("Cass has a cat.", subjects=[CASS], source_turn_ids=[5], channel_id=3), now=T0
    )
    minted = result.minted
    assert minted is not None and minted.id > c.id and minted.current  # no dedup against its sources
    assert minted.source_turn_ids == (1, 2, 3, 4, 5) and minted.channel_id == 3
    assert result.superseded == (a.id, b.id, c.id) and result.skipped == ()
    assert [f.id for f in facts_db.ancestors_of(store, minted.id)] == [a.id, b.id, c.id]
    assert {f.superseded_by for f in facts_db.facts_by_ids(store, [a.id, b.id, c.id])} == {minted.id}


def test_merge_declines_as_a_whole_on_any_stale_id(store):
    a, b = add(store, "a", CASS), add(store, "b", CASS)
    supersede_db.supersede(store, [b.id], None)
    before = facts_db.latest_fact_id(store)
    result = supersede_db.supersede(store, [a.id, b.id, 99], FactDraft("ab", subjects=[CASS]))
    assert result.minted is None and result.superseded == ()
    assert result.skipped == ((b.id, f"fact id={b.id} already superseded"), (99, "unknown fact id=99"))
    assert facts_db.latest_fact_id(store) == before and facts_db.facts_by_ids(store, [a.id])[0].current
    empty = supersede_db.supersede(store, [], FactDraft("nothing"))
    assert empty.minted is None and empty.skipped == () and facts_db.latest_fact_id(store) == before


def test_supersede_drops_only_the_retired_rows_subjects_dossiers(store):
    for key in ("discord:1", "discord:2", "discord:11"):
        dossier_db.put_dossier(store, key, f"about {key}", 1)
    old = add(store, "Cass and Aria share a flat.", CASS, ARIA)
    new = add(store, "Cor moved in.", COR)
    result = supersede_db.supersede(store, [old.id], new.id)
    assert result.dropped_dossiers == ("discord:1", "discord:2")
    assert [d.canonical_key for d in dossier_db.dossiers(store)] == ["discord:11"]  # the replacement's subject stays

    bare, other = add(store, "It rained."), add(store, "It snowed.")
    assert supersede_db.supersede(store, [bare.id], other.id).dropped_dossiers == ()
    assert dossier_db.get_dossier(store, "discord:11") is not None


def test_merge_drops_dossiers_of_retired_subjects_not_of_the_draft(store):
    dossier_db.put_dossier(store, "discord:1", "Cass", 1)
    dossier_db.put_dossier(store, "discord:11", "Cor", 1)
    a = add(store, "Cass is tall.", CASS)
    result = supersede_db.supersede(store, [a.id], FactDraft("Cass and Cor are tall.", subjects=[CASS, COR]))
    assert result.dropped_dossiers == ("discord:1",)
    assert dossier_db.get_dossier(store, "discord:11") is not None


def test_supersede_and_upserts_twice_on_the_same_keys_in_one_transaction(tmp_path):
    """DuckDB has hit over-eager duplicate-key errors on repeated updates of indexed rows."""
    with ProjectionStore(tmp_path / "memory.duckdb") as store:
        a, b, c = add(store, "a", CASS), add(store, "b", CASS), add(store, "c", CASS)
        with store.transaction():
            dossier_db.put_dossier(store, "discord:1", "v1", 1)
            assert supersede_db.supersede(store, [a.id], b.id).superseded == (a.id,)
            assert supersede_db.supersede(store, [a.id, b.id], c.id).superseded == (b.id,)
            fact_vectors.set_fact_embedding(store, c.id, "m", [1.0, 2.0])
            fact_vectors.set_fact_embedding(store, c.id, "m", [3.0])
            for i in range(3):
                store.set_watermark("fact_supersede", fact_id=i)
            drop_projection(store, "fact_supersede")
            assert supersede_db.supersede(store, [a.id], c.id).superseded == (a.id,)
            dossier_db.put_dossier(store, "discord:1", "v2", 2)
            dossier_db.put_dossier(store, "discord:1", "v3", 3)
            summary_db.put_summary(store, "s1", 1)
            summary_db.put_summary(store, "s2", 2)
    with ProjectionStore(tmp_path / "memory.duckdb") as store:
        assert dossier_db.get_dossier(store, "discord:1").dossier_text == "v3"
        assert facts_db.facts_by_ids(store, [a.id])[0].superseded_by == c.id
        assert facts_db.facts_by_ids(store, [b.id])[0].current
        assert fact_vectors.embeddings_for(store, "m", [c.id]) == {c.id: [3.0]}
        assert store.get_watermark("fact_supersede").fact_id == 0  # dropped after being set
        assert summary_db.get_summary(store).summary_text == "s2"


def test_supersede_decisions_are_logged(store):
    new = add(store, "n", CASS)
    decision_id = supersede_db.record_supersede_decision(store,
        new_fact_id=new.id, subject_key="discord:1", shown_prior_ids=[1, 2], retired_ids=[2],
        skipped=[(1, "fact id=1 already superseded")], model="fake/model", now=T0,
    )
    rows = store.table_rows("supersede_decisions")
    assert rows == [(decision_id, new.id, "discord:1", [1, 2], [2], '[[1, "fact id=1 already superseded"]]', "fake/model", T0,
                     "familiar")]
    with pytest.raises(TypeError):
        supersede_db.record_supersede_decision(store, new_fact_id=new.id, subject_key="discord:1", shown_prior_ids=[],
                                        retired_ids=[], skipped=[3], model=None)


def test_facts_for_subjects_is_each_subjects_own_read_in_one(store):
    bo, mia = Subject("discord:2", "Bo"), Subject("discord:3", "Mia")
    for i, subjects in enumerate([(CASS,), (CASS, bo), (bo,), (mia, CASS), (bo,), (CASS,)]):
        add(store, f"fact {i}", *subjects)
    supersede_db.supersede(store, [2], 5)
    for after, upto in ((0, 6), (1, 4), (3, 3)):
        keys = ["discord:1", "discord:2", "discord:3", "discord:9"]
        expected = {k: facts_db.facts_by_ids(store, facts_db.fact_ids_for_subject(store, k, after_id=after, upto_id=upto)) for k in keys}
        assert facts_db.facts_for_subjects(store, reversed(keys), after_id=after, upto_id=upto) == expected
    assert facts_db.facts_for_subjects(store, [], after_id=0, upto_id=6) == {}


def test_reflections_written_together_match_one_at_a_time(tmp_path):
    rows = [("Cass seems happier.", [1, 2], []), ("Tea again.", [], [3]), ("Both.", [2], [3, 1])]
    with ProjectionStore(tmp_path / "one.duckdb") as one, ProjectionStore(tmp_path / "all.duckdb") as together:
        singles = [reflection_db.append_reflection(one, channel_id=5, text=t, cited_turn_ids=ts, cited_fact_ids=fs,
                                         last_turn_id=9, last_fact_id=3, now=T0) for t, ts, fs in rows]
        assert reflection_db.append_reflections(together, rows, channel_id=5, last_turn_id=9, last_fact_id=3, now=T0) == singles
        assert together.table_rows("reflections") == one.table_rows("reflections")
        with pytest.raises(ValueError, match="cite"):  # an uncited row anywhere: none of them is written
            reflection_db.append_reflections(together, [rows[0], ("Uncited.", [], [])], channel_id=5, last_turn_id=9, last_fact_id=3)
        assert len(reflection_db.all_reflections(together)) == 3


def test_watermarks_read_once_stay_true_through_rollbacks_and_raw_sql(tmp_path):
    path = tmp_path / "m.duckdb"
    with ProjectionStore(path) as store:
        store.set_watermark("rich_note", turn_id=5, now=T0)
        with pytest.raises(RuntimeError):
            with store.transaction():
                store.set_watermark("rich_note", turn_id=9, fact_id=2)
                store.set_watermark("reflection", turn_id=1)
                raise RuntimeError("the batch failed")
        assert store.get_watermark("rich_note") == Watermark("rich_note", 5, 0, 0, T0)
        assert [m.projector for m in store.watermarks()] == ["rich_note"]
        store.conn.execute("UPDATE watermarks SET fact_id = 7")
        assert store.get_watermark("rich_note").fact_id == 7
        store.set_watermark("rich_note", change_seq=3, now=T0)
        store.drop_rows(watermarks=["reflection"])
        store.set_watermark("reflection", fact_id=4, now=T0)
        kept = store.watermarks()
    with ProjectionStore(path) as reopened:
        assert reopened.watermarks() == kept == [Watermark("reflection", 0, 4, 0, T0), Watermark("rich_note", 5, 7, 3, T0)]


def test_supersede_decisions_logged_together_match_one_at_a_time(tmp_path):
    decisions = [dict(new_fact_id=i, subject_key=f"discord:{i % 2}", shown_prior_ids=list(range(1, i)),
                      retired_ids=[1] if i == 3 else [], skipped=[(2, "fact id=2 already superseded")] if i == 2 else [],
                      model=None if i == 1 else "fake/model") for i in (1, 2, 3)]
    with ProjectionStore(tmp_path / "one.duckdb") as one, ProjectionStore(tmp_path / "all.duckdb") as together:
        ids = [supersede_db.record_supersede_decision(one, **d, now=T0) for d in decisions]
        assert supersede_db.record_supersede_decisions(together, decisions, now=T0) == ids == [1, 2, 3]
        assert together.table_rows("supersede_decisions") == one.table_rows("supersede_decisions")
        with pytest.raises(TypeError, match="pairs"):  # a bad one anywhere: nothing of the batch is written
            supersede_db.record_supersede_decisions(together, [decisions[0], {**decisions[1], "skipped": [5]}])
        assert len(together.table_rows("supersede_decisions")) == 3
        assert supersede_db.record_supersede_decisions(together, []) == []


# ------------------------------------------------------------------ validity and reads


def test_current_reads_hide_expired_rows_even_with_include_superseded(store):
    expired = add(store, "Cass was ill.", CASS, valid_from=T0 - timedelta(days=40), valid_to=T0 - timedelta(days=30))
    live = add(store, "Cass is well.", CASS)
    assert [f.id for f in facts_db.current_facts(store, now=T0)] == [live.id]
    assert [f.id for f in facts_db.recent_facts(store, 10, include_superseded=True, now=T0)] == [live.id]
    assert [f.id for f in facts_db.facts_for_subject(store, "discord:1", include_superseded=True, now=T0)] == [live.id]
    assert facts_db.facts_by_ids(store, [expired.id])[0].id == expired.id  # by-id reads return everything


def test_as_of_gives_the_world_time_slice_including_superseded_rows(store):
    acme = add(store, "Cass works at Acme.", CASS, valid_from="2025-01-01", valid_to="2025-07-01")
    globex = add(store, "Cass works at Globex.", CASS, valid_from="2025-07-01")
    belief = add(store, "Cass lives in Oslo.", CASS, valid_from="2025-01-15")
    supersede_db.supersede(store, [belief.id], globex.id, now="2025-08-01")
    def ids(facts):
        return [f.id for f in facts]

    assert ids(facts_db.recent_facts(store, 10, as_of="2025-03-01")) == [belief.id, acme.id]
    assert ids(facts_db.recent_facts(store, 10, as_of="2025-09-01")) == [belief.id, globex.id]
    assert ids(facts_db.facts_for_subject(store, "discord:1", as_of="2025-07-01")) == [globex.id, belief.id]  # half-open
    assert ids(facts_db.facts_for_subject(store, "discord:1", as_of="2024-12-31")) == []
    assert ids(facts_db.current_facts(store, now="2025-09-01")) == [globex.id]


def test_facts_for_subject_matches_keys_exactly_and_respects_min_id(store):
    f1 = add(store, "one", CASS)
    f2 = add(store, "two", CASS, ARIA)
    f3 = add(store, "three", COR)
    f4 = add(store, "four", CASS)
    supersede_db.supersede(store, [f4.id], None)
    assert [f.id for f in facts_db.facts_for_subject(store, "discord:1")] == [f1.id, f2.id]  # not discord:11
    assert [f.id for f in facts_db.facts_for_subject(store, "discord:1", min_id_exclusive=f1.id)] == [f2.id]
    assert [f.id for f in facts_db.facts_for_subject(store, "discord:2")] == [f2.id]
    assert [f.id for f in facts_db.facts_for_subject(store, "discord:1", include_superseded=True)] == [f1.id, f2.id, f4.id]
    assert [f.id for f in facts_db.facts_for_subject(store, "discord:11")] == [f3.id]


def test_subjects_with_facts_maps_keys_to_newest_current_fact(store):
    assert facts_db.subjects_with_facts(store) == {}
    add(store, "subjectless")
    f2 = add(store, "c", CASS)
    f3 = add(store, "a", ARIA)
    f4 = add(store, "both", CASS, ARIA)
    f5 = add(store, "c2", CASS)
    supersede_db.supersede(store, [f5.id], None)
    assert facts_db.subjects_with_facts(store) == {"discord:1": f4.id, "discord:2": f4.id}
    assert f2.id < f3.id < f4.id


def test_id_reads(store):
    assert facts_db.latest_fact_id(store) == 0 and facts_db.all_fact_ids(store) == set()
    a, b, c = add(store, "a"), add(store, "b"), add(store, "c")
    supersede_db.supersede(store, [b.id], None)
    assert facts_db.latest_fact_id(store) == c.id and facts_db.all_fact_ids(store) == {a.id, b.id, c.id}
    assert [f.id for f in facts_db.facts_by_ids(store, [c.id, 999, a.id, b.id])] == [a.id, b.id, c.id]
    assert facts_db.facts_by_ids(store, []) == []
    assert [f.id for f in facts_db.recent_facts(store, 2)] == [c.id, a.id]
    assert facts_db.recent_facts(store, 0) == [] and facts_db.recent_facts(store, -1) == []


# ------------------------------------------------------------------ summary, dossiers, reflections


def test_summary_upserts_and_refuses_empty_text(store):
    assert summary_db.get_summary(store) is None
    summary_db.put_summary(store, "First.", 10, now=T0)
    summary_db.put_summary(store, "Second.", 20, now=T0 + timedelta(hours=1))
    summary = summary_db.get_summary(store)
    assert (summary.summary_text, summary.last_turn_id, summary.created_at) == ("Second.", 20, T0 + timedelta(hours=1))
    with pytest.raises(ValueError):
        summary_db.put_summary(store, "   ", 30)
    assert summary_db.get_summary(store).summary_text == "Second."
    assert len(store.table_rows("summaries")) == 1


def test_dossiers_upsert_list_and_delete(store):
    assert dossier_db.get_dossier(store, "discord:1") is None
    dossier_db.put_dossier(store, "discord:2", "Aria.", 3, now=T0)
    dossier_db.put_dossier(store, "discord:1", "Cass.", 7, now=T0)
    dossier_db.put_dossier(store, "discord:1", "Cass, again.", 9, now=T0)
    assert dossier_db.get_dossier(store, "discord:1").last_fact_id == 9
    assert [d.canonical_key for d in dossier_db.dossiers(store)] == ["discord:1", "discord:2"]
    with pytest.raises(ValueError):
        dossier_db.put_dossier(store, "discord:1", "", 10)
    with pytest.raises(ValueError):
        dossier_db.put_dossier(store, "Cass", "text", 10)
    assert dossier_db.delete_dossiers(store, ["discord:1", "discord:404"]) == 1
    assert dossier_db.delete_dossiers(store, []) == 0
    assert [d.canonical_key for d in dossier_db.dossiers(store)] == ["discord:2"]


def test_reflections_round_trip_and_filter_by_channel(store):
    r1 = reflection_db.append_reflection(store, channel_id=5, text="Cass seems happier.", cited_turn_ids=[1, 2],
                                 cited_fact_ids=[7], last_turn_id=42, last_fact_id=11, now=T0)
    r2 = reflection_db.append_reflection(store, channel_id=None, text="Everyone likes tea.", cited_turn_ids=[],
                                 cited_fact_ids=[3], last_turn_id=43, last_fact_id=11)
    r3 = reflection_db.append_reflection(store, channel_id=6, text="Channel six is quiet.", cited_turn_ids=[40],
                                 cited_fact_ids=[], last_turn_id=44, last_fact_id=12)
    assert reflection_db.recent_reflections(store, channel_id=5, limit=10) == [r2, r1]
    assert reflection_db.recent_reflections(store) == [r3, r2, r1]
    assert reflection_db.recent_reflections(store, limit=1) == [r3] and reflection_db.recent_reflections(store, limit=0) == []
    assert (r1.cited_turn_ids, r1.cited_fact_ids, r1.last_turn_id, r1.last_fact_id, r1.channel_id) == ((1, 2), (7,), 42, 11, 5)
    assert r2.channel_id is None
    with pytest.raises(ValueError, match="cite"):
        reflection_db.append_reflection(store, channel_id=1, text="Uncited.", cited_turn_ids=[], cited_fact_ids=[],
                                last_turn_id=1, last_fact_id=1)


# ------------------------------------------------------------------ embeddings


def test_embeddings_upsert_per_model_and_read_back(store):
    a, b = add(store, "a"), add(store, "b")
    fact_vectors.set_fact_embedding(store, a.id, "hash-v1", [0.1, 0.2, 0.3])
    fact_vectors.set_fact_embedding(store, a.id, "other", [1.0])
    got = fact_vectors.embeddings_for(store, "hash-v1", [a.id, b.id])
    assert list(got) == [a.id] and got[a.id] == pytest.approx([0.1, 0.2, 0.3], abs=1e-6)
    fact_vectors.set_fact_embedding(store, a.id, "hash-v1", [0.5, 0.5])  # dim change overwrites
    assert fact_vectors.embeddings_for(store, "hash-v1", [a.id]) == {a.id: [0.5, 0.5]}
    assert fact_vectors.embeddings_for(store, "other", [a.id]) == {a.id: [1.0]}
    assert fact_vectors.embeddings_for(store, "hash-v1", []) == {}
    assert [r[:3] for r in store.table_rows("fact_embeddings")] == [(a.id, "hash-v1", 2), (a.id, "other", 1)]
    for bad_vector, error in (([], ValueError), ([float("nan")], ValueError), (["x"], TypeError)):
        with pytest.raises(error):
            fact_vectors.set_fact_embedding(store, b.id, "hash-v1", bad_vector)
    with pytest.raises(ValueError, match="unknown fact"):
        fact_vectors.set_fact_embedding(store, 999, "hash-v1", [1.0])


def test_unembedded_facts_are_current_unvectored_ascending(store):
    a, b, c, d = (add(store, t) for t in "abcd")
    expired = add(store, "e", valid_from=T0 - timedelta(days=2), valid_to=T0 - timedelta(days=1))
    assert [f.id for f in fact_vectors.unembedded_facts(store, "m", 10, now=T0)] == [a.id, b.id, c.id, d.id]
    fact_vectors.set_fact_embedding(store, b.id, "m", [1.0])
    fact_vectors.set_fact_embedding(store, c.id, "other", [1.0])
    supersede_db.supersede(store, [d.id], None)
    assert [f.id for f in fact_vectors.unembedded_facts(store, "m", 10, now=T0)] == [a.id, c.id]
    assert [f.id for f in fact_vectors.unembedded_facts(store, "m", 1, now=T0)] == [a.id]
    assert fact_vectors.unembedded_facts(store, "m", 0) == []
    assert expired.id not in {f.id for f in fact_vectors.unembedded_facts(store, "m", 10, now=T0)}


# ------------------------------------------------------------------ watermarks and transactions


def test_watermarks_default_to_zero_and_update_per_axis(store):
    empty = store.get_watermark("rich_note")
    assert (empty.turn_id, empty.fact_id, empty.change_seq, empty.updated_at) == (0, 0, 0, None)
    store.set_watermark("reflection", turn_id=42, fact_id=11, now=T0)
    mark = store.set_watermark("reflection", change_seq=3, now=T0 + timedelta(minutes=1))
    assert store.get_watermark("reflection") == mark
    assert (mark.turn_id, mark.fact_id, mark.change_seq, mark.updated_at) == (42, 11, 3, T0 + timedelta(minutes=1))
    for kwargs in ({}, {"turn_id": -1}, {"fact_id": "3"}):
        with pytest.raises((ValueError, TypeError)):
            store.set_watermark("reflection", **kwargs)
    assert store.get_watermark("reflection") == mark


def test_an_exception_in_a_transaction_rolls_back_facts_and_watermark(store):
    kept = add(store, "kept")
    with pytest.raises(RuntimeError, match="boom"):
        with store.transaction():
            add(store, "lost", CASS)
            dossier_db.put_dossier(store, "discord:1", "lost", 1)
            store.set_watermark("rich_note", turn_id=50)
            assert fact_count(store) == 2  # visible inside
            raise RuntimeError("boom")
    assert facts_db.all_fact_ids(store) == {kept.id}
    assert store.get_watermark("rich_note").turn_id == 0 and dossier_db.get_dossier(store, "discord:1") is None
    # the store is usable afterwards and ids keep growing past the rolled-back one
    assert add(store, "next").id > kept.id


def test_a_swallowed_database_error_still_fails_the_transaction_loudly(store):
    with pytest.raises(StoreError, match="rolled back"):
        with store.transaction():
            add(store, "lost")
            with pytest.raises(duckdb.ConstraintException):
                store.sql("INSERT INTO facts (id) VALUES (1)")
    assert fact_count(store) == 0
    assert add(store, "kept").current and fact_count(store) == 1


def test_nested_transactions_join_the_outer_one(store):
    with pytest.raises(KeyError):
        with store.transaction():
            add(store, "outer")
            with store.transaction():
                store.set_watermark("rich_note", turn_id=5)
            raise KeyError("late failure")
    assert fact_count(store) == 0 and store.get_watermark("rich_note").turn_id == 0
    with store.transaction():
        with store.transaction():
            add(store, "inner")
        store.set_watermark("rich_note", turn_id=6)
    assert fact_count(store) == 1 and store.get_watermark("rich_note").turn_id == 6


# ------------------------------------------------------------------ drop_projection and table_rows


def row_counts(store):
    return {t: len(store.table_rows(t)) for t in [*store.tables, "watermarks"]}


def remaining_watermarks(store):
    return {r[0] for r in store.table_rows("watermarks")}


def test_drop_rich_note_takes_facts_and_everything_built_on_them(store):
    a, b, c = populate_every_table(store)
    drop_projection(store, "rich_note")
    assert row_counts(store) == {
        "facts": 0, "fact_subjects": 0, "summaries": 1, "people_dossiers": 0, "reflections": 0,
        "fact_embeddings": 0, "turn_embeddings": 1, "turn_window_embeddings": 1, "turn_passage_embeddings": 2,
        "watermarks": 5, "supersede_decisions": 0,
        "wishes": 0,  # its wishes come from facts too (kind "wish"): rebuilt from turns and the new facts
    }
    # Turn and window vectors are built from turns, not facts: they survive. Standing wishes read
    # the facts of kind "wish" too (whose ids restart), so they rebuild with them.
    assert remaining_watermarks(store) == {"rolling_summary", "turns_fts", "turn_embedding", "turn_window_embedding",
                                           "turn_passage_embedding"}
    # nothing citing a fact id survives, so ids restart: a rebuild reproduces the incremental ids
    assert add(store, "Cass likes tea.", CASS).id == 1


def test_drop_fact_supersede_unretires_and_drops_affected_dossiers(store):
    a, b, c = populate_every_table(store)
    drop_projection(store, "fact_supersede")
    assert {f.id for f in facts_db.current_facts(store)} == {a.id, b.id, c.id}
    assert store.table_rows("supersede_decisions") == []
    assert [d.canonical_key for d in dossier_db.dossiers(store)] == ["discord:2"]
    assert remaining_watermarks(store) == set(PROJECTIONS) - {"fact_supersede"}


@pytest.mark.parametrize(
    "name, table",
    [("rolling_summary", "summaries"), ("people_dossier", "people_dossiers"),
     ("reflection", "reflections"), ("fact_embedding", "fact_embeddings")],
)
def test_drop_single_table_projections(store, name, table):
    populate_every_table(store)
    before = row_counts(store)
    drop_projection(store, name)
    after = row_counts(store)
    assert after[table] == 0
    assert {k: v for k, v in after.items() if k not in (table, "watermarks")} == {
        k: v for k, v in before.items() if k not in (table, "watermarks")
    }
    assert remaining_watermarks(store) == set(PROJECTIONS) - {name}


def test_drop_unknown_projection_lists_the_known_ones(store):
    with pytest.raises(ValueError, match="rich_note"):
        drop_projection(store, "facts")


def test_table_rows_are_ordered_and_can_leave_out_system_time(store):
    populate_every_table(store)
    rows = store.table_rows("facts", exclude=store.system_time_columns())
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    assert len(rows[0]) == len(store.table_rows("facts")[0]) - 2  # created_at, superseded_at
    assert store.table_rows("fact_subjects")[0][:2] == (1, "discord:1")
    with pytest.raises(ValueError):
        store.table_rows("facts; DROP TABLE facts")
    with pytest.raises(ValueError):
        store.table_rows("facts", exclude=["no_such_column"])


# ------------------------------------------------------------------ files, read-only, schema versions, views


def test_file_store_persists_and_read_only_open_reads_but_never_writes(tmp_path):
    path = tmp_path / "fam" / "memory.duckdb"
    with ProjectionStore(path) as writer:
        fact = add(writer, "Cass likes tea.", CASS)
        writer.set_watermark("rich_note", turn_id=3)
    with ProjectionStore(path, read_only=True) as reader:
        assert facts_db.facts_by_ids(reader, [fact.id]) == [fact]
        assert reader.get_watermark("rich_note").turn_id == 3
        with pytest.raises(ReadOnlyStoreError):
            facts_db.append_fact(reader, FactDraft("x"))
        with pytest.raises(ReadOnlyStoreError):
            drop_projection(reader, "rich_note")
    with pytest.raises(FileNotFoundError):
        ProjectionStore(tmp_path / "missing.duckdb", read_only=True)
    with pytest.raises(ValueError):
        ProjectionStore(None, read_only=True)


def test_a_held_file_gives_a_clear_locked_error(tmp_path):
    path = tmp_path / "memory.duckdb"
    with ProjectionStore(path):
        probe = textwrap.dedent(f"""
            from familiar_pipeline.storage.store import ProjectionStore, StoreLockedError
            try:
                ProjectionStore({str(path)!r}, read_only=True)
            except StoreLockedError as exc:
                print("locked:", exc)
        """)
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("locked:") and "another process" in out.stdout, out.stderr


def test_writable_stores_share_one_attachment_and_the_last_close_releases_the_file(tmp_path):
    path, other = tmp_path / "memory.duckdb", tmp_path / "other.duckdb"
    probe = textwrap.dedent(f"""
        from familiar_pipeline.storage.store import ProjectionStore, StoreLockedError
        try:
            ProjectionStore({str(path)!r}).close()
            print("opened")
        except StoreLockedError:
            print("locked")
    """)

    def another_process() -> str:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()

    first, second, elsewhere = ProjectionStore(path), ProjectionStore(path), ProjectionStore(other)
    fact, _ = facts_db.append_fact(first, FactDraft("Cass likes tea.", subjects=[CASS]))
    elsewhere.set_watermark("rich_note", turn_id=9)
    first.close()
    assert facts_db.facts_by_ids(second, [fact.id]) == [fact] and second.get_watermark("rich_note").turn_id == 0
    assert another_process() == "locked"  # still held: one store of this process has it open
    second.close()
    assert another_process() == "opened"
    assert elsewhere.get_watermark("rich_note").turn_id == 9
    elsewhere.close()
    with ProjectionStore(path) as again:  # attached afresh after its detach
        assert facts_db.facts_by_ids(again, [fact.id]) == [fact]


def test_files_from_the_future_or_foreign_files_are_refused(tmp_path):
    future = tmp_path / "future.duckdb"
    with ProjectionStore(future):
        pass
    with duckdb.connect(str(future)) as raw:
        raw.execute("INSERT INTO schema_version VALUES (99, now())")
    for read_only in (False, True):
        with pytest.raises(SchemaVersionError, match="newer"):
            ProjectionStore(future, read_only=read_only)

    foreign = tmp_path / "foreign.duckdb"
    with duckdb.connect(str(foreign)) as raw:
        raw.execute("CREATE TABLE something_else (x INT)")
    with pytest.raises(SchemaVersionError, match="not a familiar"):
        ProjectionStore(foreign)


def test_notebook_views_work_from_a_plain_read_only_connection(tmp_path):
    path = tmp_path / "memory.duckdb"
    now = datetime.now(UTC)
    with ProjectionStore(path) as store:
        acme = add(store, "Cass works at Acme.", CASS, valid_from="2025-01-01", valid_to="2025-07-01", now=now)
        old = add(store, "Cass lives in Oslo.", CASS, ARIA, valid_from="2025-01-01", now=now)
        new = add(store, "Cass lives in Rome.", CASS, valid_from="2025-08-01", now=now)
        newest = add(store, "Cass lives in Bergen.", CASS, valid_from="2025-09-01", now=now)
        supersede_db.supersede(store, [old.id], new.id, now=now)
        supersede_db.supersede(store, [new.id], newest.id, now=now)

    with duckdb.connect(str(path), read_only=True) as nb:
        current = nb.execute("SELECT id, subjects, subject_keys FROM current_facts ORDER BY id").fetchall()
        assert current == [(newest.id, [{"canonical_key": "discord:1", "display_at_write": "Cass"}], ["discord:1"])]

        march = nb.execute("SELECT id, superseded_by FROM facts_as_of('2025-03-01 00:00:00+00') ORDER BY id").fetchall()
        assert march == [(acme.id, None), (old.id, new.id)]  # includes the retired belief
        august = nb.execute("SELECT id FROM facts_as_of(TIMESTAMPTZ '2025-08-15 00:00:00+00') ORDER BY id").fetchall()
        assert [r[0] for r in august] == [old.id, new.id]

        lineage = dict((r[0], r[1:]) for r in nb.execute("SELECT id, supersedes, superseded_by FROM fact_lineage").fetchall())
        assert lineage[new.id] == ([old.id], newest.id)
        assert lineage[newest.id] == ([new.id], None)

        chain = nb.execute("SELECT depth, id FROM supersession_chain(?)", [new.id]).fetchall()
        assert chain == [(-1, old.id), (0, new.id), (1, newest.id)]

        by_subject = nb.execute(
            "SELECT canonical_key, fact_id, is_current, valid_to FROM facts_by_subject ORDER BY canonical_key, fact_id"
        ).fetchall()
        assert [(k, i, cur) for k, i, cur, _ in by_subject] == [
            ("discord:1", acme.id, False), ("discord:1", old.id, False), ("discord:1", new.id, False),
            ("discord:1", newest.id, True), ("discord:2", old.id, False),
        ]
        assert by_subject[0][3] == datetime(2025, 7, 1, tzinfo=UTC)


def test_fact_dataclass_is_frozen_and_current_means_not_superseded(store):
    fact = add(store, "x")
    assert isinstance(fact, Fact) and fact.current
    with pytest.raises(AttributeError):
        fact.text = "y"  # type: ignore[misc]
    draft = FactDraft("y", source_turn_ids=[1, 2], subjects=[CASS])
    assert draft.source_turn_ids == (1, 2) and draft.subjects == (CASS,)


# ------------------------------------------------------------------ append_facts (batch form)


def test_append_facts_matches_append_fact_one_by_one(tmp_path):
    drafts = [
        FactDraft(text="Cass likes tea.", source_turn_ids=(1,), subjects=(Subject("discord:1", "Cass"),), importance=4),
        FactDraft(text="  cass LIKES 'tea'  ", source_turn_ids=(2,), subjects=(Subject("discord:1", "Cass"),)),
        FactDraft(text="Aria sings.", source_turn_ids=(3,), subjects=(Subject("discord:2", "Aria"), Subject("discord:1", "Cass"))),
        FactDraft(text="Aria sings.", source_turn_ids=(4,), valid_to=datetime(2030, 1, 1, tzinfo=timezone.utc)),
        FactDraft(text="Bo left.", source_turn_ids=(5,)),
    ]
    one = ProjectionStore(None)
    facts_db.append_fact(one, FactDraft(text="Bo left.", source_turn_ids=(9,)))
    expected = [(f.id, f.text, inserted) for f, inserted in (facts_db.append_fact(one, d) for d in drafts)]
    batch = ProjectionStore(None)
    facts_db.append_fact(batch, FactDraft(text="Bo left.", source_turn_ids=(9,)))
    got = [(f.id, f.text, inserted) for f, inserted in facts_db.append_facts(batch, drafts)]
    assert got == expected
    assert batch.table_rows("fact_subjects") == one.table_rows("fact_subjects")
    assert [r[:9] for r in batch.table_rows("facts", exclude=("created_at",))] == [
        r[:9] for r in one.table_rows("facts", exclude=("created_at",))
    ]
