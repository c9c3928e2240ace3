"""Scopes on the pipeline side (issue 26, item 1): batches never mix scopes.

A batch of the turn log may hold turns of a DM and of a server; extraction splits it
per scope (one call each, each with that scope's participants only), facts carry
their scope, and supersession never crosses scopes. Real Dagster runs, DuckDB and
the scripted offline model.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest

from familiar_pipeline.config.loading import load_config
from familiar_pipeline.defs.jobs import materialize_in_process
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.facts.prompt import SYSTEM_MARK as EXTRACT_MARK
from familiar_pipeline.projectors.facts.run import build_manifest, extraction_messages
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog

from .fact_helpers import GRAPH_TOML
from .helpers import append_chat, make_familiar

BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
SERVER, DM_CHANNEL = 1, 50
CASS, BO, MIA = ("discord:111", "Cass"), ("discord:222", "Bo"), ("discord:333", "Mia")


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def run_assets(root, instance, assets, *, rebuild=False):
    instance.add_dynamic_partitions("familiars", ["fam"])
    return materialize_in_process(assets, instance=instance, data_root=root, partition_key="fam", rebuild=rebuild)


def say(paths, rows, *, start_minute: int = 0) -> list:
    """(person, guild id or None for the DM, text) rows, one minute apart; DMs in channel 50, the server in 10."""
    turns = []
    with TurnLog(paths.turns_db) as log:
        for i, ((key, name), guild, text) in enumerate(rows):
            log.upsert_participant(key, username=name.lower(), global_name=name)
            turns.append(log.append_turn(
                channel_id=DM_CHANNEL if guild is None else 10, guild_id=guild, role="user", author_key=key,
                author_display=name, content=text, created_at=BASE + timedelta(minutes=start_minute + i)))
    return turns


def extraction_calls(fake_llm):
    return [c for c in fake_llm.calls if EXTRACT_MARK in c.system]


def facts_by_scope(paths) -> dict[str, list[str]]:
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        found: dict[str, list[str]] = {}
        for f in facts_db.current_facts(store):
            found.setdefault(f.scope, []).append(f.text)
        return found


MIXED = [
    (CASS, None, "Please keep this private, my zephyrine test came back positive"),
    (BO, SERVER, "Our guild raid on quokkaland starts Friday evening at eight"),
    (CASS, None, "I have not told anyone about the zephyrine result yet"),
    (MIA, SERVER, "I will bring the quokkaland maps and the spare potions"),
    (BO, SERVER, "Remember that quokkaland has a fire boss near the end"),
    (CASS, None, "My doctor says the zephyrine treatment starts next month"),
    (MIA, SERVER, "Then we need fire resistance gear for quokkaland again"),
    (CASS, None, "Thanks for listening, zephyrine stuff is heavy to carry"),
    (BO, SERVER, "Everyone bring food buffs for the quokkaland run too"),
    (MIA, SERVER, "I can craft the quokkaland food buffs on Thursday night"),
]


def test_a_batch_mixing_a_dm_and_a_server_is_extracted_per_scope(tmp_path, instance, fake_llm):
    paths = make_familiar(tmp_path)
    say(paths, MIXED)  # ten turns: one full batch at the test cadence
    run_assets(tmp_path, instance, ["facts"])
    calls = extraction_calls(fake_llm)
    assert len(calls) == 2, "one extraction call per scope of the batch"
    dm_call = next(c for c in calls if "zephyrine" in c.user)
    server_call = next(c for c in calls if "quokkaland" in c.user)
    assert "quokkaland" not in dm_call.user and "zephyrine" not in server_call.user
    # Each manifest holds its scope's people only (and the familiar).
    assert "discord:111" in dm_call.user and "discord:222" not in dm_call.user and "discord:333" not in dm_call.user
    assert "discord:222" in server_call.user and "discord:333" in server_call.user and "discord:111" not in server_call.user
    scoped = facts_by_scope(paths)
    assert set(scoped) == {f"channel:{DM_CHANNEL}", f"guild:{SERVER}"}, scoped.keys()
    assert all("zephyrine" in t for t in scoped[f"channel:{DM_CHANNEL}"])
    assert all("quokkaland" in t for t in scoped[f"guild:{SERVER}"])
    with TurnLog(paths.turns_db) as log:
        dm_ids = {t.id for t in log.turns_after(0) if t.guild_id is None}
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        for fact in facts_db.current_facts(store):
            assert (set(fact.source_turn_ids) <= dm_ids) == (fact.scope == f"channel:{DM_CHANNEL}")


def test_widening_never_brings_a_participant_seen_only_in_another_scope(tmp_path, instance, fake_llm):
    """A channel id reused by a DM and a server (as the console may): widening keeps to the batch's scope."""
    paths = make_familiar(tmp_path)
    with TurnLog(paths.turns_db) as log:
        log.upsert_participant("discord:444", username="dee", global_name="Dee")
        log.append_turn(channel_id=10, guild_id=None, role="user", author_key="discord:444", author_display="Dee",
                        content="A secret only said outside the server", created_at=BASE - timedelta(hours=2))
    say(paths, [(BO if i % 2 else MIA, SERVER, f"{MIXED[1][2]} number {i}") for i in range(10)])
    run_assets(tmp_path, instance, ["facts"])
    server_call = next(c for c in extraction_calls(fake_llm) if "number 0" in c.user)
    assert "discord:444" not in server_call.user and "Dee" not in server_call.user


