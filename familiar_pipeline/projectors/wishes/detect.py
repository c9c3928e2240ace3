"""Which sentences of a turn are standing wishes addressed to the familiar, and what each is about.

A wish is an instruction or a preference for how the familiar should behave from now on
("from now on keep answers short", "call me Sam", "never bring up my ex", "I prefer
step-by-step explanations"). Recall by similarity misses them: a later "show me the
parser" shares no word with "always number code lines", so they are pinned instead
(issue 33). This is a heuristic with no model, so it runs wherever the familiar runs.

Precision matters more than recall: a pinned line costs tokens in every reply to that
person. So a cue counts only at the start of a sentence (after a discourse marker such
as "ok", "also", "from now on"), which is what keeps out someone else's words ("she
always says…", "my boss never…") and statements about the past ("I always went there
as a kid": "I always" is not a cue); quoted text (in quotes, or a ``>`` quote line) is
cut out before anything is read; a question ("do you always…?") is not a wish, except
the polite request form "could you (please) …". Weak cues ("keep…", "don't…", "you
can…", "feel free…") count only when what follows names a known point, and so do
preferences said as the person's own taste ("metric units work better for me", "I learn
best through analogies", "Celsius please"). A clause after a reason ("I'm a beginner, so
please avoid jargon") is read on its own when the whole sentence is not a wish.

Each wish gets a **point**: what it is about (``address``, ``length``, ``language``,
``format:emoji``, ``topic:ex``, ...), so that a newer wish on the same point retires
the older ("call me Sam", later "call me Sammy"). A wish on no known point gets a point
from its own leading words, so it retires only a wish worded the same way.

English only: the turn index's tokenizer (``storage/fts.py``) stems English alone, so no
other language has support elsewhere in the project either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .tables import MAX_CHARS


@dataclass(frozen=True)
class Wish:
    """One detected wish: its point (what it is about) and its sentence as said, trimmed."""

    point: str
    text: str


# --------------------------------------------------------------------------- quoted text and sentences

_QUOTED = re.compile(
    r'"[^"\n]*"'  # "…"
    r"|“[^”\n]*”|„[^“”\n]*[“”]|«[^»\n]*»|‘[^’\n]*’"  # typographic quotes
    r"|(?<![\w'])'[^'\n]*'(?![\w'])"  # '…' (an apostrophe inside a word is not a quote)
)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")


def unquoted(text: str) -> str:
    """The text without what it quotes: quoted spans, code, and ``>`` quote lines become gaps.

    A gap ends a sentence (``" | "`` is not a sentence character), so nothing on either side
    of a quote joins into one sentence.
    """
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(">")]
    text = _CODE.sub(" | ", "\n".join(lines))
    return _QUOTED.sub(" | ", text)


def sentences(text: str) -> list[str]:
    """The unquoted text's sentences, each with its closing punctuation, stripped."""
    out = []
    for part in unquoted(text).split("|"):
        out += [s.strip() for s in _SENTENCE.findall(part) if s.strip(" .!?\t")]
    return out


# --------------------------------------------------------------------------- cues

# What may come before a cue without making it someone else's words: discourse markers, then at most
# one condition ("when you explain code,"), then markers again. One condition, not any number: a free
# `[^,]{1,40}` inside the repeated group let "when i when i when i ..." backtrack without end.
_MARKERS = (r"(?:(?:ok(?:ay)?|so|also|and|but|oh|hey|hi|no|nah|wait|oops|sorry|btw|by the way|actually|just|"
            r"one more thing|seriously|honestly|again|anyway|well|look|listen|fyi|note|remember|reminder|pls|please|"
            r"from now on|going forward|in (?:the )?future|for future reference|"
            r"from here on(?: out)?|moving forward|for now on|for the future|(?:from )?today on)"
            r"[\s,:;-]*)*")
_CONDITION = (r"(?:(?:when(?:ever)? (?:you|we|i|there'?s|there (?:is|are)|it'?s)|if (?:you|i)|(?:before|after) you)"
              r" [^,]{1,40}[\s,:;-]*)")
# A habit the wish is tied to ("whenever you explain code, ...", "before you advise me on anything, ...";
# "before/after you" only with any/every/each: "after you finish, ..." is for this once):
# an imperative after it is standing without "always" (an "if you ..." condition is not: "if you have
# time, check my essay" is for this once, and so is "when you get a chance / can / are free, ...").
_HABIT = re.compile(r"^" + _MARKERS + r"(?:(?:whenever you|when you(?! (?:get|find|have|can|could|are|'re|'ve|'ll|"
                    r"will)\b)) [^,]{1,40}|(?:before|after) you [^,]{0,40}\b(?:any|every|each)\w*[^,]{0,40}),",
                    re.I)
