"""Faults that must heal by themselves: a full disk, a dead Dagster daemon; and private files.

Each test injects its fault on the real component (docs/reliability.md has the table):

* a full disk under the turn log, as SQLite sees one (`tests.helpers.FullDisk`), while a
  console chat is typing: nothing is lost, the chat goes on, and everything said is
  stored in order once the disk has room; the pipeline then catches up by itself;
* `dagster dev`'s daemon SIGKILLed under a running `familiar up`: it is started again
  with backoff while the console chat keeps answering, and memory keeps being built;
* another local account (uid 65534) trying to read what `familiar up` and a pipeline
  run wrote: the data root, the familiar folders and DAGSTER_HOME are closed to it.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import errno
import io
import logging
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from familiar_bot.app import supervisor
from familiar_bot.app.supervisor import Backoff, Restarter, free_port
from familiar_pipeline.config.demo import DEMO_FAMILIAR
from familiar_pipeline.testing.scripted import FAKE_MODELS_TOML
from familiar_pipeline.projectors.facts import reads as fact_reads
from tests.test_up import wait_for
from tests.conftest import host_free

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- a full disk


FULL_DISK_TOML = 'aliases = ["Fam"]\n' + FAKE_MODELS_TOML + "\n[providers.memory.rich_note]\nbatch_size = 4\n"


def test_a_full_disk_loses_no_message_and_memory_catches_up_by_itself(tmp_path, monkeypatch):
    """Six long lines typed while the disk under the turn log is full, then space comes back.

    Before: SQLite's own rollback after SQLITE_FULL made the turn log's second ROLLBACK raise,
    the chat crashed (`familiar up` exited 1) and the six lines were lost; a pipeline run that
    failed on the full disk left memory stale until someone spoke again.
    """
    import dagster as dg

    from familiar_bot.responder.opening import open_responder
    from familiar_bot.transports.console import console_person, run_console
    from familiar_pipeline.config import load_config
    from familiar_pipeline.defs.jobs import execute_request
    from familiar_pipeline.engine.schedule import RETRY_FIRST_S
    from tests.helpers import sensor_tick
    from familiar_pipeline.storage.snapshots import publish as snapshots
    from familiar_pipeline.storage.snapshots import SnapshotReader
    from familiar_pipeline.storage.turns import TurnLog
    from familiar_pipeline.testing.fake_llm import fake_llm
    from familiar_pipeline.testing.scripted import demo_model
    from tests.helpers import FullDisk, long_line, make_familiar

    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "fam", FULL_DISK_TOML)
    typed = [long_line(n) for n in range(6)]
    read_end, write_end = os.pipe()
    stdin, keyboard = os.fdopen(read_end), os.fdopen(write_end, "w")
    shown = io.StringIO()

    async def until(condition, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, shown.getvalue()[-2000:]
            await asyncio.sleep(0.05)

    async def chat(responder) -> tuple[int, int]:
        console = asyncio.create_task(run_console(responder, speaker=console_person("Sam"), stdin=stdin,
                                                  stdout=shown, interactive=False))
        def type_lines(lines: list[str]) -> None:  # a thread of its own: a pipe holds only 64 KiB
            for line in lines:
                keyboard.write(line + "\n")
                keyboard.flush()

        with FullDisk(responder.turn_log) as disk:
            await asyncio.to_thread(type_lines, typed)
            await until(lambda: shown.getvalue().count("I couldn't take that message in") == 6, 30)
            kept = len(responder.spool)
            disk.free()
            freed = time.monotonic()
            await until(lambda: not len(responder.spool), 10)  # nobody speaks: it drains by itself
            print(f"spool of {kept} drained {time.monotonic() - freed:.1f}s after space came back")
        keyboard.write("the disk has room again, Fam\n")
        keyboard.close()
        return await console, kept

    with fake_llm(demo_model):
        handle = open_responder(paths, load_config("fam", root=tmp_path))
        try:
            status, kept = asyncio.run(chat(handle.responder))
        finally:
            handle.close()
    assert status == 0 and kept == 6, "the chat went on; all six kept"
    assert "(scripted demo reply)" in shown.getvalue(), "and it answers once the disk has room"
    with TurnLog(paths.turns_db, readonly=True) as log:
        users = [t for t in log.turns_after(0) if t.role == "user"]
    assert [t.content for t in users] == [*typed, "the disk has room again, Fam"], "in order, none lost"
    assert len({t.created_at for t in users}) == len(users), "each with its own time"

    # The pipeline: a run that fails on the full disk (its snapshot publish: ENOSPC) leaves memory
    # stale; with no new turn, the sensor asks again on its own once RETRY_FIRST_S has passed.
    with dg.instance_for_test() as instance, fake_llm(demo_model):
        instance.add_dynamic_partitions("familiars", ["fam"])
        requests, _, cursor, _ = sensor_tick({}, ["fam"], ["fam"], root=tmp_path, in_flight={}, max_requests=5,
                                               now=1000.0)

        def disk_full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        real_write = snapshots._write_manifest
        monkeypatch.setattr(snapshots, "_write_manifest", disk_full)
        assert not execute_request(requests[0], instance=instance, data_root=tmp_path, raise_on_error=False).success
        monkeypatch.setattr(snapshots, "_write_manifest", real_write)  # space is back
        assert sensor_tick(cursor, ["fam"], ["fam"], root=tmp_path, in_flight={}, max_requests=5,
                             now=1000.0 + RETRY_FIRST_S - 1)[0] == []
        retry, _, cursor, notes = sensor_tick(cursor, ["fam"], ["fam"], root=tmp_path, in_flight={}, max_requests=5,
                                                now=1000.0 + RETRY_FIRST_S)
        assert len(retry) == 1 and "asking again" in " ".join(notes)
        assert execute_request(retry[0], instance=instance, data_root=tmp_path).success
        # It had nothing new to project (the failed run committed its facts), yet it republished:
        assert sensor_tick(cursor, ["fam"], ["fam"], root=tmp_path, in_flight={}, max_requests=5,
                             now=1e9)[0] == [], "caught up: nothing due any more"
    reader = SnapshotReader(paths.serving_dir)
    facts = fact_reads.current_facts(reader.current())
    assert {f.text.split(" ")[3] for f in facts if f.text.startswith("Sam said: line")} == {str(n) for n in range(6)}


# --------------------------------------------------------------------------- a damaged snapshot


def run_due(root: Path, instance, cursor: dict, now: float) -> tuple[list, dict, list[str]]:
    """One sensor tick for familiar "fam" and its runs, executed in this process: (requests, cursor, notes)."""
    from familiar_pipeline.defs.jobs import execute_request
    from tests.helpers import sensor_tick

    requests, _, cursor, notes = sensor_tick(cursor, ["fam"], ["fam"], root=root, in_flight={}, max_requests=5, now=now)
    for request in requests:
        assert execute_request(request, instance=instance, data_root=root).success
    return requests, cursor, notes


@pytest.mark.parametrize("fault", ["manifest deleted", "manifest cut short", "table cut short", "table deleted"])
def test_a_damaged_snapshot_is_served_from_the_last_whole_one_and_republished(tmp_path, monkeypatch, caplog, fault):
    """Before: a restarted reader (`familiar prompt`, a restarted bot) of a familiar whose manifest.json
    or a snapshot file was lost or cut short served an empty snapshot, though the previous version was
    whole on disk, and nothing published a whole one until the next turn."""
    import dagster as dg

    from familiar_pipeline.storage.snapshot_lag import snapshot_lag
    from familiar_pipeline.storage.snapshots import SnapshotReader, published_manifests
    from familiar_pipeline.storage.store import ProjectionStore
    from familiar_pipeline.testing.fake_llm import fake_llm
    from familiar_pipeline.testing.scripted import demo_model
    from tests.helpers import append_chat, make_familiar

    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "fam", FULL_DISK_TOML)
    serving = paths.serving_dir
    with dg.instance_for_test() as instance, fake_llm(demo_model):
        instance.add_dynamic_partitions("familiars", ["fam"])
        append_chat(paths, 8)
        _, cursor, _ = run_due(tmp_path, instance, {}, now=1000.0)
        append_chat(paths, 8, start=8)
        _, cursor, _ = run_due(tmp_path, instance, cursor, now=1001.0)
        whole = SnapshotReader(serving)
        latest, facts = whole.version, sorted(f.text for f in fact_reads.current_facts(whole.current()))
        assert latest >= 2 and len(facts) >= 4 and whole.last_error is None
        previous = max(v for v in (m.version for m in published_manifests(serving, every_copy=True).manifests)
                       if v < latest)
        facts_file = serving / whole.manifest.tables["facts"].file
        if fault == "manifest deleted":
            (serving / "manifest.json").unlink()
        elif fault == "manifest cut short":
            (serving / "manifest.json").write_bytes((serving / "manifest.json").read_bytes()[:100])
        elif fault == "table cut short":
            facts_file.write_bytes(facts_file.read_bytes()[:200])
        else:
            facts_file.unlink()

        # A reader started now serves the newest whole snapshot: the same version from its manifest's
        # copy when only manifest.json is damaged, else the previous one, never nothing.
        caplog.set_level(logging.WARNING, logger="familiar_pipeline.storage.snapshots.reader")
        restarted = SnapshotReader(serving)
        served = latest if fault.startswith("manifest") else previous
        assert restarted.version == served, restarted.last_error
        assert fact_reads.current_facts(restarted.current()), "memory, not an empty snapshot"
        if fault.startswith("manifest"):
            assert sorted(f.text for f in fact_reads.current_facts(restarted.current())) == facts
        assert f"serving v{served}, the newest whole snapshot" in restarted.last_error
        assert len([r for r in caplog.records if "newest whole snapshot" in r.getMessage()]) == 1, "one line"
        assert restarted.refresh() is False and restarted.version == served

        with ProjectionStore(paths.memory_db) as store:  # what the UI's serving_snapshot_in_step check shows
            assert snapshot_lag(store, serving)["damaged"]

        # The sensor sees the damage with no new turn and asks for the cheapest run; that run republishes.
        requests, cursor, notes = run_due(tmp_path, instance, cursor, now=1002.0)
        assert [sorted(k.path[-1] for k in r.asset_selection) for r in requests] == [["turns_fts", "wishes"]], notes
        republished = published_manifests(serving)
        assert republished.problem is None and republished.manifest.version > latest
        assert restarted.refresh() is True and restarted.last_error is None
        assert restarted.version == republished.manifest.version
        assert sorted(f.text for f in fact_reads.current_facts(restarted.current())) == facts, "all of it again"
        assert run_due(tmp_path, instance, cursor, now=1003.0)[0] == [], "whole again: nothing due"


# --------------------------------------------------------------------------- a corrupt store


def corrupt_store(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "garbage header":
        data[:4096] = os.urandom(4096)
    elif how == "cut short":
        del data[len(data) // 3:]
    else:  # "bad blocks": every block past the header, so the first query meets one
        data[8192:] = os.urandom(len(data) - 8192)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage header", "cut short", "bad blocks"])
def test_a_corrupt_store_is_moved_aside_and_rebuilt_from_turns_while_the_last_snapshot_is_served(
        tmp_path, monkeypatch, caplog, how):
    """Before: two runs failed with a clear error, then new facts stopped silently; `rm memory.duckdb`
    rebuilt everything, but nothing said so."""
    import dagster as dg
    from dagster._core.storage.event_log.base import PartitionKeyFilter

    from familiar_pipeline.defs.checks import STORE_CHECK
    from familiar_pipeline.storage import corrupt
    from familiar_pipeline.storage.snapshots import SnapshotReader
    from familiar_pipeline.testing.fake_llm import fake_llm
    from familiar_pipeline.testing.scripted import demo_model
    from tests.helpers import append_chat, make_familiar

    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    paths = make_familiar(tmp_path, "fam", FULL_DISK_TOML)
    caplog.set_level(logging.INFO, logger="familiar_pipeline.storage.corrupt")
    with dg.instance_for_test() as instance, fake_llm(demo_model):
        instance.add_dynamic_partitions("familiars", ["fam"])
        append_chat(paths, 12)
        _, cursor, _ = run_due(tmp_path, instance, {}, now=1000.0)
        reader = SnapshotReader(paths.serving_dir)
        before = sorted(f.text for f in fact_reads.current_facts(reader.current()))
        served_version = reader.version
        assert len(before) >= 3

        corrupt_store(paths.memory_db, how)
        append_chat(paths, 4, start=12)  # someone speaks: the next run meets the corrupt store
        now, runs = 1001.0, 0
        while True:
            requests, cursor, notes = sensor_tick_and_run(tmp_path, instance, cursor, now)
            if not requests:
                break
            runs += 1
            assert runs <= 4, notes
            if corrupt.rebuilding(paths) is not None:  # under way: the bot keeps the last good snapshot
                assert reader.refresh() is False and reader.version == served_version
            now += 200.0  # past any retry's backoff
        moved = corrupt.moved_aside(paths)
        assert len(moved) == 1 and moved[0].stat().st_size > 0, "moved aside, not deleted"
        assert corrupt.rebuilding(paths) is None, "rebuilt"
        said = [r.getMessage() for r in caplog.records if r.name == "familiar_pipeline.storage.corrupt"]
        assert len([m for m in said if "is corrupt" in m]) == 1, said
        assert len([m for m in said if "is rebuilt" in m]) == 1, said

        assert reader.refresh() is True
        after = sorted(f.text for f in fact_reads.current_facts(reader.current()))
        assert set(before) <= set(after) and len(after) > len(before), "everything again, and the new turns"

        # The UI: the store check on the turn index warns while the moved-aside file is there.
        key = dg.AssetCheckKey(dg.AssetKey("turns_fts"), STORE_CHECK)
        [latest] = instance.event_log_storage.get_asset_check_execution_history(
            key, limit=1, partition_filter=PartitionKeyFilter(key="fam"))
        evaluation = latest.event.dagster_event.event_specific_data
        assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
        assert evaluation.metadata["moved_aside"].value == 1
        moved[0].unlink()
        append_chat(paths, 1, start=16)
        assert sensor_tick_and_run(tmp_path, instance, cursor, now + 10_000)[0]
        [latest] = instance.event_log_storage.get_asset_check_execution_history(
            key, limit=1, partition_filter=PartitionKeyFilter(key="fam"))
        assert latest.event.dagster_event.event_specific_data.passed, "gone once the operator removed it"


def sensor_tick_and_run(root: Path, instance, cursor: dict, now: float) -> tuple[list, dict, list[str]]:
    """Like `run_due`, but a run may fail (it met the corrupt store): the sensor asks again."""
    from familiar_pipeline.defs.jobs import execute_request
    from tests.helpers import sensor_tick

    requests, _, cursor, notes = sensor_tick(cursor, ["fam"], ["fam"], root=root, in_flight={}, max_requests=5, now=now)
    for request in requests:
        execute_request(request, instance=instance, data_root=root, raise_on_error=False)
    return requests, cursor, notes


# --------------------------------------------------------------------------- a dead Dagster daemon


SHORT_LIVED_SERVER = textwrap.dedent("""
    import http.server, sys, threading, time
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(float(sys.argv[2]))
    sys.exit(0)   # as `dagster dev` does when its daemon dies: status 0
