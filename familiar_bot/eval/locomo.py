"""Reading LoCoMo-format conversations (long multi-session chats with annotated questions).

Used by the pipeline benchmark and the retrieval evaluation. The data file is
licensed (CC BY-NC 4.0) and is read from wherever it lies; it is never copied
into this repository.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

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
