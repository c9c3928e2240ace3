"""Scripted long chats between one person and the familiar, for ``benchmarks/updates.py`` (issue 33).

Each chat is many sessions, days apart, of filler chat (many topics, templates and
fillers) with four kinds of planted question, each knowing its evidence turns:

* ``update``: a value is stated, then changed later in other words (a date moved, a
  library swapped, a count changed, a city, a pet's name...), sometimes twice; the
  question asks for the current value in words unlike the update's. The newest
  statement is the evidence; the older ones are recorded (``older``).
* ``wish``: an instruction to the familiar ("from now on keep answers short", "call me
  Sam"); the question, asked many sessions later, is an unrelated task it should shape.
* ``preference``: a preference stated once ("I'd rather you use metric units"), then a
  question it should shape.
* ``ordering``: "in what order did I bring up X, Y and Z?" or "list every time I
  mentioned the gym", the evidence spread over many sessions.

Distractors are planted too and are never evidence: the same subjects said of other
people ("my brother's demo is on the 9th"), wishes inside quotes or someone else's words
("my boss keeps saying \"always keep it short\""), questions that look like wishes
("should I always number my code lines?"), and the familiar mentioning an ordering topic.

Deterministic from the seed; no randomness but ``random.Random(seed)``. Dialogue ids are
LoCoMo-style ``D<session>:<n>`` so the evaluation's session helpers apply. Pure Python:
importing this module loads neither Dagster nor a model.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Sequence

KINDS = ("update", "wish", "preference", "ordering")
QUOTES = ('"', "“", "”", "'")

# --------------------------------------------------------------------------- data model


@dataclass(frozen=True)
class ChatTurn:
    dia_id: str  # "D<session>:<n>", n from 1 within the session
    session: int
    role: str  # "user" (the person) or "assistant" (the familiar)
    text: str
    at: datetime
    tag: str = "filler"  # what planted it: "filler", "<kind>:<probe>", "lead:<probe>", "distractor:<probe>"


@dataclass(frozen=True)
class Probe:
    """One planted question and what answers it."""

    id: str
    kind: str
    text: str
    evidence: tuple[str, ...]  # dia ids; for an update, the newest statement
    older: tuple[str, ...] = ()  # an update's earlier statements, oldest first
    distractors: tuple[str, ...] = ()  # look-alike turns that are not evidence
    subject: str = ""
    answer: str = ""


@dataclass
class Chat:
    id: str
    person_key: str
    person_name: str
    turns: list[ChatTurn]
    probes: list[Probe]
    asked_at: datetime  # when every question is put: after the last session

    def turn(self, dia_id: str) -> ChatTurn:
        return self._by_id()[dia_id]

    def _by_id(self) -> dict[str, ChatTurn]:
        cache = getattr(self, "_index", None)
        if cache is None:
            cache = {t.dia_id: t for t in self.turns}
            self._index = cache
        return cache

    @property
    def sessions(self) -> int:
        return max(t.session for t in self.turns)


# --------------------------------------------------------------------------- template filling

SLOTS: dict[str, Sequence[str]] = {
    "quality": ("great", "surprisingly good", "a bit meh", "honestly fantastic", "not bad at all", "kind of a mess",
                "better than expected", "disappointing", "pretty solid", "weirdly fun"),
    "weather": ("rain", "wind", "fog", "sunshine", "drizzle", "heat", "cold snap", "thunderstorm", "frost", "humidity"),
    "dish": ("a lentil curry", "mushroom risotto", "shakshuka", "a big pot of chili", "homemade ramen", "tacos",
             "a tray bake with peppers", "pesto pasta", "dumplings from scratch", "a frittata", "banana bread",
             "stuffed peppers", "miso soup", "a Greek salad", "pancakes"),
    "show": ("that baking competition", "the detective series", "a nature documentary", "an old sitcom",
             "the space drama", "a Korean thriller", "the cooking show", "that anime about volleyball",
             "a true crime podcast series", "the fantasy series everyone talks about"),
    "device": ("laptop", "phone", "router", "headphones", "printer", "smartwatch", "e-reader", "tablet", "keyboard",
               "speaker"),
    "device_issue": ("dropping the wifi", "freezing every hour", "draining its battery by noon", "refusing to update",
                     "making a buzzing noise", "losing its bluetooth pairing", "rebooting for no reason"),
    "book": ("a thick sci-fi novel", "that memoir about sailing", "a mystery set in Oslo", "a book on habits",
             "a graphic novel", "the poetry collection my aunt sent", "a history of salt", "a short story anthology"),
    "room": ("hallway", "bedroom", "kitchen", "bathroom", "study", "living room", "balcony door"),
    "colour": ("sage green", "a warm white", "terracotta", "navy", "pale yellow", "charcoal", "dusty pink"),
    "work_topic": ("the quarterly roadmap", "hiring", "the office move", "a vendor contract", "budget forecasts",
                   "the onboarding docs", "security training", "the new ticket system"),
    "animal": ("a fox", "two crows", "a heron", "a hedgehog", "a very loud seagull", "a squirrel", "a stray cat",
               "a woodpecker"),
    "place": ("the park", "the canal", "the old bridge", "the market", "the library", "the train station",
              "the riverside path", "the corner bakery", "the community garden"),
    "drink": ("flat white", "chai", "iced tea", "hot chocolate", "matcha latte", "lemonade", "cold brew"),
    "fixable": ("bathroom tap", "wobbly shelf", "squeaky door", "bike chain", "garden hose", "blinds",
                "kitchen drawer", "desk lamp"),
    "hobby": ("crosswords", "knitting", "bouldering", "sketching", "chess puzzles", "birdwatching", "baking",
              "jigsaw puzzles", "learning the ukulele", "journaling"),
    "game": ("a board game about trains", "charades", "a co-op video game", "poker", "a trivia night",
             "Mario Kart", "a card game", "a murder mystery game"),
    "count_small": ("two", "three", "four", "five", "six"),
    "plant": ("basil plant", "monstera", "succulent", "fiddle leaf fig", "tomato seedling", "orchid", "mint pot"),
    "clock": ("six", "half five", "5:40", "dawn", "quarter past six", "seven"),
    "friend": ("Priya", "Tom", "Lena", "Marcus", "Ines", "Jonah", "Aiko", "Felix", "Rosa", "Dev"),
    "meal": ("breakfast", "lunch", "dinner", "brunch"),
    "music": ("some old jazz records", "a new indie album", "film soundtracks", "a lo-fi playlist", "nineties pop",
              "a cello concerto", "a folk band from Ireland"),
    "feeling": ("tired", "pretty upbeat", "a bit scattered", "calm", "restless", "weirdly productive", "sleepy"),
    "errand": ("the post office", "the pharmacy", "the hardware store", "the bank", "the dry cleaner",
               "the recycling centre"),
    "weekday": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "snack": ("popcorn", "almonds", "a clementine", "rice crackers", "dark chocolate", "hummus and carrots"),
    "sport": ("football", "tennis", "cycling", "the basketball final", "snooker", "rugby", "the marathon on TV"),
}
_FIELD = string.Formatter()


def fill(template: str, rng: random.Random, **fixed: str) -> str:
    """``template`` with each ``{slot}`` from ``fixed``, else a random choice from ``SLOTS`` (one draw per slot)."""
    values: dict[str, str] = dict(fixed)
    for _, name, _, _ in _FIELD.parse(template):
        if name and name not in values:
            values[name] = rng.choice(SLOTS[name])
    text = template.format(**values)
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- filler

# (person line, familiar's reply): small talk on many topics, each with its own words.
FILLER: tuple[tuple[str, str], ...] = (
    ("just got back from a walk along {place}, the {weather} was something else",
     "Sounds bracing! Did you spot anything interesting on the way?"),
    ("made {dish} for {meal}, turned out {quality}", "Nice, that's a good one to have in the rotation."),
    ("I've been rewatching {show}, it's {quality}", "Rewatching is underrated. Do you notice new things this time?"),
    ("my {device} keeps {device_issue}, it's driving me up the wall",
     "That's maddening. A reset or a firmware update sometimes sorts that out."),
    ("finally finished {book}, the ending was {quality}", "Oh, how did you feel about how it wrapped up?"),
    ("thinking about painting the {room} {colour}", "That could look lovely, especially with good light."),
    ("work was a slog today, three meetings about {work_topic}",
     "Three in one day is a lot. Hope tomorrow's calmer."),
    ("there was {animal} outside the window at {clock} this morning", "What a start to the day!"),
    ("tried the {drink} at the new cafe by {place}, it was {quality}", "Always fun to find a new spot."),
    ("spent the afternoon fixing the {fixable}, took way longer than it should have",
     "Those little fixes always do. Is it holding up now?"),
    ("got really into {hobby} this week", "That's a great way to unwind. What got you started?"),
    ("played {game} with friends last night and lost {count_small} rounds in a row",
     "Ha, that's the spirit of game night though."),
    ("my {plant} is looking a bit sad, the leaves are drooping",
     "Could be water or light. Check whether the soil is soggy or bone dry."),
    ("had {meal} with {friend} today, we talked for hours", "Those are the best kind of catch-ups."),
    ("listening to {music} while I tidy up", "Good soundtrack for chores."),
    ("feeling {feeling} today, not sure why", "Some days are just like that. Anything you want to do about it?"),
    ("ran to {errand} and the queue was out the door", "Classic. At least it's done now."),
    ("I can't believe it's {weekday} already", "The week really flew by."),
    ("snacking on {snack} and pretending it counts as {meal}", "Honestly, that counts."),
    ("stayed up too late watching {sport}", "Was it worth the lost sleep?"),
    ("the neighbours are renovating again, the drilling started at {clock}",
     "Ugh, earplugs might be your friend this week."),
    ("found an old photo album at my parents' place", "That must have brought back memories."),
    ("I think I finally figured out the washing machine settings", "A small victory, but a real one."),
    ("the {weather} ruined my plan to sit outside", "Maybe next weekend will be kinder."),
    ("trying to drink more water, it's harder than it sounds", "A bottle on the desk helps some people."),
    ("my commute took forever because of roadworks", "That's rough. Podcasts at least?"),
    ("baked something for {friend}'s birthday", "That's thoughtful, I bet they loved it."),
    ("does anyone actually enjoy doing taxes", "I've yet to meet that person."),
    ("went to a pottery market and bought a mug I didn't need", "Every kitchen needs one more mug."),
    ("what's a good way to keep my {plant} alive indoors",
     "Bright indirect light, and water only when the top of the soil is dry."),
    ("how long do you boil eggs for a jammy yolk", "About six and a half minutes, then straight into cold water."),
    ("is it weird that I like the sound of rain more than music", "Not at all, lots of people find it soothing."),
    ("my phone says my screen time is up again", "Those weekly reports can be humbling."),
    ("I rearranged the bookshelf by colour", "That sounds satisfying to look at."),
    ("thinking of taking up {hobby} again", "Could be a nice thing to come back to."),
    ("the bus driver waited for me today, faith in humanity restored", "Small kindnesses go a long way."),
    ("just cleaned out the fridge, found something unidentifiable", "Brave work. Best not to investigate further."),
    ("{friend} recommended {show}, should I give it a go",
     "If you liked the last thing they recommended, probably yes."),
    ("I keep meaning to call my grandmother", "Maybe a quick call this evening? She'd likely love it."),
    ("wrote three pages in my journal tonight", "That's a good habit to keep going."),
    ("the sunset over {place} was unreal tonight", "Those evenings are worth stopping for."),
    ("lost my keys for twenty minutes, they were in my pocket", "The classic. Happens to everyone."),
    ("trying a new recipe with {dish} vibes", "Improvising in the kitchen is half the fun."),
    ("my back is stiff from sitting all day", "A few stretches every hour can help."),
    ("went to bed early for once", "How do you feel today?"),
    ("the cat next door keeps visiting our balcony", "Sounds like you've been adopted."),
    ("had a long chat with {friend} about {work_topic}", "Did it help to talk it through?"),
    ("bought new running socks, life changing", "Good socks really are underrated."),
    ("what should I listen to on a long drive", "Audiobooks or a long podcast series work well for drives."),
    ("it snowed a tiny bit and everyone lost their minds", "A little snow does that to people."),
    ("organised my desk drawer, found four pens that work", "Four is a good haul."),
    ("the library had a book sale, came home with {count_small} paperbacks", "A dangerous place to wander into."),
    ("my {device} finally died, time to shop around", "Sorry to hear it. Anything you liked about the old one?"),
    ("caught the end of {sport} at the pub", "Was the atmosphere good?"),
    ("we had a power cut for an hour, read by candlelight", "That sounds oddly cosy."),
    ("the farmers market had the best strawberries today", "Nothing beats them in season."),
    ("tried {hobby} for the first time, I'm terrible at it", "Everyone starts there, it's part of the fun."),
    ("my friend {friend} is learning to drive, I'm the passenger of doom", "Brave of you. How is it going?"),
    ("there's a jazz night at {place} on {weekday}", "Could be a nice evening out."),
    ("cooked too much rice again, fried rice tomorrow I guess", "Day-old rice makes the best fried rice."),
    ("the heating made a clanking sound all night", "Maybe bleed the radiators if it keeps happening."),
    ("watched the clouds from {place} for a while, very calming", "Sometimes that's exactly what you need."),
    ("found a great secondhand shop near {place}", "Treasure hunting is the best."),
    ("accidentally left my umbrella on the tram", "The umbrella graveyard claims another."),
    ("the {weather} kept everyone indoors today", "A good excuse for a slow day."),
    ("my grandmother sent a postcard from her holiday", "That's lovely, where is she?"),
)
OPENERS: tuple[tuple[str, str], ...] = (
    ("morning!", "Good morning! How are you doing?"), ("hey, I'm back", "Welcome back! What's new?"),
    ("hi there", "Hi! Good to hear from you."), ("evening", "Good evening. How was the day?"),
    ("hello again", "Hello! What's on your mind?"), ("yo", "Hey! What's up?"),
    ("quick check-in", "Sure, I'm here."), ("ok I have a few minutes", "Great, go ahead."),
)
CLOSERS: tuple[tuple[str, str], ...] = (
    ("ok, heading off now", "Take care, talk soon!"), ("night!", "Good night, sleep well."),
    ("gotta run", "No problem, catch you later."), ("thanks for listening", "Any time."),
    ("that's it for today", "Have a good rest of your day."),
)
LEADS = ("news on the {s}", "about the {s}", "so, the {s}", "the {s} thing", "update on the {s}")
LOOKALIKE_REPLIES = ("Ha, fair enough.", "Interesting!", "Hm, it depends on the situation.", "I can see that.",
                     "That's one way to do it.", "Funny how people differ on that.")
ACKS = ("Got it.", "Noted!", "Thanks for letting me know.", "Good to know.", "Okay, understood.",
        "Thanks for the update.", "Ah, okay.", "I'll keep that in mind.", "Understood.", "Makes sense.",
        "Right, thanks.", "Okay!")

# --------------------------------------------------------------------------- updates

# Each scenario: the subjects it can be about, each with its own values and a second way to name it
# (used by some updates instead of the subject's word), the statements, updates and questions.
# In updates, {s} is the subject, {alias} its other name, {v} the new value, {old} the one it replaces.
UPDATE_SCENARIOS: tuple[dict[str, Any], ...] = (
    {"name": "date",
     "subjects": (("demo", "the client showcase"), ("product launch", "the big release"),
                  ("dentist appointment", "the checkup"), ("piano recital", "the concert"),
                  ("job interview", "the second round"), ("team offsite", "the retreat"),
                  ("thesis defense", "the viva"), ("moving day", "the move")),
     "values": ("the 3rd", "the 7th", "the 9th", "the 12th", "the 14th", "the 17th", "the 21st", "the 24th",
                "the 28th", "the 30th"),
     "state": ("the {s} is on {v}", "we set the {s} for {v}", "just got the date for the {s}: {v}",
               "heads up, my {s} is scheduled for {v}", "so the {s} will be on {v}",
               "marking my calendar, {s} on {v}"),
     "update": ("we pushed it to {v}", "it got moved, it's {v} now", "change of plans, {alias} is on {v} instead",
                "they rescheduled {alias} to {v}", "it slipped again, now {v}", "bumped to {v}, not {old}",
                "{alias} got postponed, we're looking at {v}"),
     "lead": ("How's the {s} coming along?", "Any news on the {s}?", "Is everything still on track for the {s}?"),
     "ask": ("when is the {s}?", "what date is my {s}?", "remind me, which day is the {s}?",
             "when's the {s} happening?", "on what date is the {s}?"),
     "other": ("my brother's {s} is on {v}", "{friend} said her {s} is {v}", "my coworker's {s} got moved to {v}")},
    {"name": "library",
     "subjects": (("HTTP library for the scraper", "the scraper"), ("database for the side project", "the side project"),
                  ("plotting library for the report", "the charts"), ("test framework at work", "our test suite")),
     "values_by_subject": {
         "HTTP library for the scraper": ("requests", "httpx", "aiohttp", "urllib3"),
         "database for the side project": ("Postgres", "SQLite", "MySQL", "DuckDB"),
         "plotting library for the report": ("matplotlib", "plotly", "seaborn", "Altair"),
         "test framework at work": ("pytest", "unittest", "nose2", "Hypothesis with pytest")},
     "state": ("I'm using {v} as the {s}", "went with {v} for the {s}", "the {s} is {v} for now",
               "settled on {v} as the {s}", "picked {v} for the {s}, seemed simplest"),
     "update": ("ripped out {old} today, {v} handles it way better", "switched {alias} over to {v}",
                "{old} was a pain so we moved to {v}", "ended up replacing it with {v}",
                "migrated {alias} to {v} over the weekend", "we're on {v} now after all"),
     "lead": ("How's {alias} going?", "Did you hit any snags with {alias}?", "Any progress on {alias}?"),
     "ask": ("which {s} am I using?", "what's my {s}?", "what did I pick as the {s}?",
             "remind me what the {s} is", "which tool is the {s}?"),
     "other": ("{friend} uses {v} as the {s} at her job", "my teammate swears by {v} for his {s}")},
    {"name": "count",
     "subjects": (("people coming to the party", "the guest list"), ("chapters in my novel draft", "the manuscript"),
                  ("people on my team", "the team"), ("kilometres I run each week", "my mileage")),
     "values": ("6", "8", "11", "12", "15", "18", "20", "24", "31", "40"),
     "state": ("there are {v} {s}", "counting now: {v} {s}", "so far, {v} {s}", "looks like {v} {s}",
               "the number of {s} is {v}"),
     "update": ("a few changes, we're at {v} now", "it went from {old} to {v}", "updated count: {v}",
                "{alias} is up to {v} now", "{alias} shrank to {v}", "make that {v}, not {old}"),
     "lead": ("How's {alias} looking?", "Any change with {alias}?", "What's the latest on {alias}?"),
     "ask": ("how many {s} are there?", "what's the number of {s}?", "remind me how many {s} there are",
             "how many {s} did I say?", "what's the count of {s} now?"),
     "other": ("my sister has {v} {s}", "{friend} told me there are {v} {s} at hers")},
    {"name": "city",
     "subjects": (("city we're moving to", "the relocation"), ("city for my new job", "the new office"),
                  ("place we're going on honeymoon", "the honeymoon")),
     "values": ("Lisbon", "Porto", "Valencia", "Utrecht", "Leipzig", "Montreal", "Ljubljana", "Kyoto", "Tallinn",
                "Bologna"),
     "state": ("the {s} is {v}", "it's official, the {s} is {v}", "we decided: {v} is the {s}",
               "looks like the {s} will be {v}", "{v}, that's the {s}"),
     "update": ("scratch that, it's {v} now", "plans changed, {alias} is {v} instead", "we're going with {v} after all",
                "{old} fell through, so {v}", "{alias} moved to {v}", "turns out it'll be {v}"),
     "lead": ("Any updates on {alias}?", "Has anything changed with {alias}?", "How are plans for {alias}?"),
     "ask": ("what's the {s}?", "remind me of the {s}", "which place is the {s}?", "where is the {s}?",
             "what did we choose as the {s}?"),
     "other": ("{friend} is moving to {v} next year", "my cousin's {s} is {v}")},
    {"name": "pet",
     "subjects": (("new kitten", "the little one"), ("puppy", "the pup"), ("rabbit", "our bunny"),
                  ("goldfish", "the fish")),
     "values": ("Biscuit", "Mochi", "Pepper", "Juniper", "Waffles", "Noodle", "Clementine", "Pixel", "Olive",
                "Bean"),
     "state": ("we named the {s} {v}", "the {s} is called {v}", "meet {v}, our {s}", "{v} is the {s}'s name",
               "we went with {v} for the {s}"),
     "update": ("the kids renamed {alias} {v}", "{v} suits her better, so that's the name now",
                "we started calling {alias} {v} and it stuck", "{old} didn't fit, it's {v} now",
                "{alias} answers to {v} these days"),
     "lead": ("How's {alias} settling in?", "How is {alias} doing?", "Is {alias} behaving?"),
     "ask": ("what's my {s} called?", "what name did we give the {s}?", "what do we call the {s}?",
             "remind me of the {s}'s name"),
     "other": ("my neighbour's {s} is called {v}", "{friend} named her {s} {v}")},
    {"name": "weekday",
     "subjects": (("pottery class", "the class"), ("book club", "the club"), ("Spanish lesson", "the lessons"),
                  ("climbing session", "climbing")),
     "values": ("Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays", "Sundays"),
     "state": ("my {s} is on {v}", "signed up for the {s}, it's on {v}", "the {s} meets on {v}",
               "I do the {s} on {v}"),
     "update": ("{alias} switched to {v}", "they moved it to {v}, which suits me better",
                "no more {old}, it's {v} from now", "{alias} is {v} now because the teacher changed"),
     "lead": ("How's {alias} going?", "Still enjoying {alias}?", "How was {alias} this week?"),
     "ask": ("what day is my {s}?", "which day do I have the {s}?", "when is the {s} each week?",
             "remind me what day the {s} is"),
     "other": ("my flatmate's {s} is on {v}", "{friend} has her {s} on {v}")},
    {"name": "budget",
     "subjects": (("budget for the trip", "the trip money"), ("budget for the new laptop", "the laptop fund"),
                  ("rent I'm paying", "the rent")),
     "values": ("900 euros", "1,200 euros", "1,500 euros", "1,800 euros", "2,000 euros", "2,400 euros",
                "650 euros", "3,000 euros"),
     "state": ("the {s} is {v}", "I've set {v} as the {s}", "we agreed on {v} for the {s}",
               "so the {s} comes to {v}"),
     "update": ("we had to trim it down to {v}", "{alias} went up to {v}", "new number: {v}",
                "it's {v} now instead of {old}", "{alias} is {v} after the changes"),
     "lead": ("How's {alias} holding up?", "Any change to {alias}?", "Are you still on track with {alias}?"),
     "ask": ("what's the {s}?", "how much is the {s}?", "remind me what the {s} is",
             "what amount did we settle on for the {s}?"),
     "other": ("my parents' {s} is {v}", "{friend}'s {s} is about {v}")},
    {"name": "race",
     "subjects": (("race I'm training for", "the training plan"), ("hike we're planning", "the trek")),
     "values_by_subject": {
         "race I'm training for": ("a 10k", "a half marathon", "a full marathon", "a 5k", "a trail ultra"),
         "hike we're planning": ("a 30 km ridge route", "a two-day hut walk", "the coastal path loop",
                                 "a glacier day trip", "the three-lakes circuit")},
     "state": ("the {s} is {v}", "signed up: {v} is the {s}", "the {s} will be {v}"),
     "update": ("upgraded to {v}", "{alias} changed, we're doing {v}", "dropped {old}, going for {v}",
                "swapped it for {v}"),
     "lead": ("How's {alias} going?", "Feeling ready for {alias}?", "Any changes to {alias}?"),
     "ask": ("what's the {s}?", "what distance is the {s}?", "remind me what the {s} is"),
     "other": ("{friend} is doing {v} in the spring", "my uncle's {s} is {v}")},
    {"name": "car",
     "subjects": (("car we're buying", "the car hunt"), ("bike I'm getting", "the bike plan")),
     "values_by_subject": {
         "car we're buying": ("a used Corolla", "a Golf estate", "a Fiat Panda", "a second-hand Leaf", "a Skoda Fabia"),
         "bike I'm getting": ("a gravel bike", "a folding bike", "a cargo bike", "a road bike", "an e-bike")},
     "state": ("the {s} is {v}", "we're going for {v}", "decided on {v} as the {s}"),
     "update": ("we ended up with {v} instead", "{alias} changed course, it's {v}", "{old} was too pricey, {v} it is",
                "went for {v} in the end"),
     "lead": ("How's {alias} going?", "Any luck with {alias}?", "Did {alias} get anywhere?"),
     "ask": ("what's the {s}?", "which one is the {s}?", "remind me what the {s} is"),
     "other": ("my brother just bought {v}", "{friend} is getting {v} too")},
)

# --------------------------------------------------------------------------- wishes and preferences

# A wish is said to the familiar, without a question mark and never inside quotes; its question is an
# unrelated task it should shape. {nick}, {name}, {ex} come from the chat's person.
WISHES: tuple[dict[str, Any], ...] = (
    {"name": "short",
     "say": ("from now on keep your answers short", "please keep your replies brief, a few sentences at most",
             "always give me the short version, I don't need essays", "keep it short with me from now on"),
     "ask": ("what's the difference between a mutex and a semaphore?", "how does compound interest work?",
             "explain what DNS does", "why is the sky blue?")},
    {"name": "line numbers",
     "say": ("always format code with line numbers", "whenever you show me code, number the lines",
             "from now on put line numbers on every code snippet", "please always add line numbers to code"),
     "ask": ("can you show me the parser?", "write me a function that merges two sorted lists",
             "show me how to read a CSV file in Python", "could you sketch the retry loop for me?")},
    {"name": "ex",
     "say": ("never bring up my ex, {ex}", "please don't mention {ex} again, ever",
             "from now on don't talk about my ex at all", "do not bring up {ex} anymore, I mean it"),
     "ask": ("any ideas for what to do this weekend?", "I'm feeling a bit low, cheer me up",
             "help me plan a birthday dinner", "what should I write in my journal tonight?")},
    {"name": "nickname",
     "say": ("call me {nick} from now on", "please call me {nick}, nobody calls me {name}",
             "just call me {nick}", "from now on I'd like you to call me {nick}"),
     "ask": ("good morning! what should I focus on today?", "write a short welcome-back note for me",
             "can you greet me like an old friend?", "say something encouraging before my exam")},
    {"name": "no emojis",
     "say": ("never use emojis in your replies", "please stop using emojis with me",
             "from now on, no emojis in anything you write", "no emojis please, always plain text"),
     "ask": ("write a birthday message for my coworker", "draft a post announcing our launch",
             "write a thank-you note to my neighbour", "give me a caption for my holiday photo")},
    {"name": "bullets",
     "say": ("always use bullet points when you list things", "from now on give me lists as bullet points",
             "please always break answers into bullet points", "whenever there are several items, use bullets"),
     "ask": ("how should I prepare for a job interview?", "what should I pack for a weekend camping trip?",
             "what are the main causes of inflation?", "how do I get started with composting?")},
    {"name": "sources",
     "say": ("always tell me where a fact comes from", "whenever you state a fact, include a source",
             "please always cite your sources", "from now on name the source for any statistic"),
     "ask": ("how tall is Mount Kilimanjaro?", "when was the printing press invented?",
             "how many people live in Canada?", "how fast does light travel?")},
    {"name": "24h",
     "say": ("always use 24-hour time with me", "please write times in 24-hour format from now on",
             "never use am or pm with me, 24-hour clock only"),
     "ask": ("what time is sunset around midsummer?", "plan my Saturday morning for me",
             "when should I leave for a 9 o'clock train that's 40 minutes away?")},
    {"name": "spoilers",
     "say": ("never spoil the endings of shows for me", "please don't ever give away plot twists",
             "from now on, no spoilers for films or books"),
     "ask": ("what's Severance about?", "should I watch The Expanse?", "is the Dune sequel worth reading?")},
    {"name": "type hints",
     "say": ("always add type hints to Python code you write for me",
             "from now on, every Python function you write should have type annotations",
             "please always include type hints in Python"),
     "ask": ("write a function that counts words in a file", "can you show me a quick script to rename photos?",
             "give me a helper that flattens nested lists")},
    {"name": "clarify",
     "say": ("always ask me a clarifying question before giving advice",
             "before you advise me on anything, ask what I actually want first",
             "from now on check what I mean before you answer advice questions"),
     "ask": ("should I take the new job offer?", "is it a good idea to lend my friend money?",
             "should I switch to a standing desk?")},
)

PREFERENCES: tuple[dict[str, Any], ...] = (
    {"name": "step by step",
     "say": ("I prefer step-by-step explanations", "honestly I learn best when things are broken into steps",
             "I'd rather you walk me through things one step at a time", "step-by-step works much better for me"),
     "ask": ("how do I set up a VPN on my router?", "how do I change a bike tyre?",
             "how do I make a pivot table?", "how do I descale a kettle?")},
    {"name": "metric",
     "say": ("I'd rather you use metric units", "I prefer metric, grams and metres please",
             "metric units work better for me than imperial", "I'm much more comfortable with metric units"),
     "ask": ("how much flour goes into a loaf of bread?", "how far is a typical half marathon?",
             "how tall should a desk be?", "how heavy is an average adult cat?")},
    {"name": "vegetarian",
     "say": ("I'd rather keep my meals vegetarian", "I prefer vegetarian recipes these days",
             "I like to cook without meat, so vegetarian suggestions suit me best", "I lean vegetarian when I cook"),
     "ask": ("what should I cook tonight?", "suggest a dish for a dinner party",
             "what's a good high-protein lunch?", "give me an idea for a quick weeknight meal")},
    {"name": "python",
     "say": ("I prefer examples in Python over JavaScript", "Python examples are easiest for me to follow",
             "I'd rather see code samples in Python", "when there's code involved I like Python best"),
     "ask": ("how do I sort a list of records by a key?", "show me how to make an HTTP request",
             "how do I parse a date string?", "how would I remove duplicates from a sequence?")},
    {"name": "analogies",
     "say": ("I understand things best through analogies", "I prefer explanations with an everyday comparison",
             "analogies really help me get a concept", "I like it when you compare ideas to everyday things"),
     "ask": ("how does public key encryption work?", "explain how a transformer model works",
             "what is a blockchain, really?", "how does the immune system remember germs?")},
    {"name": "celsius",
     "say": ("I'd rather get temperatures in Celsius", "I prefer Celsius for anything about temperature",
             "Celsius please, Fahrenheit means nothing to me"),
     "ask": ("what temperature should I bake salmon at?", "what's the weather like in Tokyo in April?",
             "how hot should the water be for green tea?")},
    {"name": "budget",
     "say": ("I prefer cheap options, I'm saving money this year", "I'd rather go for budget-friendly choices",
             "inexpensive suggestions suit me best at the moment"),
     "ask": ("recommend a laptop for programming", "where should I go on holiday in May?",
             "what's a good gift for my dad?")},
    {"name": "casual",
     "say": ("I prefer a casual tone, nothing too formal", "I'd rather you keep things relaxed and informal",
             "I like it when the writing sounds casual and friendly"),
     "ask": ("write an email asking my landlord about the heating", "draft a message to my team about Friday",
             "help me reply to the wedding invitation")},
    {"name": "summary first",
     "say": ("I like a one-line summary at the top of long answers", "I prefer the conclusion first, details after",
             "give me the bottom line first, that's what works for me"),
     "ask": ("what are the pros and cons of renting versus buying?", "compare electric and gas stoves",
             "should small businesses use cloud accounting?")},
    {"name": "tables",
     "say": ("I prefer tables when comparing things", "comparisons are clearest for me as a table",
             "I'd rather see side-by-side tables for comparisons"),
     "ask": ("compare the three big cloud providers", "how do the main note-taking apps differ?",
             "what are the differences between the espresso machines in my price range?")},
)
# Look-alikes of wishes and preferences that are not the person's own standing wish.
WISH_DISTRACTORS: tuple[str, ...] = (
    'my boss keeps saying "always keep your answers short" in every meeting',
    'the sign at the gym literally says "never skip leg day"',
    "my sister always tells her kids to never bring up politics at dinner",
    "should I always format my code with line numbers?",
    "do you think people should always cite sources in group chats?",
    'my teacher used to say "from now on, no excuses" every Monday',
    "she always says never use emojis in work email",
    "is it rude to ask people to call you by a nickname?",
    "my dad prefers imperial units, it drives me nuts",
    "do you prefer tea or coffee?",
    "my roommate would rather eat meat every day",
    'the recipe book says "always use metric for baking"',
    "would it be weird if I always asked for the short version at work?",
    "my friend prefers step-by-step guides but I never read them",
    "he always says to never trust a forecast",
    "my manager insists everyone writes times in 24-hour format",
)

# --------------------------------------------------------------------------- ordering

# (how the question names it, how the person refers to it: the first shares the question's word, the
# others do not, so an ordering question cannot be answered by one keyword alone).
ORDER_TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the broken dishwasher", ("the dishwasher", "the machine that does the dishes", "the kitchen appliance repair")),
    ("my cousin's wedding", ("the wedding", "Ana's big day", "the ceremony in the vineyard")),
    ("the tax return", ("my tax return", "the forms for the revenue office", "the annual filing")),
    ("the leaky roof", ("the roof", "the water dripping into the attic", "the tiles the storm loosened")),
    ("the Japanese lessons", ("Japanese", "my kanji practice", "the language course on Thursday nights")),
    ("the job offer from the agency", ("the agency offer", "that recruiter's proposal", "the contract they sent me")),
    ("the camping trip", ("the camping trip", "the tent and the sleeping bags", "our weekend by the lake")),
    ("the vet visit", ("the vet", "the dog's checkup", "the animal clinic")),
    ("the sourdough starter", ("my sourdough starter", "the jar of bubbling flour", "the bread culture")),
    ("the parking ticket", ("the parking ticket", "the fine on my windscreen", "the appeal to the council")),
    ("the new mattress", ("the mattress", "the new bed I ordered", "sleeping on the memory foam")),
    ("the choir audition", ("the audition", "singing for the choir director", "my solo for the tryout")),
    ("the garden shed", ("the shed", "the wooden hut at the back", "the flat-pack building project")),
    ("the flu jab", ("the flu jab", "my vaccination appointment", "the shot at the pharmacy")),
    ("the lost passport", ("my passport", "the travel document I misplaced", "the embassy paperwork")),
    ("the charity run", ("the charity run", "the fundraiser race", "the sponsored 5k")),
)
ORDER_MENTION = ("ugh, {t} again: {d}", "so about {t}, {d}", "finally dealt with {t}, {d}",
                 "quick thing on {t}: {d}", "update on {t}, {d}", "can't stop thinking about {t}, {d}",
                 "today it was {t}, {d}", "spent the evening on {t}, {d}")
ORDER_DETAIL = ("it took all morning", "that went better than I feared", "still not sorted",
                "I need to call someone about it", "cost more than I expected", "my friend helped out",
                "there's paperwork involved of course", "I'm glad that's moving", "what a saga")
ORDER_ASK = ("in what order did I bring up {a}, {b} and {c}?", "which did I mention first: {a}, {b} or {c}?",
             "put these in the order I talked about them: {a}, {b}, {c}",
             "what was the sequence in which I mentioned {a}, {b} and {c}?",
             "did I talk about {a} before {b}, and where does {c} fit?",
             "sort {a}, {b} and {c} by when I first told you about them")
# A topic the person comes back to: some mentions name it, the others only describe it.
RECURRING: tuple[dict[str, Any], ...] = (
    {"topic": "the gym", "named": ("hit the gym before work", "the gym was packed tonight",
                                   "the gym changed its opening hours"),
     "described": ("did deadlifts this morning, new personal best", "the squat rack was free for once",
                   "twenty minutes on the rowing machine, then stretching", "skipped my workout, felt lazy",
                   "leg day, I can barely walk")},
    {"topic": "my knee", "named": ("my knee is aching again", "the physio looked at my knee today",
                                   "my knee clicked on the stairs"),
     "described": ("wearing the brace on my left leg again", "stairs are a struggle, that old injury is back",
                   "iced the joint after the walk, the swelling is down", "ran pain-free today, the leg held up")},
    {"topic": "the landlord", "named": ("the landlord finally replied about the boiler",
                                        "still waiting on the landlord about the mould"),
     "described": ("the property manager wants to raise the rent", "the owner of the flat sent a plumber",
                   "the letting agency says the inspection is on Friday", "got an email about the lease renewal")},
    {"topic": "the garden", "named": ("first tomatoes from the garden", "the garden fence blew over"),
     "described": ("planted garlic in the raised beds", "slugs ate all the lettuce overnight",
                   "spent an hour weeding the vegetable patch", "the apple tree out back is finally blossoming")},
    {"topic": "my brother", "named": ("my brother called about the holidays", "my brother got a promotion"),
     "described": ("helped my little bro move a sofa", "Jamie is visiting next month, can't wait to see him",
                   "argued with Jamie about football again", "my sibling sent photos of his new flat")},
    {"topic": "the night shifts", "named": ("on night shifts again this week", "covered a night shift for a colleague"),
     "described": ("working till 6am again, the rota is brutal", "slept through the afternoon after work",
                   "last overnight rotation of the month, finally", "the ward was quiet at 3am for once")},
)
RECURRING_ASK = ("list every time I mentioned {t}", "when did I talk about {t}?",
                 "how many times have I brought up {t}, and when?", "go through each time I mentioned {t}",
                 "what have I said about {t} over time?", "give me a timeline of everything I told you about {t}")
# The familiar asking after an ordering topic (after the person brought it up): not the person's mention.
ORDER_ECHO = ("Did you sort out {t} in the end?", "Any news about {t}?", "Fingers crossed for {t}.",
              "How did things go with {t}?", "Is {t} still on your mind?")
ECHO_REPLIES = ("not much to report", "all fine", "same as ever", "later maybe", "eh, no change", "let's not")
# The familiar mentioning a recurring topic: not the person's own mention.
RECURRING_ECHO = ("By the way, how are things with {t} these days?", "I was wondering about {t}, anything new?",
                  "Last time you sounded unsure about {t}.", "Do you want to talk about {t}?",
                  "I remember you mentioned {t} a while back.")

# --------------------------------------------------------------------------- the person

PEOPLE: tuple[tuple[str, str], ...] = (
    ("Samantha", "Sam"), ("Alexander", "Alex"), ("Katherine", "Kit"), ("Benjamin", "Benji"),
    ("Margarita", "Rita"), ("Theodore", "Teddy"), ("Elisabeth", "Lise"), ("Maximilian", "Max"),
    ("Josephine", "Jo"), ("Nathaniel", "Nat"), ("Gabriela", "Gabi"), ("Frederick", "Fred"),
)
EXES = ("Daniel", "Chloe", "Marco", "Hannah", "Oskar", "Yasmin", "Lucas", "Petra")
ASK_WRAP = ("{q}", "{q}", "quick question: {q}", "sorry, I forgot: {q}", "hey, {q}", "{q} I blanked on it")
TASK_WRAP = ("{q}", "{q}", "ok, new thing: {q}", "{q} Thanks!", "random one, {q}")


# --------------------------------------------------------------------------- generation

@dataclass
class _Block:
    """Turns planted together in one session: ``(role, text, tag)`` in order."""

    lines: list[tuple[str, str, str]]
    # Where each planted line lands: (probe id, role of the line for that probe) by line index.
    marks: dict[int, tuple[str, str]] = field(default_factory=dict)


@dataclass
class _Plan:
    probe_id: str
    kind: str
    question: str
    subject: str
    answer: str = ""
    blocks: list[tuple[int, _Block]] = field(default_factory=list)  # (session, block)


def _ordinal_sessions(rng: random.Random, lo: int, hi: int, n: int, gap: int = 1) -> list[int]:
    """``n`` increasing sessions in [lo, hi], at least ``gap`` apart (as spread as the range allows)."""
    for _ in range(200):
        picks = sorted(rng.sample(range(lo, hi + 1), n))
        if all(b - a >= gap for a, b in zip(picks, picks[1:])):
            return picks
    span = (hi - lo) / max(1, n - 1) if n > 1 else 0
    return [lo + round(i * span) for i in range(n)]


def _wrap(template: Sequence[str], rng: random.Random, q: str) -> str:
    text = rng.choice(template).format(q=q)
    return text[:1].upper() + text[1:]


def generate_chat(seed: int, index: int, *, sessions: int = 60, turns_per_session: tuple[int, int] = (10, 14),
                  updates: int = 12, wishes: int = 8, preferences: int = 8, orders: int = 4, recurring: int = 4,
                  quiet_tail_turns: int = 240, start: datetime | None = None) -> Chat:
    """One scripted chat. Wishes and preferences are said before the last ``quiet_tail_turns`` turns (so
    a 200-turn recent history window does not hold them when the questions are asked); updates,
    ordering mentions and distractors are spread over every session but the last."""
    rng = random.Random(f"{seed}:{index}")
    name, nick = rng.choice(PEOPLE)
    ex = rng.choice(EXES)
    chat_id = f"upd-{seed}-{index}"
    key = f"bench:{name.lower()}-{index}"
    sizes = [rng.randint(*turns_per_session) for _ in range(sessions)]
    # The sessions wishes and preferences may go in: every turn of them ends before the quiet tail.
    total = sum(sizes)
    ends = [sum(sizes[: i + 1]) for i in range(sessions)]
    early_last = max([i + 1 for i, end in enumerate(ends) if end <= total - quiet_tail_turns] or [2])
    last = sessions - 1  # the last session is left to filler: it is the one the questions follow
    plans: list[_Plan] = []
    counter = iter(range(1000))

    def probe_id(kind: str) -> str:
        return f"{chat_id}:{kind}:{next(counter)}"

    # updates: a statement, then one or two later updates in other words, and a look-alike about someone else
    # One subject of each scenario in turn (a second date, a second count... once every scenario has one).
    order = rng.sample(UPDATE_SCENARIOS, len(UPDATE_SCENARIOS))
    unused = {sc["name"]: rng.sample(list(sc["subjects"]), len(sc["subjects"])) for sc in order}
    picked: list[tuple[dict[str, Any], tuple[str, str]]] = []
    while len(picked) < updates and any(unused.values()):
        for sc in order:
            if len(picked) < updates and unused[sc["name"]]:
                picked.append((sc, unused[sc["name"]].pop()))
    for sc, (subject, alias) in picked:
        pool = sc.get("values_by_subject", {}).get(subject) or sc["values"]
        times = 3 if rng.random() < 0.35 else 2
        values = rng.sample(list(pool), times + 1)
        pid = probe_id("update")
        plan = _Plan(pid, "update", fill(rng.choice(ASK_WRAP).format(q=rng.choice(sc["ask"])), rng, s=subject),
                     subject, answer=values[times - 1])
        at = _ordinal_sessions(rng, 1, last - 1, times + 1, gap=2)
        first = _Block([("user", fill(rng.choice(sc["state"]), rng, s=subject, v=values[0]), "update"),
                        ("assistant", rng.choice(ACKS), "filler")], {0: (pid, "statement")})
        plan.blocks.append((at[0], first))
        for step in range(1, times):
            template = rng.choice(sc["update"])
            text = fill(template, rng, s=subject, alias=alias, v=values[step], old=values[step - 1])
            lines: list[tuple[str, str, str]] = []
            if "{alias}" not in template and "{s}" not in template:
                # The update names nothing: the subject comes from the turn before it.
                if rng.random() < 0.6:
                    lines.append(("assistant", fill(rng.choice(sc["lead"]), rng, s=subject, alias=alias), "lead"))
                else:
                    lines.append(("user", fill(rng.choice(LEADS), rng, s=subject), "lead"))
            lines.append(("user", text, "update"))
            lines.append(("assistant", rng.choice(ACKS), "filler"))
            plan.blocks.append((at[step], _Block(lines, {len(lines) - 2: (pid, "statement")})))
        other = _Block([("user", fill(rng.choice(sc["other"]), rng, s=subject, v=values[times]), "distractor"),
                        ("assistant", rng.choice(ACKS), "filler")], {0: (pid, "distractor")})
        plan.blocks.append((at[-1], other))
        plans.append(plan)

    def standing(bank: Sequence[dict[str, Any]], kind: str, n: int) -> None:
        for item in rng.sample(list(bank), min(n, len(bank))):
            pid = probe_id(kind)
            said = fill(rng.choice(item["say"]), rng, nick=nick, name=name, ex=ex)
            task = rng.choice(item["ask"])
            plan = _Plan(pid, kind, _wrap(TASK_WRAP, rng, task), item["name"])
            block = _Block([("user", said, kind), ("assistant", rng.choice(ACKS), "filler")], {0: (pid, "statement")})
            plan.blocks.append((rng.randint(1, early_last), block))
            plans.append(plan)

    standing(WISHES, "wish", wishes)
    standing(PREFERENCES, "preference", preferences)
    # look-alikes of wishes, anywhere before the last session (not evidence of any question)
    for text in rng.sample(WISH_DISTRACTORS, min(len(WISH_DISTRACTORS), wishes + preferences)):
        pid = probe_id("lookalike")
        block = _Block([("user", text[:1].upper() + text[1:], "distractor"),
                        ("assistant", rng.choice(LOOKALIKE_REPLIES), "filler")], {0: (pid, "distractor")})
        plans.append(_Plan(pid, "lookalike", "", "", blocks=[(rng.randint(1, last - 1), block)]))

    # ordering: three topics in three sessions far apart; and a topic mentioned four to six times
    topics = rng.sample(ORDER_TOPICS, 3 * orders)
    for o in range(orders):
        trio = topics[3 * o: 3 * o + 3]
        pid = probe_id("ordering")
        named = [t[0] for t in trio]
        shown = named[:]
        while shown == named:
            rng.shuffle(shown)
        question = rng.choice(ORDER_ASK).format(a=shown[0], b=shown[1], c=shown[2])
        plan = _Plan(pid, "ordering", question[:1].upper() + question[1:], " / ".join(named),
                     answer=", ".join(named))
        for session, (label, refs) in zip(_ordinal_sessions(rng, 1, last - 2, 3, gap=max(2, last // 5)), trio):
            text = fill(rng.choice(ORDER_MENTION), rng, t=rng.choice(refs), d=rng.choice(ORDER_DETAIL))
            plan.blocks.append((session, _Block([("user", text, "ordering"), ("assistant", rng.choice(ACKS), "filler")],
                                                {0: (pid, "statement")})))
            # Later, the familiar asks after it in the question's own words: not the person bringing it up.
            yours = re.sub(r"^my ", "your ", label)
            for echo_text in rng.sample(ORDER_ECHO, 2):
                echo = _Block([("assistant", echo_text.format(t=yours), "distractor"),
                               ("user", rng.choice(ECHO_REPLIES), "filler")], {0: (pid, "distractor")})
                plan.blocks.append((rng.randint(session + 1, last - 1), echo))
        plans.append(plan)
    for item in rng.sample(RECURRING, recurring):
        pid = probe_id("ordering")
        said = [*rng.sample(item["named"], rng.randint(0, 1)), *rng.sample(item["described"], 4)]
        rng.shuffle(said)
        question = rng.choice(RECURRING_ASK).format(t=item["topic"])
        plan = _Plan(pid, "ordering", question[:1].upper() + question[1:], item["topic"])
        for session, text in zip(_ordinal_sessions(rng, 1, last - 1, len(said), gap=max(1, last // 8)), said):
            plan.blocks.append((session, _Block([("user", text[:1].upper() + text[1:], "ordering"),
                                                 ("assistant", rng.choice(ACKS), "filler")], {0: (pid, "statement")})))
        yours = re.sub(r"^my ", "your ", item["topic"])
        opening = plan.blocks[0][0]
        for echo_text in rng.sample(RECURRING_ECHO, 3):
            echo = _Block([("assistant", echo_text.format(t=yours), "distractor"),
                           ("user", rng.choice(ECHO_REPLIES), "filler")], {0: (pid, "distractor")})
            plan.blocks.append((rng.randint(min(opening + 1, last - 1), last - 1), echo))
        plans.append(plan)

    # Lay the sessions out: an opener, the planted blocks among filler exchanges, sometimes a closer.
    by_session: dict[int, list[tuple[_Plan, _Block]]] = {}
    for plan in plans:
        for session, block in plan.blocks:
            by_session.setdefault(session, []).append((plan, block))
    clock = start or datetime(2025, 2, 3, tzinfo=timezone.utc) + timedelta(days=rng.randint(0, 40))
    turns: list[ChatTurn] = []
    located: dict[str, dict[str, list[str]]] = {p.probe_id: {"statement": [], "distractor": []} for p in plans}
    filler = list(FILLER)
    rng.shuffle(filler)
    fill_at = 0
    for s in range(1, sessions + 1):
        clock = clock.replace(hour=0, minute=0, second=0) + timedelta(days=rng.randint(1, 5),
                                                                      hours=rng.randint(7, 21),
                                                                      minutes=rng.randint(0, 59))
        planted = by_session.get(s, [])
        rng.shuffle(planted)
        planted_turns = sum(len(b.lines) for _, b in planted)
        exchanges = max(1, (sizes[s - 1] - planted_turns - 2) // 2)
        items: list[Any] = [None] * exchanges + [b for _, b in planted]
        body = items[:]
        rng.shuffle(body)
        sequence: list[tuple[str, str, str, tuple[str, str] | None]] = []
        opener = rng.choice(OPENERS)
        sequence += [("user", opener[0], "filler", None), ("assistant", opener[1], "filler", None)]
        for item in body:
            if item is None:
                pair = filler[fill_at % len(filler)]
                fill_at += 1
                sequence += [("user", fill(pair[0], rng), "filler", None),
                             ("assistant", fill(pair[1], rng), "filler", None)]
            else:
                owner = next(p for p, b in planted if b is item)
                for i, (role, text, tag) in enumerate(item.lines):
                    sequence.append((role, text, f"{tag}:{owner.probe_id}" if tag != "filler" else "filler",
                                     item.marks.get(i)))
        if rng.random() < 0.5:
            closer = rng.choice(CLOSERS)
            sequence += [("user", closer[0], "filler", None), ("assistant", closer[1], "filler", None)]
        for n, (role, text, tag, mark) in enumerate(sequence, start=1):
            clock += timedelta(seconds=rng.randint(20, 150))
            dia = f"D{s}:{n}"
            turns.append(ChatTurn(dia, s, role, text, clock, tag))
            if mark is not None:
                located[mark[0]][mark[1]].append(dia)
    probes = []
    for plan in plans:
        if plan.kind == "lookalike":
            continue
        said = located[plan.probe_id]["statement"]
        evidence: tuple[str, ...] = tuple(said)
        older: tuple[str, ...] = ()
        if plan.kind == "update":
            evidence, older = (said[-1],), tuple(said[:-1])
        # Its own look-alikes; a wish or preference also has every quoted or questioning look-alike.
        lookalikes = [d for other in plans if other.kind == "lookalike" and plan.kind in ("wish", "preference")
                      for d in located[other.probe_id]["distractor"]]
        probes.append(Probe(plan.probe_id, plan.kind, plan.question, evidence, older,
                            tuple(located[plan.probe_id]["distractor"] + lookalikes), plan.subject, plan.answer))
    probes.sort(key=lambda p: (KINDS.index(p.kind), p.id))
    return Chat(chat_id, key, name, turns, probes, asked_at=clock + timedelta(hours=2))


def generate(seed: int = 33, chats: int = 4, **options: Any) -> list[Chat]:
    """``chats`` scripted chats, deterministic from ``seed``."""
    return [generate_chat(seed, i, **options) for i in range(chats)]


QUICK = {"sessions": 12, "turns_per_session": (8, 10), "updates": 3, "wishes": 2, "preferences": 2, "orders": 1,
         "recurring": 1, "quiet_tail_turns": 40}


# --------------------------------------------------------------------------- checks


def quoted(text: str) -> bool:
    return any(q in text for q in QUOTES[:3])


def problems(chat: Chat) -> list[str]:
    """What is wrong with a generated chat (empty: valid). The test asserts it on every chat."""
    out = []
    ids = [t.dia_id for t in chat.turns]
    if len(set(ids)) != len(ids):
        out.append("duplicate dialogue ids")
    times = [t.at for t in chat.turns]
    if times != sorted(times) or len(set(times)) != len(times):
        out.append("turn times are not strictly increasing")
    known = set(ids)
    distractors = {d for p in chat.probes for d in p.distractors}
    for p in chat.probes:
        if p.kind not in KINDS:
            out.append(f"{p.id}: unknown kind {p.kind}")
        if not p.evidence or not p.text.strip():
            out.append(f"{p.id}: no evidence or no question")
        for d in (*p.evidence, *p.older):
            if d not in known:
                out.append(f"{p.id}: evidence {d} names no turn")
                continue
            turn = chat.turn(d)
            if turn.role != "user":
                out.append(f"{p.id}: evidence {d} is not the person's turn")
            if d in distractors:
                out.append(f"{p.id}: evidence {d} is also a distractor")
            if p.kind in ("wish", "preference") and (quoted(turn.text) or "?" in turn.text):
                out.append(f"{p.id}: wish {d} is quoted or a question: {turn.text!r}")
        if p.kind == "update" and not p.older:
            out.append(f"{p.id}: an update with no older statement")
        if p.kind == "update" and any(chat.turn(o).at >= chat.turn(p.evidence[0]).at for o in p.older if o in known):
            out.append(f"{p.id}: an older statement is not older")
    if chat.asked_at <= chat.turns[-1].at:
        out.append("questions are asked before the chat ends")
    return out


def evidence_turns(chats: Iterable[Chat]) -> set[tuple[str, str]]:
    return {(c.id, d) for c in chats for p in c.probes for d in (*p.evidence, *p.older)}


_WORD = re.compile(r"[a-z]+")


def vocabulary(chats: Iterable[Chat]) -> int:
    """Distinct lowercase words over every turn (a rough check that the chats are varied)."""
    return len({w for c in chats for t in c.turns for w in _WORD.findall(t.text.lower())})
