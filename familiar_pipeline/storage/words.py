"""The words an erasure takes out, and the redaction of the familiar's replies that repeat them.

A person's *distinctive words* are the words of their erased messages that no surviving message
of anyone else uses: a word someone else also said is not theirs to take out of other people's
lines. The turn log uses them when an erasure is recorded (the familiar's replies that repeat
them are redacted, `TurnLog.request_erasure`); the purge uses them to scrub the files it cannot
rebuild and to check that nothing holds them any more (`familiar_pipeline.erasure`).

A word is a maximal run of four or more letters or digits, compared case-insensitively: shorter
runs ("the", "my", "ok") say nothing of a person, and cutting on runs (not on a regular expression
of the words) keeps a scan linear in the text, whatever the number of words.
"""

from __future__ import annotations

import re
from typing import Iterable

ERASED = "[erased]"
WORD = re.compile(r"[^\W_]{4,}")
# The same cut in DuckDB's SQL: the words of a text column, as a list (format `column`).
SQL_WORDS = "regexp_extract_all(lower(coalesce({column}, '')), '[\\pL\\pN]{{4,}}')"
# The words looked for, as a DuckDB temporary table: rows holding one are found by a hash join, not a
# list search per row (thousands of words against every row of a table).
SQL_WORD_TABLE = "CREATE OR REPLACE TEMP TABLE erased_words AS SELECT DISTINCT unnest(?::VARCHAR[]) AS w"


def words_of(text: str | None) -> set[str]:
    """The words of `text`, lower-cased."""
    return {w.lower() for w in WORD.findall(text or "")}


def distinctive_words(erased: Iterable[str], surviving: Iterable[str]) -> set[str]:
    """Words of the erased texts that no surviving text uses (case-insensitively)."""
    gone: set[str] = set()
    for text in erased:
        gone |= words_of(text)
    if not gone:
        return gone
    for text in surviving:
        gone -= words_of(text)
        if not gone:
            break
    return gone


def holds_any(text: str | None, words: frozenset[str] | set[str]) -> bool:
    """Whether `text` holds one of `words` (lower-cased) as a whole word."""
    return bool(words and text) and any(w.lower() in words for w in WORD.findall(text or ""))


def redact(text: str, words: frozenset[str] | set[str]) -> str:
    """`text` with each of `words` (lower-cased), as a whole word in any case, replaced by ``[erased]``."""
    if not words:
        return text
    return WORD.sub(lambda m: ERASED if m.group().lower() in words else m.group(), text)


def sql_rows_holding(source: str, columns: tuple[str, ...] | list[str], key: str = "rowid") -> str:
    """DuckDB SQL selecting `key` of the rows of `source` whose `columns` hold a word of the temporary
    table `SQL_WORD_TABLE` made."""
    words = " || ".join(SQL_WORDS.format(column=c) for c in columns)
    return (f"SELECT DISTINCT u.k FROM (SELECT {key} AS k, unnest({words}) AS w FROM {source}) u "
            "SEMI JOIN erased_words e ON e.w = u.w")