def test_a_single_scope_batch_sends_the_prompt_it_always_did(tmp_path, instance, fake_llm):
    """Byte-identical to the prompt built over the whole batch (the old way), and to the digest the old code sent."""
    paths = make_familiar(tmp_path)
    turns = append_chat(paths, 10)
    run_assets(tmp_path, instance, ["facts"])
    (call,) = extraction_calls(fake_llm)
    cfg = load_config("fam", root=tmp_path)
    me, name = ego_key(cfg.familiar_id), cfg.display_name
    with TurnLog(paths.turns_db) as log:
        manifest = build_manifest(turns, log, participants_max=cfg.memory.rich_note.participants_max,
                                  self_key=me, self_name=name)
    sent = [{"role": m["role"], "content": m["content"]} for m in call["messages"]]
    assert sent == extraction_messages(turns, manifest, self_key=me, self_name=name)
    digest = hashlib.sha256(json.dumps(sent, sort_keys=True).encode()).hexdigest()
    assert digest == OLD_DIGEST, digest


# The digest of that prompt as the code before scopes sent it (measured on the parent commit:
# a250213b...); since issue 33's wish facts the prompt also asks for "kind" (one line in the field
# list and one paragraph on standing wishes), so the pinned digest is that prompt's.
OLD_DIGEST = "71d27142fa045a717fb7550c86a5baf918285817255856eb5665f954125e67d4"


MOVES = [
    (CASS, None, "I live in Berlin these days, please keep it quiet"),
    (CASS, SERVER, "I moved to Lisbon last week with my partner"),
    (BO, SERVER, "lol ok"),
    (CASS, None, "ok"),
    (MIA, SERVER, "nice"),
    (BO, SERVER, "cool cool"),
    (MIA, SERVER, "yes"),
    (CASS, SERVER, "Actually I moved to Madrid this spring instead"),
    (BO, SERVER, "ha"),
    (MIA, SERVER, "ok"),
]


def test_supersession_never_crosses_scopes(tmp_path, instance, fake_llm):
    """The server's move retires the server's earlier home, never the home Cass told the DM."""
    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML)
    say(paths, MOVES)
    run_assets(tmp_path, instance, ["facts", "fact_supersessions"])
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        everything = {f.text: f for f in facts_db.facts_by_ids(store, facts_db.all_fact_ids(store))}
        decisions = store.conn.execute("SELECT scope, shown_prior_ids FROM supersede_decisions").fetchall()
    berlin = next(f for t, f in everything.items() if "Berlin" in t)
    lisbon = next(f for t, f in everything.items() if "Lisbon" in t)
    madrid = next(f for t, f in everything.items() if "Madrid" in t)
    assert berlin.scope == f"channel:{DM_CHANNEL}" and lisbon.scope == madrid.scope == f"guild:{SERVER}"
    assert berlin.superseded_at is None, "a fact said in the server never retires one said in the DM"
    assert lisbon.superseded_by == madrid.id, "within one scope supersession works as before"
    assert madrid.superseded_at is None
    assert decisions and all(berlin.id not in shown for _, shown in decisions), "the DM fact is never shown"


def test_summaries_are_per_scope_and_fold_only_their_scope(tmp_path, instance, fake_llm):
    """Windows cut as before; each scope's turns fold into that scope's summary only (one call per scope)."""
    from familiar_pipeline.projectors.summary import tables as summary_db
    from familiar_pipeline.projectors.summary.prompt import SYSTEM_MARK as SUMMARY_MARK
    from familiar_pipeline.storage.snapshots import SnapshotReader

    paths = make_familiar(tmp_path)
    say(paths, MIXED)
    say(paths, [(row[0], row[1], row[2].replace("zephyrine", "zephyrine again").replace("quokkaland", "quokkaland again"))
                for row in MIXED], start_minute=10)
    run_assets(tmp_path, instance, ["rolling_summary"])
    calls = [c for c in fake_llm.calls if SUMMARY_MARK in c.system]
    assert len(calls) == 4, "two windows of ten turns, two scopes in each"
    assert not any("zephyrine" in c.user and "quokkaland" in c.user for c in calls)
    reader = SnapshotReader(paths.serving_dir)
    reader.refresh()
    rows = {row.scope: row for row in summary_db.summaries(reader)}
    dm, server = f"channel:{DM_CHANNEL}", f"guild:{SERVER}"
    assert set(rows) == {dm, server}
    assert "zephyrine" in rows[dm].summary_text and "quokkaland" not in rows[dm].summary_text
    assert "quokkaland" in rows[server].summary_text and "zephyrine" not in rows[server].summary_text
    assert rows[dm].last_turn_id == rows[server].last_turn_id == 20  # every turn of each scope up to 20
    assert [r.scope for r in summary_db.summaries(reader, scopes=[dm])] == [dm]
    assert summary_db.summaries(reader, scopes=[]) == []
    # the second window folds into its own scope's prior
    second_dm = [c for c in calls if "zephyrine again" in c.user]
    assert second_dm and all(c.user.startswith("Previous summary:") for c in second_dm)


