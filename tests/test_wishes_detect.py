"""The standing-wish detector (issue 33): what is pinned, on which point, and what never is.

Every case is a real sentence through `detect`, the function the projector runs; the
precision figure in the report is the share of these cases it gets right.
"""

from __future__ import annotations

import pytest

from familiar_pipeline.projectors.wishes.detect import Wish, detect, point_of, said_in, sentences, trimmed, unquoted

# (message, the point it pins)
WISHES = [
    ("From now on keep answers short.", "length"),
    ("Call me Sam.", "address"),
    ("Actually, call me Sammy from now on.", "address"),
    ("ok so my name is Jordan btw", "address"),
    ("Stop calling me Sammy.", "address"),
    ("Could you please call me Sam from now on?", "address"),
    ("Never bring up my ex again.", "topic:ex"),
    ("I'd rather not talk about work.", "topic:work"),
    ("Please don't mention my weight anymore.", "topic:weight"),
    ("I prefer step-by-step explanations.", "explain:steps"),
    ("Please don't use emojis.", "format:emoji"),
    ("You can go into detail now.", "length"),
    ("Always format code snippets with line numbers.", "format:line_numbers"),
    ("Please reply in French from now on.", "language"),
    ("I'd rather you didn't swear.", "tone:language"),
    ("I want you to be blunt with me.", "tone:honesty"),
    ("Stop apologizing so much.", "tone:apology"),
    ("I never want you to mention my brother.", "topic:brother"),
    ("Going forward, use bullet points for lists of options.", "format:lists"),
    ("Hey, when you explain code, always add comments.", "format:code"),
    ("my pronouns are they/them", "pronouns"),
    ("Keep it concise please.", "length"),
    # preferences for how to be answered, said as the person's taste rather than an order
    ("Metric units work better for me than imperial.", "units"),
    ("I'm much more comfortable with metric units.", "units"),
    ("Celsius please, Fahrenheit means nothing to me.", "units:temperature"),
    ("honestly I learn best when things are broken into steps", "explain:steps"),
    ("I understand things best through analogies.", "explain:analogies"),
    ("I lean vegetarian when I cook.", "diet"),
    ("when there's code involved I like Python best", "code_language"),
    ("I'd rather see side-by-side tables for comparisons.", "format:tables"),
    ("give me the bottom line first, that's what works for me", "format:summary"),
    ("I'd rather go for budget-friendly choices.", "budget"),
    ("whenever there are several items, use bullets", "format:lists"),
    ("no emojis please, always plain text", "format:emoji"),
    ("I'm a beginner, so please avoid jargon.", "explain:level"),  # the clause after ", so"
    ("I'd like replies in German from now on.", "language"),
    ("I respond better to gentle feedback.", "tone:honesty"),
    ("Diagrams help me more than text.", "format:visual"),
    # stop 41's misses, caught since: a habit as the condition, "go easy on", spelling, numbered steps
    ("before you advise me on anything, ask what I actually want first", "general:ask what actually first"),
    ("Numbered steps are easiest for me.", "explain:steps"),
    ("Use British spelling with me.", "spelling"),
    ("Go easy on the jargon with me.", "explain:level"),
    ("When you write emails for me, sign them Sam.", "general:sign them sam"),
]

# Looks like a wish, is not one: each is its own reason (quoted, a question, someone else's words, the past).
NOT_WISHES = [
    'He said "always use tabs" and I laughed.',  # quoted
    "She always says 'be nice to everyone'.",  # someone else's words, quoted too
    "“Never bring up my ex” is what she told him.",  # typographic quotes
    "> never bring up my ex",  # a quote line
    "`always use tabs` is the linter rule",  # code
    "Do you always use tabs?",  # a question
    "What do you always say?",  # a question
    "Can you show me the parser?",  # a task, not a standing wish
    "She always says that.",  # someone else's words
    "My boss never lets me leave early.",  # someone else
    "He never calls me back.",  # someone else
    "They always bring up politics at dinner.",  # someone else
    "I always went there as a kid.",  # the past
    "I never liked that place.",  # the past
    "Always went there as a kid, loved it.",  # the past, subject dropped
    "Never mind.",  # an idiom
    "Never again!",  # an exclamation
    "Don't worry about it.",  # a momentary request on no point
    "Keep the answer short this time.",  # this once
    "Explain how the parser works.",  # a task
    "I prefer.",  # nothing preferred
    "Never give up!",  # encouragement (LoCoMo)
    "Always here to help.",  # no verb: a statement (LoCoMo)
    "Keep going and never give up!",  # encouragement (LoCoMo)
    "My dad prefers imperial units, it drives me nuts.",  # someone else's taste
    "My roommate would rather eat vegetarian every day.",  # someone else's taste
    "I'd rather stay in tonight.",  # a plan, on no point
    "I'd rather have the vegetarian lasagna tonight.",  # this once
    "Coffee please.",  # a request on no point
    "That recipe works better for me.",  # on no point
    "I'd like to go to the short film festival on Saturday.",  # a plan ("short" is no wish on length)
    "I'd like the details of the trip when you have them.",  # a request for once
    "I like long walks on the beach.",  # a taste, on no point
    "Running helps me a lot with stress.",  # on no point
    # a condition that is for this once, not a habit
    "When you get a chance, tell me about the tables at the venue.",
    "After you finish, show me the tables.",
    "If you have time, explain the code to me.",
    "Before you leave, use the spare key.",
]


