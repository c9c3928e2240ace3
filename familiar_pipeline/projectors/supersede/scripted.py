"""The scripted offline model's supersession judgement: a newer value for the same slot retires the older.

Exclusive slots (home, job, relationship, diet) hold one value at a time; preferences
carry their object and a polarity. Deterministic, from the prompt's own fact lines.
"""

from __future__ import annotations

import json
import re

from familiar_pipeline.projectors.prompting import FACT_LINE, messages_text

from .prompt import SYSTEM_MARK


_NEW_FACT = re.compile(r'^NEW fact \(id=(\d+)\): ("(?:[^"\\]|\\.)*")$')
_ADDITIVE = re.compile(r"\b(?:also|too|as well|in addition|another|additionally|besides)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:no longer|not anymore|doesn't|does not|don't|do not|never|stopped|quit|gave up)\b", re.IGNORECASE)

# Exclusive slots: a person has one value at a time. Each pattern captures the value.
_SLOTS: list[tuple[str, re.Pattern]] = [
    ("home", re.compile(r"\b(?:lives?|living|moved|relocated|resides|is based|settled)\b(?: back)?(?: \w+)?? (?:in|to) "
                        r"(?P<v>[A-Z][\w'-]*(?: [A-Z][\w'-]*)*)")),
    ("job", re.compile(r"\b(?:works|working|worked|got a job|took a job|started a job|started working|is employed|employed)\b"
                       r"(?: now)?(?: as| at| for)(?: an?| the)? (?P<v>[\w' -]+?)(?:[.,;]|$)")),
    ("relationship", re.compile(r"\b(?:is dating|is married to|is engaged to|is in a relationship with|is single)\b"
                                r" ?(?P<v>[\w' -]*?)(?:[.,;]|$)")),
    ("diet", re.compile(r"\b(?:is|became|went) (?P<v>vegan|vegetarian|pescatarian|carnivore)\b")),
]
_PREFERENCE = re.compile(
    r"\b(?P<verb>(?:like|love|enjoy|adore|hate|dislike|detest|prefer|eat|drink|play|own)s?|can't stand)\b(?P<obj>[\w' -]+?)(?:[.,;]|$)",
    re.IGNORECASE,
)
_NEGATIVE_VERBS = {"hate", "dislike", "detest", "can't stand"}
_FILLER = re.compile(r"\b(?:now|really|still|actually|a lot|very much|so much)\b", re.IGNORECASE)


def _norm(value: str) -> str:
    return " ".join(_FILLER.sub(" ", value).lower().replace("'s", "").split()).strip(" .,;-")


def fact_claim(text: str) -> tuple[str, str, bool] | None:
    """(slot, value, positive) for the facts the careful model can judge, else None.

    Exclusive slots (home, job, relationship, diet) carry a value; preferences
    carry their object as the slot and a polarity ("loves X" vs "hates X",
    "no longer eats X").
    """
    negated = bool(_NEGATION.search(text))
    for slot, pattern in _SLOTS:
        match = pattern.search(text)
        if match:
            return slot, _norm(match.group("v")), not negated
    match = _PREFERENCE.search(text)
    if match:
        verb = match.group("verb").lower()
        verb = verb[:-1] if verb.endswith("s") else verb
        obj = _norm(re.sub(r"\b(?:anymore|any more)\b", "", match.group("obj")))
        positive = (verb not in _NEGATIVE_VERBS) != negated
        group = verb if verb in ("eat", "drink", "play", "own") else "pref"
        return f"{group}:{obj}", "", positive
    return None


def retires(new_text: str, prior_text: str) -> bool:
    """What a careful model answers: does the new fact contradict or replace the prior?"""
    new, prior = fact_claim(new_text), fact_claim(prior_text)
    if new is None or prior is None or new[0] != prior[0]:
        return False
    slot, value, positive = new
    if slot.startswith(("pref:", "eat:", "drink:", "play:", "own:")):
        return positive != prior[2]  # a flipped preference or a negation
    if not positive:  # "no longer works at the bakery" ends that job only
        return value == prior[1] or not value
    if _ADDITIVE.search(new_text):
        return False  # a second job, another home base: adds, never replaces
    return value != prior[1] or not prior[2]


def decide_supersession(user_text: str) -> dict:
    """Each NEW fact retires the earlier facts (PRIOR, or NEW above it) that `retires` says it replaces."""
    earlier: list[tuple[int, str]] = []  # (fact id, text)
    decisions: list[dict] = []
    for line in user_text.splitlines():
        if match := _NEW_FACT.match(line):
            new_id, new_text = int(match.group(1)), json.loads(match.group(2))
            named = [pid for pid, text in earlier if retires(new_text, text)]
            if named:
                decisions.append({"new_id": new_id, "superseded_ids": named})
            earlier.append((new_id, new_text))
        elif match := FACT_LINE.match(line):
            earlier.append((int(match.group(1)), json.loads(match.group(2))))
    return {"decisions": decisions}


def answer(messages: list[dict]) -> str | None:
    system, user = messages_text(messages)
    return json.dumps(decide_supersession(user)) if SYSTEM_MARK in system else None
