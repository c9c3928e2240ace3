"""The scripted offline model's supersession judgement: a newer value for the same subject's slot retires the older.

Exclusive slots (home, job, relationship, diet) hold one value at a time; preferences
carry their object (its head: "hiking", not "hiking in the mountains on weekends") and a
polarity. A claim is about the clause's own subject, not whoever said it: in "Sam said: my
friend Bob lives in Berlin" the home is Bob's, so it never retires Sam's "I moved to Porto"
(the extractor files both under the speaker, so the prompt shows them side by side).
Deterministic, from the prompt's own fact lines.
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
    ("job", re.compile(r"\b(?:works?|working|worked|got a job|took a job|started a job|started working|is employed|employed)\b"
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
# Where a preference's object ends: "hiking in the mountains on weekends" and "hiking since my knee
# injury" are both about hiking.
_OBJECT_END = re.compile(r"\s\b(?:in|on|at|since|because|when|with|every|during|for|after|before|while|but|and|so|"
                         r"anymore|any more|these days|lately|nowadays)\b.*$", re.IGNORECASE)
# "Sam said: ..." (the scripted extractor's facts): the speaker, for what they say about themselves.
_SAID = re.compile(r"^\s*(?P<speaker>[^:]{1,60}?) said:\s*")
_CLAUSE_END = re.compile(r"[,;.!?]|\b(?:but|so|because|since|then)\b", re.IGNORECASE)
_AND = re.compile(r"\band\b", re.IGNORECASE)
_SELF = {"i", "i'm", "im", "i've", "i'd", "me", "myself"}
_NOT_NAMES = {"I", "I'm", "My", "The", "A", "An", "Our", "Her", "His", "Their", "She", "He", "They", "We", "It",
              "Hi", "Hey", "Hello", "Oh", "Well", "Now", "Also", "Only", "Still", "Just"}
_ARTICLES = {"my", "the", "a", "an", "our", "your", "his", "her", "their"}
_ADVERBS = {"only", "also", "just", "still", "now", "really", "actually", "recently", "finally", "never", "always",
            "even", "already", "currently", "usually", "often", "sometimes", "no", "longer"}


def _norm(value: str) -> str:
    return " ".join(_FILLER.sub(" ", value).lower().replace("'s", "").split()).strip(" .,;-")


def _one_subject(words: list[str], speaker: str) -> str:
    # A capitalised adverb opening a sentence ("Actually I moved ...") is not a name.
    names = [w for w in words if w[:1].isupper() and w not in _NOT_NAMES and w.lower() not in _ADVERBS]
    if names:
        return names[-1].lower()
    lowered = [w.lower() for w in words if w.lower() not in _ADVERBS]
    if not lowered or lowered[-1] in _SELF:
        return speaker or "i"
    nouns = [w for w in lowered if w not in _ARTICLES]
    return " ".join(nouns) if nouns else speaker


def claim_subjects(text: str, verb_at: int) -> frozenset[str]:
    """Who the clause ending at `verb_at` is about: a name it gives ("my friend Bob" -> bob), the
    speaker for a first-person clause ("Sam said: I ..." -> sam), else its noun ("my sister" -> sister);
    a compound subject names each ("Cass and Bo live ...", "Ana and I cook ...")."""
    said = _SAID.match(text)
    speaker = said.group("speaker").strip().lower() if said else ""
    clause = _CLAUSE_END.split(text[said.end() if said else 0:verb_at])[-1]
    parts = [[w.strip("'\"()") for w in part.split()] for part in _AND.split(clause)]
    subjects = {_one_subject(parts[-1], speaker)}
    for part in reversed(parts[:-1]):  # "Cass and Bo": bare names (or "I") before the last are subjects too
        if len(part) != 1 or not (part[0] in ("I", "i") or (part[0][:1].isupper() and part[0] not in _NOT_NAMES)):
            break
        subjects.add(_one_subject(part, speaker))
    return frozenset(subjects)


def fact_claim(text: str) -> tuple[frozenset[str], str, str, bool] | None:
    """(subjects, slot, value, positive) for the facts the careful model can judge, else None.

    Exclusive slots (home, job, relationship, diet) carry a value; preferences
    carry their object as the slot and a polarity ("loves X" vs "hates X",
    "no longer eats X").
    """
    negated = bool(_NEGATION.search(text))
    for slot, pattern in _SLOTS:
        match = pattern.search(text)
        if match:
            return claim_subjects(text, match.start()), slot, _norm(match.group("v")), not negated
    match = _PREFERENCE.search(text)
    if match:
        verb = match.group("verb").lower()
        verb = verb[:-1] if verb.endswith("s") else verb
        obj = _norm(_OBJECT_END.sub("", " " + match.group("obj").strip()))
        positive = (verb not in _NEGATIVE_VERBS) != negated
        group = verb if verb in ("eat", "drink", "play", "own") else "pref"
        return claim_subjects(text, match.start()), f"{group}:{obj}", "", positive
    return None


def retires(new_text: str, prior_text: str) -> bool:
    """What a careful model answers: does the new fact contradict or replace the prior, about the same
    subject and the same slot?"""
    new, prior = fact_claim(new_text), fact_claim(prior_text)
    if new is None or prior is None or not new[0] & prior[0] or new[1] != prior[1]:
        return False
    _, slot, value, positive = new
    _, _, prior_value, prior_positive = prior
    if slot.startswith(("pref:", "eat:", "drink:", "play:", "own:")):
        return positive != prior_positive  # a flipped preference or a negation
    if not positive:  # "no longer works at the bakery" ends that job only
        return value == prior_value or not value
    if _ADDITIVE.search(new_text):
        return False  # a second job, another home base: adds, never replaces
    return value != prior_value or not prior_positive


def decide_supersession(user_text: str) -> dict:
    """Each NEW fact retires the earlier facts of its person's section (PRIOR, or NEW above it) that
    `retires` says it replaces."""
    earlier: list[tuple[int, str]] = []  # (fact id, text) of the current section
    decisions: list[dict] = []
    for line in user_text.splitlines():
        if line.startswith("Person: "):
            earlier = []
        elif match := _NEW_FACT.match(line):
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
