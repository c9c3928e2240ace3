"""The scope matrix, end to end (issue 26): two servers, a DM and the console each hear
a unique marker word, interleaved so that every batch of the turn log mixes scopes;
the whole graph runs through Dagster with the scripted model; then a prompt is
assembled in every place with a cue naming every marker, and `familiar facts --scope`
lists each scope. Each marker shows only in its own place (and in a joined one when
`[memory.scopes]` groups them).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest

from familiar_bot.app.cli.main import main
from familiar_bot.prompt.assembly import Assembler
from familiar_bot.prompt.layers.stack import default_layers
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.prompt.types import AssemblyContext
from familiar_pipeline.config.loading import load_config
from familiar_pipeline.defs.jobs import materialize_in_process
from familiar_pipeline.storage.turns import TurnLog

from .fact_helpers import GRAPH_TOML
from .helpers import make_familiar

BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
# place: (channel, guild or None, marker, the two people who talk there)
PLACES = {
    "server-a": (10, 111, "aardvark", (("discord:111", "Cass"), ("discord:222", "Bo"))),
    "server-b": (20, 222, "bassoon", (("discord:222", "Bo"), ("discord:333", "Mia"))),
    "dm": (50, None, "cormorant", (("discord:111", "Cass"),)),
    "console": (60, None, "dulcimer", (("console:ana", "Ana"),)),
}
MARKERS = {place: marker for place, (_, _, marker, _) in PLACES.items()}
CUE = "what about the " + ", the ".join(MARKERS.values())
EVERYTHING = ["turns_fts", "rolling_summary", "facts", "fact_embeddings", "fact_supersessions",
              "people_dossiers", "reflections"]


def scope_of(place: str) -> str:
    channel, guild, _, _ = PLACES[place]
    return f"guild:{guild}" if guild is not None else f"channel:{channel}"


@pytest.fixture
def familiar(tmp_path, fake_llm):
    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML + "\n[providers.memory.reflection]\nturns_threshold = 10\n")
    minute = 0
    with TurnLog(paths.turns_db) as log:
        for round_ in range(8):  # round-robin over the places: every batch holds several scopes (3 batches: a dossier fold)
            for channel, guild, marker, people in PLACES.values():
                key, name = people[round_ % len(people)]
                log.upsert_participant(key, username=name.lower(), global_name=name)
                log.append_turn(channel_id=channel, guild_id=guild, role="user", author_key=key,
                                author_display=name, content=f"I keep thinking about my {marker} number {round_} today",
                                created_at=BASE + timedelta(minutes=minute))
                minute += 1
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["fam"])
        result = materialize_in_process(EVERYTHING, instance=instance, data_root=tmp_path, partition_key="fam")
        assert result.success
    return tmp_path, paths


def assemble(root, paths, place: str, env: dict | None = None):
    channel, guild, _, _ = PLACES[place]
    memory = MemoryView(paths, load_config("fam", root=root, env=env or {}))
    try:
        return Assembler(memory, default_layers()).assemble(AssemblyContext("fam", channel, guild, "text", CUE))
    finally:
        memory.close()


def markers_in(prompt) -> set[str]:
    text = prompt.system_prompt + "\n" + "\n".join(m.content for m in prompt.history)
    return {m for m in MARKERS.values() if m in text}


def test_each_place_reads_only_what_was_said_there(familiar):
    root, paths = familiar
    for place in PLACES:
        prompt = assemble(root, paths, place)
        assert not prompt.debug["errors"], prompt.debug["errors"]
        assert markers_in(prompt) == {MARKERS[place]}, place
        sections = {s.name: s.text for s in prompt.sections}
        # The derived memory of its own scope is there: facts, the summary, quoted earlier turns.
        assert MARKERS[place] in sections["rag_context"] and MARKERS[place] in sections["conversation_summary"]
        assert prompt.debug["scopes"]["excluded_total"] > 0, "the other places' rows were there to exclude"


def test_a_group_joins_the_two_servers_and_nothing_else(familiar):
    root, paths = familiar
    env = {"FAMILIAR__MEMORY__SCOPES__GROUPS": '{ guilds = ["guild:111", "guild:222"] }'}
    for place in ("server-a", "server-b"):
        assert markers_in(assemble(root, paths, place, env)) == {MARKERS["server-a"], MARKERS["server-b"]}
    assert markers_in(assemble(root, paths, "dm", env)) == {MARKERS["dm"]}


def test_familiar_facts_by_scope(familiar, monkeypatch, capsys):
    root, _ = familiar
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    for place in PLACES:
        assert main(["facts", "--familiar", "fam", "--scope", scope_of(place)]) == 0
        out = capsys.readouterr().out
        assert {m for m in MARKERS.values() if m in out} == {MARKERS[place]}, place


def test_a_person_heard_in_several_places_has_a_dossier_in_each_holding_only_that_place(familiar):
    """Cass talks in server A and in a DM, Bo in both servers: one dossier per person and place,
    each folding only what was said there, and each place's prompt shows its own."""
    from familiar_pipeline.storage.store import ProjectionStore

    root, paths = familiar
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        rows = store.sql("SELECT canonical_key, scope, dossier_text FROM people_dossiers "
                         "WHERE canonical_key IN ('discord:111', 'discord:222')").fetchall()
    places = {scope_of(place): place for place in PLACES}
    seen = {(key, scope) for key, scope, _ in rows}
    assert {("discord:111", "guild:111"), ("discord:111", "channel:50"), ("discord:222", "guild:111"),
            ("discord:222", "guild:222")} <= seen
    for key, scope, text in rows:
        assert {m for m in MARKERS.values() if m in text} == {MARKERS[places[scope]]}, (key, scope)
    for place in ("server-a", "dm"):
        dossiers = {s.name: s.text for s in assemble(root, paths, place).sections}["people_dossier"]
        assert MARKERS[place] in dossiers, place


def test_a_dm_sees_what_its_person_said_in_servers_only_when_the_operator_allows_it(familiar):
    """`[memory.scopes] dm_sees_person`: the DM with Cass also reads Cass's own words from server A
    (turns, and facts resting on them alone), never Bo's words there, nor server B where Cass never
    spoke, nor server A's summary or dossiers; off by default; a server's replies are unchanged."""
    root, paths = familiar
    env = {"FAMILIAR__MEMORY__SCOPES__DM_SEES_PERSON": "true"}
    assert markers_in(assemble(root, paths, "dm")) == {MARKERS["dm"]}, "strict by default"
    prompt = assemble(root, paths, "dm", env)
    assert not prompt.debug["errors"], prompt.debug["errors"]
    assert markers_in(prompt) == {MARKERS["dm"], MARKERS["server-a"]}
    assert "person:discord:111" in prompt.debug["scopes"]["visible"]
    sections = {s.name: s.text for s in prompt.sections}
    said = sections["rag_context"]
    marker = MARKERS["server-a"]
    assert any(f"{marker} number {r}" in said for r in (0, 2, 4, 6)), "Cass's turns and facts in server A"
    assert not any(f"{marker} number {r}" in said for r in (1, 3, 5, 7)), "Bo's words in server A stay there"
    for section in ("conversation_summary", "people_dossier", "reflection"):
        assert marker not in sections.get(section, ""), section
    assert markers_in(assemble(root, paths, "server-a", env)) == {marker}
