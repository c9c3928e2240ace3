"""People in the cue: which participants a message names, and how a turn relates to them.

"Which event did Calvin attend in Boston?" is answered by Calvin's turns, or by
turns that talk about Calvin; not by Dave's gala in Boston, and not by "Thanks,
Calvin!" (a turn *addressed* to him, which says nothing about him). BM25 over
"speaker: text" cannot tell these apart: the name is one rare word either way.

* :class:`Directory`: every name each account is known by, read from the turn
  log (:meth:`TurnLog.names_known`: profile names, guild nicknames, the display
  names its turns were written under), casefolded and split into words.
* :func:`read_people`: the accounts a cue names, by a whole name, a first name
  ("Calvin" for "Calvin Reyes"), or a capitalised short form of one
  ("Mel" for "Melanie"). A lowercase word counts only when it is not a
  common word ("will", "may"). When several people are named and some only
  possessively ("what did Jon say about *Gina's* store"), the possessive ones
  are what is talked about, not who talks.
* :meth:`PeopleCue.relation`: 1.0 for a turn by a named person, ``mention`` for a
  turn by someone else that names them (their name, a nickname, a ``<@id>``
  ping) other than as a form of address, 0.0 otherwise. "Hey Calvin,",
  "Thanks, Mel!", "Wow Calvin, ..." are addresses: the name stands alone in its
  clause, after nothing but a greeting or a comma, and before punctuation.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from familiar_pipeline.storage.fts import STOPWORDS

MAX_CUE_CHARS = 2000
MAX_TEXT_CHARS = 4000  # of a turn, when looking for names in it
MIN_SHORT_FORM = 3  # letters of a capitalised short form ("Mel")
MAX_NAME_WORDS = 6  # a longer display name is matched by its first word only
MAX_PEOPLE = 8  # people of one cue looked for in the candidates' texts
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
# Words a clause may hold before a name that it addresses ("hey", "thanks", "wow").
GREETINGS = frozenset("""
    hey hi hello heya hiya yo oh ooh wow whoa aw aww awww thanks thank thx ty you so much congrats
    congratulations sorry yes yeah yep yup no nope ok okay dear good morning evening night afternoon
    haha hahaha lol omg well great nice cool sure right alright hmm um welcome back bye see later
    love miss ah ahh same happy birthday
""".split())
# Common words that are also names people use ("Will", "May", "Bill"): matched only when capitalised.
COMMON_WORDS = STOPWORDS | frozenset("""
    will may can bill mark rose grace joy hope faith art bob pat sue max ray rob dawn summer june
    august april jack frank pearl ruby sky storm rain river sage page amber ivy lily violet guy
""".split())


@dataclass(frozen=True)
class Directory:
    """Names to accounts: ``aliases`` maps a name's words to the keys known by it."""

    aliases: Mapping[tuple[str, ...], frozenset[str]]
    words: Mapping[str, frozenset[str]]  # each single name word of 4+ letters, for short forms
    longest: int = 1
    ordered: tuple[str, ...] = ()  # ``words`` sorted, so a short form's names are one bisect away

    @classmethod
    def build(cls, names: Iterable[tuple[str, str]]) -> "Directory":
        aliases: dict[tuple[str, ...], set[str]] = {}
        words: dict[str, set[str]] = {}
        for key, name in names:
            parts = tuple(_WORD.findall(str(name).casefold()))
            if not parts or not any(len(p) >= 2 for p in parts):
                continue
            aliases.setdefault(parts, set()).add(key)
            if len(parts) > 1 and len(parts[0]) >= MIN_SHORT_FORM:
                aliases.setdefault(parts[:1], set()).add(key)  # a first name alone
            for part in parts:
                if len(part) > MIN_SHORT_FORM and part.isalpha():
                    words.setdefault(part, set()).add(key)
        aliases = {k: v for k, v in aliases.items() if len(k) <= MAX_NAME_WORDS}
        return cls({k: frozenset(v) for k, v in aliases.items()}, {k: frozenset(v) for k, v in words.items()},
                   max((len(k) for k in aliases), default=1), tuple(sorted(words)))

    def short_form(self, word: str) -> frozenset[str]:
        """Keys with a name word that ``word`` begins ("mel" -> melanie), if exactly one person has one."""
        keys: set[str] = set()
        at = bisect_left(self.ordered, word)
        while at < len(self.ordered) and self.ordered[at].startswith(word):
            if self.ordered[at] != word:
                keys |= self.words[self.ordered[at]]
                if len(keys) > 1:
                    return frozenset()
            at += 1
        return frozenset(keys)


