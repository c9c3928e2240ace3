"""The LLM client over litellm, exercised end to end through the in-process fake provider."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import asyncio
import json
import math
import threading
import time

import pytest

from familiar_pipeline.config import ConfigError, LlmConfig, LlmSlotConfig
from familiar_pipeline.testing.fake_llm import NO_CHOICES, FakeLLM, fake_llm, replies_in_order
from familiar_pipeline.models.llm import (
    LlmClient,
    LlmError,
    LlmNotConfigured,
    LlmUsage,
    ResponseCache,
    client_for,
    import_litellm,
)

SYSTEM = "You extract facts. Reply with a JSON array."
USER = "Turns:\n- [#1 Cass] I adopted a cat named Miso."
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


@pytest.fixture
def fake():
    with fake_llm() as f:
        yield f


def slot(**overrides) -> LlmSlotConfig:
    values = dict(name="background", model="fake/test-model", temperature=0.2, max_tokens=256,
                  timeout_s=5.0, max_retries=2)
    values.update(overrides)
    return LlmSlotConfig(**values)


def client(s: LlmSlotConfig | None = None, **kwargs) -> LlmClient:
    kwargs.setdefault("retry_base_delay_s", 0.001)
    return LlmClient(s or slot(), **kwargs)


def counting_responder():
    """Replies that differ on every call, so a repeated reply proves a cache hit."""
    counter = {"n": 0}

    def responder(messages):
        counter["n"] += 1
        return f"reply #{counter['n']}"

    return responder


# --- a plain call --------------------------------------------------------------


def test_reply_through_the_fake_provider(fake):
    fake.script([("adopted a cat", '[{"text": "Cass has a cat named Miso"}]')], default="[]")
    reply = client().complete(MESSAGES)

    assert reply.text == '[{"text": "Cass has a cat named Miso"}]'
    assert reply.model == "fake/test-model"
    assert reply.prompt_tokens == math.ceil((len(SYSTEM) + len(USER)) / 4)
    assert reply.completion_tokens == math.ceil(len(reply.text) / 4)
    assert reply.cached is False
    assert reply.cost_usd == 0.0  # fake models have no pricing; never an error
    assert reply.latency_s > 0

    [call] = fake.calls
    assert call.messages == MESSAGES
    assert call.model == "fake/test-model"
    assert call.params["temperature"] == 0.2
    assert call.params["max_tokens"] == 256
    assert call.timeout == 5.0
    assert call.system == SYSTEM and call.user == USER
    assert call["messages"] == call.messages and call["params"] is call.params


def test_rules_fall_back_to_default_and_predicates_match(fake):
    fake.script(
        [
            (lambda messages: len(messages) == 1, "single"),
            ("supersede", '{"superseded_ids": []}'),
        ],
        default="[]",
    )
    c = client()
    assert c.complete([{"role": "user", "content": "hello"}]).text == "single"
    supersede = [{"role": "system", "content": "supersede?"}, {"role": "user", "content": "x"}]
    assert c.complete(supersede).text == '{"superseded_ids": []}'
    assert c.complete(MESSAGES).text == "[]"


def test_json_values_are_sent_as_json_text(fake):
    fake.script(lambda messages: [{"text": "Zoë 🧀", "source_turn_ids": [1]}])
    assert json.loads(client().complete(MESSAGES).text) == [{"text": "Zoë 🧀", "source_turn_ids": [1]}]


def test_per_call_params_override_the_slot_and_reach_the_provider(fake):
    fake.script(lambda messages: "ok")
    client().complete(MESSAGES, temperature=0.0, max_tokens=12, response_format={"type": "json_object"})
    params = fake.calls[0].params
    assert params["temperature"] == 0.0
    assert params["max_tokens"] == 12
    assert params["response_format"] == {"type": "json_object"}


SCHEMA = {"name": "facts", "schema": {"type": "object", "properties": {"facts": {"type": "array"}}, "required": ["facts"]}}


@pytest.mark.parametrize(
    "structured, expected",
    [
        ("json_schema", {"type": "json_schema", "json_schema": SCHEMA}),
        ("json_object", {"type": "json_object", "schema": SCHEMA["schema"]}),
        ("off", None),
        ("auto", None),  # a fake provider is never sent a schema
    ],
)
def test_a_prompt_schema_becomes_response_format_as_the_slot_says(fake, structured, expected):
    fake.script(lambda messages: {"facts": []})
    client(slot(structured=structured)).complete(MESSAGES, json_schema=SCHEMA)
    params = fake.calls[0].params
    assert params.get("response_format") == expected and "json_schema" not in params


@pytest.mark.parametrize(
    "model, api_base, expected",
    [
        ("openai/smollm2", "http://127.0.0.1:8080/v1", "json_object"),  # llama.cpp and other OpenAI-compatible servers
        ("ollama_chat/llama3.1", None, "json_schema"),
        ("fake/careful", None, "off"),
        ("openai/gpt-4o-mini", None, "json_schema"),  # litellm lists it as schema-capable
    ],
)
def test_auto_structured_output_by_provider(model, api_base, expected):
    from familiar_pipeline.models.llm import schema_mode

    assert schema_mode(slot(model=model, api_base=api_base, structured="auto")) == expected


def test_the_schema_is_part_of_the_cache_key(fake):
    fake.script(counting_responder())
    cache = ResponseCache()
    on = client(slot(structured="json_schema", cache=True), cache=cache)
    first = on.complete(MESSAGES, json_schema=SCHEMA).text
    assert on.complete(MESSAGES, json_schema=SCHEMA).text == first
    assert on.complete(MESSAGES).text != first, "a reply without the schema is another request"


@pytest.mark.parametrize("reply", [NO_CHOICES, None, ""])
def test_empty_choices_or_none_content_is_empty_text(fake, reply):
    fake.script(lambda messages: reply)
    result = client().complete(MESSAGES)
    assert result.text == ""
    assert result.completion_tokens == 0


def test_unscripted_fake_fails_clearly_without_retrying(fake):
    with pytest.raises(LlmError, match="no script") as info:
        client().complete(MESSAGES)
    assert info.value.attempts == 1
    assert len(fake.calls) == 1


def test_bad_calls_are_rejected_before_the_provider(fake):
    fake.script(lambda messages: "ok")
    c = client()
    with pytest.raises(TypeError, match="api_key"):
        c.complete(MESSAGES, api_key="sk-nope")
    with pytest.raises(TypeError, match="model"):
        c.complete(MESSAGES, model="fake/other")
    with pytest.raises(ValueError, match="non-empty list"):
        c.complete([])
    with pytest.raises(ValueError, match=r"messages\[1\]"):
        c.complete([{"role": "user", "content": "a"}, "not a message"])
    assert fake.calls == []


# --- retries ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rate_limit", "server", "timeout", "unavailable", "connection"])
def test_transient_errors_are_retried_then_succeed(fake, kind):
    fake.script(replies_in_order(FakeLLM.error(kind), FakeLLM.error(kind), "finally"))
    usage = LlmUsage()
    reply = client(usage=usage).complete(MESSAGES)
    assert reply.text == "finally"
    assert len(fake.calls) == 3
    assert usage.retries == 2
    assert usage.errors == 0
    assert usage.calls == 1


def test_retries_exhausted_raise_llm_error(fake):
    fake.script(lambda messages: FakeLLM.error("rate_limit", "slow down"))
    usage = LlmUsage()
    with pytest.raises(LlmError) as info:
        client(slot(max_retries=3), usage=usage).complete(MESSAGES)
    err = info.value
    assert err.attempts == 4 and len(fake.calls) == 4
    assert err.transient is True and err.kind == "RateLimitError" and err.status_code == 429
    assert "retries exhausted" in str(err) and "slow down" in str(err)
    assert usage.errors == 1 and usage.retries == 3 and usage.calls == 0


def test_zero_max_retries_means_one_attempt(fake):
    fake.script(lambda messages: FakeLLM.error("server"))
    with pytest.raises(LlmError):
        client(slot(max_retries=0)).complete(MESSAGES)
    assert len(fake.calls) == 1


@pytest.mark.parametrize("kind", ["auth", "bad_request"])
def test_non_transient_errors_are_not_retried(fake, kind):
    fake.script(replies_in_order(FakeLLM.error(kind, "nope"), "would have worked"))
    with pytest.raises(LlmError, match="not retryable") as info:
        client().complete(MESSAGES)
    assert len(fake.calls) == 1
    assert info.value.transient is False


def test_backoff_grows_exponentially_with_jitter(fake):
    fake.script(lambda messages: FakeLLM.error("server"))
    c = client(slot(max_retries=3), retry_base_delay_s=0.02, retry_max_delay_s=0.05)
    started = time.perf_counter()
    with pytest.raises(LlmError):
        c.complete(MESSAGES)
    # Delays are at least half of 0.02, 0.04, min(0.08, 0.05) = 0.01 + 0.02 + 0.025.
    assert time.perf_counter() - started >= 0.055


# --- cache ---------------------------------------------------------------------------


def test_cache_hit_skips_the_provider_across_clients_sharing_a_file(fake, tmp_path):
    fake.script(counting_responder())
    path = tmp_path / "cache" / "llm.sqlite"
    caching = slot(cache=True)
    usage = LlmUsage()

    first = client(caching, cache=ResponseCache(path), usage=usage).complete(MESSAGES)
    second_cache = ResponseCache(path)
    second = client(caching, cache=second_cache, usage=usage).complete(MESSAGES)

    assert first.text == second.text == "reply #1"
    assert len(fake.calls) == 1
    assert second.cached is True and first.cached is False
    assert (second.prompt_tokens, second.completion_tokens) == (first.prompt_tokens, first.completion_tokens)
    assert second.model == first.model
    assert second.cost_usd == 0.0
    assert second_cache.hits == 1 and second_cache.misses == 0
    assert usage.calls == 1 and usage.cached_calls == 1
    assert usage.prompt_tokens == first.prompt_tokens  # the hit spent nothing


def test_cache_is_keyed_by_messages_and_params(fake):
    fake.script(counting_responder())
    cache = ResponseCache(None)
    c = client(slot(cache=True), cache=cache)
    other_messages = [MESSAGES[0], {"role": "user", "content": USER + " And a dog."}]

    texts = [
        c.complete(MESSAGES).text,
        c.complete(MESSAGES).text,  # hit
        c.complete(other_messages).text,
        c.complete(MESSAGES, temperature=0.9).text,
        c.complete(MESSAGES, max_tokens=99).text,
        c.complete(MESSAGES, response_format={"type": "json_object"}).text,
        c.complete(MESSAGES, response_format={"type": "json_object"}).text,  # hit
    ]
    assert texts == ["reply #1", "reply #1", "reply #2", "reply #3", "reply #4", "reply #5", "reply #5"]
    assert len(fake.calls) == 5
    assert (cache.hits, cache.misses) == (2, 5)


def test_cache_key_is_canonical():
    a = ResponseCache.key("m", MESSAGES, 0.2, 10, {"b": 1, "a": 2})
    b = ResponseCache.key("m", [dict(reversed(m.items())) for m in MESSAGES], 0.2, 10, {"a": 2, "b": 1})
    assert a == b and len(a) == 64
    assert a != ResponseCache.key("m2", MESSAGES, 0.2, 10, {"b": 1, "a": 2})


def test_cache_is_ignored_when_the_slot_does_not_cache(fake):
    fake.script(counting_responder())
    c = client(slot(cache=False), cache=ResponseCache(None))
    assert [c.complete(MESSAGES).text for _ in range(2)] == ["reply #1", "reply #2"]


def test_empty_replies_are_not_cached(fake):
    fake.script(replies_in_order("", "second try"))
    cache = ResponseCache(None)
    c = client(slot(cache=True), cache=cache)
    assert c.complete(MESSAGES).text == ""
    assert c.complete(MESSAGES).text == "second try"
    assert c.complete(MESSAGES).cached is True
    assert len(cache) == 1


def test_a_corrupt_cache_file_is_a_clear_error_and_is_left_alone(tmp_path):
    path = tmp_path / "llm.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ValueError, match="not a usable SQLite database"):
        ResponseCache(path)
    assert path.read_bytes() == b"this is not sqlite" * 100


# --- usage and cost -------------------------------------------------------------------


def test_usage_sums_tokens_cost_and_outcomes(fake):
    litellm = import_litellm()
    litellm.register_model(
        {"fake/priced": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6,
                         "litellm_provider": "fake", "mode": "chat"}}
    )
    fake.script([("boom", FakeLLM.error("auth"))], default="x" * 40)
    usage = LlmUsage()
    c = client(slot(model="fake/priced", cache=True), cache=ResponseCache(None), usage=usage)

    long_prompt = [{"role": "user", "content": "y" * 400}]
    replies = [c.complete(MESSAGES), c.complete(long_prompt), c.complete(MESSAGES)]
    with pytest.raises(LlmError):
        c.complete([{"role": "user", "content": "boom"}])

    paid = [r for r in replies if not r.cached]
    assert len(paid) == 2
    assert paid[0].cost_usd == pytest.approx(paid[0].prompt_tokens * 1e-6 + paid[0].completion_tokens * 2e-6)
    assert usage.as_metadata() == {
        "llm_calls": 2,
        "llm_cached_calls": 1,
        "llm_prompt_tokens": sum(r.prompt_tokens for r in paid),
        "llm_completion_tokens": sum(r.completion_tokens for r in paid),
        "llm_cost_usd": round(sum(r.cost_usd for r in paid), 6),
        "llm_errors": 1,
        "llm_retries": 0,
    }
    assert usage.cost_usd > 0


def test_an_unpriced_model_is_not_priced_twice(fake, monkeypatch):
    """litellm stamps each response's cost (None: no price known); the client reads the stamp, not the cost map again."""
    litellm = import_litellm()
    asked = []
    monkeypatch.setattr(litellm, "completion_cost", lambda *a, **k: asked.append(k) or 1.0)
    fake.script([], default="a reply")
    usage = LlmUsage()
    reply = client(slot(model="fake/unpriced"), usage=usage).complete(MESSAGES)
    assert (reply.text, reply.cost_usd, asked) == ("a reply", 0.0, [])
    assert reply.prompt_tokens > 0 and usage.as_metadata()["llm_prompt_tokens"] == reply.prompt_tokens