""")


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_stable_run():
    backoff = Backoff(first_s=1, max_s=8, stable_s=60)
    assert [backoff.next_delay(ran_for=2) for _ in range(5)] == [1, 2, 4, 8, 8]
    assert backoff.next_delay(ran_for=61) == 1, "it stayed up: a one-off, not a crash loop"


def test_a_child_that_exits_is_started_again_with_backoff_and_said_so(tmp_path):
    port = free_port()
    lines: list[str] = []
    starts: list[float] = []

    def start() -> supervisor.Child:
        starts.append(time.monotonic())
        return supervisor.start_child("server", [sys.executable, "-c", SHORT_LIVED_SERVER, str(port), "1.5"],
                                      env=dict(os.environ), log_path=tmp_path / "server.log")

    restarter = Restarter("server", start, f"http://127.0.0.1:{port}/", say=lines.append,
                          backoff=Backoff(first_s=0.2, max_s=0.4, stable_s=60), ready_timeout=20)
    stop = threading.Event()
    child = start()
    try:
        for _ in range(3):
            child.process.wait(timeout=20)
            assert child.process.returncode == 0
            child = restarter.again(child, stop)
            assert child is not None and child.running()
        assert restarter.restarts == 3
        said = "\n".join(lines)
        assert "restarting server in 0s (restart 1); the chat stays up" in said
        assert "server is back (restart 3" in said
        stop.set()
        child.process.wait(timeout=20)
        assert restarter.again(child, stop) is None, "a stop while waiting ends it"
    finally:
        supervisor.stop_children([child])


# --------------------------------------------------------------------------- the UI's address


def test_a_non_loopback_host_is_warned_about_and_shown_as_bound():
    from familiar_bot.app.cli.commands.up import OPEN_UI_WARNING

    assert supervisor.is_loopback("127.0.0.1") and supervisor.is_loopback("localhost") and supervisor.is_loopback("::1")
    assert not supervisor.is_loopback("0.0.0.0") and not supervisor.is_loopback("192.168.1.4")
    assert not supervisor.is_loopback("example.org")
    shown = supervisor.ui_address("0.0.0.0", 3999)
    assert shown != "http://127.0.0.1:3999" and shown.endswith(":3999")
    machine = supervisor.machine_address()
    if machine:
        assert shown == f"http://{machine}:3999"
    assert supervisor.ui_address("192.168.1.4", 80) == "http://192.168.1.4:80"
    assert supervisor.ui_address("::", 80).startswith("http://")
    assert supervisor.local_address("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert supervisor.local_address("::", 80) == "http://[::1]:80"
    warning = OPEN_UI_WARNING.format(host="0.0.0.0", address=shown)
    assert "no login" in warning and "docs/playbook.md" in warning and shown in warning


def up_env(root: Path, home: Path) -> dict[str, str]:
    """A `familiar up` environment of its own: data root, DAGSTER_HOME, no host settings or token."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if not host_free(k)}
    env.update(FAMILIAR_DATA_ROOT=str(root), DAGSTER_HOME=str(home), PYTHONUNBUFFERED="1",
               FAMILIAR__PIPELINE__SENSOR_INTERVAL_S="5")
    return env


