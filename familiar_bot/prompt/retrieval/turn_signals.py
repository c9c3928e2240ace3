"""Evidence beyond the words: who said a turn, when, and what it answered.

:func:`~familiar_bot.prompt.retrieval.ranking.fuse_turns` ranks turns by how their text matches the cue. Three
things a turn's text does not say, measured on LoCoMo to decide what a
question's evidence is (docs/benchmarks.md, "Who and when"), are added here on top:

* **speaker** (``turn_speaker_weight``): a cue naming a participant favours
  that participant's turns, and (``turn_mention_share`` of it) turns that talk
  about them, not turns addressed to them (:mod:`familiar_bot.prompt.retrieval.cue_people`);
* **time** (``turn_time_weight``): a cue naming a date or a relative time
  favours the turns said in that window and, fading over
  ``turn_time_slack_days``, just after it (:mod:`familiar_bot.prompt.retrieval.cue_time`);
  a cue asking *when* favours (``turn_when_share`` of it) turns that carry a
  time expression;
* **answers after questions** (``turn_reply_credit``): a question-like turn
  that ranks well passes that share of its score to the reply right after it
  (the next turn in its channel by someone else): "Which city did Tim
  suggest?" matches John's "where should we go?", and Tim's answer names the
  city without repeating the question's words.

Each signal is in [0, 1] and is added with its weight to the fused total
(whose parts are each min-max normalised to [0, 1]), so a weight reads as
"worth this share of a perfect text match". Everything here is pure but the
row reads, which go through the caller's functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Any, Callable, Iterable

from familiar_bot.prompt.retrieval.cue_people import PeopleCue
from familiar_bot.prompt.retrieval.cue_time import TimeCue, has_time_words

REPLY_SOURCES = 30  # the best-ranked candidates whose replies are looked up
REPLY_REACH = 4  # how far (in ids) after a question its reply is looked for


@dataclass(frozen=True)
class CueSignals:
    """What one cue asks about beyond its words, read once per reply."""

    people: PeopleCue
    time: TimeCue
    tz: tzinfo
    knobs: Any  # the familiar's RetrievalConfig: the turn_* weights named in the module docstring

    @property
    def active(self) -> bool:
        k = self.knobs
        return bool((k.turn_speaker_weight > 0 and self.people) or (k.turn_time_weight > 0 and self.time.dated)
                    or (k.turn_time_weight > 0 and k.turn_when_share > 0 and self.time.asks_when)
                    or k.turn_reply_credit > 0)

    def debug(self) -> dict[str, Any]:
        return {"people": sorted(self.people.actors), "people_objects": sorted(self.people.objects),
                "time": [f"{a.isoformat()}..{b.isoformat()}" for a, b in self.time.windows],
                "time_yearly": [list(spec) for spec in self.time.yearly], "asks_when": self.time.asks_when}


def is_question(text: str) -> bool:
    """A turn that asks something: it has a question mark (the reply right after it answers it)."""
    return "?" in text


def credit_replies(fused: list[dict], rows: dict[int, Any], reply_of: Callable[[list[Any]], dict[int, int]],
                   credit: float) -> list[dict]:
    """Each question among the best :data:`REPLY_SOURCES` candidates passes ``credit`` x its total
    to its reply (``reply_of``: question turn -> reply id); a reply keeps the larger of its own
    total and the credit. Replies that were not candidates join with the credit alone."""
    if credit <= 0:
        return fused
    questions = [f for f in fused[:REPLY_SOURCES]
                 if (t := rows.get(f["turn_id"])) is not None and is_question(t.content) and f["total"] > 0]
    if not questions:
        return fused
    replies = reply_of([rows[f["turn_id"]] for f in questions])
    by_id = {f["turn_id"]: f for f in fused}
    added: list[dict] = []
    for f in questions:
        reply = replies.get(f["turn_id"])
        if reply is None:
            continue
        given = credit * f["total"]
        entry = by_id.get(reply)
        if entry is None:
            entry = {"turn_id": reply, "bm25": None, "cosine": None, "total": 0.0,
                     "candidate_index": len(fused) + len(added)}
            by_id[reply] = entry
            added.append(entry)
        if given > entry["total"]:
            entry["total"] = given
            entry["reply_to"] = f["turn_id"]
    return fused + added


def next_replies(questions: list[Any], channel_of: Callable[[Iterable[int]], dict[int, int]],
                 rows_of: Callable[[Iterable[int]], list[Any]]) -> dict[int, int]:
    """``{question id: id of the first later turn in its channel by someone else}``, within
    :data:`REPLY_REACH` ids (stopping at the asker's own next turn)."""
    reach = {q.id: range(q.id + 1, q.id + 1 + REPLY_REACH) for q in questions}
    channels = channel_of({i for ids in reach.values() for i in ids})
    later = {t.id: t for t in rows_of({i for q in questions for i in reach[q.id]
                                        if channels.get(i) == q.channel_id})}
    out: dict[int, int] = {}
    for q in questions:
        for i in reach[q.id]:
            t = later.get(i)
            if t is None or t.channel_id != q.channel_id:
                continue
            if _same_speaker(t, q):
                break
            out[q.id] = t.id
            break
    return out


def _same_speaker(a, b) -> bool:
    if a.author_key or b.author_key:
        return a.author_key == b.author_key
    return a.role == b.role


def add_signals(fused: list[dict], rows: dict[int, Any], signals: CueSignals) -> list[dict]:
    """``fused`` with the speaker and time boosts added to each total, re-sorted (ties keep the order)."""
    k = signals.knobs
    people = signals.people if k.turn_speaker_weight > 0 else None
    dated = k.turn_time_weight > 0 and signals.time.dated
    when = k.turn_time_weight > 0 and k.turn_when_share > 0 and signals.time.asks_when and not dated
    for f in fused:
        turn = rows.get(f["turn_id"])
        if turn is None:
            continue
        boost = 0.0
        if people:
            speaker = people.relation(turn.author_key, turn.content, k.turn_mention_share)
            f["speaker"] = speaker
            boost += k.turn_speaker_weight * speaker
        if dated:
            at = signals.time.strength(_aware(turn.created_at), signals.tz, k.turn_time_slack_days)
            f["time"] = at
            boost += k.turn_time_weight * at
        elif when and has_time_words(turn.content):
            f["time"] = k.turn_when_share
            boost += k.turn_time_weight * k.turn_when_share
        f["total"] += boost
    return sorted(fused, key=lambda f: (-f["total"], f["candidate_index"]))


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


MAX_WINDOWS = 4  # time windows of one cue turned into turn-id ranges


def window_id_ranges(log, windows: Iterable[tuple[date, date]], tz: tzinfo,
                     slack_days: float) -> list[tuple[int, int]]:
    """``[(first id, last id)]`` of the turns said in each window (and its slack after).

    Found by bisecting the turn log on ``created_at``, which assumes ids grow with
    time, as they do for turns appended as they are said; history imported out of
    order only makes the range miss some of a window's turns (the boost still
    applies to them when the words or the cosine find them)."""
    latest = log.latest_id()
    if latest <= 0:
        return []
    ranges = []
    for start, end in list(windows)[:MAX_WINDOWS]:
        first = _first_id_at(log, day_start(start, tz), latest)
        after = _first_id_at(log, day_start(end, tz) + timedelta(days=slack_days), latest)
        if after > first:
            ranges.append((first, after - 1))
    return ranges


def _first_id_at(log, moment: datetime, latest: int) -> int:
    """The smallest id whose turn was written at or after ``moment`` (``latest + 1`` if none)."""
    low, high = 1, latest + 1
    while low < high:
        mid = (low + high) // 2
        probe = log.turns_after(mid - 1, limit=1)
        if not probe or probe[0].id > latest:
            high = mid
        elif _aware(probe[0].created_at) >= moment:
            high = mid
        else:
            low = probe[0].id + 1
    return low


def day_start(day: date, tz: tzinfo) -> datetime:
    """The instant a local day starts in ``tz``."""
    return datetime(day.year, day.month, day.day, tzinfo=tz)
