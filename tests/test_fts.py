"""The tantivy full-text indexes: analyzer, query safety, writes, retries, processes."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from familiar_pipeline.storage import fts
from familiar_pipeline.storage.fts import (
    COMMIT_RETRY_DELAYS_S,
    STOPWORDS,
    FtsError,
    FtsIndex,
    FtsLockedError,
    FtsReadOnlyError,
    analyze,
    is_transient_commit_error,
    retry_transient,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

TURNS = [
    (1, "The fox jumped over the moon."),
    (2, "I like strawberry jam."),
    (3, "The quick brown fox."),
    (4, "Rainy day in Seattle."),
    (5, "Anything with foxes is cool."),
    (6, "Cor's favourite thing is the café on Main Street."),
    (7, "We played chess at the foo bar yesterday."),
]


@pytest.fixture
def index():
    idx = FtsIndex(None)
    idx.upsert_many(TURNS)
    assert idx.commit()
    yield idx
    idx.close()


def ids(hits):
    return [row_id for row_id, _ in hits]


# --- analyzer ---------------------------------------------------------------


def test_stopword_list_is_the_87_words():
    assert len(STOPWORDS) == 87
    assert {"a", "lol", "hey", "know", "yours", "anything"} <= STOPWORDS
    assert "fox" not in STOPWORDS


def test_analyzer_stems_folds_and_drops_stopwords():
    assert analyze("fox") == analyze("foxes")
    assert analyze("strawberry") == analyze("strawberries")
    assert analyze("Café NAÏVE") == analyze("cafe naive")
    assert analyze("Hey, do you know anything about the fox?") == analyze("fox")
    assert analyze("hi the a do you") == []


def test_analyzer_drops_tokens_of_64_bytes_or_more():
    assert analyze("a" * 63) == ["a" * 63]
    assert analyze("b" * 64 + " fox") == analyze("fox")


def test_analyzer_accepts_any_string_but_only_strings():
    assert analyze("\ud800fox\udfff") == analyze("fox")  # lone surrogates cannot reach Rust as-is
    assert analyze("") == []
    with pytest.raises(TypeError):
        analyze(None)  # type: ignore[arg-type]


# --- search semantics ---------------------------------------------------------


def test_stemming_finds_plural_and_singular(index):
    assert sorted(ids(index.search("fox", 10))) == [1, 3, 5]
    assert ids(index.search("strawberries", 10)) == [2]


def test_ascii_folding_matches_both_ways(index):
    assert ids(index.search("cafe", 10)) == [6]
    assert ids(index.search("CAFÉ", 10)) == [6]


@pytest.mark.parametrize("query", ["", "   ", "hi the a do you", "lol ok yes", "?!", "zyzzyx"])
def test_queries_without_a_matching_token_return_nothing(index, query):
    assert index.search(query, 10) == []


def test_non_positive_limit_returns_nothing(index):
    assert index.search("fox", 0) == []
    assert index.search("fox", -3) == []


HOSTILE_QUERIES = {
    "what's Cor's \"thing\"?": 6,
    "content:foo": 7,
    "foo AND (bar OR": 7,
    'row_id:[1 TO 9] "fox': 1,
    "fox\x00": 1,
    "🦊 fox 🦊🔥": 1,
    "\u202efox\u202c": 1,  # right-to-left override around the word
    "fo\u200bx fox\u200d": 1,  # zero-width space and joiner
    "fox" + "\u0301": 1,  # a stray combining accent folds away
}


@pytest.mark.parametrize("query,expected_id", HOSTILE_QUERIES.items())
def test_hostile_queries_never_raise_and_still_find_the_words(index, query, expected_id):
    assert expected_id in ids(index.search(query, 10))


@pytest.mark.parametrize(
    "query", ["*", "+-^~:", "\x00", "🦊🔥👍🏽", "?!:'\"()[]{}" * 1000, "\ud800", "\u202e\u200b\u2066", "AND OR NOT"]
)
def test_queries_of_pure_syntax_or_noise_return_nothing(index, query):
    assert index.search(query, 10) == []


def test_a_huge_wordy_query_is_fine(index):
    cue = " ".join(f"w{i}" for i in range(2000)) + " strawberry"
    assert ids(index.search(cue, 5)) == [2]


def test_or_semantics_a_long_chatty_cue_finds_a_doc_sharing_one_word(index):
    cue = "hey so i was just wondering if anyone here remembers that rainy thing we talked about lol"
    assert 4 in ids(index.search(cue, 10))
    both = ids(index.search("fox AND strawberry", 10))
    assert set(both) == {1, 2, 3, 5}


def test_results_are_best_first_with_positive_bm25(index):
    hits = index.search("fox jumped moon", 10)
    assert hits[0][0] == 1  # shares three words
    scores = [score for _, score in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(score > 0 for score in scores)


def test_ties_go_to_the_higher_id_even_beyond_the_limit():
    idx = FtsIndex(None)
    idx.upsert_many((row_id, "same little sentence") for row_id in range(1, 61))
    idx.upsert(100, "a different sentence entirely, much longer than the others are")
    idx.commit()
    hits = idx.search("sentence", 3)
    assert ids(hits) == [60, 59, 58]
    assert hits[0][1] == hits[2][1]
    assert ids(idx.search("sentence", 3)) == [60, 59, 58]  # deterministic across calls


def test_a_cut_that_splits_no_tie_costs_one_tantivy_search(monkeypatch):
    """One hit past the limit shows the cut splits no tie; only a tie makes the search go deeper."""
    idx = FtsIndex(None)
    idx.upsert_many((row_id, "fox " * row_id) for row_id in range(1, 41))  # more foxes, higher score: no ties
    idx.upsert_many((row_id, "hound") for row_id in range(100, 120))  # all tied
    idx.commit()
    live = idx._live_index()
    searches: list[int] = []

    class CountingSearcher:
        def __init__(self, searcher):
            self._searcher = searcher

        def search(self, query, limit, **kwargs):
            searches.append(limit)
            return self._searcher.search(query, limit, **kwargs)

        def __getattr__(self, name):
            return getattr(self._searcher, name)

    class CountingIndex:
        def searcher(self):
            return CountingSearcher(live.searcher())

    monkeypatch.setattr(idx, "_live_index", lambda: CountingIndex())
    assert ids(idx.search("fox", 5)) == [40, 39, 38, 37, 36]
    assert searches == [6]
    searches.clear()
    assert ids(idx.search("hound", 5)) == [119, 118, 117, 116, 115]
    assert searches == [6, 12, 24]  # followed the 20 tied hits past the cut


def test_max_id_filters_inside_the_query_not_after_truncation():
    idx = FtsIndex(None)
    for row_id in range(1, 6):  # old, long turns: weak matches
        idx.upsert(row_id, f"the fox was mentioned in passing among many other words number {row_id}")
    for row_id in range(100, 121):  # recent, short turns: strong matches
        idx.upsert(row_id, "fox")
    idx.commit()
    unbounded = idx.search("fox", 3)
    assert all(row_id >= 100 for row_id in ids(unbounded))
    bounded = idx.search("fox", 3, max_id=50)
    assert ids(bounded) == [5, 4, 3]
    # the filter does not change scores
    old_score = dict(idx.search("fox", 30))[5]
    assert dict(bounded)[5] == old_score
    assert ids(idx.search("fox", 10, max_id=100)) == [100, 5, 4, 3, 2, 1]
    assert idx.search("fox", 3, max_id=0) == []
    assert idx.search("fox", 3, max_id=-1) == []


def test_max_id_gives_a_subset_of_the_unbounded_result(index):
    everything = set(ids(index.search("fox", 10)))
    bounded = set(ids(index.search("fox", 10, max_id=3)))
    assert bounded and bounded < everything
    assert all(row_id <= 3 for row_id in bounded)


def test_bad_limit_or_max_id_types_raise():
    idx = FtsIndex(None)
    with pytest.raises(TypeError):
        idx.search("fox", "3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        idx.search("fox", 3, max_id=2.5)  # type: ignore[arg-type]


# --- writes -------------------------------------------------------------------


def test_writes_are_visible_only_after_commit():
    idx = FtsIndex(None)
    idx.upsert(1, "lighthouse keeper")
    assert idx.search("lighthouse", 5) == [] and idx.doc_count() == 0
    assert idx.commit()
    assert ids(idx.search("lighthouse", 5)) == [1] and idx.doc_count() == 1


def test_upsert_replaces_the_old_text(index):
    index.upsert(3, "a slow grey wolf")
    index.commit()
    assert 3 not in ids(index.search("quick brown", 10))
    assert ids(index.search("wolf", 10)) == [3]
    assert index.doc_count() == len(TURNS)


def test_repeated_upserts_before_one_commit_keep_the_last():
    idx = FtsIndex(None)
    idx.upsert_many([(1, "first draft"), (1, "second draft"), (1, "final version")])
    idx.commit()
    assert idx.doc_count() == 1
    assert ids(idx.search("final", 5)) == [1] and idx.search("first", 5) == []


def test_delete_by_id(index):
    index.delete(1)
    assert index.delete_many([5, 999]) == 2  # an unknown id is a no-op
    index.commit()
    assert ids(index.search("fox", 10)) == [3]
    assert index.doc_count() == len(TURNS) - 2


def test_ids_across_the_whole_u64_range():
    idx = FtsIndex(None)
    big = 2**64 - 1
    idx.upsert_many([(0, "zero marmot"), (2**63 + 7, "middle marmot"), (big, "top marmot")])
    idx.commit()
    assert ids(idx.search("marmot", 5)) == [big, 2**63 + 7, 0]
    assert ids(idx.search("marmot", 5, max_id=2**63 + 7)) == [2**63 + 7, 0]
    idx.delete(big)
    idx.commit()
    assert ids(idx.search("marmot", 5)) == [2**63 + 7, 0]


def test_clear_and_rebuild(index):
    index.clear()
    index.commit()
    assert index.doc_count() == 0
    assert index.rebuild(TURNS + [(2, "Blueberry jam instead."), (3, "A fox again.")]) == len(TURNS)
    assert index.doc_count() == len(TURNS)
    assert ids(index.search("blueberry", 5)) == [2] and index.search("strawberry", 5) == []
    assert sorted(ids(index.search("fox", 10))) == [1, 3, 5]


@pytest.mark.parametrize(
    "bad_row,error",
    [((-1, "x"), ValueError), ((2**64, "x"), ValueError), ((True, "x"), TypeError),
     (("7", "x"), TypeError), ((8, None), TypeError), ((9,), TypeError), (None, TypeError)],
)
def test_bad_rows_raise_clearly_and_lose_nothing(index, bad_row, error):
    index.upsert(50, "pending pelican")
    with pytest.raises(error):
        index.upsert_many([(40, "good gannet"), bad_row])
    with pytest.raises(error):
        index.rebuild([(41, "good gull"), bad_row])
    assert index.commit()
    assert index.doc_count() == len(TURNS) + 1  # the pending upsert survived, nothing else landed
    assert ids(index.search("pelican", 5)) == [50]
    assert index.search("gannet gull", 5) == []
    assert sorted(ids(index.search("fox", 10))) == [1, 3, 5]


def test_bad_ids_for_delete_raise_before_deleting_anything(index):
    with pytest.raises(TypeError):
        index.delete_many([1, "3"])  # type: ignore[list-item]
    index.commit()
    assert sorted(ids(index.search("fox", 10))) == [1, 3, 5]


# --- commit retry policy --------------------------------------------------------

LOCK_ERROR = (
    "Failed to open file for write: 'IoError { io_error: Os { code: 5, kind: PermissionDenied, "
    "message: \"Access is denied.\" }, filepath: \"6db45bb5.term\" }'"
)


class Attempts:
    """An attempt that fails with the given errors, then succeeds."""

    def __init__(self, *errors: Exception):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


@pytest.mark.parametrize(
    "message",
    [LOCK_ERROR, "IoError: The process cannot access the file because it is being used by another process. (os error 32)",
     "Access is denied. (os error 5)", "kind: PermissionDenied, message: \"Operation not permitted\""],
)
def test_lock_like_errors_are_transient(message):
    assert is_transient_commit_error(ValueError(message))


@pytest.mark.parametrize("message", ["Schema error: schema mismatch", "No space left on device (os error 28)", "os error 50"])
def test_other_errors_are_not_transient(message):
    assert not is_transient_commit_error(ValueError(message))


def test_retry_succeeds_after_two_transient_failures():
    attempt, sleeps = Attempts(ValueError(LOCK_ERROR), ValueError(LOCK_ERROR)), []
    assert retry_transient(attempt, sleep=sleeps.append) is True
    assert attempt.calls == 3 and sleeps == [0.05, 0.2]


def test_retry_gives_up_after_four_attempts(caplog):
    attempt, sleeps = Attempts(*[ValueError(LOCK_ERROR)] * 10), []
    with caplog.at_level(logging.WARNING, logger="familiar_pipeline.storage.fts"):
        assert retry_transient(attempt, sleep=sleeps.append) is False
    assert attempt.calls == 4 and sleeps == list(COMMIT_RETRY_DELAYS_S) == [0.05, 0.2, 0.5]
    assert sum("commit_retry=" in r.message for r in caplog.records) == 3
    assert any("commit skipped" in r.message for r in caplog.records)


def test_retry_raises_other_errors_at_once():
    attempt, sleeps = Attempts(ValueError("schema mismatch")), []
    with pytest.raises(ValueError, match="schema mismatch"):
        retry_transient(attempt, sleep=sleeps.append)
    assert attempt.calls == 1 and sleeps == []


class FlakyWriter:
    """The real writer, except that ``commit`` (or ``add_document``) first fails."""

    def __init__(self, real, *errors: Exception, add_errors: tuple[Exception, ...] = ()):
        self.real, self.errors, self.add_errors = real, list(errors), list(add_errors)
        self.commits = self.rollbacks = 0

    def commit(self):
        self.commits += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.real.commit()

    def add_document(self, doc):
        if self.add_errors:
            raise self.add_errors.pop(0)
        return self.real.add_document(doc)

    def rollback(self):
        self.rollbacks += 1
        return self.real.rollback()

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def no_sleep(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(fts, "_sleep", slept.append)
    return slept


def test_index_commit_survives_two_lock_failures(no_sleep):
    idx = FtsIndex(None)
    idx._writer = FlakyWriter(idx._writer, ValueError(LOCK_ERROR), ValueError(LOCK_ERROR))
    idx.upsert(1, "antivirus was here")
    assert idx.commit() is True
    assert idx._writer.commits == 3 and no_sleep == [0.05, 0.2]
    assert idx._writer.rollbacks == 2  # each retry starts from a rolled-back writer
    assert ids(idx.search("antivirus", 5)) == [1]


def test_a_writer_that_dies_while_buffering_is_repaired_at_commit(no_sleep):
    idx = FtsIndex(None)
    killed = ValueError("An error occurred in a thread: 'An index writer was killed.. A worker thread encountered an error'")
    idx._writer = FlakyWriter(idx._writer, add_errors=(killed,))
    idx.upsert_many([(1, "first otter"), (2, "second otter")])  # never raises: it is journalled
    assert idx.commit() is True
    assert idx._writer.rollbacks == 1 and no_sleep == []
    assert sorted(ids(idx.search("otter", 5))) == [1, 2]


def test_index_commit_skip_keeps_the_writes_for_the_next_commit(no_sleep, caplog):
    idx = FtsIndex(None)
    idx._writer = FlakyWriter(idx._writer, *[ValueError(LOCK_ERROR)] * 4)
    idx.upsert(1, "still buffered")
    with caplog.at_level(logging.WARNING, logger="familiar_pipeline.storage.fts"):
        assert idx.commit() is False
    assert idx.search("buffered", 5) == []
    assert any("commit skipped" in r.message for r in caplog.records)
    idx.upsert(2, "buffered later")
    assert idx.commit() is True
    assert sorted(ids(idx.search("buffered", 5))) == [1, 2]


def test_index_commit_raises_other_errors_and_stays_usable(no_sleep):
    idx = FtsIndex(None)
    idx._writer = FlakyWriter(idx._writer, ValueError("schema mismatch"))
    idx.upsert(1, "kept despite the error")
    with pytest.raises(FtsError, match="schema mismatch"):
        idx.commit()
    assert idx._writer.commits == 1 and no_sleep == []
    assert idx.commit() is True
    assert ids(idx.search("despite", 5)) == [1]


def _chattr(flag: str, path: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False).returncode == 0


def test_a_real_failed_commit_is_recovered_without_losing_writes(tmp_path, monkeypatch):
    """tantivy poisons its writer after a failed commit: later commits 'succeed' but
    index nothing until a rollback. An immutable folder makes a real commit fail."""
    folder = tmp_path / "turns"
    idx = FtsIndex(folder, writable=True)
    idx.upsert(1, "before the lock")
    idx.commit()
    if not _chattr("+i", folder):
        idx.close()
        pytest.skip("needs chattr +i (root on ext4-like filesystems)")
    unlock_at = {"first_sleep": True}

    def sleep_then_unlock(_seconds):
        if unlock_at.pop("first_sleep", False):
            _chattr("-i", folder)

    monkeypatch.setattr(fts, "_sleep", sleep_then_unlock)
    try:
        idx.upsert_many([(2, "during the lock"), (3, "also during the lock")])
        assert idx.commit() is True
    finally:
        _chattr("-i", folder)
    assert sorted(ids(idx.search("lock", 5))) == [1, 2, 3]
    idx.upsert(4, "after the lock")
    assert idx.commit()
    assert idx.doc_count() == 4
    idx.close()


def test_a_real_commit_skip_keeps_writes_until_the_folder_recovers(tmp_path, no_sleep):
    folder = tmp_path / "facts"
    idx = FtsIndex(folder, writable=True)
    if not _chattr("+i", folder):
        idx.close()
        pytest.skip("needs chattr +i (root on ext4-like filesystems)")
    try:
        idx.upsert(1, "written while locked")
        assert idx.commit() is False
        assert len(no_sleep) == 3
    finally:
        _chattr("-i", folder)
    idx.upsert(2, "written after")
    assert idx.commit() is True
    assert sorted(ids(idx.search("written", 5))) == [1, 2]
    idx.close()


# --- files, readers and processes ------------------------------------------------


def test_reopening_a_persisted_index(tmp_path):
    folder = tmp_path / "fts" / "turns"
    with FtsIndex(folder, writable=True) as writer:
        writer.upsert_many(TURNS)
        writer.commit()
        writer.upsert(8, "left buffered, committed by close")
    reader = FtsIndex(folder)
    assert reader.doc_count() == len(TURNS) + 1
    assert sorted(ids(reader.search("fox", 10))) == [1, 3, 5]
    assert ids(reader.search("buffered", 10)) == [8]
    writer = FtsIndex(folder, writable=True)
    writer.upsert(1, "the moon alone")
    writer.commit()
    writer.close()
    reader.reload()
    assert sorted(ids(reader.search("fox", 10))) == [3, 5]
    reader.close()


def test_readers_cannot_write_and_closed_indexes_refuse_work(tmp_path):
    reader = FtsIndex(tmp_path / "new")  # a reader of a missing index creates it, empty
    assert (tmp_path / "new" / "meta.json").exists() and reader.doc_count() == 0
    assert reader.search("anything fox", 5) == []
    for write in (lambda: reader.upsert(1, "x"), lambda: reader.delete(1), reader.clear, reader.commit,
                  lambda: reader.rebuild([])):
        with pytest.raises(FtsReadOnlyError):
            write()
    reader.close()
    reader.close()  # twice is fine
    with pytest.raises(FtsError):
        reader.search("fox", 5)


def test_one_writer_per_index_in_a_process(tmp_path):
    writer = FtsIndex(tmp_path / "x", writable=True)
    with pytest.raises(FtsLockedError, match="already open for writing"):
        FtsIndex(tmp_path / "x", writable=True)
    writer.close()
    FtsIndex(tmp_path / "x", writable=True).close()  # close released the lock


def test_a_folder_with_another_schema_gives_a_clear_error(tmp_path):
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("body")
    (tmp_path / "odd").mkdir()
    tantivy.Index(builder.build(), path=str(tmp_path / "odd"))
    with pytest.raises(FtsError, match="rebuild"):
        FtsIndex(tmp_path / "odd")


CHILD_WRITER = textwrap.dedent(
    """
    import sys
    from familiar_pipeline.storage.fts import FtsIndex
    index = FtsIndex(sys.argv[1], writable=True)
    index.upsert_many([(7, "the sphinx of black quartz"), (8, "judge my vow")])
    assert index.commit()
    print("committed", flush=True)
    sys.stdin.readline()  # hold the writer lock until told (or killed)
    """
)


@pytest.mark.timeout(60)
def test_a_second_process_writes_and_a_reader_sees_it_after_reload(tmp_path):
    folder = tmp_path / "fts" / "turns"
    reader = FtsIndex(folder)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_WRITER, str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = child.stdout.readline().strip()
        assert line == "committed", child.stderr.read() if child.poll() is not None else line
        assert reader.search("quartz", 5) == []  # a reader keeps its snapshot until reload()
        reader.reload()
        assert ids(reader.search("quartz vow", 5)) and reader.doc_count() == 2
        started = time.monotonic()
        with pytest.raises(FtsLockedError):
            FtsIndex(folder, writable=True)
        assert time.monotonic() - started < 2  # fails fast, never waits on the lock
        second_reader = FtsIndex(folder)  # readers never need the lock
        assert second_reader.doc_count() == 2
        second_reader.close()
    finally:
        child.kill()  # a crashed writer must not leave a stale lock behind
        child.wait(timeout=30)
        child.stdout.close()
        child.stderr.close()
    writer = FtsIndex(folder, writable=True)
    writer.delete(7)
    writer.commit()
    writer.close()
    reader.reload()
    assert reader.search("quartz", 5) == [] and ids(reader.search("vow", 5)) == [8]
    reader.close()