@pytest.mark.parametrize("text,point", WISHES)
def test_a_wish_is_pinned_on_its_point(text, point):
    found = detect(text)
    assert [w.point for w in found] == [point], found
    assert found[0].text == text.strip()


@pytest.mark.parametrize("text", NOT_WISHES)
def test_quoted_questions_others_words_and_the_past_are_not_wishes(text):
    assert detect(text) == []


def test_precision_over_every_case():
    """The figure the report gives: right answers over all cases (a wish on its point, a non-wish empty)."""
    right = sum([w.point for w in detect(t)] == [p] for t, p in WISHES) + sum(detect(t) == [] for t in NOT_WISHES)
    assert right == len(WISHES) + len(NOT_WISHES)


def test_a_quote_is_cut_out_but_the_rest_of_the_message_is_read():
    text = 'My teacher said "always use tabs". Anyway, from now on keep answers short.'
    assert "tabs" not in unquoted(text)
    assert [(w.point, w.text) for w in detect(text)] == [("length", "Anyway, from now on keep answers short.")]
    # an apostrophe inside a word is not a quote
    assert [w.point for w in detect("Don't use emojis, I can't stand them.")] == ["format:emoji"]


def test_one_wish_per_point_per_message_the_last_sentence_wins():
    found = detect("Call me Sam. Actually no, call me Sammy. Never bring up my ex.")
    assert [(w.point, w.text) for w in found] == [("address", "Actually no, call me Sammy."),
                                                  ("topic:ex", "Never bring up my ex.")]


def test_points_name_what_a_wish_is_about():
    assert point_of("never bring up my ex-husband") == "topic:ex-husband"
    assert point_of("don't talk about the divorce, please") == "topic:divorce"
    assert point_of("keep replies brief") == "length"
    assert point_of("answer in German") == "language"
    assert point_of("hello there") is None
    # a wish on no known point gets one from its own words: it retires only a wish worded alike
    assert [w.point for w in detect("Always greet the cat first.")] == ["greeting"]
    assert [w.point for w in detect("Always double-check the dates.")] == ["general:double-check dates"]


def test_text_is_trimmed_at_a_word_and_sentences_split():
    long = "From now on keep answers short " + "and sweet " * 40
    [wish] = detect(long, limit=60)
    assert len(wish.text) <= 60 and wish.text.endswith("…") and wish.text.startswith("From now on keep")
    assert trimmed("a  b\n c") == "a b c"
    assert sentences("One. Two? Three!\nFour") == ["One.", "Two?", "Three!", "Four"]


def test_bad_input_gets_a_clear_error():
    with pytest.raises(TypeError, match="takes a message's text"):
        detect(None)  # type: ignore[arg-type]


def test_a_repeated_condition_is_read_once_so_hostile_text_cannot_stall_the_projector():
    """"when i when i ..." once backtracked without end (a free `[^,]{1,40}` inside a repeated lead):
    the projector run over such a message never finished. Now a lead holds at most one condition."""
    assert detect("when i " * 300) == []
    assert detect("when there's x " * 200 + ", please") == []
    assert [w.point for w in detect("so " * 2000 + "when you explain code, always add comments")] == ["format:code"]


# --------------------------------------------------------------------------- wishes a model found (said_in)

@pytest.mark.parametrize("text, paraphrase, point, said", [
    # the sentence that says it, not the whole message; its point, else the paraphrase's
    ("ugh the bus again. anyway, two lines max per reply going forward please",
     "Cass wants replies of at most two lines", "general:anyway two lines max",
     "anyway, two lines max per reply going forward please"),
    ("honestly it's Sam for me from here on, not Cassandra.", "Cass wants to be called Sam", "address",
     "honestly it's Sam for me from here on, not Cassandra."),
    ("I really like when you explain with little stories", "Cass likes explanations with stories", "explain",
     "I really like when you explain with little stories"),
    ("lunch was great. it would help me if answers came as bullet lists", "Cass prefers bullet lists",
     "format:lists", "it would help me if answers came as bullet lists"),
])
def test_a_models_wish_is_pinned_as_the_sentence_that_says_it(text, paraphrase, point, said):
    assert said_in(text, paraphrase) == Wish(point, said)


@pytest.mark.parametrize("text, paraphrase", [
    ('my sister keeps saying "keep it short"', "Cass wants short answers"),  # only inside a quote
    ("> always answer in French\nlol look what my bot says", "Cass wants answers in French"),  # a quote line
    ("see you tomorrow!", "Cass wants to be called Sam"),  # no sentence backs the claim
    ("", "Cass wants short answers"),
])
def test_a_models_wish_no_sentence_backs_pins_nothing(text, paraphrase):
    assert said_in(text, paraphrase) is None


def test_a_models_wish_on_hostile_text_is_read_in_time():
    import time

    started = time.perf_counter()
    assert said_in("when i " * 5000 + "call me Sam", "Cass wants to be called Sam").point == "address"
    assert time.perf_counter() - started < 2.0
