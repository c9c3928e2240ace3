"""Start, watch and stop the processes of `familiar up` (and of benchmarks that need the real stack).

Each child runs in its own session (`start_new_session=True`), hence its own process
group: a `dagster dev` spawns a webserver, a daemon and code servers, and only a signal
to the whole group reaches them all. A child in its own session also does not get the
terminal's Ctrl-C directly, so the supervisor is the one place that decides how the
group stops: SIGTERM to every group, a grace period, then SIGKILL to whatever is left
(stragglers such as orphaned code servers included).

Nothing is restarted: a child that exits on its own is reported, with the tail of its
log, and the caller stops the rest.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Sequence

from familiar_pipeline.storage.paths import REPO_ROOT, data_root

STOP_GRACE_S = 8.0  # SIGTERM first; SIGKILL after this, so a full stop stays under 10 s
READY_TIMEOUT_S = 120.0


class ChildExited(RuntimeError):
    """A supervised child exited on its own (or never became ready)."""


@dataclass
class Child:
    """One supervised process, leader of its own process group."""

    name: str
    process: subprocess.Popen
    log_path: Path | None = None
    _log_file: IO | None = field(default=None, repr=False)

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session makes the child its group's leader

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def describe_exit(self) -> str:
        code = self.process.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        tail = self.log_tail()
        where = f" (log: {self.log_path})" if self.log_path else ""
        return f"{self.name} {how}{where}" + (f"\n{tail}" if tail else "")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def child_env(extra: dict[str, str] | None = None, *, dagster_home: Path | None = None) -> dict[str, str]:
    """The environment every child gets: absolute DAGSTER_HOME and data root, offline litellm."""
    env = dict(os.environ)
    home = Path(env.get("DAGSTER_HOME") or dagster_home or REPO_ROOT / "dagster_home").expanduser().resolve()
    env["DAGSTER_HOME"] = str(home)
    # Children run with cwd=REPO_ROOT; pin the data root so a relative one still means
    # what it meant where the operator typed the command.
    env["FAMILIAR_DATA_ROOT"] = str(data_root())
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # litellm must not fetch its cost map at import
    # Every Dagster run is a fresh process: let them cache bytecode, or each one compiles
    # litellm and dagster from source again (seconds per run).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra or {})
    return env


def start_child(name: str, argv: Sequence[str], *, env: dict[str, str], log_path: Path | None = None,
                cwd: Path = REPO_ROOT) -> Child:
    """Start `argv` as the leader of a new session; output to `log_path` (or inherited)."""
    log_file = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab", buffering=0)
    process = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=log_file if log_file else None, stderr=subprocess.STDOUT if log_file else None,
        start_new_session=True,
    )
    return Child(name, process, log_path, log_file)


def dagster_dev_argv(host: str, port: int, workspace: Path = REPO_ROOT / "workspace.yaml") -> list[str]:
    return [sys.executable, "-m", "dagster", "dev", "-w", str(workspace), "-h", host, "-p", str(port)]


def start_dagster_dev(host: str, port: int, *, env: dict[str, str], log_path: Path | None) -> Child:
    """The real `dagster dev`: webserver, daemon (sensors, run queue) and code server."""
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    return start_child("dagster dev", dagster_dev_argv(host, port), env=env, log_path=log_path)


def ui_address(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}"


def wait_until_ready(url: str, children: Sequence[Child], timeout: float = READY_TIMEOUT_S,
                     should_stop: Callable[[], bool] = lambda: False) -> float:
    """Poll `url` until it answers 200; seconds waited. Raises if a child dies first."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for child in children:
            if not child.running():
                raise ChildExited(child.describe_exit())
        if should_stop():
            raise InterruptedError("stop requested while waiting for the UI")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.2)
    raise ChildExited(f"{url} did not answer within {timeout:.0f}s")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (pgid reused): not ours to wait on
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_children(children: Sequence[Child], grace: float = STOP_GRACE_S) -> float:
    """SIGTERM every child's group, wait up to `grace`, SIGKILL what is left; seconds taken."""
    started = time.monotonic()
    for child in children:
        _signal_group(child.pgid, signal.SIGTERM)
    deadline = started + grace
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # Group members other than the leader (code servers, run workers) may outlive it.
    while time.monotonic() < deadline and any(group_alive(c.pgid) for c in children):
        time.sleep(0.1)
    for child in children:
        if group_alive(child.pgid):
            _signal_group(child.pgid, signal.SIGKILL)
        if child.running():
            child.process.wait()
        if child._log_file is not None:
            child._log_file.close()
    return time.monotonic() - started


# --------------------------------------------------------------------------- measuring


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(pgid, session id) of a process, from /proc/<pid>/stat; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "(comm)": state ppid pgrp session ...
    return int(fields[2]), int(fields[3])


def processes_in_sessions(sessions: set[int]) -> list[int]:
    """Pids whose session id is one of `sessions` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat and stat[1] in sessions:
                found.append(int(entry.name))
    return found


def child_sessions(pid: int) -> set[int]:
    """Session ids led by direct children of `pid` (each `familiar up` child has its own session)."""
    sessions = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and int(fields[3]) == int(entry.name):  # ppid, session id
            sessions.add(int(entry.name))
    return sessions


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss_bytes(root_pid: int) -> tuple[int, int]:
    """Summed RSS and process count of `root_pid` plus every session led by one of its children.

    `familiar up` puts each child in a session of its own, so "the group" is the
    supervisor itself and everything in its children's sessions (webserver, daemon,
    code servers, run workers).
    """
    if _proc_stat(root_pid) is None:
        return 0, 0
    pids = {root_pid, *processes_in_sessions(child_sessions(root_pid))}
    return sum(rss_bytes(p) for p in pids), len(pids)
