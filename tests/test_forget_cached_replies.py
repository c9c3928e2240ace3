"""Forgetting a person's messages reaches the LLM response cache, and only as far as it must.

A familiar runs the whole graph with the scripted model, so every projector's replies are
cached with the turns they rest on (`models.llm.llm_sources`). Mia speaks only in the middle
of the log. Forgetting her turns erases every cached reply whose prompt could carry her
words or her name, down to the bytes of the file, and nothing else: a rebuild afterwards
asks the model again exactly the prompts that mentioned her, and answers every other one
from the cache.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg

from familiar_pipeline.models.llm import ResponseCache
from familiar_pipeline.storage.turns import TurnLog

from .fact_helpers import ALL_ASSETS, GRAPH_TOML, materialize
from .helpers import cache_rows, file_bytes, make_familiar

BASE = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
MARKER = "xylophonist"  # a word only Mia says
CASS, BO, MIA = ("discord:111", "Cass"), ("discord:222", "Bo"), ("discord:333", "Mia")


def speaker(i: int) -> tuple[str, str]:
    """Cass and Bo throughout; Mia on the odd turns of 21-30 only."""
    if 21 <= i <= 30:
        return MIA if i % 2 else CASS
    return CASS if i % 2 else BO


def line(i: int, name: str) -> str:
    if name == "Mia":
        return f"My brother the {MARKER} plays every evening, number {i}"
    return f"{name} is repotting the garden ferns again today, number {i}"


def test_forgetting_a_persons_turns_erases_the_cached_replies_resting_on_them_and_keeps_the_rest(
        tmp_path, fake_llm):
    paths = make_familiar(tmp_path, extra_toml=GRAPH_TOML)
    with TurnLog(paths.turns_db) as log:
        for i in range(1, 41):
            key, name = speaker(i)
            log.upsert_participant(key, username=name.lower(), global_name=name)
            log.append_turn(channel_id=10, guild_id=1, role="user", author_key=key, author_display=name,
                            content=line(i, name), created_at=BASE + timedelta(minutes=i))
    mia_turns = [i for i in range(1, 41) if speaker(i) == MIA]
    cache_path = paths.cache_dir / "llm_cache.sqlite"

    with dg.instance_for_test() as instance:
        assert materialize(tmp_path, instance, ALL_ASSETS).success
        first = {(call.system, call.user) for call in fake_llm.calls}
        rows = cache_rows(cache_path)
        # every projector asked, and every reply our call sites cached declares real turns
        for mark in ("Extract a short list of atomic facts", "running summary", "keep a short dossier",
                     "You write short reflections", "PRIOR facts"):
            assert any(mark in system or mark in user for system, user in first), mark
        assert len(rows) == len(first)
        assert all(turns or upto is not None for _, turns, upto in rows.values()), "a reply with no sources"
        assert all(turns <= set(range(1, 41)) and (upto or 0) <= 40 for _, turns, upto in rows.values())
        assert MARKER.encode() in file_bytes(cache_path)

        forgotten = ResponseCache(cache_path).forget_resting_on(mia_turns)

        kept = cache_rows(cache_path)
        assert forgotten == len(rows) - len(kept) > 0
        assert all(not (turns & set(mia_turns)) and (upto or 0) < min(mia_turns) for _, turns, upto in kept.values())
        assert not any("Mia" in text or MARKER in text for text, _, _ in kept.values())
        assert MARKER.encode() not in file_bytes(cache_path)
        assert any("Cass" in text for text, _, _ in kept.values())  # what rests on others stays

        # A rebuild sends the same prompts: exactly those that mentioned Mia reach the model again.
        before = len(fake_llm.calls)
        assert materialize(tmp_path, instance, ALL_ASSETS, rebuild=True).success
        asked_again = {(call.system, call.user) for call in fake_llm.calls[before:]}
        assert asked_again == {(system, user) for system, user in first if "Mia" in user}
        assert asked_again and len(asked_again) < len(first)


def test_an_edited_turns_replies_made_from_its_earlier_text_go_and_later_ones_stay(tmp_path):
    """`edited`: a reply resting on an edited turn and cached before the edit was made from the earlier
    text (whatever words it kept); one cached after it, and replies resting on other turns, stay."""
    import time as clock

    from familiar_pipeline.models.llm import CachedReply, LlmSources

    cache = ResponseCache(tmp_path / "llm_cache.sqlite")
    try:
        reply = CachedReply("a paraphrase with none of the words", "fake/careful", 1, 1, 0.0)
        cache.put("before", reply, LlmSources(turns=frozenset({5})))
        cache.put("other", reply, LlmSources(turns=frozenset({6})))
        edited_at = clock.time()
        clock.sleep(0.01)
        cache.put("after", reply, LlmSources(turns=frozenset({5})))
        assert cache.forget_resting_on([], edited={5: edited_at}) == 1
        assert cache.get("before") is None and cache.get("after") and cache.get("other")
    finally:
        cache.close()
