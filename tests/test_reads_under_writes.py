"""Reads never fail while the pipeline writes.

A writer thread plays a busy pipeline run plus the responder: it appends turns,
writes facts, retires some, rewrites the summary, dossiers and reflections,
publishes a snapshot after each write (which also garbage-collects old
snapshot files) and commits both full-text indexes, in a tight loop. Meanwhile
the assembler runs 500 assemblies. Not one may raise or report a failed layer.
"""

from __future__ import annotations

import threading
import traceback
from datetime import timedelta

from familiar_pipeline.storage.fts import FtsIndex
from familiar_pipeline.storage.snapshots import publish_snapshot
from familiar_pipeline.projectors.facts.store import FactDraft
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.storage.turns import TurnLog
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.summary import tables as summary_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

from tests.test_assembly import BO, CASS, T0, World, ctx

CUES = ["strawberry cake", "what about Berlin?", "Pixel the cat", "hiking in June", "peanut allergy",
        "cello lessons", "", "who's visiting from Lisbon", "bakery at six", "new album"]
WORDS = ["strawberry", "Berlin", "Pixel", "hiking", "peanut", "cello", "Lisbon", "bakery", "album"]


def store_writer(paths, stop: threading.Event, stats: dict) -> None:
    """A pipeline run's store side: facts, retirements, summary, dossiers, reflections, publish."""
    try:
        with ProjectionStore(paths.memory_db) as store:
            i = 0
            while not stop.is_set():
                word, who = WORDS[i % len(WORDS)], (CASS, BO)[i % 2]
                fact, _ = facts_db.append_fact(store, FactDraft(f"{who[1]} said something about {word} ({i})",
                                                      source_turn_ids=(1 + i % 40,), importance=1 + i % 10,
                                                      subjects=(Subject(*who),)))
                if i % 3 == 0 and fact.id > 2:
                    supersede_db.supersede(store, [fact.id - 2], None)
                summary_db.put_summary(store, f"Summary revision {i}: lots about {word}.", 40)
                dossier_db.put_dossier(store, who[0], f"{who[1]} talks about {word} (rev {i}).", fact.id)
                reflection_db.append_reflection(store, channel_id=10, text=f"Reflection {i} on {word}",
                                        cited_turn_ids=[1 + i % 40], cited_fact_ids=[fact.id],
                                        last_turn_id=40, last_fact_id=fact.id)
                publish_snapshot(store.conn, paths.serving_dir, store_watermark={"i": i}, durable=False)
                i += 1
            stats["publishes"] = i
    except Exception:
        stats["error"] = traceback.format_exc()


def index_writer(paths, stop: threading.Event, stats: dict) -> None:
    """The responder appending turns, and index runs committing both full-text indexes."""
    try:
        log = TurnLog(paths.turns_db)  # a second connection, as the responder would have
        turns_ix = FtsIndex(paths.fts_turns, writable=True)
        facts_ix = FtsIndex(paths.fts_facts, writable=True)
        try:
            i = 0
            while not stop.is_set():
                word, who = WORDS[i % len(WORDS)], (CASS, BO)[i % 2]
                turn = log.append_turn(channel_id=10 + i % 2, guild_id=1, role="user", author_key=who[0],
                                       author_display=who[1], content=f"more about {word} #{i}",
                                       created_at=T0 + timedelta(hours=1, seconds=i))
                turns_ix.upsert(turn.id, turn.content)
                turns_ix.commit()
                facts_ix.upsert(10_000 + i, f"{who[1]} mentioned {word} again")  # not yet in the snapshot
                facts_ix.commit()
                i += 1
            stats["commits"] = i
        finally:
            facts_ix.close()
            turns_ix.close()
            log.close()
    except Exception:
        stats["error"] = traceback.format_exc()


def test_500_assemblies_while_the_pipeline_writes(tmp_path):
    world = World(tmp_path)
    for i in range(40):
        world.say(f"{WORDS[i % len(WORDS)]} talk number {i}", (CASS, BO)[i % 2])
    world.fact("Cass likes strawberry cake", subjects=[CASS], importance=6)
    world.sync()
    world.store.close()  # the writer thread owns the store from here on
    assembler = world.assembler()
    stop, stats = threading.Event(), {}
    writers = [threading.Thread(target=target, args=(world.paths, stop, stats), daemon=True)
               for target in (store_writer, index_writer)]
    errors: list[str] = []
    versions: set[int] = set()
    for writer in writers:
        writer.start()
    try:
        for n in range(500):
            try:
                prompt = assembler.assemble(ctx(CUES[n % len(CUES)], channel=10 + n % 2))
            except Exception:
                errors.append(traceback.format_exc())
                continue
            if prompt.debug["errors"]:
                errors.append(str(prompt.debug["errors"]))
            versions.add(prompt.debug["snapshot_version"])
            if n % 2 == 0:  # channel 10 had history from the start
                assert prompt.history, "the channel history vanished"
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=60)
    world.log.close()
    assert "error" not in stats, stats.get("error")
    assert errors == []
    # The test means something only if the writer really raced the reader.
    assert stats["publishes"] >= 3 and stats["commits"] >= 3 and len(versions) >= 3
    assert assembler.memory.snapshot.last_error is None
