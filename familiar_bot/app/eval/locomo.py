"""Reading LoCoMo-format conversations (long multi-session chats with annotated questions).

Used by the pipeline benchmark and the retrieval evaluation. The data file is
licensed (CC BY-NC 4.0) and is read from wherever it lies; it is never copied
into this repository.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

DATA_ENV = "FAMILIAR_LOCOMO"
WHERE_TO_GET = ("get LoCoMo from its public release, github.com/snap-research/locomo (data/locomo10.json, "
                "CC BY-NC 4.0), and pass its path with --data or " + DATA_ENV)


class LocomoMissing(LookupError):
    """No LoCoMo file was given, or the one given does not exist (the message is one line)."""


def locate(path: str | Path | None, env: dict[str, str] | None = None) -> Path:
    """The LoCoMo file to read: `path` (from --data), else ``$FAMILIAR_LOCOMO``.

    The file is licensed and never shipped here, so a missing one is the common case
    on a fresh clone: the error says where to get it.
    """
    given = str(path) if path else (os.environ if env is None else env).get(DATA_ENV, "").strip()
    if not given:
        raise LocomoMissing(f"no LoCoMo file given; {WHERE_TO_GET}")
    data = Path(given).expanduser()
    if not data.is_file():
        raise LocomoMissing(f"LoCoMo file {data}: no such file; {WHERE_TO_GET}")
    return data


def locate_or_exit(path: str | Path | None) -> Path:
    """:func:`locate` for scripts: on a missing file print the one-line error and exit 2."""
    try:
        return locate(path)
    except LocomoMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


_SESSION = re.compile(r"^session_(\d+)$")
TURN_SPACING = timedelta(seconds=30)


@dataclass(frozen=True)
class LocomoTurn:
    conversation: str
    session: int
    dia_id: str
    speaker: str
    text: str
    timestamp: datetime


def parse_session_time(value: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> aware UTC datetime."""
    cleaned = re.sub(r"\s+", " ", value.strip())
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise ValueError(f"unrecognised LoCoMo session time {value!r}")


def load(path: str | Path) -> list[dict]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    return data


def turns_of(sample: dict) -> Iterator[LocomoTurn]:
    """Every turn of one conversation in session order, 30 s apart from the session's start time."""
    conv = sample["conversation"]
    sessions = sorted(int(m.group(1)) for k in conv if (m := _SESSION.match(k)))
    for n in sessions:
        start = parse_session_time(conv[f"session_{n}_date_time"])
        for i, turn in enumerate(conv[f"session_{n}"]):
            text = turn.get("text", "")
            if turn.get("blip_caption"):
                text = f"{text} [shares a photo: {turn['blip_caption']}]".strip()
            yield LocomoTurn(
                conversation=sample.get("sample_id", "conv"),
                session=n,
                dia_id=turn["dia_id"],
                speaker=turn["speaker"],
                text=text,
                timestamp=start + i * TURN_SPACING,
            )


def speaker_key(speaker: str) -> str:
    return "locomo:" + re.sub(r"[^a-z0-9_-]+", "-", speaker.lower()).strip("-")
