"""Reads by scope (issue 26 item 2): a reply reads the memory of its own scope only.

Two servers, a DM and the console each hear a unique marker word; each scope has its
own fact, summary, reflection and turn vectors, and a person's dossier; a row of each
kind scoped ``familiar`` (built across scopes or before them) has a marker of its own.
A prompt assembled in each place, with a cue naming every marker, shows its own
scope's markers only (the ``familiar`` one never under the strict default), a
``[memory.scopes]`` group shows its members', and the excluded counts are right.
The rows are written through the store API with the scope each place gives them
(``turn_scope``), as the per-scope pipeline writes them.
"""

from __future__ import annotations

import pytest

from familiar_bot.prompt.assembly import render_sections
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.facts import store as facts_db
from familiar_pipeline.projectors.facts.store import FactDraft
from familiar_pipeline.projectors.facts.tables import Subject
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.summary import tables as summary_db
from familiar_pipeline.projectors.turn_embeddings.tables import TURN_EMBEDDINGS
from familiar_pipeline.projectors.vectors import set_vectors
from familiar_pipeline.storage.scopes import FAMILIAR_WIDE, turn_scope
from tests.test_assembly import BO, CASS, MIA, World, ctx
from tests.test_retrieval import CountingEmbedder

# (channel, guild, marker): two servers, a DM, the console (a channel outside any server).
PLACES = {
    "server-a": (10, 111, "aardvark"),
    "server-b": (20, 222, "bassoon"),
    "dm": (30, None, "cormorant"),
    "console": (40, None, "dulcimer"),
}
LEGACY = "eglantine"  # the marker of every row scoped "familiar"
MARKERS = [m for _, _, m in PLACES.values()] + [LEGACY]
CUE = "tell me about the " + ", the ".join(MARKERS)
ENV = {"FAMILIAR__PROVIDERS__EMBEDDING__BACKEND": '"hash"',
       "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS": '["rich_note", "fact_embedding", "turn_embedding"]',
       "FAMILIAR__PROVIDERS__HISTORY__TEXT_WINDOW_SIZE": "3"}
# Whose dossier lives in which scope (the dossier table holds one per person on this branch).
DOSSIER_OF = {"server-a": CASS, "server-b": BO, None: MIA}


def scope_of(place: str) -> str:
    channel, guild, _ = PLACES[place]
    return f"guild:{guild}" if guild is not None else f"channel:{channel}"


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    vectors = []
    for place, (channel, guild, marker) in PLACES.items():
        said = w.say(f"I finally got my {marker} yesterday", CASS, channel=channel, guild=guild)
        assert turn_scope(said) == scope_of(place)
        vectors.append(said)
        for i in range(4):  # push the marker turn out of the 3-turn history window
            who = (BO, MIA, CASS, BO)[i]
            vectors.append(w.say(f"small talk number {i} here", who, channel=channel, guild=guild))
        scope = scope_of(place)
        facts_db.append_fact(w.store, FactDraft(f"Cass owns a {marker}.", source_turn_ids=(said.id,),
                                                channel_id=channel, subjects=(Subject(*CASS),), scope=scope))
        summary_db.put_summary(w.store, f"They talked about the {marker}.", said.id, scope=scope)
        reflection_db.append_reflection(w.store, channel_id=None, text=f"Cass cares about the {marker}.",
                                        cited_turn_ids=[said.id], cited_fact_ids=[], last_turn_id=said.id,
                                        last_fact_id=0, scope=scope)
        if place in DOSSIER_OF:
            dossier_db.put_dossier(w.store, DOSSIER_OF[place][0], f"Has a {marker} at home.", 1, scope=scope)
    # Rows built across scopes (or before scopes existed): read by no reply under the strict default.
    facts_db.append_fact(w.store, FactDraft(f"Cass owns an {LEGACY}.", source_turn_ids=(1,), channel_id=10,
                                            subjects=(Subject(*CASS),)))
    summary_db.put_summary(w.store, f"They talked about the {LEGACY}.", 1, scope=FAMILIAR_WIDE)
    reflection_db.append_reflection(w.store, channel_id=None, text=f"Cass cares about the {LEGACY}.",
                                    cited_turn_ids=[1], cited_fact_ids=[], last_turn_id=1, last_fact_id=0)
    dossier_db.put_dossier(w.store, DOSSIER_OF[None][0], f"Has an {LEGACY} at home.", 1)
    # Every turn equally near the cue: without the scope mask the nearest turns would be any scope's.
    set_vectors(w.store, TURN_EMBEDDINGS, "test-emb", [(t.id, [1.0, 0.0, 0.0], turn_scope(t)) for t in vectors])
    w.sync()
    yield w
    w.close()


def assemble(world, place: str):
    channel, guild, _ = PLACES[place]
    assembler = world.assembler(ENV, embedder=CountingEmbedder())
    try:
        return assembler.assemble(ctx(CUE, channel=channel, guild=guild))
    finally:
        assembler.memory.close()


def shown(prompt) -> str:
    return prompt.system_prompt + "\n" + "\n".join(m.content for m in prompt.history)