# --- concurrency ---------------------------------------------------------------------


def test_sync_concurrency_cap_is_process_wide(fake):
    lock = threading.Lock()
    state = {"in_flight": 0, "peak": 0}

    def slow(messages):
        with lock:
            state["in_flight"] += 1
            state["peak"] = max(state["peak"], state["in_flight"])
        time.sleep(0.05)
        with lock:
            state["in_flight"] -= 1
        return "ok"

    fake.script(slow)
    clients = [client(max_concurrency=3), client(slot(name="reply"), max_concurrency=3)]
    threads = [threading.Thread(target=clients[i % 2].complete, args=(MESSAGES,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake.calls) == 12
    assert state["peak"] == 3  # reached, never exceeded


def test_bad_concurrency_is_rejected():
    with pytest.raises(ValueError, match="max_concurrency"):
        client(max_concurrency=0)


# --- async -------------------------------------------------------------------------------


def test_async_reply_retry_cache_and_cap(fake):
    state = {"in_flight": 0, "peak": 0}

    async def slow(messages):
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        await asyncio.sleep(0.02)
        state["in_flight"] -= 1
        return f"async {messages[-1]['content']}"

    async def scenario():
        usage = LlmUsage()
        c = client(slot(cache=True), cache=ResponseCache(None), max_concurrency=2, usage=usage)
        fake.script(replies_in_order(FakeLLM.error("rate_limit"), "after retry"))
        first = await c.acomplete(MESSAGES)
        again = await c.acomplete(MESSAGES)
        fake.script(slow)
        many = await asyncio.gather(
            *(c.acomplete([{"role": "user", "content": str(i)}]) for i in range(8))
        )
        return usage, first, again, many

    usage, first, again, many = asyncio.run(scenario())
    assert first.text == "after retry" and first.cached is False
    assert again.text == "after retry" and again.cached is True
    assert [r.text for r in many] == [f"async {i}" for i in range(8)]
    assert state["peak"] == 2
    assert usage.retries == 1 and usage.calls == 9 and usage.cached_calls == 1


def test_async_errors_are_llm_errors(fake):
    fake.script(lambda messages: FakeLLM.error("auth"))
    with pytest.raises(LlmError, match="AuthenticationError"):
        asyncio.run(client().acomplete(MESSAGES))


# --- configuration and secrets -------------------------------------------------------------


def test_not_configured_names_the_setting_before_any_call(fake):
    fake.script(lambda messages: "ok")
    with pytest.raises(LlmNotConfigured) as info:
        client(slot(model="  ")).complete(MESSAGES)
    message = str(info.value)
    assert "[llm.background].model" in message
    assert "data/familiars/<id>/character.toml" in message
    assert "FAMILIAR__LLM__BACKGROUND__MODEL" in message

    missing = client_for(LlmConfig(slots={}), "reply", familiar_id="sapphire")
    assert missing.configured is False
    with pytest.raises(LlmNotConfigured, match=r"\[llm\.reply\]\.model in data/familiars/sapphire/"):
        missing.complete(MESSAGES)
    with pytest.raises(LlmNotConfigured):
        asyncio.run(missing.acomplete(MESSAGES))
    assert fake.calls == []


def test_missing_key_variable_is_a_configuration_error(fake, monkeypatch):
    monkeypatch.delenv("FAMILIAR_TEST_UNSET_KEY", raising=False)
    fake.script(lambda messages: "ok")
    with pytest.raises(LlmNotConfigured, match="FAMILIAR_TEST_UNSET_KEY"):
        client(slot(api_key_env="FAMILIAR_TEST_UNSET_KEY")).complete(MESSAGES)
    assert fake.calls == []


def test_api_key_is_read_at_call_time_and_never_leaks(fake, monkeypatch):
    planted = "sk-planted-9f8e7d6c5b4a39281706"
    monkeypatch.setenv("FAMILIAR_TEST_KEY", planted)
    fake.script(
        replies_in_order(
            "ok",
            FakeLLM.error("auth", f"Incorrect API key provided: {planted}. Authorization: Bearer {planted}"),
        )
    )
    c = client(slot(api_key_env="FAMILIAR_TEST_KEY", api_base="http://127.0.0.1:9/v1"))

    assert planted not in repr(c)
    assert "FAMILIAR_TEST_KEY" in repr(c)
    assert c.complete(MESSAGES).text == "ok"
    assert fake.calls[0].api_key == planted
    assert fake.calls[0].api_base == "http://127.0.0.1:9/v1"
    assert planted not in repr(fake.calls[0])

    with pytest.raises(LlmError) as info:
        c.complete(MESSAGES)
    assert planted not in str(info.value)
    assert planted not in repr(info.value)
    assert "[redacted]" in str(info.value)
    assert info.value.__cause__ is None

    rotated = "sk-rotated-0011223344556677"
    monkeypatch.setenv("FAMILIAR_TEST_KEY", rotated)
    fake.script(lambda messages: "ok")
    c.complete(MESSAGES)
    assert fake.calls[-1].api_key == rotated


def test_client_for_builds_from_config(fake, tmp_path):
    config = LlmConfig(
        max_concurrency=7,
        slots={"background": slot(cache=True), "reply": slot(name="reply", model="fake/chat")},
    )
    usage = LlmUsage()
    background = client_for(config, "background", cache_path=tmp_path / "c.sqlite", usage=usage)
    reply = client_for(config, "reply", cache_path=tmp_path / "c.sqlite")
    assert background.max_concurrency == 7 and background.usage is usage
    assert background.cache is not None and background.cache.path == tmp_path / "c.sqlite"
    assert reply.cache is None  # the reply slot does not cache
    assert reply.slot.model == "fake/chat"


def test_fake_is_scripted_from_the_environment(monkeypatch):
    with fake_llm() as fake:
        monkeypatch.setenv("FAMILIAR_FAKE_LLM", "json:dumps")
        c = client_for(LlmConfig(slots={"background": slot()}), "background")
        assert fake.scripted
        assert c.complete(MESSAGES).text == json.dumps(MESSAGES)

        # Code-scripted fakes win over a stray environment variable.
        fake.script(lambda messages: "from code")
        client_for(LlmConfig(slots={"background": slot()}), "background")
        assert c.complete(MESSAGES).text == "from code"

        fake.reset()
        monkeypatch.setenv("FAMILIAR_FAKE_LLM", "json")
        with pytest.raises(ConfigError, match="package.module:function"):
            client_for(LlmConfig(slots={"background": slot()}), "background")
        monkeypatch.setenv("FAMILIAR_FAKE_LLM", "json:no_such_function")
        with pytest.raises(ConfigError, match="cannot load"):
            client_for(LlmConfig(slots={"background": slot()}), "background")


def test_install_is_idempotent_and_reset_forgets(fake):
    from familiar_pipeline.testing.fake_llm import install_fake_llm

    assert install_fake_llm() is fake
    litellm = import_litellm()
    assert [e["provider"] for e in litellm.custom_provider_map].count("fake") == 1
    fake.script(lambda messages: "ok")
    client().complete(MESSAGES)
    fake.reset()
    assert fake.calls == [] and not fake.scripted


def test_a_broken_responder_fails_at_once_with_its_own_message(fake):
    def broken(messages):
        return messages[0]["no_such_key"]

    fake.script(broken)
    with pytest.raises(LlmError, match="fake LLM script error: KeyError") as info:
        client().complete(MESSAGES)
    assert info.value.attempts == 1

    fake.script(lambda messages: 42)
    with pytest.raises(LlmError, match="must be str"):
        client().complete(MESSAGES)


def test_a_keyless_openai_compatible_server_gets_a_placeholder_key(fake, monkeypatch):
    """Never the user's OPENAI_API_KEY to an arbitrary api_base; and the SDK needs some key."""
    from familiar_pipeline.models.llm import LOCAL_SERVER_KEY

    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-key-000000")
    local = client(slot(model="openai/smollm2", api_base="http://127.0.0.1:1/v1"))
    assert local._api_key() == LOCAL_SERVER_KEY
    assert client(slot(model="openai/gpt-4o-mini"))._api_key() is None


def test_an_async_call_imports_litellm_off_the_event_loop(fake, monkeypatch):
    """The first import takes seconds; on the loop it held back every message a transport read
    meanwhile (the console's lines typed during the first demo reply were recorded late, together)."""
    import threading

    from familiar_pipeline.models import llm as llm_module

    where: list[str] = []
    real = llm_module.import_litellm

    def watched():
        where.append(threading.current_thread().name)
        return real()

    monkeypatch.setattr(llm_module, "import_litellm", watched)
    fake.script(lambda messages: "hi")

    async def scenario():
        loop_thread = threading.current_thread().name
        reply = await client().acomplete(MESSAGES)
        return loop_thread, reply

    loop_thread, reply = asyncio.run(scenario())
    assert reply.text == "hi" and where and loop_thread not in where
