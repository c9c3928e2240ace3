"""Issue 48: the genre of a scope's talk, and long turns shown as their passage matching the cue."""

from __future__ import annotations

from dataclasses import dataclass

from familiar_bot.prompt.retrieval import genre, passages


@dataclass(frozen=True)
class Row:
    role: str
    content: str
    id: int = 0
    deleted: bool = False


def test_people_talking_is_the_people_genre():
    rows = [Row("user", "I went kayaking near Porto last week")] * 20
    assert genre.read_genre(rows).name == genre.PEOPLE
    assert genre.read_genre([]).name == genre.PEOPLE


def test_a_person_with_a_familiar_whose_replies_are_long_is_the_familiar_genre():
    rows = [Row("user", "How do I repot a fern?"), Row("assistant", "Here is how to repot a fern. " * 30)] * 10
    read = genre.read_genre(rows)
    assert read.name == genre.FAMILIAR and read.familiar_share == 0.5 and read.turns == 20
    assert read.debug()["genre"] == "familiar"


def test_a_familiar_answering_in_a_line_now_and_then_stays_people():
    short = [Row("user", "Anyone up for climbing on Sunday?")] * 10 + [Row("assistant", "Count me in!")] * 10
    assert genre.read_genre(short).name == genre.PEOPLE
    rare = [Row("user", "We moved the demo to Friday")] * 30 + [Row("assistant", "Noted. " * 100)] * 3
    assert genre.read_genre(rare).name == genre.PEOPLE  # a tenth of the turns
    deleted = [Row("user", "hi")] * 4 + [Row("assistant", "x" * 900, deleted=True)] * 10
    assert genre.read_genre(deleted).name == genre.PEOPLE


def test_split_passages_cuts_at_line_and_sentence_ends_and_loses_no_word():
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 50 + "end." for i in range(6))
    parts = passages.split_passages(text, 400)
    assert len(parts) >= 3 and all(len(p) <= 400 for p in parts)
    assert " ".join(parts).split() == text.split()
    assert all(p.endswith(".") for p in parts)  # never inside a sentence that fits
    one_line = " ".join(f"Sentence number {i} is here." for i in range(80))
    parts = passages.split_passages(one_line, 300)
    assert all(len(p) <= 300 and p.endswith(".") for p in parts)
    assert passages.split_passages("short", 300) == ["short"]
    assert all(len(p) <= 50 for p in passages.split_passages("x" * 10 + " " + "y" * 40 + " z" * 30, 50))


def test_a_long_turn_is_shown_as_the_passage_that_matches_the_cue():
    text = ("Here are some ideas for your trip.\n\n" + "Museums are lovely in spring. " * 12 + "\n\n"
            + "For food, try the bacalhau at Cervejaria Ramiro in Lisbon. " * 6 + "\n\n" + "Trains run often. " * 20)
    shown, at, count = passages.passage_of(text, passages.cue_tokens("Which restaurant in Lisbon for bacalhau?"), 400)
    assert count > 2 and "Ramiro" in shown and shown.startswith(passages.ELLIPSIS) and len(shown) < 500
    # no cue word anywhere: the opening
    shown, at, _ = passages.passage_of(text, passages.cue_tokens("xylophone"), 400)
    assert at == 0 and shown.startswith("Here are some ideas")
    # short turns are shown whole, and size 0 turns the cut off
    assert passages.passage_of("a short turn", frozenset(), 400) == ("a short turn", 0, 1)
    assert passages.passage_of(text, frozenset(), 0) == (text, 0, 1)
    row = Row("assistant", text, id=7)
    part = passages.shown_part(row, passages.cue_tokens("bacalhau"), 400)
    assert part.id == 7 and "bacalhau" in part.content and row.content == text


def test_advice_cues_and_the_persons_taste():
    assert genre.asks_advice("Can you suggest a hotel for my upcoming trip to Miami?")
    assert genre.asks_advice("I'm trying to decide whether to buy a NAS device now or wait. What do you think?")
    assert not genre.asks_advice("Where did I complete my Bachelor's degree?")
    assert genre.tells_taste("Besides great views, I also like hotels with unique features, such as a rooftop pool")
    assert genre.tells_taste("I'm particularly interested in the history podcasts.")
    assert genre.tells_taste("I've been listening to a lot of true crime")
    assert not genre.tells_taste("What is the capital of Portugal?")
    assert not genre.tells_taste("x" * 2000 + " I love jazz")  # past the head that is read


# ----------------------------------------------------------------------------- through retrieval


def test_a_dm_with_long_replies_ranks_as_the_familiar_genre_and_shows_passages(tmp_path):
    """Through the real assembler (turn log, tantivy): a DM of a person and the familiar's long replies is
    read as the familiar genre (shown in the debug), the familiar's replies weigh less than the person's
    words, and a long reply shows only its passage matching the cue, under its own time."""
    from tests.test_assembly import World, ctx, section

    world = World(tmp_path)
    try:
        filler = "Here is a general overview of many unrelated things you might want to consider. " * 8
        for i in range(6):
            world.say(f"Tell me something about topic {i}?")
            world.say(filler + f"Topic {i} is interesting.", who=None, role="assistant")
        world.say("I adopted a rescue greyhound named Biscuit last spring.")
        reply = world.say(filler + "\n\nFor a greyhound like Biscuit, a padded martingale collar is kind. " + filler,
                          who=None, role="assistant")
        for i in range(4):
            world.say(f"More about subject {i}?")
            world.say(filler + f"Subject {i} done.", who=None, role="assistant")
        world.index()
        small = {"FAMILIAR__CHANNELS__10__HISTORY_WINDOW_SIZE": "2"}  # the history shows none of it
        prompt = world.assembler(small).assemble(ctx("What collar suits my greyhound Biscuit?"))
        debug = prompt.debug["rag"]
        assert debug["turn_genre"]["genre"] == "familiar" and debug["turn_genre"]["familiar_share"] == 0.5
        text = section(prompt, "rag_context").text
        assert "martingale collar" in text and reply.id in debug["shown_turn_ids"]
        assert "…" in text and "For a greyhound like Biscuit" in text  # the long reply is shown in part
        assert "consider.\n>\n> For a greyhound" not in text
        from familiar_bot.prompt.assembly import render_sections

        assert "turn genre: familiar (the familiar's replies 50% of the newest" in render_sections(prompt)
        weighed = [t for t in debug["turns"] if t["turn_id"] == reply.id][0]
        assert weighed["familiar"] == 0.75
        people = world.assembler({**small, "FAMILIAR__MEMORY__RETRIEVAL__TURN_GENRE": '"people"',
                                  "FAMILIAR__MEMORY__RETRIEVAL__TURN_PASSAGE_CHARS": "0"}).assemble(
            ctx("What collar suits my greyhound Biscuit?"))
        assert people.debug["rag"]["turn_genre"]["genre"] == "people"
        assert "familiar" not in [t for t in people.debug["rag"]["turns"] if t["turn_id"] == reply.id][0]
        assert "…" not in section(people, "rag_context").text  # every turn shown whole
    finally:
        world.close()


def test_a_cue_asking_what_the_familiar_said():
    assert genre.asks_its_words("I'm looking back at our previous conversation about building a cocktail bar. "
                                "You recommended five bottles, which were they?")
    assert genre.asks_its_words("you mentioned some resources for music theory, remind me?")
    assert not genre.asks_its_words("Can you suggest a hotel for my trip? What do you think?")
    assert not genre.asks_its_words("What did I say about my sister?")
