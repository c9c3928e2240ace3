"""Time in the cue: the dates a message asks about, as windows of local days.

A turn's text rarely carries its own date ("got a new car"); its timestamp
does. So when a cue names a time ("in March 2023", "on 7 July", "last week",
"the week before August 3"), retrieval gives a boost to the turns *said* in
that window, and for a while after it: people report an event after it happened
("I went to the fair yesterday"), never before. Rules, not a model:

* absolute dates: ``2023-07-07``, ``7 July 2023``, ``July 7th, 2023``,
  ``March 2023``, ``in 2023``; a day or month without a year ("on 7 July",
  "in June") matches that day or month of any year;
* relative to now, in ``display_tz`` (the days people speak in): today,
  tonight, yesterday, last night, this/last week, weekend, month, year,
  "N days/weeks/months/years ago", "last Friday", "last June";
* seasons (northern hemisphere): "summer 2023", "last winter", "in the fall";
* anchored: a date after "before" widens to the two weeks up to it ("the
  week before 9 June"), after "after" to the two weeks from it.

Vague words ("recently", "before the trip") are not resolved: a window that
covers everything favours nothing. English only. Whether the cue asks for a
time ("when did ...", "what year ...") is reported too (:attr:`TimeCue.asks_when`):
the turns that carry a time expression are the ones an answer's date comes from.

Nothing here raises on text: impossible dates ("31 February", year 99999) are
skipped, and the cue is read only up to :data:`MAX_CUE_CHARS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo

MAX_CUE_CHARS = 2000
MIN_YEAR, MAX_YEAR = 1900, 2200
ANCHOR_DAYS = 14  # "before DATE" / "after DATE": the two weeks up to or from it
MAX_AGO = 200  # "N units ago" beyond this is not a date anyone means

MONTHS = {name: n for n, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
    ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sept", "sep"),
    ("october", "oct"), ("november", "nov"), ("december", "dec")), start=1) for name in names}
FULL_MONTHS = {name for name in MONTHS if len(name) > 3 or name == "may"}
WEEKDAYS = {name: n for n, name in enumerate(
    ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))}
SEASONS = {"spring": (3, 5), "summer": (6, 8), "fall": (9, 11), "autumn": (9, 11), "winter": (12, 2)}
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a couple": 2,
           "couple of": 2, "a few": 3, "few": 3, "several": 4}

_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"
_NUMBER = r"(?P<n>\d{1,4}|" + "|".join(sorted(map(re.escape, NUMBERS), key=len, reverse=True)) + ")"
_UNIT = r"(?P<unit>day|week|weekend|month|year)s?"

# Order matters: longer forms first, and each match masks its span from later patterns.
PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple((kind, re.compile(rx)) for kind, rx in (
    ("iso", r"\b(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})\b"),
    ("day", rf"\b{_DAY}(?:\s+of)?\s+{_MONTH}(?:,?\s+{_YEAR})?\b"),
    ("day", rf"\b{_MONTH}\s+{_DAY}(?!\d)(?:,?\s+{_YEAR})?\b(?!\s*:)"),
    ("month", rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}\b"),
    ("season", r"\b(?P<rel>last|this|past)\s+(?P<season>spring|summer|fall|autumn|winter)\b"),
    ("season", r"\b(?P<season>spring|summer|fall|autumn|winter)(?:\s+of)?\s+(?P<year>\d{4})\b"),
    ("season", r"\b(?:in|during|over|through|throughout)\s+(?:the\s+)?(?P<season>spring|summer|fall|autumn|winter)\b"),
    ("rel_month", rf"\b(?P<rel>last|this|past)\s+{_MONTH}\b"),
    ("bare_month", rf"\b(?:in|during|since|early|late|mid|until|through|throughout)[\s-]+{_MONTH}\b"),
    ("year", rf"\b(?:in|during|since|from|around|back in|year|of|until|through)\s+{_YEAR}\b"),
    ("ago", rf"\b{_NUMBER}\s+{_UNIT}\s+ago\b"),
    ("rel_unit", rf"\b(?P<rel>last|this|past|previous)\s+{_UNIT}\b"),
    ("weekday", r"\b(?P<rel>last|this|past|on)\s+(?P<weekday>monday|tuesday|wednesday|thursday|friday|saturday"
                r"|sunday)\b"),
    ("day_word", r"\b(?P<word>the day before yesterday|yesterday|today|tonight|last night|this morning"
                 r"|this afternoon|this evening)\b"),
))
_ANCHOR = re.compile(r"\b(?P<side>before|after|prior to|since)\W+(?:\w+\W+){0,1}$")
_ASKS_WHEN = re.compile(
    r"\bwhen(?:'s|\s+(?:did|do|does|was|were|is|are|will|has|have|had|would|could))\b"
    r"|\bwhat\s+(?:date|day|time|year|month|week)\b|\bhow\s+long\s+ago\b|\bsince\s+when\b|\bwhich\s+(?:year|month|day)\b")
_TIME_WORDS = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|ago|weekend|recently|lately"
    r"|(?:last|this|next|past)\s+(?:night|week|month|year|morning|evening|summer|winter|spring|fall|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    r"|january|february|march|april|june|july|august|september|october|november|december"
    r"|(?:19|20)\d\d)\b", re.IGNORECASE)


@dataclass(frozen=True)
class TimeCue:
    """The local-day windows a cue names, and whether it asks for a time.

    ``windows``: ``(first day, day after the last)`` pairs in the familiar's
    ``display_tz``; ``yearly``: ``(month, day or None)`` of dates given without
    a year, matched in any year.
    """

    windows: tuple[tuple[date, date], ...] = ()
    yearly: tuple[tuple[int, int | None], ...] = ()
    asks_when: bool = False
    phrases: tuple[str, ...] = field(default=(), compare=False)  # what was read, for the debug structure

    @property
    def dated(self) -> bool:
        return bool(self.windows or self.yearly)

    def strength(self, moment: datetime, tz: tzinfo, slack_days: float) -> float:
        """How well a turn said at ``moment`` fits the named time, in [0, 1].

        Inside a window: its precision, 1.0 for a week or less and ``sqrt(7 / days)``
        for a wider one (a month 0.48, a year 0.14: "in 2023" says less about a turn
        than "on 7 July"). After a window it fades linearly to 0 over ``slack_days``
        or the window's own length if longer (a March event may be told in April);
        ``slack_days`` 0: no fade. Before a window: 0. The best window counts."""
        if not self.dated:
            return 0.0
        day = moment.astimezone(tz).date()
        spans = list(self.windows)
        for year in (day.year, day.year - 1):
            spans += [span for spec in self.yearly if (span := _yearly_span(spec, year)) is not None]
        return max((_fit(day, start, end, slack_days) for start, end in spans), default=0.0)


def has_time_words(text: str) -> bool:
    """Whether a turn carries a time expression ("yesterday", "last week", a month, a year)."""
    return bool(_TIME_WORDS.search(text[:MAX_CUE_CHARS]))


PRECISE_DAYS = 7  # a window this long or shorter counts in full


def _fit(day: date, start: date, end: date, slack_days: float) -> float:
    if day < start:
        return 0.0
    length = max(1, (end - start).days)
    precision = min(1.0, (PRECISE_DAYS / length) ** 0.5)
    if day < end:
        return precision
    if slack_days <= 0:
        return 0.0
    fade = max(slack_days, length)
    late = (day - end).days + 1
    return precision * max(0.0, 1.0 - late / (fade + 1))


def _yearly_span(spec: tuple[int, int | None], year: int) -> tuple[date, date] | None:
    month, day = spec
    try:
        if day is None:
            return date(year, month, 1), _month_end(year, month)
        start = date(year, month, day)
    except ValueError:  # 29 February in a common year
        return None
    return start, start + timedelta(days=1)


def _month_end(year: int, month: int) -> date:
    return date(year + (month == 12), month % 12 + 1, 1)


def parse_time_cue(cue: str, now: datetime, tz: tzinfo) -> TimeCue:
    """The :class:`TimeCue` of ``cue`` asked at ``now`` (aware), with days in ``tz``."""
    text = cue[:MAX_CUE_CHARS].lower()
    today = now.astimezone(tz).date()
    windows: list[tuple[date, date]] = []
    yearly: list[tuple[int, int | None]] = []
    phrases: list[str] = []
    masked = text
    for kind, pattern in PATTERNS:
        for match in pattern.finditer(masked):
            try:
                spans, every_year = _resolve(kind, match.groupdict(), today)
            except (ValueError, OverflowError, KeyError):  # an impossible date: not a time the cue names
                continue
            if not spans and not every_year:
                continue
            anchor = _ANCHOR.search(masked[:match.start()])
            if anchor is not None and kind in ("iso", "day", "month", "year"):
                spans = [_anchored(span, anchor.group("side")) for span in spans]
            windows += spans
            yearly += every_year
            phrases.append(match.group(0))
        # Mask what matched so "7 July 2023" is not read again as "July 2023" or "in 2023".
        masked = pattern.sub(lambda m: " " * len(m.group(0)), masked)
    return TimeCue(tuple(windows), tuple(yearly), bool(_ASKS_WHEN.search(text)), tuple(phrases))


def _anchored(span: tuple[date, date], side: str) -> tuple[date, date]:
    start, end = span
    if side in ("before", "prior to"):
        return start - timedelta(days=ANCHOR_DAYS), end
    return start, end + timedelta(days=ANCHOR_DAYS)


Spans = list[tuple[date, date]]
Yearly = list[tuple[int, int | None]]


def _resolve(kind: str, g: dict, today: date) -> tuple[Spans, Yearly]:
    """``(windows, yearly specs)`` of one match; both empty when it names no usable time.

    Raises ValueError for an impossible date (the caller skips the match)."""
    if kind in ("iso", "day"):
        month = int(g["month"]) if kind == "iso" else MONTHS[g["month"]]
        day = int(g["day"])
        if g.get("year") is None:
            if kind == "day" and g["month"] not in FULL_MONTHS:
                return [], []  # "jan 5" with no year is too often a name and a number
            date(2000, month, day)  # raises for a day no month has
            return [], [(month, day)]
        start = date(_year(g["year"]), month, day)
        return [(start, start + timedelta(days=1))], []
    if kind == "month":
        year, month = _year(g["year"]), MONTHS[g["month"]]
        return [(date(year, month, 1), _month_end(year, month))], []
    if kind == "bare_month":
        return ([], [(MONTHS[g["month"]], None)]) if g["month"] in FULL_MONTHS else ([], [])
    if kind == "rel_month":
        month = MONTHS[g["month"]]
        year = today.year if (g["rel"] == "this" or month < today.month) else today.year - 1
        return [(date(year, month, 1), _month_end(year, month))], []
    if kind == "year":
        year = _year(g["year"])
        return [(date(year, 1, 1), date(year + 1, 1, 1))], []
    if kind == "season":
        return _season(g.get("rel"), g["season"], g.get("year"), today)
    if kind == "ago":
        return _ago(g["n"], g["unit"], today), []
    if kind == "rel_unit":
        return [_relative_unit(g["rel"], g["unit"], today)], []
    if kind == "weekday":
        weekday = today - timedelta(days=(today.weekday() - WEEKDAYS[g["weekday"]]) % 7 or 7)
        return [(weekday, weekday + timedelta(days=1))], []
    word = g["word"]
    named = today - timedelta(days={"yesterday": 1, "last night": 1, "the day before yesterday": 2}.get(word, 0))
    # "last night" may be told the next morning: keep the day after in the window.
    return [(named, named + timedelta(days=2 if word == "last night" else 1))], []


def _year(text: str) -> int:
    year = int(text)
    if not MIN_YEAR <= year <= MAX_YEAR:
        raise ValueError(f"year {year} is out of range")
    return year


def _season(rel: str | None, name: str, year_text: str | None, today: date) -> tuple[Spans, Yearly]:
    """A season's months (winter runs December to February, into the next year)."""
    first, last = SEASONS[name]
    months = [(first + i - 1) % 12 + 1 for i in range(3)]
    if rel is None and year_text is None:
        return [], [(m, None) for m in months]
    if year_text is not None:
        year = _year(year_text)
    else:
        # The season as it started in the latest year it has started by today ("this").
        year = today.year if today.month >= first else today.year - 1
        if rel in ("last", "past"):
            end = _month_end(year + (first > last), last)
            if end > today:  # still running (or not begun): "last" is the one before
                year -= 1
    return [(date(year, first, 1), _month_end(year + (first > last), last))], []