def markers_in(prompt) -> set[str]:
    text = shown(prompt)
    return {m for m in MARKERS if m in text}


@pytest.mark.parametrize("place", list(PLACES))
def test_each_place_reads_its_own_scope_only(world, place):
    prompt = assemble(world, place)
    marker = PLACES[place][2]
    assert not prompt.debug["errors"]
    assert markers_in(prompt) == {marker}
    sections = {s.name: s.text for s in prompt.sections}
    assert marker in sections["conversation_summary"]
    assert marker in sections["reflection"]
    assert f"Cass owns a {marker}." in sections["rag_context"]
    assert f"I finally got my {marker} yesterday" in sections["rag_context"]  # a quoted earlier turn
    if place in DOSSIER_OF:
        assert f"Has a {marker} at home." in sections["people_dossier"]
    scopes = prompt.debug["scopes"]
    assert scopes["reply"] == scope_of(place) and scopes["visible"] == [scope_of(place)]
    # Other scopes' rows, counted: 3 other places' + the familiar-wide one of each kind,
    # and the 3 other places' marker turns (the turn vectors of other scopes are never candidates).
    expected = {"conversation_summary": 4, "reflection": 4, "rag_context facts": 4, "rag_context turns": 3,
                "people_dossier": 3 - (place in DOSSIER_OF)}
    assert scopes["excluded"] == expected
    assert scopes["excluded_total"] == sum(expected.values())


def test_a_scope_with_few_rows_fills_its_budget_from_its_own(world):
    """Other scopes' hits ranked above the DM's own, more than the usual refetch depth reaches
    (1 x 4^3 turns and 1 x 4^2 facts with these settings), do not starve the DM's section."""
    # Each says it more often than the last: distinct scores (a run of tied ones is fetched whole),
    # all above the DM's own.
    for i in range(150):
        world.say(f"in the server {'cormorant ' * (i + 2)}", BO, channel=10, guild=111)
    facts_db.append_facts(world.store, [
        FactDraft(f"Bo saw {'cormorant ' * (i + 2)}", source_turn_ids=(1,), channel_id=10,
                  scope="guild:111") for i in range(150)])
    for _ in range(4):
        world.say("filler in the dm", CASS, channel=30, guild=None)
    world.sync()
    # Full-text ranking alone: the turn vectors' scope mask would find the DM's turn by itself.
    env = {**ENV, "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS": '["rich_note"]',
           "FAMILIAR__BUDGET__TEXT__MAX_RAG_TURNS": "1", "FAMILIAR__MEMORY__RETRIEVAL__TURN_CANDIDATES": "1",
           "FAMILIAR__BUDGET__TEXT__MAX_RAG_FACTS": "1", "FAMILIAR__MEMORY__RETRIEVAL__FACT_OVERFETCH": "1",
           "FAMILIAR__MEMORY__RETRIEVAL__TURN_NEIGHBOURS": "0"}
    assembler = world.assembler(env)
    prompt = assembler.assemble(ctx("cormorant", channel=30, guild=None))
    assembler.memory.close()
    rag = next(s.text for s in prompt.sections if s.name == "rag_context")
    assert "I finally got my cormorant yesterday" in rag and "Cass owns a cormorant." in rag
    assert "in the server" not in rag and "Bo saw" not in rag
    assert prompt.debug["scopes"]["excluded"]["rag_context turns"] > 64
    assert prompt.debug["scopes"]["excluded"]["rag_context facts"] > 16


def test_a_group_joins_its_members_and_only_them(world):
    with world.paths.character_toml.open("a") as f:
        f.write('\n[memory.scopes]\ngroups = { team = ["guild:111", "guild:222"] }\n')
    for place in ("server-a", "server-b"):
        prompt = assemble(world, place)
        assert markers_in(prompt) == {"aardvark", "bassoon"}
        scopes = prompt.debug["scopes"]
        assert scopes["visible"] == [scope_of(place), *({"guild:111", "guild:222"} - {scope_of(place)})]
        assert scopes["excluded"]["conversation_summary"] == 3
        assert scopes["excluded"]["rag_context facts"] == 3
    for place in ("dm", "console"):
        assert markers_in(assemble(world, place)) == {PLACES[place][2]}


def test_familiar_wide_rows_only_when_a_group_lists_familiar(world):
    with world.paths.character_toml.open("a") as f:
        f.write('\n[memory.scopes]\ngroups = { legacy = ["channel:30", "familiar"] }\n')
    assert markers_in(assemble(world, "dm")) == {"cormorant", LEGACY}
    assert markers_in(assemble(world, "server-a")) == {"aardvark"}


def test_context_report_says_what_was_read_and_how_much_was_left_out(world):
    report = render_sections(assemble(world, "server-a"))
    assert "=== scopes: this reply reads guild:111 only ===" in report
    assert ("rows of other scopes left out: 17 (conversation_summary 4, reflection 4, people_dossier 2, "
            "rag_context facts 4, rag_context turns 3)") in report
    for marker in MARKERS[1:]:
        assert marker not in report  # counts only, never the excluded text
