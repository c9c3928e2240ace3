"""`familiar import`: JSON Lines transcripts become turns; bad lines are reported by number and skipped."""

from __future__ import annotations

import io
import json

import pytest

from familiar_bot.app.cli.main import main
from familiar_bot.app.cli.commands.import_ import channel_number, import_transcript
from familiar_pipeline.storage.turns import TurnLog, TurnLogError
from tests.helpers import FAKE_MODEL_TOML, make_familiar


def line(**fields) -> str:
    return json.dumps(fields)


GOOD = [
    line(speaker="Ana Lima", text="I moved to Lisbon last spring", timestamp="2024-05-01T18:03:00+02:00"),
    line(speaker="Bo", text="Welcome! I run a bakery there", timestamp="2024-05-01T18:04:00Z", channel=7),
    line(speaker="Ana Lima", text="I know, I buy your bread", timestamp="2024-05-01T18:05:00",
         user_id="discord:1234", channel="general"),
]


def test_import_writes_turns_participants_and_channels(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "seed")
    transcript = tmp_path / "talk.jsonl"
    transcript.write_text("\n".join(GOOD) + "\n\n")

    assert main(["import", "--familiar", "seed", str(transcript)]) == 0
    out = capsys.readouterr().out
    assert "imported 3 turns (turns 1-3) from 3 speakers" in out
    assert "appends its turns again" in out
    general = channel_number("general")[0]
    assert f"channel 'general' -> {general}" in out

    with TurnLog(paths.turns_db, readonly=True) as log:
        turns = log.turns_after(0)
        assert [(t.author_key, t.channel_id, t.content) for t in turns] == [
            ("import:ana-lima", 1, "I moved to Lisbon last spring"),
            ("import:bo", 7, "Welcome! I run a bakery there"),
            ("discord:1234", general, "I know, I buy your bread"),
        ]
        assert turns[0].created_at.isoformat() == "2024-05-01T16:03:00+00:00"  # converted to UTC
        assert turns[2].created_at.isoformat() == "2024-05-01T18:05:00+00:00"  # naive means UTC
        assert {t.role for t in turns} == {"user"}
        ana = log.participant("import:ana-lima")
        assert ana.global_name == "Ana Lima" and ana.platform == "import"
        assert log.participant("discord:1234").global_name == "Ana Lima"

    # Re-importing appends again (documented): the log is append-only.
    assert main(["import", "--familiar", "seed", str(transcript)]) == 0
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert log.count() == 6


def test_bad_lines_are_skipped_with_line_numbers_and_the_good_ones_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "seed")
    transcript = tmp_path / "talk.jsonl"
    transcript.write_text("\n".join([
        GOOD[0],
        "{not json",
        line(speaker="Bo", text="hi there", timestamp="yesterday"),
        line(speaker="Bo", text="hi there"),
        line(speaker="Bo", text="hi", timestamp="2024-05-01T18:04:00Z", mood="happy"),
        line(speaker="Bo", text="hi", timestamp="2024-05-01T18:04:00Z", user_id="nocolon"),
        line(speaker="Bo", text="hi", timestamp="2024-05-01T18:04:00Z", channel=-3),
        "[1, 2]",
        GOOD[1],
    ]) + "\n")

    assert main(["import", "--familiar", "seed", "--strict", str(transcript)]) == 1
    strict = capsys.readouterr()
    assert "--strict: 7 bad lines (2, 3, 4, 5, 6, 7, 8); nothing was imported" in strict.err
    assert "line 2: not valid JSON" in strict.err
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert log.count() == 0

    assert main(["import", "--familiar", "seed", str(transcript)]) == 0  # a partial import: the good lines kept
    captured = capsys.readouterr()
    assert "imported 2 turns" in captured.out and "skipped 7 bad lines: 2, 3, 4, 5, 6, 7, 8" in captured.out
    err = captured.err
    assert "line 2: not valid JSON" in err
    assert "line 3: timestamp 'yesterday' is not ISO-8601" in err
    assert "line 4: missing timestamp" in err
    assert "line 5: unknown field(s) mood" in err
    assert "line 6: user_id:" in err
    assert "line 7: channel must be a positive integer" in err
    assert "line 8: expected a JSON object" in err
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert [t.content for t in log.turns_after(0)] == ["I moved to Lisbon last spring", "Welcome! I run a bakery there"]


