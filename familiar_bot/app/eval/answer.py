"""Answer quality on LoCoMo: the bot answers each question, scored by token F1 and an LLM judge.

What the published memory systems report on LoCoMo is end-to-end answer quality:
a model answers each question from the memory the system retrieved, and a
judge model labels every answer CORRECT or WRONG against the gold answer ("J",
generous about wording and date formats), next to token F1. This module
produces the same two figures for a familiar, through the bot's own path:

* each question is a direct message from an asker, in a channel of its own
  (so no question sees another in its history), handled by the real
  :class:`~familiar_bot.responder.flow.Responder`: the message is recorded, the real
  assembler builds the text-tier prompt with every default layer (the question
  is the retrieval cue), and the ``[llm.reply]`` slot answers;
* the judge is the ``[llm.judge]`` slot (falling back to the answering model),
  asked for a one-line reason and a label as JSON;
* both slots use the response cache at an explicit path, so a rerun of the same
  evaluation makes no new call.

The asker adds :data:`ANSWER_STYLE` to the question: the gold answers are a few
words, token F1 punishes every extra word, and the peers' answer prompts ask for
the same brevity.

Only scores, token counts, costs, latencies and the generated answers and
reasons leave this module; the licensed questions and gold answers do not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import statistics
import string
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Mapping

from familiar_pipeline.config import FrozenDict, load_config
from familiar_pipeline.models.jsonparse import coerce_json
from familiar_pipeline.models.llm import LlmError, client_for
from familiar_pipeline.storage.paths import FamiliarPaths

from familiar_bot.app.eval.evaluation import EVAL_SCOPE, CATEGORIES, PreparedConversation, _percentile
from familiar_bot.responder.messages import IncomingMessage, Person
from familiar_bot.responder.opening import open_responder

ANSWER_STYLE = "(Answer in a few words, from what you remember of our conversations.)"
ASKER_KEY = "locomo:asker"
ASKER_NAME = "Asker"
# Question channels start here, far above the conversation's own channel.
QUESTION_CHANNEL_BASE = 1_000_000
# The question is asked an hour after the conversation's last turn.
ASKED_AFTER = timedelta(hours=1)

JUDGE_SYSTEM = """\
You grade answers to questions about long conversations between two people. You get a question, \
the gold (true) answer, and a generated answer. Label the generated answer CORRECT or WRONG.

Be generous about form: a longer answer is CORRECT as long as it names the same thing as the gold \
answer. For time questions it is CORRECT when it refers to the same date or period, in any format \
("7 May 2023", "May 7th", "the week before 9 May 2023" for "7 May 2023"). It is WRONG when it names \
something else, says it does not know, or contradicts the gold answer.

Reply with a JSON object only: {"reason": "<one short sentence>", "label": "CORRECT" or "WRONG"}."""

JUDGE_SCHEMA = {
    "name": "judgement",
    "schema": {
        "type": "object",
        "properties": {"reason": {"type": "string"}, "label": {"type": "string", "enum": ["CORRECT", "WRONG"]}},
        "required": ["reason", "label"],
        "additionalProperties": False,
    },
}


def judge_messages(question: str, gold: str, generated: str) -> list[dict]:
    user = (f"Question: {json.dumps(question, ensure_ascii=False)}\n"
            f"Gold answer: {json.dumps(gold, ensure_ascii=False)}\n"
            f"Generated answer: {json.dumps(generated, ensure_ascii=False)}")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


_LABEL = re.compile(r"\b(CORRECT|WRONG)\b")


def parse_judgement(text: str) -> tuple[str | None, str]:
    """``(label, reason)`` from a judge's reply; label None when it names neither or both labels.

    JSON first (``{"reason", "label"}``); otherwise the reply's one upper-case label
    word, as the protocol's own scripts read it.
    """
    data = coerce_json(text, "object")
    if isinstance(data, dict):
        label = str(data.get("label", "")).strip().upper()
        if label in ("CORRECT", "WRONG"):
            return label, " ".join(str(data.get("reason", "")).split())
    labels = set(_LABEL.findall(text or ""))
    if len(labels) == 1:
        return labels.pop(), " ".join(_LABEL.sub("", text).split())[:200]
    return None, " ".join((text or "").split())[:200]


# --------------------------------------------------------------------------- token F1

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation + "‘’“”")


def answer_tokens(text: str) -> list[str]:
    """Lower case, no punctuation, no articles (nor "and"): the SQuAD-style normalisation LoCoMo's F1 uses."""
    text = str(text).lower().replace(",", " ").translate(_PUNCTUATION)
    return _ARTICLES.sub(" ", text).split()


