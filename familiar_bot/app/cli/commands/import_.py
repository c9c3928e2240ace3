"""`familiar import`: seed a familiar's turn log from a JSON Lines transcript.

One JSON object per line:

    {"speaker": "Ana", "text": "I moved to Lisbon", "timestamp": "2024-05-01T18:03:00+00:00",
     "channel": 7, "user_id": "discord:1234"}

`speaker`, `text` and `timestamp` (ISO-8601; no offset means UTC) are required;
`channel` (an integer, or a name that is mapped to a stable number) and `user_id`
(a canonical key `platform:id`) are optional. A speaker without `user_id` becomes
the participant `import:<slug of the name>`. Every line is recorded as a person's turn,
with the transcript's timestamps (the history shows them dated and in time order),
except with `--familiar-speaker NAME`: that speaker's lines are the familiar's own replies
(role `assistant`, its own key and display name, each answering the person's line before
it in its channel), as the bot records a DM. A conversation migrated from another bot
then reads as a person talking with the familiar, which retrieval treats as its own genre
(`familiar_bot/prompt/retrieval/genre.py`), instead of as two people talking among themselves.

Bad lines are reported with their line number and skipped; the good ones are kept
and the command exits 0 with a summary ("skipped 2 bad lines: 4, 9"), or 1 when no
line was usable. `--strict` checks every line first and writes nothing if any is bad.
Good lines are written in chunks, each chunk one transaction, so an interrupted
import leaves whole chunks and never half a line. Importing the same file twice
appends its turns twice: the turn log is append-only and has no natural key for a
transcript line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Iterable, Iterator

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command, require_familiar

CHUNK_TURNS = 500
IMPORT_PLATFORM = "import"
DEFAULT_CHANNEL = 1
REQUIRED = ("speaker", "text", "timestamp")
OPTIONAL = ("channel", "user_id")
_MAX_CHANNEL = 2**63 - 1


class BadLine(ValueError):
    pass


@dataclass(frozen=True)
class TranscriptLine:
    line_no: int
    speaker: str
    author_key: str
    text: str
    at: datetime
    channel_id: int
    familiar: bool = False  # the familiar's own reply (--familiar-speaker)


@dataclass
class ImportResult:
    imported: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)  # "line N: why", first MAX_SHOWN only
    skipped_lines: list[int] = field(default_factory=list)  # every bad line's number
    first_turn_id: int | None = None
    last_turn_id: int | None = None
    participants: set[str] = field(default_factory=set)
    replies: int = 0  # lines recorded as the familiar's own replies
    channels: dict[str, int] = field(default_factory=dict)  # channel name -> number, when names were used


MAX_SHOWN_ERRORS = 20


def speaker_slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-")
    if not slug:
        raise BadLine(f"speaker {name!r} has no letters or digits to make a participant key from; add user_id")
    return slug


def channel_number(value: object) -> tuple[int, str | None]:
    """(channel id, the name it came from if it was a name)."""
    if isinstance(value, bool):
        raise BadLine(f"channel must be an integer or a name, got {value!r}")
    if isinstance(value, int):
        if not 0 < value <= _MAX_CHANNEL:
            raise BadLine(f"channel must be a positive integer below 2^63, got {value}")
        return value, None
    if isinstance(value, str) and value.strip():
        name = value.strip()
        if name.isdigit():
            return channel_number(int(name))
        # A stable number from the name, so re-imports and later files agree.
        digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
        return (int.from_bytes(digest, "big") & _MAX_CHANNEL) or 1, name
    raise BadLine(f"channel must be an integer or a non-empty name, got {value!r}")


def json_problem(exc: json.JSONDecodeError) -> str:
    """The decoder's message with its column, said once: some messages already end in "at"
    ("Invalid control character at"), which a naive " at column N" turned into "at at"."""
    message = exc.msg[: -len(" at")] if exc.msg.endswith(" at") else exc.msg
    return f"{message} at column {exc.colno}"


def same_speaker(name: str) -> str:
    """How speaker names are compared: spacing and case do not matter."""
    return " ".join(name.split()).casefold()


def parse_line(raw: str, line_no: int, default_channel: int,
               familiar: tuple[str, str] | None = None) -> tuple[TranscriptLine, str | None]:
    """One transcript line -> a validated turn; raises BadLine with the reason.

    ``familiar``: (the speaker name read as the familiar, compared by :func:`same_speaker`; its key).
    """
    from familiar_pipeline.storage.identity import canonical_key, split_key

    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not valid JSON: {json_problem(exc)}") from None
    if not isinstance(record, dict):
        raise BadLine(f"expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise BadLine(f"unknown field(s) {', '.join(unknown)}; valid: {', '.join(REQUIRED + OPTIONAL)}")
    missing = [name for name in REQUIRED if record.get(name) in (None, "")]
    if missing:
        raise BadLine(f"missing {', '.join(missing)}")
    speaker, text, stamp = record["speaker"], record["text"], record["timestamp"]
    for name, value in (("speaker", speaker), ("text", text), ("timestamp", stamp)):
        if not isinstance(value, str):
            raise BadLine(f"{name} must be a string, got {type(value).__name__}")
    speaker = " ".join(speaker.split())
    if not text.strip():
        raise BadLine("text is blank")
    try:
        at = datetime.fromisoformat(stamp.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadLine(f"timestamp {stamp!r} is not ISO-8601 (e.g. 2024-05-01T18:03:00+00:00)") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    user_id = record.get("user_id")
    channel, channel_name = (default_channel, None) if record.get("channel") is None else channel_number(record["channel"])
    if familiar is not None and same_speaker(speaker) == familiar[0]:
        if user_id is not None:
            raise BadLine(f"speaker {speaker!r} is the familiar (--familiar-speaker), whose lines carry no user_id")
        return TranscriptLine(line_no, speaker, familiar[1], text, at, channel, familiar=True), channel_name
    if user_id is None:
        key = canonical_key(IMPORT_PLATFORM, speaker_slug(speaker))
    else:
        try:
            if not isinstance(user_id, str):
                raise ValueError(f"user_id must be a string like 'discord:1234', got {user_id!r}")
            platform, user = split_key(user_id.strip())
            key = canonical_key(platform, user)
        except ValueError as exc:
            raise BadLine(f"user_id: {exc}") from None
    return TranscriptLine(line_no, speaker, key, text, at, channel), channel_name


def read_transcript(lines: Iterable[str], result: ImportResult, default_channel: int,
                    familiar: tuple[str, str] | None = None) -> Iterator[TranscriptLine]:
    """Valid lines, in order; bad ones are counted and described in `result`."""
    for line_no, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            parsed, channel_name = parse_line(raw, line_no, default_channel, familiar)
        except BadLine as exc:
            result.skipped += 1
            result.skipped_lines.append(line_no)
            if len(result.errors) < MAX_SHOWN_ERRORS:
                result.errors.append(f"line {line_no}: {exc}")
            continue
        if channel_name is not None:
            result.channels[channel_name] = parsed.channel_id
        yield parsed


def import_transcript(turn_log, lines: Iterable[str], *, default_channel: int = DEFAULT_CHANNEL,
                      chunk: int = CHUNK_TURNS, progress=None,
                      familiar: tuple[str, str, str] | None = None) -> ImportResult:
    """Append the transcript's valid lines to `turn_log`; each chunk is one transaction.

    A chunk's participants are upserted just before its turns, so every imported
    turn's author exists (an interrupted import may leave a participant without
    turns, which is harmless: upserts are idempotent).

    ``familiar``: (speaker name as :func:`same_speaker` gives it, the familiar's familiar_id, its display
    name). That speaker's lines become the familiar's replies, written as the responder writes one: role
    ``assistant``, the ego key, the display name, answering the newest person line of its channel before
    it (in an earlier chunk by id, in the same one by position); the familiar is no participant.
    """
    from familiar_pipeline.storage.identity import ego_key
    from familiar_pipeline.storage.turns import TurnLogError

    result = ImportResult()
    pending: list[TranscriptLine] = []
    speaker = (familiar[0], ego_key(familiar[1])) if familiar else None
    last_person: dict[int, int] = {}  # channel -> the newest person turn written, for the replies that follow

    def row(index: int, line: TranscriptLine, in_chunk: dict[int, int]) -> dict:
        if not line.familiar:
            in_chunk[line.channel_id] = index
            return {"channel_id": line.channel_id, "role": "user", "content": line.text,
                    "author_key": line.author_key, "author_display": line.speaker, "created_at": line.at}
        assert familiar is not None
        answers: dict = ({"reply_to_row": in_chunk[line.channel_id]} if line.channel_id in in_chunk
                         else {"reply_to_turn_id": last_person.get(line.channel_id)})
        return {"channel_id": line.channel_id, "role": "assistant", "content": line.text,
                "author_key": line.author_key, "author_display": familiar[2], "created_at": line.at, **answers}

    def flush() -> None:
        seen: dict[str, TranscriptLine] = {}
        for line in pending:
            if not line.familiar:
                seen[line.author_key] = line  # the latest line per author, for the display name
        for key, line in seen.items():
            first = min(p.at for p in pending if p.author_key == key)
            turn_log.upsert_participant(key, global_name=line.speaker, seen_at=first)
            turn_log.upsert_participant(key, seen_at=line.at)
        in_chunk: dict[int, int] = {}
        rows = [row(index, line, in_chunk) for index, line in enumerate(pending)]
        try:
            turns = turn_log.append_turns(rows)
        except TurnLogError as exc:
            # A row the turn log refuses (e.g. > 1 MiB of text): find it, so the operator gets a line number.
            index = int(m.group(1)) if (m := re.match(r"row (\d+): ", str(exc))) else None
            where = f"line {pending[index].line_no}" if index is not None else f"lines {pending[0].line_no}-{pending[-1].line_no}"
            raise CliError(f"{where}: {exc}; nothing from this chunk was written "
                           f"({result.imported} turns were imported before it)") from None
        result.imported += len(turns)
        result.replies += sum(line.familiar for line in pending)
        result.participants.update(seen)
        for line, turn in zip(pending, turns):
            if not line.familiar:
                last_person[line.channel_id] = turn.id
        if turns:
            result.first_turn_id = result.first_turn_id or turns[0].id
            result.last_turn_id = turns[-1].id
        if progress is not None:
            progress.update(len(turns))
        pending.clear()

    for parsed in read_transcript(lines, result, default_channel, speaker):
        pending.append(parsed)
        if len(pending) >= chunk:
            flush()
    if pending:
        flush()
    return result


# --------------------------------------------------------------------------- command


RECORD_HELP = """\
record format, one JSON object per line:
  {"speaker": "Sam", "text": "I moved to Porto", "timestamp": "2024-05-01T10:00:00Z",
   "channel": 7, "user_id": "discord:1234"}
  speaker, text, timestamp (ISO-8601; no offset means UTC) are required.
  channel: a number, or a name mapped to a stable number (default: --channel).
  user_id: who the speaker is, as PLATFORM:ID, the key the bot itself records:
    "discord:1234" (a Discord user id) or "console:sam" (a console chat name), so
    imported turns and live ones are the same participant. Without it the speaker
    becomes "import:<name>", e.g. "import:sam".
