"""The README's offline-demo transcript is what the demo prints (issue 50 item 5).

The demo conversation is typed into the console chat of the familiar `familiar up --demo` runs,
with the demo's settings and its scripted model (`familiar_pipeline.testing.scripted:demo_model`),
one line at a time as a person waits for each reply; then the projection step runs every asset
as the turn sensor would (in process here), and `/context Porto` is asked. The README shows that
session: the chat whole, the report abridged, each `...` line standing for lines left out. A line
of the README's block that the session did not print, or printed elsewhere, fails here, so the
sample cannot drift from what the demo does.
"""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import dagster as dg
import pytest

from familiar_pipeline.config.demo import DEMO_FAMILIAR, DEMO_FAMILIAR_ENV
from tests.conftest import host_free
from tests.fact_helpers import ALL_ASSETS, materialize

REPO = Path(__file__).resolve().parents[1]
README_SECTION = REPO / "README.md"
# What the README's demo types: a home, other people's lives (a sister's job, a friend's home), a
# preference that flips, a move. Eight lines: with the replies, four whole extraction batches of the demo.
DEMO_LINES = [
    "hi, I'm Sam and I live in Lisbon.",
    "my sister Ana works as a teacher in Porto.",
    "I love hiking in the mountains on weekends.",
    "my cat Miso only eats fresh tuna every day.",
    "I moved to Porto last month to be near Ana.",
    "my friend Bob lives in Berlin.",
    "I hate hiking now since my knee injury.",
    "Ana and I cook dinner together on Sundays.",
]
CUE = "Porto"
GAP = "..."


def demo_session(root: Path) -> str:
    """The demo conversation as a terminal shows it: the name asked once, each line and its reply, the report."""
    from familiar_bot.app.cli.commands.chat import ensure_familiar
    from familiar_bot.responder.opening import open_responder
    from familiar_bot.transports.console import resolve_speaker, run_console
    from familiar_pipeline.config import load_config
    from familiar_pipeline.storage.paths import FamiliarPaths
    from familiar_pipeline.testing.fake_llm import fake_llm
    from familiar_pipeline.testing.scripted import demo_model

    assert ensure_familiar(DEMO_FAMILIAR, create=True)  # as `familiar up --demo` creates it
    paths = FamiliarPaths.for_id(DEMO_FAMILIAR, root)
    shown = io.StringIO()
    speaker = resolve_speaker(paths.dir, None, fallback="nobody", stdin=io.StringIO("Sam\n"), stdout=shown,
                              interactive=True)
    shown.write("Sam\n")  # the terminal echoes the answer
    assert speaker is not None

    with fake_llm(demo_model):
        def typed(line: str) -> None:
            """One line at a prompt, and what the chat prints before the next prompt."""
            handle = open_responder(paths, load_config(DEMO_FAMILIAR))
            try:
                out = io.StringIO()
                assert asyncio.run(run_console(handle.responder, speaker=speaker, stdin=io.StringIO(line + "\n"),
                                               stdout=out, interactive=False)) == 0
            finally:
                handle.close()
            shown.write(f"{speaker.label}> {line}\n{out.getvalue()}")

        for line in DEMO_LINES:
            typed(line)
        with dg.instance_for_test() as instance:  # what the turn sensor's runs do under `familiar up`
            materialize(root, instance, ALL_ASSETS, familiar_id=DEMO_FAMILIAR)
        typed(f"/context {CUE}")
    return shown.getvalue()


def readme_transcript() -> str:
    """The README's demo transcript: the text block right after the line that introduces it."""
    text = README_SECTION.read_text()
    found = re.search(r"<!-- demo-transcript: tests/test_demo_transcript.py -->\n```text\n(.*?)```", text, re.S)
    assert found, "README.md has no demo transcript block"
    return found.group(1)


def unmatched(abridged: list[str], full: list[str]) -> list[str]:
    """The lines of `abridged` that are not `full` with runs of lines replaced by `...` lines, in order."""
    at, problems, gap = 0, [], True  # a leading ... may skip; without one, the first lines must match
    for line in abridged:
        if line == GAP:
            gap = True
            continue
        if gap:
            nxt = next((i for i in range(at, len(full)) if full[i] == line), None)
        else:
            nxt = at if at < len(full) and full[at] == line else None
        if nxt is None:
            problems.append(line)
            continue
        at, gap = nxt + 1, False
    return problems