@dataclass(frozen=True)
class PeopleCue:
    """The people a cue names: ``actors`` (who it asks about) and ``objects`` (named only as owners).

    ``forms`` holds, per key, the words the cue used for it and its known names,
    to find them in turn texts."""

    actors: frozenset[str] = frozenset()
    objects: frozenset[str] = frozenset()
    forms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    _patterns: dict = field(default_factory=dict, compare=False, repr=False)

    def __bool__(self) -> bool:
        return bool(self.actors or self.objects)

    def relation(self, author_key: str | None, text: str, mention: float) -> float:
        """1.0 for a turn by an actor; ``mention`` for one by an object or one naming a named person
        other than to address them; else 0.0."""
        if author_key in self.actors:
            return 1.0
        if author_key in self.objects:
            return mention
        for key in self.actors | self.objects:
            if key != author_key and self._names(key, text):
                return mention
        return 0.0

    def _names(self, key: str, text: str) -> bool:
        pattern = self._patterns.get(key)
        if pattern is None:
            pattern = self._patterns[key] = _name_pattern(key, self.forms.get(key, ()))
        return pattern is not None and any(not addressed(text, m.start(), m.end())
                                           for m in pattern.finditer(text[:MAX_TEXT_CHARS]))


def _name_pattern(key: str, forms: Iterable[str]) -> re.Pattern | None:
    options = sorted({re.escape(f) for f in forms if f}, key=len, reverse=True)
    platform, _, user_id = key.partition(":")
    if platform == "discord" and user_id.isdigit():
        options.append(rf"<@!?{user_id}>")
    if not options:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(options) + r")(?!\w)", re.IGNORECASE)


_CLAUSE_END = re.compile(r"[.!?\n;:]")


def addressed(text: str, start: int, end: int) -> bool:
    """Whether the name at ``text[start:end]`` addresses someone ("Hey Mel!", "Thanks, Mel.")
    rather than talks about them ("I told Mel", "Mel's car")."""
    after = text[end:end + 3]
    if after[:2] in ("'s", "’s"):
        return False
    before = text[max(0, start - 80):start]
    clause = _CLAUSE_END.split(before)[-1]
    pinged = text.startswith("<@", start) or clause.endswith("@")
    clause = clause.removesuffix("@")
    if pinged and not clause.strip():
        return True  # a ping opening the message ("@Mel look", "<@123> look") gets their attention
    rest = after.lstrip(" ")
    if rest and (rest[0].isalnum() or rest[0] in "'’-"):
        return False  # the sentence goes on through the name: "Mel said", "Mel and I"
    if clause.rstrip().endswith(",") or not clause.strip():
        return True
    words = [w.casefold() for w in _WORD.findall(clause)]
    return all(w in GREETINGS for w in words)


def read_people(cue: str, directory: Directory) -> PeopleCue:
    """The :class:`PeopleCue` of ``cue`` against the known names."""
    text = cue[:MAX_CUE_CHARS]
    tokens = [(m.group(0), m.start(), m.end()) for m in _WORD.finditer(text)]
    # Possessives are tokens of their own here ("Mel's" -> "mel", "s"): split the apostrophe off.
    words = [(w.split("'")[0].split("’")[0], s, e) for w, s, e in tokens]
    found: dict[str, list[bool]] = {}  # key -> per occurrence: possessive?
    forms: dict[str, set[str]] = {}
    i = 0
    while i < len(words):
        matched = 0
        for n in range(min(directory.longest, len(words) - i), 0, -1):
            span = words[i:i + n]
            name = tuple(w.casefold() for w, _, _ in span)
            keys = directory.aliases.get(name)
            if not keys:
                continue
            shown = text[span[0][1]:span[-1][2]]
            if n == 1 and not shown[:1].isupper() and name[0] in COMMON_WORDS:
                continue
            matched = n
            break
        keys_here = keys if matched else frozenset()
        if not matched:
            word, start, _ = words[i]
            if word[:1].isupper() and len(word) >= MIN_SHORT_FORM and word.casefold() not in COMMON_WORDS:
                keys_here = directory.short_form(word.casefold())
            matched = 1
        if keys_here:
            last = tokens[i + matched - 1]
            possessive = last[0].casefold().endswith(("'s", "’s")) or text[last[2]:last[2] + 2] in ("'s", "’s")
            for key in keys_here:
                found.setdefault(key, []).append(possessive)
                forms.setdefault(key, set()).add(" ".join(w for w, _, _ in words[i:i + matched]))
        i += matched
    if not found:
        return PeopleCue()
    if len(found) > MAX_PEOPLE:  # a cue naming a crowd singles nobody out; keep the first few (dicts keep order)
        found = dict(list(found.items())[:MAX_PEOPLE])
        forms = {k: forms[k] for k in found}
    plain = {k for k, marks in found.items() if not all(marks)}
    actors = frozenset(plain) if plain else frozenset(found)
    for key, names in directory_names(directory, found).items():
        forms[key] |= names
    return PeopleCue(actors, frozenset(found) - actors, {k: tuple(sorted(v)) for k, v in forms.items()})


def directory_names(directory: Directory, keys: Iterable[str]) -> dict[str, set[str]]:
    """Every known name of ``keys`` (whole names and their first words), to find them in turns."""
    wanted = set(keys)
    out: dict[str, set[str]] = {k: set() for k in wanted}
    for parts, owners in directory.aliases.items():
        for key in owners & wanted:
            out[key].add(" ".join(parts))
    return out