def test_two_scopes_incremental_build_equals_rebuild(tmp_path, instance, fake_llm):
    """Same rows whether the two scopes' turns arrived in pieces or are rebuilt at once, with no provider call."""
    from .test_pipeline import all_tables

    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML)
    everything = ["turns_fts", "rolling_summary", "facts", "fact_embeddings", "fact_supersessions",
                  "people_dossiers", "reflections"]
    rows = MIXED + MOVES + [(r[0], r[1], r[2] + " later") for r in MIXED]
    start = 0
    for size in (7, 12, 11):
        say(paths, rows[start:start + size], start_minute=start)
        start += size
        run_assets(tmp_path, instance, everything)
    incremental = all_tables(paths.memory_db)
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        scopes = {r[0] for r in store.conn.execute("SELECT scope FROM facts UNION SELECT scope FROM summaries").fetchall()}
    assert scopes == {f"channel:{DM_CHANNEL}", f"guild:{SERVER}"}
    calls = len(fake_llm.calls)
    run_assets(tmp_path, instance, everything, rebuild=True)
    assert len(fake_llm.calls) == calls, "a rebuild of unchanged prompts makes no provider calls"
    assert all_tables(paths.memory_db) == incremental


def test_a_reflection_window_never_spans_scopes(tmp_path, instance, fake_llm):
    """One call per scope of a window, each showing that scope's turns and facts; every row carries its scope."""
    from familiar_pipeline.projectors.reflections.prompt import SYSTEM_MARK as REFLECT_MARK

    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML + "\n[providers.memory.reflection]\nturns_threshold = 10\n")
    say(paths, MIXED)
    run_assets(tmp_path, instance, ["facts", "fact_supersessions", "reflections"])
    calls = [c for c in fake_llm.calls if REFLECT_MARK in c.system]
    assert len(calls) == 2, "one reflection call per scope of the window"
    assert not any("zephyrine" in c.user and "quokkaland" in c.user for c in calls), "turns or facts of two scopes"
    with TurnLog(paths.turns_db) as log:
        scope_of = {t.id: (f"channel:{DM_CHANNEL}" if t.guild_id is None else f"guild:{SERVER}") for t in log.turns_after(0)}
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        rows = store.conn.execute("SELECT scope, cited_turn_ids, cited_fact_ids FROM reflections").fetchall()
        fact_scope = dict(store.conn.execute("SELECT id, scope FROM facts").fetchall())
    assert {r[0] for r in rows} == {f"channel:{DM_CHANNEL}", f"guild:{SERVER}"}
    for scope, turns, facts in rows:
        assert all(scope_of[t] == scope for t in turns) and all(fact_scope[f] == scope for f in facts)


def test_fact_reads_filter_by_scopes(tmp_path, instance, fake_llm):
    """The bot's snapshot reads take the reply's visible scopes; None reads every scope, as before."""
    from familiar_pipeline.projectors.facts import reads as fact_reads
    from familiar_pipeline.storage.snapshots import SnapshotReader

    paths = make_familiar(tmp_path)
    say(paths, MIXED)
    run_assets(tmp_path, instance, ["facts"])
    reader = SnapshotReader(paths.serving_dir)
    reader.refresh()
    dm, server = f"channel:{DM_CHANNEL}", f"guild:{SERVER}"
    everything = fact_reads.current_facts(reader)
    assert {f.scope for f in everything} == {dm, server}
    assert fact_reads.current_facts(reader, scopes=None) == everything
    for scope, marker, other in ((dm, "zephyrine", "quokkaland"), (server, "quokkaland", "zephyrine")):
        for found in (fact_reads.current_facts(reader, scopes=[scope]),
                      fact_reads.recent_facts(reader, 50, scopes={scope}),
                      fact_reads.facts_for_subject(reader, CASS[0], scopes=[scope]) if scope == dm else
                      fact_reads.facts_for_subject(reader, BO[0], scopes=[scope])):
            assert found and all(f.scope == scope and marker in f.text and other not in f.text for f in found)
    assert fact_reads.facts_for_subject(reader, CASS[0], scopes=[server]) == []
    assert fact_reads.recent_facts(reader, 50, scopes=[]) == []
    assert len(fact_reads.recent_facts(reader, 2, scopes=[dm])) == 2  # the limit counts the scope's rows only
