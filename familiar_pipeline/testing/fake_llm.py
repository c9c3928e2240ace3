"""An in-process litellm provider ("fake") so tests exercise the real client path.

Registered through ``litellm.custom_provider_map``, models named ``fake/<anything>``
go through litellm itself: request building, exception mapping, usage objects,
cost lookup, and our own retries and cache on top. Only the network is missing.
That is the point: a test that scripts replies here proves the client code a
real provider would run, not a shortcut around it.

Scripting: ``FakeLLM.script(responder)`` with ``responder(messages) -> reply``, or a
list of ``(match, reply)`` rules plus a ``default``. A reply is one of

* ``str``: the message content;
* ``list`` or ``dict``: sent as its JSON text (handy for projector tests);
* ``None``: a message whose content is None;
* ``NO_CHOICES``: a response with an empty ``choices`` list;
* an ``Exception``: raised from the provider, e.g. ``FakeLLM.error("rate_limit")``;
* in ``acompletion`` only, an awaitable resolving to one of the above.

Usage tokens are estimated from the real text (``ceil(chars / 4)``), so prompt
sizes in metadata and tests are real even when replies are canned.

Other processes (a Dagster run subprocess) pick a responder through
``FAMILIAR_FAKE_LLM=package.module:function``; ``llm.client_for`` installs it for
any slot whose model starts with ``fake/``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import math
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, Union

from familiar_pipeline.config import ConfigError
from familiar_pipeline.models.litellm_import import import_litellm

PROVIDER = "fake"
FAKE_LLM_ENV = "FAMILIAR_FAKE_LLM"


class _NoChoices:
    def __repr__(self) -> str:
        return "NO_CHOICES"


NO_CHOICES = _NoChoices()

Messages = list[dict[str, Any]]
Responder = Callable[[Messages], Any]
Matcher = Union[str, Callable[[Messages], bool]]
Rule = tuple[Matcher, Any]


@dataclass(frozen=True)
class FakeCall:
    """One request as the provider received it.

    ``messages`` are deep-copied so later mutation by the caller cannot change what
    a test asserts on; ``params`` are litellm's optional params (temperature,
    max_tokens, extras) minus the client's retry plumbing; ``api_key`` is kept
    so a test can check the key reached the provider, and left out of ``repr``.
    """

    model: str
    messages: Messages
    params: dict[str, Any]
    api_base: str | None
    timeout: float | None
    api_key: str | None = field(repr=False)

    def __getitem__(self, name: str) -> Any:
        """Dict-style access (``call["messages"]``), for tests that read calls that way."""
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    @property
    def system(self) -> str:
        return "\n".join(_text(m) for m in self.messages if m.get("role") == "system")

    @property
    def user(self) -> str:
        return "\n".join(_text(m) for m in self.messages if m.get("role") == "user")


_ERROR_KINDS = {
    "rate_limit": "RateLimitError",
    "server": "InternalServerError",
    "unavailable": "ServiceUnavailableError",
    "timeout": "Timeout",
    "connection": "APIConnectionError",
    "auth": "AuthenticationError",
    "bad_request": "BadRequestError",
}


class FakeLLM:
    """The scriptable fake. Use ``install_fake_llm()`` to get the process-wide one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._responder: Responder | None = None
        self._from_env: str | None = None
        self.calls: list[FakeCall] = []

    def __repr__(self) -> str:
        return f"FakeLLM(scripted={self._responder is not None}, calls={len(self.calls)})"

    # -- scripting ----------------------------------------------------------

    def script(self, responder: Responder | Sequence[Rule], *, default: Any = NO_CHOICES) -> FakeLLM:
        """Set how the fake answers; replaces any earlier script.

        ``responder`` is a callable taking the messages, or a list of
        ``(match, reply)`` rules: ``match`` is a substring looked for in the
        system and user messages, or a predicate over the messages. The first
        matching rule answers; with none matching, ``default`` does (by default
        a response with no choices, which the client reads as "").
        """
        if callable(responder):
            chosen: Responder = responder
        else:
            chosen = _rules_responder(list(responder), default)
        with self._lock:
            self._responder = chosen
            self._from_env = None
        return self

    def reset(self) -> None:
        """Forget the script and the recorded calls."""
        with self._lock:
            self._responder = None
            self._from_env = None
            self.calls = []

    @property
    def scripted(self) -> bool:
        return self._responder is not None

    @staticmethod
    def error(kind: str, message: str = "scripted failure") -> Exception:
        """A real litellm exception to script: ``rate_limit`` (429), ``server`` (500),
        ``unavailable`` (503), ``timeout``, ``connection`` (all retried by the client),
        ``auth`` (401) or ``bad_request`` (400) (both fail at once)."""
        if kind not in _ERROR_KINDS:
            raise ValueError(f"unknown fake error kind {kind!r}; valid: {', '.join(sorted(_ERROR_KINDS))}")
        exc_type = getattr(import_litellm(), _ERROR_KINDS[kind])
        return exc_type(message=message, llm_provider=PROVIDER, model=f"{PROVIDER}/model")

    # -- provider side --------------------------------------------------------

    def _answer(self, model: str, messages: Messages, optional_params: dict, api_base, timeout, api_key):
        recorded = FakeCall(
            model=f"{PROVIDER}/{model}",
            messages=copy.deepcopy(messages),
            params={k: v for k, v in optional_params.items() if k != "max_retries"},
            api_base=api_base,
            timeout=timeout if isinstance(timeout, (int, float)) else None,
            api_key=api_key,
        )
        with self._lock:
            self.calls.append(recorded)
            responder = self._responder
        if responder is None:
            # Returned, not raised: _fill raises it inside litellm like any scripted error.
            return import_litellm().BadRequestError(
                message=(
                    "the fake LLM has no script: call install_fake_llm().script(...) in the "
                    f"test, or set {FAKE_LLM_ENV}=package.module:function for this process"
                ),
                llm_provider=PROVIDER,
                model=recorded.model,
            )
        return responder(messages)

    def _fill(self, model_response: Any, model: str, messages: Messages, reply: Any) -> Any:
        if isinstance(reply, BaseException):
            raise reply
        from litellm.types.utils import Choices, Message, Usage

        if isinstance(reply, (list, dict)):
            reply = json.dumps(reply, ensure_ascii=False)
        if reply is NO_CHOICES:
            model_response.choices = []
            completion_chars = 0
        elif reply is None or isinstance(reply, str):
            message = Message(role="assistant", content=reply)
            model_response.choices = [Choices(index=0, message=message, finish_reason="stop")]
            completion_chars = len(reply or "")
        else:
            raise TypeError(
                "a fake LLM reply must be str, list, dict, None, NO_CHOICES or an exception; "
                f"got {reply!r:.80}"
            )
        prompt_tokens = math.ceil(sum(len(_text(m)) for m in messages) / 4)
        completion_tokens = math.ceil(completion_chars / 4)
        model_response.usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        model_response.model = f"{PROVIDER}/{model}"
        return model_response

    # -- environment ----------------------------------------------------------

    def script_from_env(self) -> bool:
        """Script from ``FAMILIAR_FAKE_LLM`` unless code already scripted the fake.

        Code wins so a test that scripts the fake is not overridden by a stray
        environment variable. Returns whether the environment script is active.
        """
        spec = os.environ.get(FAKE_LLM_ENV, "").strip()
        if not spec:
            return False
        with self._lock:
            if self._from_env == spec:
                return True
            if self._responder is not None and self._from_env is None:
                return False
        responder = load_responder(spec)
        with self._lock:
            self._responder = responder
            self._from_env = spec
        return True


