"""The response cache's provenance: each cached reply records the turns its request rests on,
and forgetting turns erases exactly the replies they shaped, to the last byte of the file.

Unit tests on the cache and the client; the projectors' own declarations are exercised on a
whole graph in tests/test_forget_cached_replies.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import asyncio
import sqlite3

import pytest

from familiar_pipeline.config import LlmSlotConfig
from familiar_pipeline.models.llm import CachedReply, LlmClient, LlmSources, ResponseCache, llm_sources
from familiar_pipeline.testing.fake_llm import fake_llm

from .helpers import file_bytes


def reply(text: str) -> CachedReply:
    return CachedReply(text=text, model="m", prompt_tokens=1, completion_tokens=1, cost_usd=0.0)


def sources(turns=(), upto=None) -> LlmSources:
    return LlmSources(frozenset(turns), upto)


# What each reply rests on, and whether forgetting turns 3 and 7 must take it.
CASES = {
    "other turns": (sources({1, 2}), False),
    "a forgotten turn": (sources({3, 4}), True),
    "another forgotten turn": (sources({7}), True),
    "every turn up to 6": (sources(upto=6), True),
    "every turn up to 3": (sources(upto=3), True),
    "every turn up to 2, and turn 2": (sources({2}, upto=2), False),
    "turn 8 and every turn up to 2": (sources({8}, upto=2), False),
    "unknown provenance": (None, True),
    "an empty declaration": (sources(), True),
}


@pytest.fixture(params=["sqlite", "memory"])
def cache(request, tmp_path):
    cache = ResponseCache(tmp_path / "cache" / "llm_cache.sqlite" if request.param == "sqlite" else None)
    yield cache
    cache.close()


def test_forgetting_turns_removes_exactly_the_replies_resting_on_them(cache):
    for name, (rests_on, _) in CASES.items():
        cache.put(name, reply(f"reply for {name}"), rests_on)

    assert cache.forget_resting_on([7, 3]) == sum(gone for _, gone in CASES.values())
    for name, (_, gone) in CASES.items():
        assert (cache.get(name) is None) == gone, name
    assert len(cache) == sum(not gone for _, gone in CASES.values())
    assert cache.forget_resting_on([]) == 0  # nothing forgotten, nothing erased
    assert cache.forget_resting_on([3, 7]) == 0


def test_a_reply_stored_again_rests_on_what_it_was_stored_with_last(cache):
    cache.put("k", reply("first"), sources({3}))
    cache.put("k", reply("second"), sources({5}))
    assert cache.forget_resting_on([3]) == 0
    assert cache.get("k").text == "second"
    cache.put("k", reply("third"))  # unknown provenance now
    assert cache.forget_resting_on([99]) == 1


def test_the_client_stores_replies_with_the_declared_sources():
    cache = ResponseCache(None)
    client = LlmClient(LlmSlotConfig(name="background", model="fake/test-model", cache=True), cache=cache)

    def ask(text: str) -> bool:
        """Asks; True when the reply came from the cache."""
        return client.complete([{"role": "user", "content": text}]).cached

    async def ask_async(text: str) -> bool:
        return (await client.acomplete([{"role": "user", "content": text}])).cached

    with fake_llm() as fake:
        fake.script(lambda messages: "ok: " + messages[-1]["content"])
        with llm_sources(turns=[1, 2]):
            ask("one")
            with llm_sources(turns=[3], upto=1):  # nested: rests on the outer declaration's turns too
                ask("two")
        with llm_sources(upto=10):
            asyncio.run(ask_async("three"))
        with llm_sources(turns=[20]):
            ask("four")
        ask("five")  # nothing declared: unknown provenance

        assert cache.forget_resting_on([20]) == 2  # four, five; three rests on turns up to 10 only
        assert cache.forget_resting_on([3]) == 2  # two (turn 3), three (every turn up to 10)
        assert [ask("one"), ask("two"), ask("three"), ask("four")] == [True, False, False, False]


def test_the_client_declarations_reach_the_sqlite_tables(tmp_path):
    path = tmp_path / "llm_cache.sqlite"
    client = LlmClient(LlmSlotConfig(name="background", model="fake/test-model", cache=True),
                       cache=ResponseCache(path))
    with fake_llm() as fake:
        fake.script(lambda messages: "ok")
        with llm_sources(turns=[4, 5], upto=2):
            client.complete([{"role": "user", "content": "one"}])
        with llm_sources(turns=[6]):
            asyncio.run(client.acomplete([{"role": "user", "content": "two"}]))
    client.cache.close()
    with sqlite3.connect(path) as conn:
        assert sorted(r[0] for r in conn.execute("SELECT turn_id FROM llm_cache_turns")) == [4, 5, 6]
        assert [r[0] for r in conn.execute("SELECT upto FROM llm_cache_upto")] == [2]


def test_a_forgotten_reply_leaves_no_byte_in_the_file_or_its_wal(tmp_path):
    path = tmp_path / "cache" / "llm_cache.sqlite"
    forgotten, kept = "zyxwvut-forgotten-marker", "qponmlk-kept-marker"
    cache = ResponseCache(path)
    reader = ResponseCache(path)  # another process's connection to the same file, idle
    cache.put("gone", reply(f"Cass said {forgotten} " * 20), sources({3}))
    cache.put("stays", reply(f"Bo said {kept} " * 20), sources({4}))
    for i in range(50):  # enough rows that the deleted ones share pages with kept ones
        cache.put(f"filler {i}", reply(f"filler {i} " * 30), sources({100 + i}))
    assert reader.get("gone") is not None
    assert forgotten.encode() in file_bytes(path)

    assert cache.forget_resting_on([3]) == 1

    assert forgotten.encode() not in file_bytes(path)
    assert kept.encode() in file_bytes(path)
    assert reader.get("gone") is None and reader.get("stays") is not None
    cache.close()
    reader.close()


def test_an_existing_cache_file_gets_the_provenance_tables_and_its_old_replies_count_as_unknown(tmp_path):
    path = tmp_path / "llm_cache.sqlite"
    with sqlite3.connect(path) as conn:  # the schema before provenance
        conn.execute("CREATE TABLE llm_response_cache (key TEXT PRIMARY KEY, model TEXT NOT NULL, text TEXT NOT NULL, "
                     "prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL, "
                     "created_at REAL NOT NULL)")
        conn.execute("INSERT INTO llm_response_cache VALUES ('old', 'm', 'old reply', 1, 1, 0.0, 0.0)")
    conn.close()
    cache = ResponseCache(path)
    cache.put("new", reply("new reply"), sources({1}))
    assert cache.get("old").text == "old reply"  # still served

    assert cache.forget_resting_on([50]) == 1
    assert cache.get("old") is None and cache.get("new") is not None
    cache.close()
