"""Console chat: the same responder as on Discord, over standard input and output.

So anyone can talk to a familiar without a Discord token: each line read is a
message from one local person, in one channel; replies are printed. Turns land
in the same turn log, so the pipeline builds memory from console chats exactly
as from Discord ones. End of input ends the session with status 0, which makes
the console scriptable (`printf 'hi\\n' | familiar chat`).

Lines starting with a command are the console's, not messages, and are not recorded:
`/context [cue]` prints the assembled prompt report, `/memory` what the familiar holds
about the speaker here and `/memory export [path]` all of it as a JSON file only its owner
can read (`familiar_bot.self_service`), `/forget <turn id, message id or link>` erases one
message and `/forget me` everything the speaker said, everywhere, after a typed "yes"
(the answer is the next line, also not recorded); `/help` lists them, `/quit` ends the
session. Whoever types here runs the familiar and can read its files, so `/forget` may
erase any turn, the familiar's replies included.

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
import os
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from familiar_bot.responder.flow import Responder
from familiar_bot.responder.messages import IncomingMessage, Person
from familiar_bot.self_service import ForgetRefused, Requester, erased_line, export_json
from familiar_pipeline.storage.identity import CONSOLE_PLATFORM, canonical_key, console_slug
from familiar_pipeline.storage.paths import CONSOLE_SPEAKER_FILE
from familiar_pipeline.storage.private import private_file

DEFAULT_CONSOLE_CHANNEL = 1


def console_person(name: str) -> Person:
    """The local speaker: `console:<slug>`, shown under the name exactly as typed."""
    shown = " ".join(name.split())
    slug = console_slug(shown)
    if not slug:
        raise ValueError(f"cannot make a console speaker name out of {name!r}; use letters or digits")
    return Person(key=canonical_key(CONSOLE_PLATFORM, slug), username=slug, global_name=shown)


SPEAKER_FILE = CONSOLE_SPEAKER_FILE  # in the familiar's folder: the name chosen on first start


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


HELP = """Commands (not recorded as messages):
  /context [words]        the prompt sections a reply to these words would be built from
  /memory                 what I remember about you here
  /memory export [path]   everything of yours I hold here, as a JSON file only you can read
  /forget <id>            forget one message: a turn id (#12), a Discord message id or link
  /forget me              forget everything you have said, everywhere (asks first)
  /quit                   leave (Ctrl-D too)"""
CONFIRM_FORGET_ME = ("This forgets everything you ({key}) have said to me, everywhere; it cannot be undone. "
                     "Type yes to confirm:")


def write_export(text: str, path: str, *, default_name: str) -> Path:
    """Write an export where asked (a folder: under `default_name`), readable by its owner only.

    The file is created 0600 under a temporary name and renamed into place, so no other account
    can read a byte of it at any moment, and an interrupted write leaves no half file behind.
    """
    target = Path(path).expanduser() if path else Path.cwd() / default_name
    if target.is_dir():
        target = target / default_name
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    private_file(partial)
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target.resolve()


async def memory_command(responder: Responder, speaker: Person, channel_id: int, rest: str) -> str:
    """`/memory` and `/memory export [path]`: what the console prints."""
    sub, _, path = rest.strip().partition(" ")
    if sub not in ("", "export"):
        return "Usage: /memory, or /memory export [path]"
    try:
        if not sub:
            return await responder.memory_report(speaker.key, channel_id, export_hint="/memory export")
        data = await responder.memory_export(speaker.key, channel_id)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        name = f"memory-{responder.familiar_id}-{speaker.key.partition(':')[2]}-{stamp}.json"
        written = write_export(export_json(data), path.strip(), default_name=name)
    except OSError as exc:
        return f"Could not write the export: {exc.strerror or exc} ({exc.filename or path})"
    except Exception as exc:  # noqa: BLE001 - one line here; the chat goes on
        return f"Could not read memory: {type(exc).__name__}: {exc}"
    return (f"Wrote {len(data['turns'])} messages and {len(data['facts'])} facts about you to {written} "
            "(readable by you only).")


async def forget_command(responder: Responder, speaker: Person, rest: str, reader: "LineReader") -> str | None:
    """`/forget <id>` and `/forget me` (which reads the next line as its answer); None at end of input."""
    what = rest.strip()
    if not what:
        return "Usage: /forget <turn id, message id or link>, or /forget me"
    try:
        if what != "me":
            return erased_line(await responder.forget_message(what, Requester(speaker.key, operator=True)))
        reader.show(CONFIRM_FORGET_ME.format(key=speaker.key))
        answer, _ = await reader.lines.get()
        if not answer:
            return None
        if answer.strip().lower() != "yes":
            return "Cancelled: nothing was erased."
        return erased_line(await responder.forget_person(speaker.key, scope=None, requested_by=speaker.key))
    except ForgetRefused as exc:
        return str(exc)


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
                     "Ctrl-D to leave; /help lists the commands (/context, /memory, /forget).\n")
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
            if command == "/help":
                reader.show(HELP)
                continue
            if command in ("/context", "/memory", "/forget"):  # once the replies under way are in
                await asyncio.gather(*pending, return_exceptions=True)
                if command == "/context":
                    reader.show(await responder.context_report(channel_id, cue=rest.strip()))
                elif command == "/memory":
                    reader.show(await memory_command(responder, speaker, channel_id, rest))
                else:
                    said = await forget_command(responder, speaker, rest, reader)
                    if said is None:  # end of input while asked to confirm: nothing was erased
                        stdout.write("Cancelled: nothing was erased.\n")
                        return 0
                    reader.show(said)
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