def load_responder(spec: str) -> Responder:
    """Import ``package.module:function`` (or ``:Class.attr``) and check it is callable."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"{FAKE_LLM_ENV}={spec!r} must look like package.module:function")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr_path.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{FAKE_LLM_ENV}={spec!r}: cannot load the responder ({exc})") from exc
    if not callable(target):
        raise ConfigError(f"{FAKE_LLM_ENV}={spec!r} names {type(target).__name__}, not a callable responder")
    return target


def replies_in_order(*replies: Any) -> Responder:
    """A responder giving ``replies`` one per call, then repeating the last one.

    The common "scripted LLM returns replies in order" of projector tests, and the
    way to script "fail twice, then answer" for retry tests.
    """
    if not replies:
        raise ValueError("replies_in_order needs at least one reply")
    lock = threading.Lock()
    position = 0

    def responder(_messages: Messages) -> Any:
        nonlocal position
        with lock:
            reply = replies[min(position, len(replies) - 1)]
            position += 1
        return reply

    return responder


def _rules_responder(rules: list[Rule], default: Any) -> Responder:
    for index, rule in enumerate(rules):
        is_pair = isinstance(rule, tuple) and len(rule) == 2
        if not (is_pair and (isinstance(rule[0], str) or callable(rule[0]))):
            raise ValueError(f"rule {index} must be a (substring-or-predicate, reply) pair, got {rule!r:.80}")

    def responder(messages: Messages) -> Any:
        searchable = "\n".join(_text(m) for m in messages if m.get("role") in ("system", "user"))
        for match, reply in rules:
            if (match in searchable) if isinstance(match, str) else match(messages):
                return reply
        return default

    return responder


def _text(message: dict[str, Any]) -> str:
    """The text of a message; multimodal content lists contribute their text parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


