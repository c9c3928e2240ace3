"""`familiar backfill` submits only to this checkout's own `familiar up`, never to whatever answers on a port.

A dummy HTTP server stands in for a foreign Dagster webserver (another checkout, another
data root) on a free port; the marker a `familiar up` leaves in DAGSTER_HOME names that
port, the way a real launcher's would. The playbook's backfill recipes then run, and the
dummy must receive nothing unless the marker is this checkout's own (the control case,
which proves the dummy would notice).
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

import pytest

from familiar_bot.app.cli.main import main
from familiar_pipeline import webserver
from familiar_pipeline.storage.paths import REPO_ROOT
from tests.test_playbook import DEMO, built, cli_args, command_lines, template  # noqa: F401  (fixtures)


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request as a live Dagster would (200, JSON) and records it."""

    requests: list[str]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        self.server.requests.append(f"{self.command} {self.path} {body[:200]}")  # type: ignore[attr-defined]
        payload = json.dumps({"data": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture
def dummy():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def backfill_lines() -> list[list[str]]:
    return [cli_args(line) for line in command_lines("familiar backfill")]


def test_backfill_sends_nothing_to_a_webserver_that_is_not_this_checkouts(built, dummy, monkeypatch, tmp_path, capsys):  # noqa: F811  (`built` is the fixture imported above)
    import os

    home = os.environ["DAGSTER_HOME"]
    url = f"http://127.0.0.1:{dummy.server_address[1]}"
    other_root = tmp_path / "someone-elses-familiars"
    assert backfill_lines(), "the playbook lost its backfill recipes"

    # 1. No marker: nothing to verify, so every recipe runs in this process.
    for argv in backfill_lines():
        assert main(argv) == 0, argv
        assert capsys.readouterr().out.endswith(", in this process)\n")

    # 2. A live `familiar up` on this DAGSTER_HOME, but for another data root: refused, naming both
    #    (`--local` asks for this process explicitly and never contacts a webserver).
    webserver.write_marker(home, url, data_root_dir=other_root)
    for argv in backfill_lines():
        if "--local" in argv:
            continue
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(other_root) in err and str(built.root) in err and url in err

    # 3. Same data root, another checkout: refused too.
    webserver.write_marker(home, url, data_root_dir=built.root)
    marker = json.loads(webserver.marker_path(home).read_text())
    webserver.marker_path(home).write_text(json.dumps({**marker, "repo": str(tmp_path / "other-clone")}))
    assert main(backfill_lines()[0]) == 1
    assert str(tmp_path / "other-clone") in capsys.readouterr().err

    # 4. This checkout's marker, but its launcher is gone (killed without cleaning up): in-process.
    webserver.write_marker(home, url, data_root_dir=built.root, pid=dead_pid())
    assert main(backfill_lines()[0]) == 0
    assert capsys.readouterr().out.endswith(", in this process)\n")

    assert dummy.requests == []  # type: ignore[attr-defined]


def test_backfill_submits_to_this_checkouts_own_familiar_up(built, dummy, capsys):  # noqa: F811  (`built` is the fixture imported above)
    """The control: with a verified marker the run goes to that address (the dummy sees it)."""
    import os

    url = f"http://127.0.0.1:{dummy.server_address[1]}"
    webserver.write_marker(os.environ["DAGSTER_HOME"], url, data_root_dir=built.root)
    argv = backfill_lines()[0]
    main(argv)  # the dummy is no Dagster, so the submission itself fails; what matters is where it went
    assert any(r.startswith("GET /server_info") for r in dummy.requests)  # type: ignore[attr-defined]
    assert any(r.startswith("POST /graphql") for r in dummy.requests)  # type: ignore[attr-defined]
    assert url in capsys.readouterr().err


def test_marker_is_removed_only_by_its_writer(tmp_path):
    webserver.write_marker(tmp_path, "http://127.0.0.1:1", data_root_dir=tmp_path, pid=123)
    webserver.remove_marker(tmp_path, pid=456)
    assert webserver.read_marker(tmp_path).pid == 123
    assert webserver.read_marker(tmp_path).repo == str(REPO_ROOT)
    webserver.remove_marker(tmp_path, pid=123)
    assert webserver.read_marker(tmp_path) is None


def test_backfill_of_a_disabled_projection_is_refused_with_the_setting(built, capsys):  # noqa: F811  (`built` is the fixture imported above)
    built.character_toml.write_text(built.character_toml.read_text().replace('"reflection", ', "").replace(', "reflection"', ""))
    from familiar_pipeline.config import load_config

    assert not load_config(DEMO).memory.is_active("reflection")
    assert main(["backfill", "--familiar", DEMO, "--projection", "reflection", "--rebuild"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[providers.memory].projectors" in err and '"reflection"' in err
    assert str(built.character_toml) in err