def token_f1(generated: str, gold: str) -> float:
    """Harmonic mean of token precision and recall between the normalised answers (0..1)."""
    pred, ref = answer_tokens(generated), answer_tokens(gold)
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


# --------------------------------------------------------------------------- asking


def slot_for(config, name: str, model: str | None, *, fallback: str | None = None):
    """``[llm.<name>]`` of ``config`` with ``model`` (else the slot's, else ``fallback``) and the cache on."""
    slot = config.llm.slot(name)
    chosen = (model or "").strip() or slot.model.strip() or (fallback or "").strip()
    return dataclasses.replace(slot, model=chosen, cache=True)


def with_slots(config, *, answer_model: str | None, judge_model: str | None):
    """``config`` with the reply and judge slots the evaluation calls; raises ValueError naming the setting."""
    reply = slot_for(config, "reply", answer_model)
    if not reply.configured:
        raise ValueError("--answer needs an answering model: --answer-model MODEL or [llm.reply].model "
                         "(FAMILIAR__LLM__REPLY__MODEL)")
    judge = slot_for(config, "judge", judge_model, fallback=reply.model)
    slots = type(config.llm.slots)({**config.llm.slots, "reply": reply, "judge": judge})
    return dataclasses.replace(config, llm=dataclasses.replace(config.llm, slots=slots))


class _Recording:
    """The reply client, keeping each reply so the harness sees its tokens, cost and latency."""

    def __init__(self, client) -> None:
        self.client = client
        self.replies: list = []

    @property
    def configured(self) -> bool:
        return self.client.configured

    async def acomplete(self, messages, **params):
        reply = await self.client.acomplete(messages, **params)
        self.replies.append(reply)
        return reply


def with_question_scopes(config, conv: PreparedConversation):
    """``config`` with each question's channel joined to the conversation's scope (and to no other
    question's): a question reads the imported conversation, as a reply in that scope would, but
    never an earlier question or answer."""
    groups = {f"question-{q.index}": (f"channel:{QUESTION_CHANNEL_BASE + q.index}", EVAL_SCOPE)
              for q in conv.questions}
    scopes = dataclasses.replace(config.memory.scopes, groups=FrozenDict(groups))
    return dataclasses.replace(config, memory=dataclasses.replace(config.memory, scopes=scopes))


def answer_conversation(conv: PreparedConversation, *, cache_path: Path, answer_model: str | None = None,
                        judge_model: str | None = None, progress: Callable[[int], None] | None = None) -> list[dict]:
    """One record per question of ``conv``: the answer, its F1 and judgement, tokens, cost and latency."""
    config = with_slots(load_config(conv.familiar_id, root=conv.root), answer_model=answer_model,
                        judge_model=judge_model)
    config = with_question_scopes(config, conv)
    paths = FamiliarPaths.for_id(conv.familiar_id, conv.root)
    handle = open_responder(paths, config)
    # The same responder as the bot's, with its reply client's cache at cache_path (kept across runs).
    if handle.responder.llm.cache is not None:
        handle.responder.llm.cache.close()
    reply_client = client_for(config.llm, "reply", cache_path=cache_path, familiar_id=conv.familiar_id)
    recording = _Recording(reply_client)
    handle.responder.llm = recording
    judge = client_for(config.llm, "judge", cache_path=cache_path, familiar_id=conv.familiar_id)
    asked_at = handle.responder.turn_log.recent_cross_channel(1)[0].created_at + ASKED_AFTER
    asker = Person(key=ASKER_KEY, global_name=ASKER_NAME)
    records: list[dict] = []

    async def ask_all() -> None:
        for q in conv.questions:
            message = IncomingMessage(channel_id=QUESTION_CHANNEL_BASE + q.index, author=asker, direct=True,
                                      content=f"{q.text}\n{ANSWER_STYLE}", created_at=asked_at)
            before = len(recording.replies)
            pieces = await handle.responder.handle(message)
            reply = recording.replies[-1] if len(recording.replies) > before else None
            answered = reply is not None and bool(pieces) and bool(reply.text.strip())
            generated = " ".join(pieces) if answered else ""
            record = {"conversation": conv.sample_id, "question_index": q.index, "category": q.category,
                      "answer": generated, "answered": answered, "f1": token_f1(generated, q.answer),
                      "answer_prompt_tokens": reply.prompt_tokens if reply else 0,
                      "answer_completion_tokens": reply.completion_tokens if reply else 0,
                      "answer_cost_usd": reply.cost_usd if reply else 0.0,
                      "answer_latency_s": reply.latency_s if reply else 0.0,
                      "answer_cached": bool(reply and reply.cached)}
            record.update(await judge_one(judge, q.text, q.answer, generated))
            records.append(record)
            if progress is not None:
                progress(1)

    try:
        asyncio.run(ask_all())
    finally:
        handle.close()
        for client in (reply_client, judge):
            if client.cache is not None:
                client.cache.close()
    return records