# --- registration --------------------------------------------------------------

_install_lock = threading.Lock()
_fake: FakeLLM | None = None
_handler: Any = None


def _make_handler(fake: FakeLLM) -> Any:
    litellm = import_litellm()
    custom_llm: Any = litellm.CustomLLM  # litellm is imported lazily (import_litellm), so untyped here

    class FakeProvider(custom_llm):
        """The litellm side: turns a request into a ModelResponse via the script."""

        def completion(self, model, messages, api_base, custom_prompt_dict, model_response, print_verbose,
                       encoding, api_key, logging_obj, optional_params, *args, timeout=None, **kwargs):
            try:
                reply = fake._answer(model, messages, optional_params, api_base, timeout, api_key)
                if inspect.iscoroutine(reply):
                    reply.close()  # never awaited: close it to avoid a "never awaited" warning
                if inspect.isawaitable(reply):
                    raise TypeError("an async responder can only answer acompletion calls")
                return fake._fill(model_response, model, messages, reply)
            except Exception as exc:  # noqa: BLE001 - re-raised, see _provider_error
                raise _provider_error(exc, model) from None

        async def acompletion(self, model, messages, api_base, custom_prompt_dict, model_response,
                              print_verbose, encoding, api_key, logging_obj, optional_params, *args,
                              timeout=None, **kwargs):
            try:
                reply = fake._answer(model, messages, optional_params, api_base, timeout, api_key)
                if inspect.isawaitable(reply):
                    reply = await reply
                return fake._fill(model_response, model, messages, reply)
            except Exception as exc:  # noqa: BLE001 - re-raised, see _provider_error
                raise _provider_error(exc, model) from None

    return FakeProvider()


def _provider_error(exc: Exception, model: str) -> Exception:
    """Pass litellm/OpenAI errors through; turn anything else into a BadRequestError.

    litellm maps an unknown exception from a provider to APIConnectionError, which
    the client retries. A bug in a test's responder (KeyError, a wrong reply type)
    must fail at once with its own message instead of looking like a flaky network.
    """
    import openai

    if isinstance(exc, openai.OpenAIError):
        return exc
    return import_litellm().BadRequestError(
        message=f"fake LLM script error: {type(exc).__name__}: {exc}",
        llm_provider=PROVIDER,
        model=f"{PROVIDER}/{model}",
    )


def install_fake_llm() -> FakeLLM:
    """Register the fake provider with litellm (idempotent); return the process-wide fake."""
    global _fake, _handler
    with _install_lock:
        if _fake is None:
            _fake = FakeLLM()
            _handler = _make_handler(_fake)
        litellm = import_litellm()
        entries = [e for e in litellm.custom_provider_map if e.get("provider") != PROVIDER]
        litellm.custom_provider_map = [*entries, {"provider": PROVIDER, "custom_handler": _handler}]
        return _fake


def install_from_env() -> FakeLLM:
    """Install the fake and apply ``FAMILIAR_FAKE_LLM`` if set (used by ``client_for``)."""
    fake = install_fake_llm()
    fake.script_from_env()
    return fake


@contextmanager
def fake_llm(
    responder: Responder | Sequence[Rule] | None = None, *, default: Any = NO_CHOICES
) -> Iterator[FakeLLM]:
    """Install, optionally script, and reset afterwards: ``with fake_llm(...) as fake:``.

    In pytest: ``@pytest.fixture def fake(): with fake_llm() as f: yield f``.
    """
    fake = install_fake_llm()
    fake.reset()
    if responder is not None:
        fake.script(responder, default=default)
    try:
        yield fake
    finally:
        fake.reset()
