"""A scripted "careful model" for tests, benchmarks and offline end-to-end runs.

It answers each projector's real prompt deterministically from the prompt's own
content (the participants and turns it lists), so prompt sizes, parsing, caching
and every watermark rule run for real while the replies cost nothing. Select it
for a familiar with `[llm.background] model = "fake/careful"` and
`FAMILIAR_FAKE_LLM=familiar_pipeline.testing.scripted:careful_model`.
"""

from __future__ import annotations

import json
import re

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

_TURN_LINE = re.compile(r'^- id=(\d+)(?: #-?\d+)? ("(?:[^"\\]|\\.)*"): ("(?:[^"\\]|\\.)*")$')
_PARTICIPANT_LINE = re.compile(r'^- ([a-z][a-z0-9_-]*:[^:\s]+): ("(?:[^"\\]|\\.)*")$')


def parse_prompt_turns(user_text: str) -> list[tuple[int, str, str]]:
    """(id, speaker, content) of every turn line in a projector prompt."""
    turns = []
    for line in user_text.splitlines():
        match = _TURN_LINE.match(line)
        if match:
            turns.append((int(match.group(1)), json.loads(match.group(2)), json.loads(match.group(3))))
    return turns


def parse_prompt_participants(user_text: str) -> dict[str, str]:
    """label -> canonical key from a Participants block."""
    found = {}
    for line in user_text.splitlines():
        match = _PARTICIPANT_LINE.match(line)
        if match:
            found[json.loads(match.group(2))] = match.group(1)
    return found


def _first_sentence(text: str, limit: int = 140) -> str:
    sentence = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return sentence[:limit].rstrip()


def extract_facts(user_text: str) -> list[dict]:
    """One fact per substantive user turn, attributed to its speaker."""
    participants = parse_prompt_participants(user_text)
    facts = []
    for turn_id, speaker, content in parse_prompt_turns(user_text):
        key = participants.get(speaker)
        words = content.split()
        if key is None or key.startswith("ego:") or len(words) < 4:
            continue
        facts.append(
            {
                "text": f"{speaker} said: {_first_sentence(content)}",
                "source_turn_ids": [turn_id],
                "subject_keys": [key],
                "importance": 1 + (len(words) % 10),
            }
        )
    return facts


def summarize(user_text: str) -> str:
    turns = parse_prompt_turns(user_text)
    if not turns:
        return ""
    speakers = sorted({speaker for _, speaker, _ in turns})
    prior = ""
    if user_text.startswith("Previous summary:"):
        prior = user_text.split("\n", 2)[1]
    latest = _first_sentence(turns[-1][2], 80)
    head = f"Through turn {turns[-1][0]}: {', '.join(speakers)} talked; latest: {latest}."
    return (prior + " " + head).strip()[-1500:]


# --------------------------------------------------------------------------- supersession

_FACT_LINE = re.compile(r'^- id=(\d+): ("(?:[^"\\]|\\.)*")$')
_NEW_FACT = re.compile(r'^NEW fact \(id=(\d+)\): ("(?:[^"\\]|\\.)*")$')
_ADDITIVE = re.compile(r"\b(?:also|too|as well|in addition|another|additionally|besides)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:no longer|not anymore|doesn't|does not|don't|do not|never|stopped|quit|gave up)\b", re.IGNORECASE)

# Exclusive slots: a person has one value at a time. Each pattern captures the value.
_SLOTS: list[tuple[str, re.Pattern]] = [
    ("home", re.compile(r"\b(?:lives?|living|moved|relocated|resides|is based|settled)\b(?: back)?(?: \w+)?? (?:in|to) (?P<v>[A-Z][\w'-]*(?: [A-Z][\w'-]*)*)")),
    ("job", re.compile(r"\b(?:works|working|worked|got a job|took a job|started a job|started working|is employed|employed)\b(?: now)?(?: as| at| for)(?: an?| the)? (?P<v>[\w' -]+?)(?:[.,;]|$)")),
    ("relationship", re.compile(r"\b(?:is dating|is married to|is engaged to|is in a relationship with|is single)\b ?(?P<v>[\w' -]*?)(?:[.,;]|$)")),
    ("diet", re.compile(r"\b(?:is|became|went) (?P<v>vegan|vegetarian|pescatarian|carnivore)\b")),
]
_PREFERENCE = re.compile(
    r"\b(?P<verb>(?:like|love|enjoy|adore|hate|dislike|detest|prefer|eat|drink|play|own)s?|can't stand)\b(?P<obj>[\w' -]+?)(?:[.,;]|$)",
    re.IGNORECASE,
)
_NEGATIVE_VERBS = {"hate", "dislike", "detest", "can't stand"}
_FILLER = re.compile(r"\b(?:now|really|still|actually|a lot|very much|so much)\b", re.IGNORECASE)


def _norm(value: str) -> str:
    return " ".join(_FILLER.sub(" ", value).lower().replace("'s", "").split()).strip(" .,;-")