_LEAD = _MARKERS + r"(?:" + _CONDITION + _MARKERS + r")?"
_NAME = r"[A-Za-z][\w'-]{0,30}(?: [A-Z][\w'-]{0,30})?"

# Strong cues: a wish whatever point it is on.
_STRONG = re.compile(
    r"^" + _LEAD + r"(?P<cue>"
    r"(?:please )?(?:always|never|don'?t ever|do not ever|never ever)\s+(?P<verb>[a-z'-]+)"
    r"|stop\s+(?P<ing>[a-z]+ing)\b"
    r"|(?:please )?(?:call|address) me\b|refer to me as\b|my name(?:'s| is)\b|i go by\b"
    r"|my pronouns are\b|use (?:[a-z]+/[a-z]+) (?:pronouns )?for me\b"
    r"|i(?: really| much| generally| usually)? prefer\b|i'?d (?:much |really )?rather you\b"
    r"|i would (?:much |really )?rather you\b|i'?d (?:much )?prefer\b|i would prefer\b"
    r"|i (?:want|need|would like|'d like|'?d love) you to\b"
    r"|i (?:don'?t|do not|never|don'?t ever) want you to\b"
    r"|(?:please )?(?:remember|keep in mind|note|don'?t forget) that i (?:prefer|like|hate|want|don'?t)\b"
    r"|you (?:should|must|need to|have to) (?:always|never)\b"
    r"|(?:from now on|going forward|in (?:the )?future)\b"
    r")",
    re.I,
)
# Weak cues: a wish only when what follows names a known point and nothing marks it as for this once.
_WEAK = re.compile(
    r"^" + _LEAD + r"(?P<cue>"
    r"(?:please )?(?:keep|don'?t|do not|no more|less|more|avoid|use|be|skip|drop)\b"
    r"|(?:please )?(?:go easy on|take it easy on|ease up on|cut (?:down|back) on|tone down)\b"
    r"|(?:you can|you may|you could|feel free to|it'?s (?:fine|ok(?:ay)?) to|no need to|you don'?t (?:have|need) to)\b"
    r"|i (?:like|love|hate|can'?t stand|don'?t like|dislike) (?:it )?when you\b"
    r"|i'?d (?:much |really )?rather (?:not|you)\b|i would rather (?:not|you)\b"
    r")",
    re.I,
)
# A preference for how to be answered, said as the person's own taste rather than an instruction
# ("metric units work better for me", "I learn best through analogies", "Celsius please"): a wish
# only when it names a known point (as a weak cue) and is not for this once. At a sentence's start
# (after a lead) when it begins with "I", so someone else's taste ("my dad prefers imperial") is not
# read; the "... for me" forms may be anywhere, as their subject is the thing preferred.
_PREFERS = re.compile(
    r"^" + _LEAD + r"(?P<cue>"
    r"i'?d (?:much |really |honestly )?rather\b|i would (?:much |really )?rather\b"
    r"|i(?: \w+)? (?:learn|understand|follow|get|take in)(?: things| it| ideas| concepts| stuff)? best\b"
    r"|i'?m (?:much |far |a lot |way )?more comfortable with\b|i am (?:much |far )?more comfortable with\b"
    r"|i(?: \w+)? lean\b|i like [\w' -]{1,30} best\b"
    r"|i like (?:it )?(?:a|an|my|when|answers|replies|responses|explanations)\b"
    r"|i find [\w' -]{1,40} (?:easier|clearer|better|more helpful)\b"
    r"|i respond (?:better|best) to\b|i (?:don'?t|do not|never) eat\b"
    r"|(?:[\w'-]+ ){0,2}[\w'-]+,? please\b"
    r")"
    r"|\b(?:better|best|easier|easiest|clearer|clearest) for me\b|\bwhat works for me\b|\bwhat i'?m used to\b"
    r"|\bsuits? me (?:best|better)\b|\bhelps? me (?:a lot|more|most|the most|best)\b|\breally helps? me\b",
    re.I,
)
_ONE_OFF = re.compile(r"\b(?:this (?:time|once|one|answer|question|reply|message|week)|for this|right now|for now|"
                      r"just now|today|tonight|here|yet)\b", re.I)