async def judge_one(judge, question: str, gold: str, generated: str) -> dict[str, Any]:
    """The judge's label and reason for one answer; an unanswered question is WRONG without a call."""
    out = {"judge_prompt_tokens": 0, "judge_completion_tokens": 0, "judge_cost_usd": 0.0,
           "judge_latency_s": 0.0, "judge_cached": False}
    if not generated.strip():
        return {**out, "label": "WRONG", "judged": False, "reason": "no answer"}
    try:
        reply = await judge.acomplete(judge_messages(question, gold, generated), json_schema=JUDGE_SCHEMA)
    except LlmError as exc:
        return {**out, "label": "WRONG", "judged": False, "reason": f"judge failed: {exc}"[:300]}
    label, reason = parse_judgement(reply.text)
    out.update(judge_prompt_tokens=reply.prompt_tokens, judge_completion_tokens=reply.completion_tokens,
               judge_cost_usd=reply.cost_usd, judge_latency_s=reply.latency_s, judge_cached=reply.cached)
    if label is None:
        return {**out, "label": "WRONG", "judged": False, "reason": f"unparsed judge reply: {reason}"}
    return {**out, "label": label, "judged": True, "reason": reason}


# --------------------------------------------------------------------------- figures


def aggregate_answers(records: list[dict]) -> dict[str, Any]:
    """J and F1 as percentages, how many were answered and judged, tokens, cost and latency."""
    n = len(records)
    if not n:
        return {"n": 0}
    latencies = [r["answer_latency_s"] for r in records]
    tokens = {k: sum(r[k] for r in records) for k in (
        "answer_prompt_tokens", "answer_completion_tokens", "judge_prompt_tokens", "judge_completion_tokens")}
    return {
        "n": n,
        "j": round(100 * sum(r["label"] == "CORRECT" for r in records) / n, 2),
        "f1": round(100 * statistics.fmean(r["f1"] for r in records), 2),
        "answered": sum(r["answered"] for r in records),
        "judged": sum(r["judged"] for r in records),
        **tokens,
        "answer_prompt_tokens_mean": round(tokens["answer_prompt_tokens"] / n, 1),
        "cost_usd": round(sum(r["answer_cost_usd"] + r["judge_cost_usd"] for r in records), 6),
        "cached_calls": sum(r["answer_cached"] + r["judge_cached"] for r in records),
        "answer_latency_s_p50": round(_percentile(latencies, 0.50), 3),
        "answer_latency_s_p95": round(_percentile(latencies, 0.95), 3),
    }


def summarize_answers(records: list[dict], *, answer_model: str, judge_model: str) -> dict[str, Any]:
    by_category = {name: aggregate_answers([r for r in records if r["category"] == c])
                   for c, name in CATEGORIES.items()}
    return {"answer_model": answer_model, "judge_model": judge_model,
            "overall": aggregate_answers(records),
            "by_category": {k: v for k, v in by_category.items() if v["n"]},
            "questions": records}


ANSWER_COLUMNS = ("n", "j", "f1", "answered", "judged", "answer_prompt_tokens_mean", "cost_usd",
                  "answer_latency_s_p50", "answer_latency_s_p95")


def answer_table(section: Mapping[str, Any]) -> str:
    """The answer section as markdown: a line naming the models, then overall and per category."""
    lines = [f"answers by {section['answer_model']}, judged by {section['judge_model']} "
             "(j: % judged CORRECT; f1: mean token F1 x 100)", "",
             "| scope | " + " | ".join(ANSWER_COLUMNS) + " |", "|" + "---|" * (len(ANSWER_COLUMNS) + 1)]
    for name, values in [("overall", section["overall"]), *section["by_category"].items()]:
        cells = [str(values[c]) if c in ("n", "answered", "judged") else
                 (f"{values[c]:.4f}" if c == "cost_usd" else f"{values[c]:.1f}" if "latency" not in c
                  else f"{values[c]:.2f}") for c in ANSWER_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def resolved_models(prepared: list[PreparedConversation], answer_model: str | None,
                    judge_model: str | None) -> tuple[str, str]:
    """The answering and judging model strings the run will use (for the results' header)."""
    if not prepared:
        return (answer_model or "", judge_model or answer_model or "")
    conv = prepared[0]
    config = with_slots(load_config(conv.familiar_id, root=conv.root), answer_model=answer_model,
                        judge_model=judge_model)
    return config.llm.slot("reply").model, config.llm.slot("judge").model