--familiar-speaker NAME: that speaker's lines are the familiar's own replies (as the
bot records a DM: role assistant, the familiar's key and display name); the name is
compared ignoring case and spacing, and must be a speaker of the file.
bad lines: reported on stderr with their line numbers and skipped; the good lines
are kept and the exit status is 0 ("skipped M bad lines: 4, 9"), or 1 when no line
was usable. --strict writes nothing and exits 1 if any line is bad.
imported turns keep their timestamps: the history shows them dated
("[2024-05-01 10:00 Sam]") and in time order among live turns."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = RECORD_HELP
    parser.add_argument("--familiar", required=True, metavar="ID", help="familiar id (must exist: `familiar init`)")
    parser.add_argument("--strict", action="store_true",
                        help="check every line first; import nothing (exit 1) if any line is bad")
    parser.add_argument("--channel", type=int, default=DEFAULT_CHANNEL, metavar="N",
                        help=f"channel for lines without a channel field (default {DEFAULT_CHANNEL})")
    parser.add_argument("--familiar-speaker", metavar="NAME",
                        help="read this speaker's lines as the familiar's own replies (a conversation with another "
                             "bot or assistant migrated here); without it every speaker is a person")
    parser.add_argument("file", help="JSON Lines transcript: speaker, text, timestamp[, channel][, user_id]; "
                                     "'-' reads standard input")


def _open(file: str) -> IO[str]:
    if file == "-":
        return sys.stdin
    path = Path(file)
    if not path.is_file():
        raise CliError(f"{file}: no such file")
    return path.open(encoding="utf-8", errors="strict", newline="")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from familiar_pipeline.storage.turns import TurnLog, TurnLogError

    familiar = require_familiar(args.familiar)
    if not 0 < args.channel < 2**63:
        raise CliError(f"--channel must be a positive integer below 2^63, got {args.channel}", EXIT_CONFIG)
    familiar_speaker = _familiar_speaker(args)
    stream = _open(args.file)
    total = None
    if stream is not sys.stdin:  # a quick pass for the progress bar's total
        with open(args.file, "rb") as counting:
            total = sum(1 for line in counting if line.strip())
    lines: Iterable[str] = stream
    if familiar_speaker is not None:
        # A mistyped name would quietly record the familiar's replies as a person's: check it is a
        # speaker of the file before anything is written (standard input is read once, kept).
        if stream is sys.stdin:
            lines = list(stream)
            speakers = _speakers(lines)
        else:
            with open(args.file, encoding="utf-8", errors="replace") as reading:
                speakers = _speakers(reading)
        check_speaker(familiar_speaker[0], args.familiar_speaker, speakers)
    try:
        turn_log = TurnLog(familiar.turns_db)
    except TurnLogError as exc:
        raise CliError(str(exc)) from None
    # The bar shows lines written; it only draws on a terminal and for long files.
    bar = tqdm(total=total, unit="turn", file=sys.stderr, disable=None if (total or 0) >= 1000 else True)
    try:
        if args.strict:
            lines = list(lines)
            checked = ImportResult()
            for _ in read_transcript(lines, checked, args.channel, familiar_speaker):
                pass
            if checked.skipped:
                report_bad_lines(checked)
                raise CliError(f"--strict: {checked.skipped} bad lines ({line_list(checked.skipped_lines)}); "
                               "nothing was imported")
        result = import_transcript(turn_log, lines, default_channel=args.channel, progress=bar,
                                   familiar=None if familiar_speaker is None else
                                   (familiar_speaker[0], args.familiar, familiar_speaker[1]))
    except UnicodeDecodeError as exc:
        raise CliError(f"{args.file} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                       "whole chunks before the bad byte were imported") from None
    finally:
        bar.close()
        turn_log.close()
        if stream is not sys.stdin:
            stream.close()
    report_bad_lines(result)
    span = f" (turns {result.first_turn_id}-{result.last_turn_id})" if result.imported else ""
    skipped = f"skipped {result.skipped} bad lines: {line_list(result.skipped_lines)}" if result.skipped \
        else "skipped 0 bad lines"
    replies = f" and {result.replies} replies of the familiar's own" if familiar_speaker is not None else ""
    print(f"imported {result.imported} turns{span} from {len(result.participants)} speakers{replies} into "
          f"{args.familiar!r}; {skipped}")
    for name, number in sorted(result.channels.items()):
        print(f"channel {name!r} -> {number}")
    if result.imported:
        print("note: importing the same file again appends its turns again (the turn log is append-only)")
    return 1 if result.skipped and not result.imported else 0


def _familiar_speaker(args: argparse.Namespace) -> tuple[str, str] | None:
    """(the --familiar-speaker name as compared, the familiar's display name), or None without the flag."""
    from familiar_pipeline.config import load_config

    if args.familiar_speaker is None:
        return None
    name = same_speaker(args.familiar_speaker)
    if not name:
        raise CliError("--familiar-speaker: give the name the familiar's lines have in the file", EXIT_CONFIG)
    return name, load_config(args.familiar).display_name  # a ConfigError is main's one-line error


def _speakers(lines: Iterable[str]) -> dict[str, str]:
    """Every speaker of the file's well-formed lines (compared form -> as written)."""
    found: dict[str, str] = {}
    for raw in lines:
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(speaker := record.get("speaker"), str) and speaker.strip():
            found.setdefault(same_speaker(speaker), " ".join(speaker.split()))
    return found


def check_speaker(name: str, given: str, speakers: dict[str, str]) -> None:
    """Refuse a --familiar-speaker that no line has, naming the speakers there are."""
    from familiar_pipeline.storage.paths import did_you_mean

    if name in speakers:
        return
    shown = ", ".join(repr(s) for s in sorted(speakers.values())[:10]) or "none"
    hint = did_you_mean(given, list(speakers.values()))
    raise CliError(f"--familiar-speaker {given!r}: no line of the file has that speaker{hint} "
                   f"(speakers: {shown}); nothing was imported", EXIT_CONFIG)


def report_bad_lines(result: ImportResult) -> None:
    for error in result.errors:
        print(f"skipped {error}", file=sys.stderr)
    if result.skipped > len(result.errors):
        print(f"... and {result.skipped - len(result.errors)} more bad lines", file=sys.stderr)


def line_list(numbers: list[int], shown: int = MAX_SHOWN_ERRORS) -> str:
    """"2, 3, 9" (the first `shown`, then "and N more")."""
    head = ", ".join(str(n) for n in numbers[:shown])
    return head + (f" and {len(numbers) - shown} more" if len(numbers) > shown else "")


COMMAND = Command("import", "import a JSON Lines transcript (speaker, text, timestamp[, channel][, user_id]) "
                  "as turns of a familiar", configure, run)
