"""The lorebook: matching rules, caps, malformed files, and the cache key."""

from __future__ import annotations

import logging
import os

import pytest

from familiar_bot.prompt.layers.lorebook import LorebookLayer
from familiar_bot.prompt.lorebook import Lorebook, LorebookError, parse_lorebook
from familiar_bot.prompt.tokens import estimate_tokens
from tests.test_assembly import World, ctx


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()


def entry(keys, content, priority=None, selective=None) -> str:
    lines = ["[[entries]]", f"keys = {keys!r}".replace("'", '"'), f'content = "{content}"']
    if priority is not None:
        lines.append(f"priority = {priority}")
    if selective is not None:
        lines.append(f"selective = {'true' if selective else 'false'}")
    return "\n".join(lines) + "\n"


def write(world, *entries: str) -> None:
    path = world.paths.lorebook_toml
    path.write_text("".join(entries))
    # Edits within one mtime tick must still be seen: bump the mtime explicitly.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def lore(world, cue="", env=None, layer=None, **kw):
    memory = world.assembler(env).memory
    memory.refresh()
    layer = layer or LorebookLayer()
    return layer.build(ctx(cue, **kw), memory.pinned())


def test_missing_file_and_no_match_are_empty(world):
    world.say("Tell me about Paris.")
    assert lore(world) == ""
    write(world, entry(["berlin"], "Berlin lore"))
    assert lore(world) == ""


def test_case_insensitive_word_boundary_match(world):
    write(world, entry(["paris"], "Paris is the capital."), entry(["cat"], "Cats rule."),
          entry(["New York"], "The big apple."))
    world.say("Tell me about PARIS. I love concatenate and new  york? no: new york!")
    text = lore(world)
    assert text == "## Lorebook\n\nParis is the capital.\n\nThe big apple."
    assert "Cats rule." in lore(world, cue="my cat's name")


def test_priority_order_file_order_ties_and_caps(world):
    write(world, entry(["x"], "alpha", 4), entry(["x"], "low", 1), entry(["x"], "beta", 3),
          entry(["x"], "gamma", 3), entry(["x"], "top", 100))
    world.say("x marks the spot")
    assert lore(world) == "## Lorebook\n\ntop\n\nalpha\n\nbeta\n\ngamma\n\nlow"
    capped = lore(world, env={"FAMILIAR__BUDGET__TEXT__MAX_LOREBOOK_ENTRIES": "2"})
    assert capped == "## Lorebook\n\ntop\n\nalpha"


def test_token_cap(world):
    write(world, entry(["dragon"], "D" * 4000), entry(["dragon"], "second"))
    world.say("a dragon!")
    text = lore(world, env={"FAMILIAR__BUDGET__TEXT__LOREBOOK_TOKENS": "20"})
    assert text.startswith("## Lorebook\n\nDDD") and len(text) < 200 and "second" not in text
    assert estimate_tokens(text.split("\n\n", 1)[1]) <= 20


def test_selective_needs_every_key(world):
    write(world, entry(["paris", "berlin"], "Both cities.", selective=True))
    world.say("paris only")
    assert lore(world) == ""
    world.say("and berlin too")
    assert lore(world) == "## Lorebook\n\nBoth cities."


def test_window_and_channel_scope(world):
    write(world, entry(["zanzibar"], "Island lore."))
    world.say("zanzibar was mentioned long ago")
    for i in range(10):
        world.say(f"filler {i}")
    world.say("zanzibar in another channel", channel=77)
    env = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "10"}
    assert lore(world, env=env) == ""
    assert lore(world) == "## Lorebook\n\nIsland lore."  # the default window still reaches it
    assert lore(world, env=env, channel=77) == "## Lorebook\n\nIsland lore."


def test_bad_entries_are_skipped_the_rest_load(world, caplog):
    write(world, "[[entries]]\nkeys = []\ncontent = \"never\"\n",
          "[[entries]]\nkeys = \"paris\"\ncontent = \"not a list\"\n",
          "[[entries]]\nkeys = [\"paris\"]\ncontent = \"bad priority\"\npriority = true\n",
          "[[entries]]\nkeys = [\"paris\"]\ncontent = \"  \"\n",
          "[[entries]]\nkey = [\"paris\"]\ncontent = \"typo key\"\n",
          entry(["paris", ""], "Good one."))
    world.say("paris")
    with caplog.at_level(logging.WARNING):
        assert lore(world) == "## Lorebook\n\nGood one."
    assert sum("skipping" in r.message for r in caplog.records) == 5


def test_malformed_file_keeps_previous_good_entries_and_logs_once(world, caplog):
    write(world, entry(["paris"], "Good lore."))
    world.say("paris")
    memory = world.assembler().memory
    layer = LorebookLayer()
    assert layer.build(ctx(), memory) == "## Lorebook\n\nGood lore."
    good_key = layer.invalidation_key(ctx(), memory)
    write(world, "[[entries]\nkeys = [\"paris\"")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert layer.build(ctx(), memory) == "## Lorebook\n\nGood lore."
            assert layer.invalidation_key(ctx(), memory) == good_key
    assert sum("not valid TOML" in r.message for r in caplog.records) == 1
    write(world, entry(["paris"], "Fixed lore."))
    assert layer.build(ctx(), memory) == "## Lorebook\n\nFixed lore."


def test_never_good_file_gives_nothing(tmp_path):
    path = tmp_path / "lorebook.toml"
    path.write_text("entries = 3\n")
    book = Lorebook(path)
    assert book.current() == ("none", ())
    with pytest.raises(LorebookError, match="array of tables"):
        parse_lorebook("entries = 3\n")


def test_key_tracks_content_and_matches(world):
    write(world, entry(["owl"], "Owls."), entry(["fox"], "Foxes."))
    world.say("an owl")
    memory = world.assembler().memory
    layer = LorebookLayer()
    first = layer.invalidation_key(ctx(), memory)
    assert first.split("|")[1] == "m0"
    world.say("and a fox")
    second = layer.invalidation_key(ctx(), memory)
    assert second != first and second.split("|")[1] == "m0,1"
    write(world, entry(["owl"], "Owls hoot."), entry(["fox"], "Foxes."))
    assert layer.invalidation_key(ctx(), memory).split("|")[0] != second.split("|")[0]
    # The new message counts even before it is logged.
    assert layer.invalidation_key(ctx("a fox", channel=30), memory).split("|")[1] == "m1"
    assert layer.invalidation_key(ctx("quiet", channel=30), memory).split("|")[1] == "m"