# An imperative with a standing marker anywhere ("reply in French from now on").
_IMPERATIVE = re.compile(r"^" + _LEAD + r"(?P<cue>(?:i'?d like|i would like|reply|answer|respond|write|speak|talk|explain|format|call|"
                         r"address|refer|greet|sign|end|start|begin|use|keep|be|give|show|tell|ask|remind|add|"
                         r"put|include|say|number|list|mention|check)\b)", re.I)
_STANDING = re.compile(r"\b(?:from now on|going forward|in (?:the )?future|from here on(?: out)?|every time|"
                       r"each time|whenever|always|never|anymore|any more|no longer)\b", re.I)
# A polite request phrased as a question: the rest after it is read as an imperative.
_POLITE = re.compile(r"^" + _LEAD + r"(?:can|could|would|will) you(?: please| kindly)?\s+", re.I)
_NOT_IMPERATIVE = re.compile(
    r"^(?:mind|again|before|ever|once|really|been|was|were|had|did|said|got|went|came|made|took|thought|knew|"
    r"felt|told|saw|gave|found|left|kept|let|bought|brought|[a-z]+ed|[a-z]+ing|[a-z]+s)$", re.I)
# "never mind", "always fun", "never give up", "keep going": idioms and encouragement, not wishes.
_IDLE = re.compile(r"^(?:never mind|nevermind|never again|stop it|stop that|"
                   r"(?:always|never) (?:a|an|the|fun|good|happy|glad|nice|great|here|there|been|so|too|very|"
                   r"really|my|your|his|her|our|their|in|on|at|for|with|gonna|going|ready|down|up|around|"
                   r"together|forget|give up|stop (?:believing|dreaming|trying|learning|smiling))|"
                   r"keep (?:going|it up|up the good work|the good work|pushing|smiling|shining|rocking|trying|"
                   r"dreaming|at it|on)|don'?t give up)\b", re.I)
_NO_VERB = {"here", "there", "been", "so", "too", "very", "really", "the", "a", "an", "my", "your", "in", "on",
            "at", "for", "with", "gonna", "ready", "together", "around", "up", "down"}


# --------------------------------------------------------------------------- points

_LANGUAGES = ("english|french|spanish|german|italian|portuguese|dutch|russian|japanese|chinese|mandarin|"
              "korean|arabic|hindi|polish|swedish|norwegian|danish|finnish|greek|turkish|hebrew|ukrainian|czech")
_POINTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((p, re.compile(r, re.I)) for p, r in (
    ("address", r"\b(?:call(?:ing)? me|address(?:ing)? me|refer(?:ring)? to me|my name(?:'s| is)|i go by|"
                r"nickname|use my (?:real |full |first )?name)\b"),
    ("pronouns", r"\b(?:pronouns?|(?:she|he|they)/(?:her|him|them))\b"),
    ("spelling", r"\b(?:british|american|us|uk|canadian|australian) (?:spelling|english)\b|\bspell(?:ing|ings)?\b"),
    ("language", rf"\b(?:in|speak|speaking|use|reply in|answer in|write in)\s+(?:{_LANGUAGES})\b|\b(?:{_LANGUAGES})\b"),
    ("format:emoji", r"\bemoj(?:i|is)\b|\bemoticons?\b"),
    ("format:types", r"\btype (?:hints?|annotations?)\b"),
    ("format:line_numbers", r"\b(?:line numbers?|number(?:ed)? (?:the |its |their )?lines)\b"),
    ("code_language", r"\b(?:python|javascript|typescript|golang|kotlin|php|c\+\+|java)\b"),
    ("format:code", r"\b(?:code|snippets?|syntax)\b"),
    ("format:visual", r"\b(?:diagrams?|charts?|drawings?|sketches)\b"),
    ("format:tables", r"\b(?:tables?|side-by-side)\b"),
    ("format:lists", r"\b(?:bullet(?:s| points?)?|numbered lists?|lists?)\b"),
    ("format:markdown", r"\b(?:markdown|headers?|headings?|bold|italics?|formatting|plain text)\b"),
    ("format:summary", r"\b(?:(?:one-line |short )?summar(?:y|ies) (?:at the top|first)|bottom line|conclusion first|"
                       r"tl;?dr (?:first|at the top))\b"),
    ("length", r"\b(?:short(?:er)?|brief(?:er)?|concise|succinct|long(?:er)?|lengthy|detail(?:s|ed)?|in depth|"
               r"in-depth|verbose|wordy|ramble|rambling|tl;?dr|one(?:-| )(?:line|sentence|word)|few sentences|"
               r"to the point|elaborate|thorough|essays?|walls? of text)\b"),
    # Ways of explaining and of speaking that can hold together ("step by step" and "with analogies";
    # "casual" and "no swearing"): each its own point, so one does not retire the other.
    ("explain:steps", r"\b(?:numbered steps|step[- ]by[- ]step|(?:broken|break(?:ing)?) (?:\w+ )?into steps|one step at a time)\b"),
    ("explain:analogies", r"\b(?:analog(?:y|ies)|everyday (?:comparisons?|things|examples)|metaphors?)\b"),
    ("explain:level", r"\b(?:eli5|simple (?:terms|words|language)|jargon|technical|beginner|like i'?m five)\b"),
    ("explain:examples", r"\bexamples?\b"),
    ("explain", r"\bexplain(?:ing|ations?)?\b"),
    ("tone:register", r"\b(?:formal|informal|casual|polite)\b"),
    ("tone:language", r"\b(?:swear(?:ing)?|curs(?:e|ing)|profanity)\b"),
    ("tone:humour", r"\b(?:sarcas(?:m|tic)|jokes?|joking|puns?|humou?r|serious|cheerful)\b"),
    ("tone:honesty", r"\b(?:blunt|honest|gentle|harsh|sugarcoat(?:ing)?)\b"),
    ("tone:apology", r"\b(?:apologi[sz](?:e|ing)|sorry)\b"),
    ("tone:praise", r"\b(?:flatter(?:y|ing)|compliments?)\b"),
    ("tone", r"\btone\b"),
    ("units:temperature", r"\b(?:celsius|fahrenheit)\b"),
    ("units", r"\b(?:metric|imperial|kilomet(?:er|re)s?|grams|kilograms|"
              r"ounces|metres|meters)\b"),
    ("diet", r"\b(?:vegetarian|vegan|pescatarian|plant-based|gluten[- ]free|dairy[- ]free|halal|kosher|"
             r"without meat|eat (?:meat|pork|fish|dairy|gluten|eggs))\b"),
    ("budget", r"\b(?:budget(?:-friendly)?|cheap(?:er)?|inexpensive|affordable|low[- ]cost)\b"),
    ("greeting", r"\b(?:greet(?:ing)?|good morning|say (?:hi|hello)|sign[- ]off)\b"),
))
_TOPIC = re.compile(
    r"\b(?:bring(?:ing)? up|mention(?:ing)?|talk(?:ing)? about|ask(?:ing)? (?:me )?about|discuss(?:ing)?|"
    r"remind(?:ing)? me (?:of|about)|joke about|get into|raise|avoid(?:ing)?|the subject of|the topic of)\s+(?P<what>.+)",
    re.I)
_FILLER = {"a", "an", "the", "my", "his", "her", "their", "our", "your", "me", "any", "anything", "about",
           "again", "anymore", "any more", "ever", "please", "now", "from", "on", "to", "of", "with", "or", "and",
           "that", "this", "those", "these", "it", "stuff", "things", "thing", "topic", "subject", "going",
           "forward", "future", "in", "at", "all", "okay", "ok", "you", "i", "so", "just", "really", "be",
           "do", "not", "don't", "dont", "is", "are", "always", "never", "when", "if", "want", "like", "for"}
_WORD = re.compile(r"[a-z0-9][a-z0-9'-]*")


def _key_words(text: str, n: int) -> str:
    words = [w for w in _WORD.findall(text.lower()) if w not in _FILLER]
    return " ".join(words[:n])


def point_of(rest: str) -> str | None:
    """What the words after a cue are about: a known point, a ``topic:…`` to avoid (or allow
    again), or None."""
    topic = _TOPIC.search(rest)
    if topic is not None:
        said = re.split(r"[,;.!?]| (?:because|since|unless|as|when|until|if|and)\b", topic.group("what"))[0]
        what = _key_words(said, 3)
        if what and not any(p.search(said) for name, p in _POINTS if not name.startswith("tone")):
            return "topic:" + what
    for name, pattern in _POINTS:
        if pattern.search(rest):
            return name
    return None


def trimmed(sentence: str, limit: int = MAX_CHARS) -> str:
    """The sentence on one line, at most ``limit`` characters (cut at a word, marked with …)."""
    text = " ".join(sentence.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0]
    return cut + "…"


# A clause that follows a reason ("I'm a beginner, so please avoid jargon"; "...; keep it short").
_THEN_CLAUSE = re.compile(r"(?:,\s*(?:and )?so|;)\s+", re.I)