def _ago(raw: str, unit: str, today: date) -> Spans:
    n = int(raw) if raw.isdigit() else NUMBERS[raw]
    if not 0 < n <= MAX_AGO:
        return []
    if unit == "day":
        day = today - timedelta(days=n)
        return [(day - timedelta(days=1), day + timedelta(days=2))]
    if unit in ("week", "weekend"):
        centre = today - timedelta(days=7 * n)
        return [(centre - timedelta(days=4), centre + timedelta(days=4))]
    if unit == "month":
        year, month = divmod(today.year * 12 + today.month - 1 - n, 12)
        return [(date(year, month + 1, 1), _month_end(year, month + 1))] if year >= MIN_YEAR else []
    year = today.year - n
    return [(date(year, 1, 1), date(year + 1, 1, 1))] if year >= MIN_YEAR else []


def _relative_unit(rel: str, unit: str, today: date) -> tuple[date, date]:
    back = rel != "this"
    if unit == "day":
        day = today - timedelta(days=1 if back else 0)
        return day, day + timedelta(days=1)
    if unit == "week":
        monday = today - timedelta(days=today.weekday()) - timedelta(days=7 if back else 0)
        return monday, monday + timedelta(days=7)
    if unit == "weekend":
        saturday = today - timedelta(days=(today.weekday() - 5) % 7)
        if back and saturday >= today - timedelta(days=1):
            saturday -= timedelta(days=7)
        return saturday, saturday + timedelta(days=2)
    if unit == "month":
        year, month = today.year, today.month
        if back:
            year, month = (year - 1, 12) if month == 1 else (year, month - 1)
        return date(year, month, 1), _month_end(year, month)
    year = today.year - (1 if back else 0)
    return date(year, 1, 1), date(year + 1, 1, 1)
