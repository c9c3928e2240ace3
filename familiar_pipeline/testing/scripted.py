"""A scripted "careful model" for tests, benchmarks and offline end-to-end runs.

It answers each projector's real prompt deterministically from the prompt's own
content (the participants and turns it lists), so prompt sizes, parsing, caching
and every watermark rule run for real while the replies cost nothing. Each
projector's answer lives in its own folder (``projectors/<name>/scripted.py``, the
spec's ``scripted``); this module routes a prompt to it and answers the bot's reply
prompt and the answer judge itself. Select it for a familiar with
`[llm.background] model = "fake/careful"` and
`FAMILIAR_FAKE_LLM=familiar_pipeline.testing.scripted:careful_model`.
"""

from __future__ import annotations

import json
import re

from familiar_pipeline.engine import registry
from familiar_pipeline.projectors.prompting import first_sentence, messages_text

# character.toml lines that point both model slots at the in-process fake, with no
# retries (a scripted fault should surface at once).
FAKE_MODELS_TOML = """
[llm.reply]
model = "fake/reply"
max_retries = 0

[llm.background]
model = "fake/careful"
max_retries = 0
"""

_WORD = re.compile(r"[a-z0-9']+")
_QUOTED_LINE = re.compile(r"^(?:> \[[^\]]*\]: |- )(.*)$")
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it its of on or she he they "
    "that the their them this to was were what when where which who why with you your".split()
)


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def answer_question(system_text: str, question: str) -> str:
    """A short answer from the reply prompt's own memory lines: the first six content words of the
    quoted line sharing most words with the question. Deterministic; "I don't know" when no line
    shares a word, so what retrieval put in the prompt decides the score."""
    asked = _content_words(question)
    best, best_overlap = "", 0
    for line in system_text.splitlines():
        match = _QUOTED_LINE.match(line.strip())
        if not match:
            continue
        overlap = len(_content_words(match.group(1)) & asked)
        if overlap > best_overlap:
            best, best_overlap = match.group(1), overlap
    rest = [w for w in _WORD.findall(best.lower()) if w not in _STOPWORDS]
    return " ".join(rest[:6]) if rest else "I don't know"


_JUDGE_FIELD = re.compile(r'^(Gold answer|Generated answer): ("(?:[^"\\]|\\.)*")$', re.MULTILINE)


def judge_answer(user_text: str) -> dict:
    """CORRECT when the generated answer shares a content word with the gold one, with a one-line reason."""
    fields = {m.group(1): json.loads(m.group(2)) for m in _JUDGE_FIELD.finditer(user_text)}
    shared = sorted(_content_words(fields.get("Gold answer", "")) & _content_words(fields.get("Generated answer", "")))
    if shared:
        return {"reason": f"both name {', '.join(shared[:3])}", "label": "CORRECT"}
    return {"reason": "no word of the gold answer appears", "label": "WRONG"}


def careful_model(messages: list[dict]) -> str:
    """Route a projector prompt to its projector's scripted answer; the bot's reply prompt and the
    answer judge of `familiar eval locomo --answer` get a short answer and a label."""
    system, user = messages_text(messages)
    if "## Replying" in system:
        return answer_question(system, re.sub(r"^\[[^\]]*\]\s*", "", user.strip()).split("\n")[0])
    if "Label the generated answer CORRECT or WRONG" in system:
        return json.dumps(judge_answer(user))
    for spec in registry.specs():
        answer = spec.load_scripted()
        if answer is not None:
            reply = answer(messages)
            if reply is not None:
                return reply
    return "[]"


# --------------------------------------------------------------------------- the offline demo

# What `familiar up --demo` names as the scripted model's script (FAMILIAR_FAKE_LLM) for itself
# and its children; the settings that select it, for the demo familiar only, are in
# familiar_pipeline/config/demo.py.
DEMO_RESPONDER = "familiar_pipeline.testing.scripted:demo_model"
DEMO_REPLY_PREFIX = "(scripted demo reply)"

def canned_reply(user_text: str) -> str:
    """The demo's reply: says plainly that it is scripted, and echoes what it will remember."""
    said = re.sub(r"^\[[^\]]*\]\s*", "", user_text.strip())  # drop the "[10:00 Sam] " history prefix
    return (f"{DEMO_REPLY_PREFIX} Noted: \"{first_sentence(said, 100).rstrip('.!?')}\". "
            "Memory is built in the background; /context shows what I know.")


def demo_model(messages: list[dict]) -> str:
    """The scripted model of `familiar up --demo`: projector prompts as `careful_model`, replies canned."""
    system = messages[0]["content"] if messages else ""
    if "## Replying" in system:  # the reply prompt (familiar_bot's reply instructions)
        # The last line from a person: the message this reply answers, as the responder shows no
        # one's later line in a reply's history (AssemblyContext.answering), however many came after it.
        said = [m["content"] for m in messages[1:] if m.get("role") == "user"]
        return canned_reply(said[-1] if said else "")
    return careful_model(messages)