def test_chunks_are_transactions_and_a_refused_row_names_its_line(tmp_path, capsys):
    paths = make_familiar(tmp_path, "seed")
    big = "x" * (1024 * 1024 + 1)  # over the turn log's per-turn limit
    lines = [line(speaker="Ana", text=f"message number {i}", timestamp="2024-05-01T18:00:00Z") for i in range(5)]
    lines.insert(3, line(speaker="Ana", text=big, timestamp="2024-05-01T18:00:00Z"))
    with TurnLog(paths.turns_db) as log:
        try:
            import_transcript(log, lines, chunk=2)
        except Exception as exc:  # CliError
            message = str(exc)
        else:
            raise AssertionError("an oversized turn must stop the import")
        # Chunk 1 (lines 1-2) is in; chunk 2 (lines 3-4, with the bad one) wrote nothing.
        assert [t.content for t in log.turns_after(0)] == ["message number 0", "message number 1"]
    assert message.startswith("line 4: ") and "nothing from this chunk was written" in message
    assert "2 turns were imported before it" in message


def test_missing_familiar_and_file_are_clear_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    assert main(["import", "--familiar", "ghost", str(tmp_path / "x.jsonl")]) == 1
    assert "no familiar 'ghost'" in capsys.readouterr().err
    make_familiar(tmp_path, "seed")
    assert main(["import", "--familiar", "seed", str(tmp_path / "x.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_channel_names_map_to_stable_numbers():
    assert channel_number("general") == channel_number("general")
    assert channel_number("general")[0] != channel_number("random")[0]
    assert channel_number("42") == (42, None)
    assert 0 < channel_number("general")[0] < 2**63


def test_nothing_usable_fails_and_help_shows_the_record_format(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    make_familiar(tmp_path, "seed")
    transcript = tmp_path / "bad.jsonl"
    transcript.write_text("{nope\n")
    assert main(["import", "--familiar", "seed", str(transcript)]) == 1
    assert "skipped 1 bad lines: 1" in capsys.readouterr().out
    assert main(["import", "--help"]) == 0
    shown = capsys.readouterr().out
    assert '"user_id": "discord:1234"' in shown and "PLATFORM:ID" in shown and "--strict" in shown


# --------------------------------------------------------------------------- --familiar-speaker

LONG = ("Here is a fuller answer, with the reasons one by one and a list of options to weigh. " * 6).strip()
DM = [  # a person and another assistant, migrated here: the assistant's lines become the familiar's own
    line(speaker="Ana", text="Can you suggest a quiet hotel in Porto?", timestamp="2024-05-01T10:00:00Z"),
    line(speaker="assistant ", text=LONG, timestamp="2024-05-01T10:00:05Z"),
    line(speaker="Ana", text="I prefer places near the river", timestamp="2024-05-01T10:01:00Z"),
    line(speaker="Assistant", text=LONG, timestamp="2024-05-01T10:01:05Z"),
    line(speaker="Ana", text="Thanks, booked it", timestamp="2024-05-01T10:02:00Z", channel=7),
    line(speaker="Assistant", text=LONG, timestamp="2024-05-01T10:02:05Z", channel=7),
    line(speaker="Assistant", text="One more thing: bring an umbrella.", timestamp="2024-05-01T10:03:00Z"),
]


def test_familiar_speaker_lines_become_the_familiars_replies(tmp_path, monkeypatch, capsys):
    from familiar_bot.prompt.retrieval.genre import read_genre

    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "seed", 'aliases = ["Wren"]\n' + FAKE_MODEL_TOML)
    transcript = tmp_path / "dm.jsonl"
    transcript.write_text("\n".join(DM) + "\n")

    assert main(["import", "--familiar", "seed", "--familiar-speaker", "ASSISTANT", str(transcript)]) == 0
    assert "imported 7 turns (turns 1-7) from 1 speakers and 4 replies of the familiar's own into 'seed'" \
        in capsys.readouterr().out
    with TurnLog(paths.turns_db, readonly=True) as log:
        turns = log.turns_after(0)
        assert [(t.role, t.author_key, t.author_display, t.reply_to_turn_id) for t in turns] == [
            ("user", "import:ana", "Ana", None),
            ("assistant", "ego:seed", "Wren", 1),
            ("user", "import:ana", "Ana", None),
            ("assistant", "ego:seed", "Wren", 3),
            ("user", "import:ana", "Ana", None),
            ("assistant", "ego:seed", "Wren", 5),  # channel 7's own person line, not channel 1's newest
            ("assistant", "ego:seed", "Wren", 3),
        ]
        assert log.participant("ego:seed") is None  # the familiar is no participant
        assert read_genre(turns).familiar  # retrieval reads it as a person talking with the familiar

    # Without the flag the same file is two people talking among themselves (the old behaviour).
    other = make_familiar(tmp_path, "plain")
    assert main(["import", "--familiar", "plain", str(transcript)]) == 0
    with TurnLog(other.turns_db, readonly=True) as log:
        turns = log.turns_after(0)
        assert {t.role for t in turns} == {"user"} and not read_genre(turns).familiar
        assert log.participant("import:assistant") is not None


def test_replies_across_chunks_answer_by_id_and_follow_an_erasure(tmp_path):
    paths = make_familiar(tmp_path, "seed")
    with TurnLog(paths.turns_db) as log:
        result = import_transcript(log, DM, chunk=3, familiar=("assistant", "seed", "Seed"))
        assert (result.imported, result.replies, result.participants) == (7, 4, {"import:ana"})
        # Chunks of 3: turn 4 answers turn 3 in its own chunk, turn 7 answers turn 3 from an earlier one.
        assert [t.reply_to_turn_id for t in log.turns_after(0)] == [None, 1, None, 3, None, 5, 3]
        log.request_erasure(kind="person", target="import:ana", requested_by="operator:test")
        # Forgetting the person takes the replies that answer them (issue 47's rule) with them.
        assert all(t.deleted_at is not None for t in log.turns_after(0, include_deleted=True))


def test_familiar_speaker_must_be_in_the_file_and_its_lines_carry_no_user_id(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "seed")
    transcript = tmp_path / "dm.jsonl"
    transcript.write_text("\n".join(DM) + "\n")
    assert main(["import", "--familiar", "seed", "--familiar-speaker", "Asistant", str(transcript)]) == 2
    err = capsys.readouterr().err
    assert "--familiar-speaker 'Asistant': no line of the file has that speaker; did you mean 'assistant'?" in err
    assert "(speakers: 'Ana', 'assistant'); nothing was imported" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(DM)))
    assert main(["import", "--familiar", "seed", "--familiar-speaker", "Bob", "-"]) == 2
    assert "no line of the file has that speaker" in capsys.readouterr().err
    with TurnLog(paths.turns_db, readonly=True) as log:
        assert log.count() == 0

    marked = DM[:2] + [line(speaker="Assistant", text="hi", timestamp="2024-05-01T10:00:09Z", user_id="discord:9")]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(marked)))
    assert main(["import", "--familiar", "seed", "--familiar-speaker", "Assistant", "-"]) == 0
    captured = capsys.readouterr()
    assert "line 3: speaker 'Assistant' is the familiar (--familiar-speaker), whose lines carry no user_id" \
        in captured.err
    assert "imported 2 turns (turns 1-2) from 1 speakers and 1 replies of the familiar's own" in captured.out


def test_reply_to_row_must_name_an_earlier_row(tmp_path):
    rows = [{"channel_id": 1, "role": "user", "content": "hi", "author_key": "import:ana"},
            {"channel_id": 1, "role": "assistant", "content": "hello", "reply_to_row": 0}]
    with TurnLog(tmp_path / "turns.db") as log:
        for bad in (1, 5, -1, "0", True):
            with pytest.raises(TurnLogError, match="reply_to_row must be the position of an earlier row"):
                log.append_turns([rows[0], {**rows[1], "reply_to_row": bad}])
        with pytest.raises(TurnLogError, match="reply_to_row"):
            log.append_turns([rows[0], {**rows[1], "reply_to_turn_id": 1}])
        assert log.count() == 0
        assert [t.reply_to_turn_id for t in log.append_turns(rows)] == [None, 1]
