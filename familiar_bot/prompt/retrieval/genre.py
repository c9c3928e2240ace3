"""Which kind of talk a scope holds: people talking among themselves, or a person talking with the familiar.

Every re-ordering of the turn ranking was learned on LoCoMo, two people chatting in short
turns. In a DM with the familiar the talk is another genre: one person, and a familiar whose
replies are long (explanations, lists, code). There the person's own words and the familiar's
replies are different evidence, and steps that are right among people reward the familiar's
long replies over what the person said: substance's length bonus, for one, lifts every long
reply (docs/benchmarks.md, "Both genres").

The genre is read from the scope's own newest turns, no knob to set: it is ``"familiar"``
when the familiar's replies are at least :data:`FAMILIAR_SHARE` of them *and* are long, on
average at least :data:`LENGTH_RATIO` times the people's turns and :data:`MIN_REPLY_CHARS`
characters; otherwise ``"people"`` (a server where the familiar answers in a line or two now
and then reads like people talking). :func:`rerank.turn_genre` asks :func:`scope_genre` once per
reply (memoised per :data:`REGENRE_EVERY` new turns of the scope) and the hub shows the answer
in ``/context``'s debug.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

PEOPLE = "people"
FAMILIAR = "familiar"
SAMPLE_TURNS = 300  # the scope's newest turns the genre is read from
FAMILIAR_SHARE = 0.25  # at least this share of them the familiar's replies ...
LENGTH_RATIO = 2.0  # ... on average this many times as long as the people's turns ...
MIN_REPLY_CHARS = 300  # ... and at least this long
REGENRE_EVERY = 50  # new turns of the scope before the genre is read again


@dataclass(frozen=True)
class Genre:
    """The genre of a scope's talk and what it was read from (shown in ``/context``)."""

    name: str
    familiar_share: float = 0.0
    familiar_chars: float = 0.0
    people_chars: float = 0.0
    turns: int = 0

    @property
    def familiar(self) -> bool:
        return self.name == FAMILIAR

    def debug(self) -> dict[str, Any]:
        return {"genre": self.name, "familiar_share": round(self.familiar_share, 3),
                "familiar_chars": round(self.familiar_chars), "people_chars": round(self.people_chars),
                "turns": self.turns}


def is_familiars(turn: Any) -> bool:
    """Whether a turn is the familiar's own reply (the responder records those as role ``assistant``)."""
    return getattr(turn, "role", None) == "assistant"


def read_genre(turns: Iterable[Any]) -> Genre:
    """The genre of ``turns`` (rows with ``role`` and ``content``; deleted ones are skipped)."""
    mine: list[int] = []
    theirs: list[int] = []
    for t in turns:
        if getattr(t, "deleted", False):
            continue
        (mine if is_familiars(t) else theirs).append(len(t.content or ""))
    total = len(mine) + len(theirs)
    if not total:
        return Genre(PEOPLE)
    share = len(mine) / total
    familiar_chars = sum(mine) / len(mine) if mine else 0.0
    people_chars = sum(theirs) / len(theirs) if theirs else 0.0
    familiar = (share >= FAMILIAR_SHARE and familiar_chars >= MIN_REPLY_CHARS
                and familiar_chars >= LENGTH_RATIO * people_chars)
    return Genre(FAMILIAR if familiar else PEOPLE, share, familiar_chars, people_chars, total)


def scope_genre(memory: Any, visible: tuple[str, ...]) -> Genre:
    """The genre of the ``visible`` scopes' newest :data:`SAMPLE_TURNS` turns, read again every
    :data:`REGENRE_EVERY` new turns (one row read of a few hundred turns, then a memo hit)."""
    ids = memory.scope_turn_ids(visible)
    bucket = len(ids) // REGENRE_EVERY

    def compute() -> Genre:
        newest = [int(i) for i in ids[-SAMPLE_TURNS:]]
        return read_genre(memory.turn_log.turns_by_ids(newest)) if newest else Genre(PEOPLE)

    return memory.memo(("turn-genre", visible, bucket), compute)


# A cue asking the familiar for advice ("can you suggest a hotel?", "any tips?", "what do you think?",
# "should I buy it now?", "could there be a reason?"): what fits is what the person said they like.
_ASKS_ADVICE = re.compile(
    r"\b(?:suggest\w*|recommend\w*|ideas?|advice|advise|tips?|what do you think|what would you"
    r"|should i|could there be|any (?:good |other )?(?:options|ideas|thoughts)|help me (?:choose|decide|pick|find))\b",
    re.IGNORECASE)
# The person telling their own taste, habits or situation ("I like hotels with a rooftop pool",
# "I prefer winding down by 9:30", "I'm particularly interested in history podcasts", "I've been
# listening to true crime", "my commute is 40 minutes").
_TASTE = re.compile(
    r"\bI(?:'m| am)?(?: \w+ly| also| still)? (?:like|love|enjoy|prefer|adore|hate|dislike|avoid|interested in|into"
    r"|a (?:big )?fan of|looking for|want to|tend to|usually|always|never)\b"
    r"|\bI(?:'ve| have) been (?:\w+ing)\b|\bmy (?:favou?rite|go-to|usual)\b|\bI (?:already|recently) \w+",
    re.IGNORECASE)
TASTE_CHARS = 1500  # a person's taste is said early in a turn; a long paste is not searched whole


def asks_advice(cue: str) -> bool:
    """Whether the cue asks the familiar for a suggestion or an opinion (its head only)."""
    return bool(_ASKS_ADVICE.search((cue or "")[:2000]))


def tells_taste(text: str) -> bool:
    """Whether a person's turn says what they like, prefer, do or have (its head only)."""
    return bool(_TASTE.search((text or "")[:TASTE_CHARS]))


# A cue asking what the familiar itself said ("you mentioned some resources...", "you recommended
# five bottles", "remind me what you told me", "in our previous conversation"): its own reply is
# the evidence, so it keeps its full weight.
_ASKS_ITS_WORDS = re.compile(
    r"\byou (?:\w+ )?(?:said|mentioned|recommended|suggested|told|gave|listed|provided|explained|described"
    r"|shared|wrote|named|pointed out)\b|\bour (?:previous|last|earlier) (?:conversation|chat|discussion)\b"
    r"|\byour (?:suggestion|recommendation|answer|advice|list)s?\b",
    re.IGNORECASE)


def asks_its_words(cue: str) -> bool:
    """Whether the cue asks what the familiar itself said before (its head only)."""
    return bool(_ASKS_ITS_WORDS.search((cue or "")[:2000]))
