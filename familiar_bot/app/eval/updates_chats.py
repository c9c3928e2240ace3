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

Two modules along the one seam there is: the word banks the chats are drawn from
(``updates_banks``: templates, scenarios, look-alikes, names; data only) and, here, the
chats' data model, the generator and the checks the test asserts. ``generate_chat`` stays
one function: every choice is a draw from one ``random.Random`` in a fixed order, so its
phases (updates, wishes and preferences, ordering, the session layout) share the stream and
the probe counter, and cutting them apart would only pass those two around.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Sequence

from familiar_bot.app.eval.updates_banks import (ACKS, ASK_WRAP, CLOSERS, ECHO_REPLIES, EXES, FILLER, LEADS,
                                                 LOOKALIKE_REPLIES, OPENERS, ORDER_ASK, ORDER_DETAIL, ORDER_ECHO,
                                                 ORDER_MENTION, ORDER_TOPICS, PEOPLE, PREFERENCES, RECURRING,
                                                 RECURRING_ASK, RECURRING_ECHO, SLOTS, TASK_WRAP, UPDATE_SCENARIOS,
                                                 WISH_DISTRACTORS, WISHES)

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

_FIELD = string.Formatter()


def fill(template: str, rng: random.Random, **fixed: str) -> str:
    """``template`` with each ``{slot}`` from ``fixed``, else a random choice from ``SLOTS`` (one draw per slot)."""
    values: dict[str, str] = dict(fixed)
    for _, name, _, _ in _FIELD.parse(template):
        if name and name not in values:
            values[name] = rng.choice(SLOTS[name])
    text = template.format(**values)
    return text[:1].upper() + text[1:]


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
