"""Each layer's rendering, budget and invalidation key."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from familiar_pipeline.storage.paths import SHIPPED_DEFAULT_DIR
from familiar_pipeline.projectors.dossiers import tables as dossier_db
from familiar_pipeline.projectors.reflections import tables as reflection_db
from familiar_pipeline.projectors.summary import tables as summary_db
from familiar_pipeline.projectors.supersede import tables as supersede_db

from familiar_bot.prompt.assembly import Message
from familiar_bot.prompt.layers.character_card import CharacterCardLayer
from familiar_bot.prompt.layers.conversation_summary import ConversationSummaryLayer
from familiar_bot.prompt.layers.operating_mode import OperatingModeLayer
from familiar_bot.prompt.layers.people_dossier import PeopleDossierLayer
from familiar_bot.prompt.layers.recent_history import RecentHistoryLayer, history_view
from familiar_bot.prompt.layers.reflection import ReflectionLayer
from familiar_bot.prompt.tokens import cap_blocks, estimate_tokens, message_tokens, truncate_to_tokens
from tests.test_assembly import BO, CASS, MIA, SCOPE, World, ctx


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()


def view(world, env=None):
    """A fresh, refreshed, pinned memory view (what a layer sees inside one assembly)."""
    memory = world.assembler(env).memory
    memory.refresh()
    return memory.pinned()


# ----------------------------------------------------------------------------- tokens


def test_token_helpers():
    assert estimate_tokens("") == 0 and estimate_tokens("abcde") == 2
    assert message_tokens("abcd", "bob") == 1 + 4 + 1
    assert truncate_to_tokens("x" * 100, 5) == "x" * 19 + "…"
    assert truncate_to_tokens("short", 5) == "short" and truncate_to_tokens("a", 0) == ""
    # The first block is always kept (truncated); a later block that does not fit ends the walk.
    assert cap_blocks(["x" * 400], 10) == ["x" * 39 + "…"]
    assert cap_blocks(["aaaa", "b" * 40, "cc"], 5) == ["aaaa"]


# ----------------------------------------------------------------------------- stable layers


def test_character_card_reads_file_and_key_follows_content(world):
    layer = CharacterCardLayer()
    memory = view(world)
    shipped = (SHIPPED_DEFAULT_DIR / "character.md").read_text().strip()
    assert layer.build(ctx(), memory) == shipped  # no card of its own: the shipped default
    default_key = layer.invalidation_key(ctx(), memory)
    world.paths.character_md.write_text("  You are Fam, a moth.  \n")
    assert layer.build(ctx(), memory) == "You are Fam, a moth."
    key = layer.invalidation_key(ctx(), memory)
    assert key != default_key
    world.paths.character_md.write_text("You are Fam, a crow.")
    assert layer.invalidation_key(ctx(), memory) != key


def test_operating_mode_per_tier(world):
    layer, memory = OperatingModeLayer(), view(world)
    assert "speaking aloud" in layer.build(ctx(tier="voice"), memory)
    assert "text channel" in layer.build(ctx(tier="text"), memory)
    assert layer.invalidation_key(ctx(tier="voice"), memory) != layer.invalidation_key(ctx(), memory)


def test_summary_renders_truncates_and_keys_on_its_watermark(world):
    layer = ConversationSummaryLayer()
    assert layer.build(ctx(), view(world)) == "" and layer.invalidation_key(ctx(), view(world)).startswith("none|")
    summary_db.put_summary(world.store, "They planned a hike.", 5, scope=SCOPE)
    world.publish()
    memory = view(world)
    assert layer.build(ctx(), memory) == "## Conversation so far\n\nThey planned a hike."
    assert layer.build(ctx(channel=999), memory) == layer.build(ctx(), memory)  # familiar-wide
    key = layer.invalidation_key(ctx(), memory)
    summary_db.put_summary(world.store, "word " * 5000, 9, scope=SCOPE)
    world.publish()
    memory = view(world)
    assert layer.invalidation_key(ctx(), memory) != key
    text = layer.build(ctx(tier="voice"), memory)  # voice summary_tokens = 600
    assert text.endswith("…") and estimate_tokens(text) <= 600 + 10


# ----------------------------------------------------------------------------- reflections


def test_reflection_breadcrumbs_and_stale_flag_with_key_change(world):
    t = world.say("we lost the match")
    f1 = world.fact("The team lost on Friday", subjects=[CASS], sources=[t.id])
    f2 = world.fact("Cass is captain", subjects=[CASS], sources=[t.id])
    reflection_db.append_reflection(world.store, channel_id=10, text="Crew morale dipped after Friday.",
                                  cited_turn_ids=[t.id], cited_fact_ids=[f1.id], last_turn_id=t.id, last_fact_id=f1.id, scope=SCOPE)
    reflection_db.append_reflection(world.store, channel_id=None, text="Cass leads\nquietly.",
                                  cited_turn_ids=[], cited_fact_ids=[f2.id], last_turn_id=t.id, last_fact_id=f2.id, scope=SCOPE)
    reflection_db.append_reflection(world.store, channel_id=77, text="Elsewhere.", cited_turn_ids=[t.id],
                                  cited_fact_ids=[], last_turn_id=t.id, last_fact_id=0, scope=SCOPE)
    world.publish()
    layer, memory = ReflectionLayer(), view(world)
    assert layer.build(ctx(), memory) == (
        "## Recent reflections\n\n- Cass leads quietly. [F#2]\n- Crew morale dipped after Friday. [T#1, F#1]")
    key = layer.invalidation_key(ctx(), memory)
    supersede_db.supersede(world.store, [f1.id], None)  # retire the cited fact; no new reflection is written
    world.publish()
    memory = view(world)
    assert layer.invalidation_key(ctx(), memory) != key  # a retired citation changes the key by itself
    assert "- Crew morale dipped after Friday. [T#1, F#1] (stale)" in layer.build(ctx(), memory)
    assert "(stale)" not in layer.build(ctx(), memory).split("\n")[2]


def test_reflection_caps(world):
    t = world.say("x")
    for i in range(15):
        reflection_db.append_reflection(world.store, channel_id=10, text=f"Thought {i} " + "blah " * 60,
                                      cited_turn_ids=[t.id], cited_fact_ids=[], last_turn_id=1, last_fact_id=0, scope=SCOPE)
    world.publish()
    text = ReflectionLayer().build(ctx(tier="voice"), view(world))  # max 6, 600 tokens
    assert text.count("\n- ") <= 6 and "Thought 14" in text and "Thought 8" not in text
    small = ReflectionLayer().build(ctx(), view(world, {"FAMILIAR__BUDGET__TEXT__REFLECTION_TOKENS": "100"}))
    assert estimate_tokens(small) <= 100 + 10 and "Thought 14" in small


# ----------------------------------------------------------------------------- people


def test_people_dossier_order_ego_authors_mentions(world):
    world.say("hello", MIA)
    world.say("hi all", BO)
    world.say("what do you think of @Mia", CASS, mentions=["discord:333"])
    t = world.say("my friend Dee loves jazz", BO)
    world.fact("Dee loves jazz", subjects=[("discord:555", "Dee")], sources=[t.id])  # derived mention
    world.log.upsert_participant("discord:555", username="dee", global_name="Dee", pronouns="she/her", bio="Jazz " * 100)
    for key, text in [("ego:fam", "I am Fam."), (CASS[0], "Cass captains."), (BO[0], "Bo bakes."),
                      (MIA[0], "Mia paints."), ("discord:555", "Dee sings\n# not a header")]:
        dossier_db.put_dossier(world.store, key, text, 1, scope=SCOPE)
    world.publish()
    text = PeopleDossierLayer().build(ctx(), view(world))
    heads = [line for line in text.splitlines() if line.startswith("### ")]
    # Newest turn first: Bo, then Dee (mentioned by Bo's turn via a fact), then Cass, then Mia.
    assert heads == ["### Fam", "### Bo", "### Dee", "### Cass", "### Mia"]
    assert "### Dee\n@dee · she/her\nBio: Jazz" in text and "…" in text
    assert "\\# not a header" in text
    assert PeopleDossierLayer().build(ctx(channel=None), view(world)) == (
        "## People in this conversation\n\n### Fam\n\nI am Fam.")


def test_people_dossier_caps_and_key(world):
    for key, name in [CASS, BO, MIA]:
        world.say(f"hi from {name}", (key, name))
        dossier_db.put_dossier(world.store, key, f"{name} " + "detail " * 150, 1, scope=SCOPE)
    world.publish()
    capped = PeopleDossierLayer().build(ctx(), view(world, {"FAMILIAR__BUDGET__TEXT__MAX_DOSSIER_PEOPLE": "2"}))
    assert "### Mia" in capped and "### Bo" in capped and "### Cass" not in capped
    tight = PeopleDossierLayer().build(ctx(), view(world, {"FAMILIAR__BUDGET__TEXT__DOSSIER_TOKENS": "200"}))
    assert estimate_tokens(tight) <= 200 + 20 and "### Mia" in tight
    memory = view(world)
    key = PeopleDossierLayer().invalidation_key(ctx(), memory)
    world.say("another turn", BO)
    assert PeopleDossierLayer().invalidation_key(ctx(), view(world)) != key


# ----------------------------------------------------------------------------- history


def test_history_format_timezone_and_roles(world):
    at = datetime(2026, 5, 1, 21, 30, tzinfo=timezone.utc)
    world.say("hey <@222>!", at=at)
    world.say("hello Cass", None, role="assistant", at=at + timedelta(minutes=1))
    world.say("search results", None, role="tool", at=at + timedelta(minutes=2))
    gone = world.say("oops wrong channel", BO, at=at + timedelta(minutes=3))
    world.log.record_deletion(turn_id=gone.id)
    edited = world.say("typo", MIA, at=at + timedelta(minutes=4), platform_message_id=99)
    world.log.record_edit(turn_id=edited.id, new_content="fixed")
    world.say("elsewhere", channel=11, at=at + timedelta(minutes=5))
    la = {"FAMILIAR__DISPLAY_TZ": '"America/Los_Angeles"'}
    messages = RecentHistoryLayer().messages(ctx(), view(world, la))
    assert messages == [
        Message("user", "[14:30 Cass] hey [@Bo]!", "discord_111"),
        Message("assistant", "hello Cass"),
        Message("user", "[tool result] search results"),
        Message("user", "[14:34 Mia] fixed (edited)", "discord_333"),
    ]
    assert RecentHistoryLayer().build(ctx(), view(world)) == ""
    assert RecentHistoryLayer().messages(ctx(channel=None), view(world)) == []


def test_history_window_trim_keeps_newest(world):
    for i in range(30):
        world.say(f"message {i:02d} " + "blah " * 20, BO, platform_message_id=1000 + i)
    memory = view(world, {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "5"})
    assert [m.content[-30:].split()[0] for m in RecentHistoryLayer().messages(ctx(), memory)][0] != ""
    assert len(RecentHistoryLayer().messages(ctx(), memory)) == 5
    tight = view(world, {"FAMILIAR__BUDGET__TEXT__RECENT_HISTORY_TOKENS": "100"})
    messages = RecentHistoryLayer().messages(ctx(), tight)
    assert "message 29" in messages[-1].content
    assert sum(message_tokens(m.content, m.name) for m in messages) <= 100
    shown = history_view(ctx(), tight).shown_ids
    assert len(shown) == len(messages) and max(shown) == world.log.latest_id(10)
    one = view(world, {"FAMILIAR__BUDGET__TEXT__RECENT_HISTORY_TOKENS": "1"})
    assert len(RecentHistoryLayer().messages(ctx(), one)) == 1  # the newest always stays


def test_history_coalesces_voice_fragments_and_name_only(world):
    start = datetime(2026, 5, 1, 1, 35, tzinfo=timezone.utc)
    for i, part in enumerate(["I okay.", "So, Tam,", "you can jump in"]):
        world.say(part, CASS, at=start + timedelta(seconds=2 * i), mode="voice")
    world.say("later", CASS, at=start + timedelta(seconds=120))
    messages = RecentHistoryLayer().messages(ctx(tier="voice"), view(world))
    # "I okay." ends a sentence: the next fragment starts a message of its own.
    assert [m.content for m in messages] == ["[01:35 Cass] I okay.", "[01:35 Cass] So, Tam, you can jump in",
                                             "[01:37 Cass] later"]
    env = {"FAMILIAR__CHANNELS__10__MESSAGE_RENDERING": '"name_only"',
           "FAMILIAR__PROVIDERS__HISTORY__COALESCE_MAX_GAP_SECONDS": "0"}
    plain = RecentHistoryLayer().messages(ctx(), view(world, env))
    assert [m.content for m in plain] == ["I okay.", "So, Tam,", "you can jump in", "later"]
    assert {m.name for m in plain} == {"discord_111"}


def test_history_reply_prefix(world):
    world.say("who wants pizza", BO, platform_message_id=1)
    world.say("me!", CASS, platform_message_id=2, reply_to_message_id=1)
    messages = RecentHistoryLayer().messages(ctx(), view(world))
    assert messages[1].content.endswith("] ↩ Bo: who wants pizza me!")


def test_console_lines_stay_their_own_messages(world):
    # Console lines carry no platform message id, so only the gap and sentence rules keep them apart.
    start = datetime(2026, 5, 1, 9, 0, tzinfo=timezone.utc)
    for seconds, line in [(0, "hi, I'm Sam."), (3, "my sister Ana lives in Porto"),
                          (20, "she visits in May"), (40, "so I was thinking"), (43, "we could go to Porto")]:
        world.say(line, CASS, at=start + timedelta(seconds=seconds))
    messages = RecentHistoryLayer().messages(ctx(), view(world))
    assert [m.content for m in messages] == [
        "[09:00 Cass] hi, I'm Sam.",  # a sentence end: never merged with what follows
        "[09:00 Cass] my sister Ana lives in Porto",
        "[09:00 Cass] she visits in May",  # 17 s later: beyond the 8 s default gap
        "[09:00 Cass] so I was thinking we could go to Porto",  # fragments seconds apart, mid-sentence
    ]


def test_imported_turns_keep_their_dates_and_sort_by_timestamp(world):
    live = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    world.say("live line", CASS, at=live)
    world.say("an old line, imported later", BO, at=datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc))
    world.say("the day before", MIA, at=live - timedelta(days=1))
    messages = RecentHistoryLayer().messages(ctx(), view(world))
    assert [m.content for m in messages] == [
        "[2024-05-01 10:00 Bo] an old line, imported later",
        "[2026-04-30 12:00 Mia] the day before",
        "[12:00 Cass] live line",  # the newest turn's day ("today") shows the time alone
    ]
