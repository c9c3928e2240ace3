"""Console chat: the same responder as on Discord, over standard input and output.

So anyone can talk to a familiar without a Discord token: each line read is a
message from one local person, in one channel; replies are printed. Turns land
in the same turn log, so the pipeline builds memory from console chats exactly
as from Discord ones. End of input ends the session with status 0, which makes
the console scriptable (`printf 'hi\\n' | familiar chat`).

A line starting with `/context` prints the assembled prompt report for the rest
of the line as the cue, and `/quit` ends the session; neither is recorded.

Who is speaking: `--as NAME`, else the name chosen the first time this familiar
was chatted with in a terminal (asked once, remembered in the familiar's
`console_speaker` file), else, when input is not a terminal, the login name.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import TextIO

from familiar_bot.responder import IncomingMessage, Person, Responder
from familiar_pipeline.storage.identity import canonical_key

CONSOLE_PLATFORM = "console"
DEFAULT_CONSOLE_CHANNEL = 1


def console_person(name: str) -> Person:
    """The local speaker: `console:<slug>`, shown under the name exactly as typed."""
    shown = " ".join(name.split())
    slug = re.sub(r"[^a-z0-9_.-]+", "-", shown.lower()).strip("-")
    if not slug:
        raise ValueError(f"cannot make a console speaker name out of {name!r}; use letters or digits")
    return Person(key=canonical_key(CONSOLE_PLATFORM, slug), username=slug, global_name=shown)


SPEAKER_FILE = "console_speaker"  # in the familiar's folder: the name chosen on first start


def resolve_speaker(familiar_dir: Path, given: str | None, *, fallback: str, stdin: TextIO | None = None,
                    stdout: TextIO | None = None, interactive: bool | None = None) -> Person | None:
    """The console speaker: `given` (--as), the remembered name, else asked once (None at end of input).

    Raises ValueError for a `given` name that has no letters or digits. Without a terminal to
    ask on, `fallback` (the login name) is used and nothing is remembered.
    """
    if given is not None:
        return console_person(given)
    remembered_file = familiar_dir / SPEAKER_FILE
    try:
        remembered = remembered_file.read_text(encoding="utf-8").strip()
        if remembered:
            return console_person(remembered)
    except (OSError, ValueError):
        pass
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    if not (stdin.isatty() if interactive is None else interactive):
        return console_person(fallback)
    while True:
        stdout.write("What name should I know you by? (asked once; `--as NAME` for another) ")
        stdout.flush()
        line = stdin.readline()
        if not line:
            return None
        try:
            person = console_person(line.strip())
        except ValueError as exc:
            stdout.write(f"{exc}\n")
            continue
        remembered_file.parent.mkdir(parents=True, exist_ok=True)
        remembered_file.write_text(person.label + "\n", encoding="utf-8")
        return person


async def run_console(
    responder: Responder,
    *,
    speaker: Person,
    channel_id: int = DEFAULT_CONSOLE_CHANNEL,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    interactive: bool | None = None,
) -> int:
    """Chat until end of input (or `/quit`); returns the exit status (0)."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    if interactive is None:
        interactive = stdin.isatty()
    name = responder.config.display_name

    async def show(piece: str) -> None:
        stdout.write(f"{name}: {piece}\n")
        stdout.flush()

    if interactive:
        stdout.write(f"Talking to {name} as {speaker.label} in console channel {channel_id}. "
                     "Ctrl-D to leave; /context shows the prompt.\n")
    while True:
        if interactive:
            stdout.write(f"{speaker.label}> ")
            stdout.flush()
        line = await asyncio.to_thread(stdin.readline)
        if not line:  # end of input
            if interactive:
                stdout.write("\n")
            return 0
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        command, _, rest = text.strip().partition(" ")
        if command in ("/quit", "/exit"):
            return 0
        if command == "/context":
            stdout.write(await responder.context_report(channel_id, cue=rest.strip()) + "\n")
            stdout.flush()
            continue
        message = IncomingMessage(channel_id=channel_id, author=speaker, content=text, console=True)
        await responder.handle(message, send=show)
