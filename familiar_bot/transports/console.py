"""Console chat: the same responder as on Discord, over standard input and output.

So anyone can talk to a familiar without a Discord token: each line read is a
message from one local person, in one channel; replies are printed. Turns land
in the same turn log, so the pipeline builds memory from console chats exactly
as from Discord ones. End of input ends the session with status 0, which makes
the console scriptable (`printf 'hi\\n' | familiar chat`).

A line starting with `/context` prints the assembled prompt report for the rest
of the line as the cue, and `/quit` ends the session; neither is recorded.

Lines are read by a thread of their own (`LineReader`) and recorded the moment they
are read, so typing never waits for a reply. On a terminal they are read with GNU
readline, which has no line-length limit (the terminal's own line buffer cuts a line
at 4,095 bytes without a word); without readline such a line is refused with a
notice rather than recorded cut.

Who is speaking: `--as NAME`, else the name chosen the first time this familiar
was chatted with in a terminal (asked once, remembered in the familiar's
`console_speaker` file), else, when input is not a terminal, the login name.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
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


# The terminal's line buffer in canonical mode (Linux's N_TTY): a longer line is cut there
# without a word. Line editing (readline) reads the terminal itself and has no such limit;
# without it, a line this long is refused rather than recorded cut.
TTY_LINE_LIMIT = 4095
CUT_LINE_NOTICE = ("That line reached this terminal's {limit:,}-byte line limit and was probably cut, so I did "
                   "not record it. Send long text through a pipe (`printf '...' | familiar chat`) or "
                   "`familiar import`.")


def line_editing(stdin: TextIO, stdout: TextIO) -> bool:
    """Whether lines are read with GNU readline: on a real terminal, when Python has it.

    Readline puts the terminal in raw mode and reads it byte by byte, so a line has no
    length limit (a pasted 50,000-character line arrives whole), and it gives editing and
    history. `input()` uses it only for the process's own stdin and stdout.
    """
    if stdin is not sys.stdin or stdout is not sys.stdout or not (stdin.isatty() and stdout.isatty()):
        return False
    try:
        import readline  # noqa: F401 - importing it is what makes input() use it
    except ImportError:
        return False
    return True


@dataclass
class TerminalState:
    """The terminal's settings at start, put back at exit.

    Line editing (readline) puts the terminal in raw mode while it reads; a chat that ends
    while its reader thread still waits in readline (`/quit`, Ctrl-C, `familiar up` stopping)
    must give the terminal back as it found it.
    """

    attributes: list | None = None

    @classmethod
    def save(cls) -> "TerminalState":
        import termios

        try:
            return cls(termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None)
        except (termios.error, OSError, ValueError, AttributeError):  # no terminal (a pipe, a closed stdin)
            return cls()

    def restore(self) -> None:
        import termios

        if self.attributes is None:
            return
        try:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self.attributes)
        except (termios.error, OSError, ValueError):
            pass


class LineReader:
    """Reads the console's lines in a thread of its own, each stamped with the moment it was read.

    The chat records a line as soon as it is read and answers lines one after another;
    reading never waits for an answer, so lines typed while the familiar is still
    composing are recorded one by one with their own times (they used to wait for the
    reply, then be read together, all with the same time).
    """

    def __init__(self, stdin: TextIO, stdout: TextIO, prompt: str, *, interactive: bool, editing: bool):
        self.stdin, self.stdout, self.prompt = stdin, stdout, prompt
        self.interactive, self.editing = interactive, editing
        self.lines: asyncio.Queue = asyncio.Queue()

    def start(self) -> threading.Thread:
        loop = asyncio.get_running_loop()
        thread = threading.Thread(target=self._read, args=(loop,), name="console-reader", daemon=True)
        thread.start()
        return thread

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            line = self._read_one()
            loop.call_soon_threadsafe(self.lines.put_nowait, (line, datetime.now(timezone.utc)))
            if not line:
                return

    def _read_one(self) -> str:
        if self.editing:
            try:
                return input(self.prompt) + "\n"
            except EOFError:
                return ""
        if self.interactive:
            self.stdout.write(self.prompt)
            self.stdout.flush()
        return self.stdin.readline()

    def show(self, text: str) -> None:
        """Print `text` above the line being typed, then the prompt and what was typed so far again."""
        if not self.editing:
            self.stdout.write(text + "\n")
            self.stdout.flush()
            return
        import readline

        self.stdout.write("\r\033[K" + text + "\n" + self.prompt + readline.get_line_buffer())
        self.stdout.flush()


async def run_console(
    responder: Responder,
    *,
    speaker: Person,
    channel_id: int = DEFAULT_CONSOLE_CHANNEL,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    interactive: bool | None = None,
) -> int:
    """Chat until end of input (or `/quit`); returns the exit status (0).

    Each line is recorded the moment it is read and answered in turn (the responder takes
    a channel's replies one at a time, in order); at the end every pending answer is
    finished before returning.
    """
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    if interactive is None:
        interactive = stdin.isatty()
    name = responder.config.display_name
    editing = interactive and line_editing(stdin, stdout)
    reader = LineReader(stdin, stdout, f"{speaker.label}> ", interactive=interactive, editing=editing)

    async def show(piece: str) -> None:
        reader.show(f"{name}: {piece}")

    if interactive:
        stdout.write(f"Talking to {name} as {speaker.label} in console channel {channel_id}. "
                     "Ctrl-D to leave; /context shows the prompt.\n")
    pending: set[asyncio.Task] = set()
    reader.start()
    try:
        while True:
            line, read_at = await reader.lines.get()
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
            if command == "/context":  # the prompt as it stands once the replies under way are in
                await asyncio.gather(*pending, return_exceptions=True)
                reader.show(await responder.context_report(channel_id, cue=rest.strip()))
                continue
            if interactive and not editing and len(line.encode("utf-8", "surrogatepass")) >= TTY_LINE_LIMIT:
                reader.show(CUT_LINE_NOTICE.format(limit=TTY_LINE_LIMIT))
                continue
            message = IncomingMessage(channel_id=channel_id, author=speaker, content=text, console=True,
                                      created_at=read_at)
            task = asyncio.create_task(responder.handle(message, send=show))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(0)  # the handler records the line before the next one is looked at
    finally:
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