def fact_claim(text: str) -> tuple[str, str, bool] | None:
    """(slot, value, positive) for the facts the careful model can judge, else None.

    Exclusive slots (home, job, relationship, diet) carry a value; preferences
    carry their object as the slot and a polarity ("loves X" vs "hates X",
    "no longer eats X").
    """
    negated = bool(_NEGATION.search(text))
    for slot, pattern in _SLOTS:
        match = pattern.search(text)
        if match:
            return slot, _norm(match.group("v")), not negated
    match = _PREFERENCE.search(text)
    if match:
        verb = match.group("verb").lower()
        verb = verb[:-1] if verb.endswith("s") else verb
        obj = _norm(re.sub(r"\b(?:anymore|any more)\b", "", match.group("obj")))
        positive = (verb not in _NEGATIVE_VERBS) != negated
        group = verb if verb in ("eat", "drink", "play", "own") else "pref"
        return f"{group}:{obj}", "", positive
    return None


def retires(new_text: str, prior_text: str) -> bool:
    """What a careful model answers: does the new fact contradict or replace the prior?"""
    new, prior = fact_claim(new_text), fact_claim(prior_text)
    if new is None or prior is None or new[0] != prior[0]:
        return False
    slot, value, positive = new
    if slot.startswith(("pref:", "eat:", "drink:", "play:", "own:")):
        return positive != prior[2]  # a flipped preference or a negation
    if not positive:  # "no longer works at the bakery" ends that job only
        return value == prior[1] or not value
    if _ADDITIVE.search(new_text):
        return False  # a second job, another home base: adds, never replaces
    return value != prior[1] or not prior[2]


def decide_supersession(user_text: str) -> dict:
    """Each NEW fact retires the earlier facts (PRIOR, or NEW above it) that `retires` says it replaces."""
    earlier, decisions = [], []
    for line in user_text.splitlines():
        if match := _NEW_FACT.match(line):
            new_id, new_text = int(match.group(1)), json.loads(match.group(2))
            named = [pid for pid, text in earlier if retires(new_text, text)]
            if named:
                decisions.append({"new_id": new_id, "superseded_ids": named})
            earlier.append((new_id, new_text))
        elif match := _FACT_LINE.match(line):
            earlier.append((int(match.group(1)), json.loads(match.group(2))))
    return {"decisions": decisions}


# --------------------------------------------------------------------------- dossiers and reflections

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def write_dossier(user_text: str) -> str:
    """Prior text (if any) followed by the new facts, capped: what a terse, faithful writer returns."""
    lines = user_text.splitlines()
    prior = ""
    if "Previous dossier:" in lines:
        prior = json.loads(lines[lines.index("Previous dossier:") + 1])
    facts = []
    for line in lines:
        if line.startswith("- "):
            match = _QUOTED.search(line)
            if match:
                tag = line[2 : match.start()]  # echo "(importance N) " like a sloppy model would
                facts.append(tag + json.loads(match.group(0)))
    if not facts:
        return prior
    return (prior + " " + " ".join(facts)).strip()[-1200:]


def write_reflections(system_text: str, user_text: str) -> list[dict]:
    """One reflection per speaker with at least three turns in the window, citing two of them and a fact naming them."""
    cap = re.search(r"at most (\d+)", system_text)
    limit = int(cap.group(1)) if cap else 3
    by_speaker: dict[str, list[int]] = {}
    for turn_id, speaker, _content in parse_prompt_turns(user_text):
        by_speaker.setdefault(speaker, []).append(turn_id)
    facts = [(int(m.group(1)), json.loads(m.group(2))) for line in user_text.splitlines() if (m := _FACT_LINE.match(line))]
    out = []
    for speaker, ids in sorted(by_speaker.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(ids) < 3:
            continue
        cited_facts = [fid for fid, text in facts if speaker in text][:1]
        out.append({
            "text": f"{speaker} keeps coming back to the same threads ({len(ids)} turns in this stretch).",
            "cited_turn_ids": [ids[0], ids[-1]],
            "cited_fact_ids": cited_facts,
        })
    return out[:limit]


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
    """Route a projector prompt to its scripted answer (by a phrase of its system prompt); the bot's
    reply prompt and the answer judge of `familiar eval locomo --answer` get a short answer and a label."""
    system = messages[0]["content"] if messages else ""
    user = messages[-1]["content"] if messages else ""
    if "## Replying" in system:
        return answer_question(system, re.sub(r"^\[[^\]]*\]\s*", "", user.strip()).split("\n")[0])
    if "Label the generated answer CORRECT or WRONG" in system:
        return json.dumps(judge_answer(user))
    if "atomic facts" in system:
        return json.dumps({"facts": extract_facts(user)})
    if "running summary" in system:
        return summarize(user)
    if "superseded_ids" in system:
        return json.dumps(decide_supersession(user))
    if "dossier" in system or "self-record" in system:
        return write_dossier(user)
    if "reflections" in system:
        return json.dumps({"reflections": write_reflections(system, user)})
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
    return (f"{DEMO_REPLY_PREFIX} Noted: \"{_first_sentence(said, 100).rstrip('.!?')}\". "
            "Memory is built in the background; /context shows what I know.")


def demo_model(messages: list[dict]) -> str:
    """The scripted model of `familiar up --demo`: projector prompts as `careful_model`, replies canned."""
    system = messages[0]["content"] if messages else ""
    if "## Replying" in system:  # the reply prompt (familiar_bot's reply instructions)
        # The newest line from a person: lines typed while a reply was composed are recorded at
        # once, so the familiar's previous reply may come after them in the history.
        said = [m["content"] for m in messages[1:] if m.get("role") == "user"]
        return canned_reply(said[-1] if said else "")
    return careful_model(messages)