def daemon_pids(up_pid: int) -> list[int]:
    """The Dagster daemon processes under a `familiar up` (in its children's sessions)."""
    found = []
    for pid in supervisor.processes_in_sessions(supervisor.child_sessions(up_pid)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dagster-daemon" in b" ".join(argv) or (b"dagster._daemon" in argv and b"run" in argv):
            found.append(pid)
    return found


def stop_up(process: subprocess.Popen) -> None:
    sessions = supervisor.child_sessions(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for session in sessions:
        try:
            os.killpg(session, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_dead_daemon_is_restarted_while_the_chat_keeps_answering(tmp_path):
    from familiar_pipeline.storage.paths import FamiliarPaths
    from familiar_pipeline.storage.snapshots import SnapshotReader

    root, home = tmp_path / "familiars", tmp_path / "dagster_home"
    env = up_env(root, home)
    port = free_port()
    out_log, err_log = tmp_path / "up.out", tmp_path / "up.err"
    with out_log.open("wb") as out, err_log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "familiar_bot.app.cli.main", "up", "--demo", "--port", str(port), "--as", "Sam"],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err)

    def say(line: str) -> None:
        process.stdin.write((line + "\n").encode())
        process.stdin.flush()

    def replies() -> int:
        return sum(line.startswith("Familiar: (scripted demo reply)") for line in out_log.read_text().splitlines())

    try:
        wait_for(lambda: "ready in" in err_log.read_text(), 180, "the UI", process, err_log)
        assert_private_sockets(process.pid)
        say("hello there, I'm Sam and I live in Lisbon.")
        wait_for(lambda: replies() == 1, 90, "the first reply", process, err_log)
        [daemon] = wait_for(lambda: daemon_pids(process.pid), 30, "the daemon", process, err_log)
        os.kill(daemon, signal.SIGKILL)
        wait_for(lambda: "restarting dagster dev in" in err_log.read_text(), 60, "the restart", process, err_log)
        lines = ["my sister Ana works as a teacher in Porto.", "I love hiking in the mountains on weekends.",
                 "my cat Miso only eats fresh tuna every day.", "I moved to Porto last month to be near Ana."]
        for line in lines:  # typed while Dagster is down or coming back: the chat answers each
            say(line)
        wait_for(lambda: replies() == 5, 60, "replies while Dagster restarts", process, err_log)
        log = err_log.read_text()
        assert "dagster dev exited with status 0" in log or "dagster dev was killed" in log, log[-2000:]
        wait_for(lambda: "dagster dev is back" in err_log.read_text(), 180, "Dagster back", process, err_log)

        reader = SnapshotReader(FamiliarPaths.for_id(DEMO_FAMILIAR, root).serving_dir)

        def facts_about_miso():
            reader.refresh()
            return [f for f in fact_reads.current_facts(reader.current()) if "Miso" in f.text]

        wait_for(facts_about_miso, 150, "memory built after the restart", process, err_log)
        assert process.poll() is None, "familiar up never stopped"
    finally:
        stop_up(process)
    assert process.returncode == 128 + signal.SIGTERM


def assert_private_sockets(up_pid: int) -> None:
    """Dagster's code servers listen on Unix sockets in the temporary folder: `familiar up` gives
    its children a private one, so another local account cannot connect to them."""
    sockets = []
    for pid in supervisor.processes_in_sessions(supervisor.child_sessions(up_pid)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        sockets += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--socket"]
    assert sockets, "the code server listens on a socket"
    for path in sockets:
        folder = Path(path).parent
        assert folder.name.startswith("familiar-up-") and stat.S_IMODE(folder.stat().st_mode) == 0o700, path


# --------------------------------------------------------------------------- private files


def run_cli(argv: list[str], env: dict[str, str], *, stdin: str = "", user: int | None = None) -> subprocess.CompletedProcess:
    """The `familiar` command in a process of its own, started with the permissive umask 022
    (what a login shell usually has), so only the project's own settings can make files private."""
    return subprocess.run([sys.executable, "-m", "familiar_bot.app.cli.main", *argv], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=240, preexec_fn=lambda: os.umask(0o022))


def loose(paths) -> list[str]:
    """Paths readable, writable or enterable by group or others."""
    return [f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p}" for p in paths if stat.S_IMODE(p.lstat().st_mode) & 0o077]


@pytest.mark.timeout(400)
def test_what_the_bot_and_the_pipeline_write_is_private(tmp_path):
    """Data root 0700, every folder 0700 and every file 0600 under it (turn log and its WAL/SHM, store,
    snapshots, indexes, LLM cache), the run state a pipeline run writes in DAGSTER_HOME; and, when the
    tests run as root, another account (uid 65534) cannot read any of it."""
    from tests.helpers import FAKE_MODEL_TOML

    root, home = tmp_path / "familiars", tmp_path / "dagster_home"
    env = up_env(root, home)
    env["FAMILIAR_FAKE_LLM"] = "familiar_pipeline.testing.scripted:careful_model"
    env["FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE"] = "4"
    (home / "dagster.yaml").chmod(0o600)  # the test's own file; what Dagster adds is checked below
    before = set(home.rglob("*"))
    assert run_cli(["init", "fam"], env).returncode == 0
    character = root / "fam" / "character.toml"
    character.write_text(character.read_text() + FAKE_MODEL_TOML)
    said = "\n".join(["I moved to Lisbon for a job at the bakery.", "My cat Pixel hates the rain.",
                       "My sister visits from Porto every spring.", "I am learning to play the cello."])
    chat = run_cli(["chat", "--familiar", "fam", "--as", "Sam"], env, stdin=said + "\n")
    assert chat.returncode == 0, chat.stderr
    for projection in ("facts", "turns_fts"):
        built = run_cli(["backfill", "--familiar", "fam", "--projection", projection, "--local"], env)
        assert built.returncode == 0, built.stdout + built.stderr

    familiar = root / "fam"
    names = {p.name for p in familiar.rglob("*")}
    assert {"turns.db", "memory.duckdb", "manifest.json", "llm_cache.sqlite", "turns", "facts"} <= names, names
    assert any(n.endswith(".parquet") for n in names)
    everything = [root, *root.rglob("*")]
    assert loose(everything) == [], "all of it is its owner's only"
    written = [p for p in home.rglob("*") if p not in before]
    assert written and loose(written) == [], "the run state Dagster wrote"

    if os.geteuid() != 0:
        pytest.skip("another account's view needs root to switch to it")
    probe = textwrap.dedent(f"""
        import os, sys
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        denied = 0
        for path in {[str(familiar / "turns.db"), str(familiar / "memory.duckdb"), str(familiar / "serving" / "manifest.json"),
                      str(home / "history" / "runs.db")]!r}:
            try:
                open(path, "rb").read(1)
            except PermissionError:
                denied += 1
        for folder in {[str(root), str(home)]!r}:
            try:
                os.listdir(folder)
            except PermissionError:
                denied += 1
        print(denied)
    """)
    looked = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert looked.stdout.strip() == "6", looked.stdout + looked.stderr