@pytest.fixture
def demo_env(tmp_path, monkeypatch):
    import os

    for name in list(os.environ):
        if host_free(name):
            monkeypatch.delenv(name)
    root = tmp_path / "familiars"
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    monkeypatch.setenv(DEMO_FAMILIAR_ENV, DEMO_FAMILIAR)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return root


def test_the_readme_demo_transcript_is_what_the_demo_prints(demo_env):
    full = demo_session(demo_env)
    lines = full.splitlines()
    block = readme_transcript().splitlines()
    # The chat itself is shown whole; only the report may be abridged.
    chat = lines[: lines.index(f"Sam> /context {CUE}") + 1]
    assert block[: len(chat)] == chat, "the README's chat differs from the demo's:\n" + full
    assert unmatched(block, lines) == [], "README lines the demo did not print there:\n" + full
    assert any(line.startswith("retired #") for line in block), "the sample shows a retirement"


def test_each_demo_reply_quotes_the_line_it_answers_and_supersession_keeps_to_its_subject(demo_env):
    """The frictions a new user met: every reply quoted the newest line; a friend's home retired the speaker's;
    "I hate hiking now" retired nothing."""
    full = demo_session(demo_env)
    replies = [line for line in full.splitlines() if line.startswith("Familiar: ")]
    assert len(replies) == len(DEMO_LINES)
    for line, reply in zip(DEMO_LINES, replies):
        assert f'Noted: "{line.rstrip(".")}"' in reply, (line, reply)
    retired = {old: new for _, old, _, new in
               re.findall(r"^retired #\d+ ([\"'])(.*?)\1 <- replaced by #\d+ ([\"'])(.*?)\3$", full, re.M)}
    assert retired == {
        "Sam said: hi, I'm Sam and I live in Lisbon.": "Sam said: I moved to Porto last month to be near Ana.",
        "Sam said: I love hiking in the mountains on weekends.": "Sam said: I hate hiking now since my knee injury.",
    }, full


def test_lines_typed_while_a_reply_is_composed_each_get_a_reply_that_quotes_them(demo_env):
    """Four lines typed before the first reply is back: each reply answers (quotes) its own line, as the
    history of a reply ends with the message it answers; they all used to quote the newest line."""
    from familiar_bot.app.cli.commands.chat import ensure_familiar
    from familiar_bot.responder.opening import open_responder
    from familiar_bot.transports.console import console_person, run_console
    from familiar_pipeline.config import load_config
    from familiar_pipeline.storage.paths import FamiliarPaths
    from familiar_pipeline.storage.turns import TurnLog
    from familiar_pipeline.testing.fake_llm import fake_llm
    from familiar_pipeline.testing.scripted import demo_model

    async def slow_first(messages):
        if not getattr(slow_first, "warm", False):
            slow_first.warm = True
            await asyncio.sleep(1.5)  # a cold model: the other lines are recorded meanwhile
        return demo_model(messages)

    ensure_familiar(DEMO_FAMILIAR, create=True)
    paths = FamiliarPaths.for_id(DEMO_FAMILIAR, demo_env)
    lines = DEMO_LINES[:4]
    out = io.StringIO()
    with fake_llm(slow_first):
        handle = open_responder(paths, load_config(DEMO_FAMILIAR))
        try:
            assert asyncio.run(run_console(handle.responder, speaker=console_person("Sam"),
                                           stdin=io.StringIO("".join(f"{line}\n" for line in lines)),
                                           stdout=out, interactive=False)) == 0
        finally:
            handle.close()
    with TurnLog(paths.turns_db, readonly=True) as log:
        turns = log.turns_after(0)
    roles = [t.role for t in turns]
    assert roles[:4] == ["user"] * 4, "all four recorded before the first reply came back"
    said = {t.id: t.content for t in turns if t.role == "user"}
    answers = [(said[t.reply_to_turn_id], t.content) for t in turns if t.role == "assistant"]
    assert [line for line, _ in answers] == lines
    for line, reply in answers:
        assert f'Noted: "{line.rstrip(".")}"' in reply, (line, reply)