def sentence_wish(sentence: str, limit: int = MAX_CHARS) -> Wish | None:
    """The wish a sentence states, or None (module doc: what is and is not one): the whole sentence
    first, then each clause after a "…, so" or ";", kept with the whole sentence's text."""
    wish = _clause_wish(sentence, limit)
    if wish is None:
        for clause in _THEN_CLAUSE.split(sentence)[1:]:
            found = _clause_wish(clause, limit)
            if found is not None:
                return Wish(found.point, trimmed(sentence, limit))
    return wish


def _clause_wish(sentence: str, limit: int) -> Wish | None:
    s = " ".join(sentence.replace("’", "'").split())
    if s.endswith("?"):  # a question, unless a polite request ("could you please call me Sam?")
        polite = _POLITE.match(s)
        if polite is None:
            return None
        s = s[polite.end():].rstrip("?")
    if not s or _IDLE.match(s):
        return None
    strong = _STRONG.match(s)
    if strong is not None and strong.group("verb") and (
            strong.group("verb").lower() in _NO_VERB or _IDLE.match(s[strong.start("cue"):])):
        strong = None  # "Always here to help.", "Keep going and never give up!"
    if strong is not None:
        verb = strong.group("verb")
        if verb is not None and _NOT_IMPERATIVE.match(verb) and verb.lower() not in _BASE_VERBS:
            return None  # "never went", "always loved", "always says": a statement, not a wish
        point = point_of(s)
        rest = _key_words(s[strong.start("verb") if strong.group("verb") else strong.end("cue"):], 4)
        return Wish(point or "general:" + rest, trimmed(sentence, limit)) if point or rest else None
    ordered = _IMPERATIVE.match(s)
    if ordered is not None and (_STANDING.search(s) or (_HABIT.match(s) and not _ONE_OFF.search(s))):
        point = point_of(s)
        rest = _key_words(s[ordered.start("cue"):], 4)
        return Wish(point or "general:" + rest, trimmed(sentence, limit)) if point or rest else None
    weak = _WEAK.match(s) or _PREFERS.search(s)
    if weak is None or _ONE_OFF.search(s):
        return None
    point = point_of(s)
    return None if point is None else Wish(point, trimmed(sentence, limit))


# Base verbs the past/-ing/-s filter would otherwise take for "went", "saying" or "says".
_BASE_VERBS = {"bring", "sing", "ring", "string", "swing", "need", "feed", "proceed", "embed", "heed", "succeed",
               "discuss", "focus", "address", "dress", "express", "guess", "pass", "press", "stress", "miss", "bless",
               "cross", "kiss", "toss", "process", "access", "mess", "use", "assess"}


def detect(text: str, *, limit: int = MAX_CHARS) -> list[Wish]:
    """The wishes a person's message states, in order; one per point (the last sentence on a point wins)."""
    if not isinstance(text, str):
        raise TypeError(f"detect() takes a message's text (str), got {type(text).__name__}")
    found: dict[str, Wish] = {}
    for sentence in sentences(text):
        wish = sentence_wish(sentence, limit)
        if wish is not None:
            found.pop(wish.point, None)
            found[wish.point] = wish
    return list(found.values())


# --------------------------------------------------------------------------- wishes a model found

def said_in(text: str, paraphrase: str, *, limit: int = MAX_CHARS) -> Wish | None:
    """The wish a model says ``text`` states (its ``paraphrase``: "Ana wants to be called Sam"), as the
    sentence of ``text`` that says it, or None when no unquoted sentence shares a content word with it.

    Where the extractor runs it finds wishes the heuristic's cues miss ("it's Sam for me from here"),
    but the pinned line is still the person's own words, and a claim no sentence backs (a misread,
    or a wish only inside a quote) pins nothing. The point is the sentence's, else the paraphrase's,
    else its own leading words (as for a wish on no known point).
    """
    wanted = set(_key_words(paraphrase, 50).split())
    best, best_shared = None, 0
    for sentence in sentences(text):
        shared = len(wanted & set(_key_words(sentence, 50).split()))
        if shared > best_shared:
            best, best_shared = sentence, shared
    if best is None:
        return None
    point = (point_of(best) or point_of(paraphrase) or ("address" if _CALLED.search(paraphrase) else None)
             or "general:" + _key_words(best, 4))
    return Wish(point, trimmed(best, limit))


# How a paraphrase says the address point ("Ana wants to be called Sam", "... addressed as Dr. Lee").
_CALLED = re.compile(r"\b(?:be called|called by|addressed as|referred to as|go by|goes by|name (?:is|as))\b", re.I)
