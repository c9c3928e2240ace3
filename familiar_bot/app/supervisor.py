"""Start, watch and stop the processes of `familiar up` (and of benchmarks that need the real stack).

Each child runs in its own session (`start_new_session=True`), hence its own process
group: a `dagster dev` spawns a webserver, a daemon and code servers, and only a signal
to the whole group reaches them all. A child in its own session also does not get the
terminal's Ctrl-C directly, so the supervisor is the one place that decides how the
group stops: SIGTERM to every group, a grace period, then SIGKILL to whatever is left
(stragglers such as orphaned code servers included).

A child that exits on its own is reported, with the tail of its log. The caller
decides what follows: `familiar up` starts `dagster dev` again with backoff
(`Restarter`: `dagster dev` exits, with status 0, when its daemon dies, and the chat
must not go down with the pipeline), and stops the rest for any other child.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Sequence

from familiar_pipeline.storage.paths import REPO_ROOT, data_root
from familiar_pipeline.storage.private import private_dir, private_file

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
    started_at: float = field(default_factory=time.monotonic)

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
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def dagster_home() -> Path:
    """The DAGSTER_HOME `familiar up` gives its children: $DAGSTER_HOME, else the checkout's `dagster_home`, absolute."""
    return Path(os.environ.get("DAGSTER_HOME") or REPO_ROOT / "dagster_home").expanduser().resolve()


def child_env(extra: dict[str, str] | None = None, *, dagster_home: Path | None = None,
              private_tmp: Path | None = None) -> dict[str, str]:
    """The environment every child gets: absolute DAGSTER_HOME and data root, offline litellm.

    `private_tmp` (a 0700 folder) becomes the children's TMPDIR: Dagster puts its code
    servers' gRPC sockets in the temporary folder, and in /tmp another local account
    could connect to them.
    """
    env = dict(os.environ)
    if private_tmp is not None:
        env["TMPDIR"] = str(private_tmp)
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
        private_dir(log_path.parent)
        log_file = open(private_file(log_path), "ab", buffering=0)  # Dagster's log quotes message text
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
    private_dir(env["DAGSTER_HOME"])  # run history and metadata quote what people said
    return start_child("dagster dev", dagster_dev_argv(host, port), env=env, log_path=log_path)


def dagster_daemon_argv(workspace: Path = REPO_ROOT / "workspace.yaml") -> list[str]:
    return [sys.executable, "-m", "dagster._daemon", "run", "-w", str(workspace)]


CODE_LOCATION = "familiar_pipeline"  # workspace.yaml's location name


def start_code_server(*, env: dict[str, str], log_path: Path, folder: Path,
                      timeout: float = READY_TIMEOUT_S) -> tuple[Child, Path]:
    """The code location served on a Unix socket in `folder` (`dagster code-server start`), as
    `dagster dev` serves it, and a workspace file pointing at it; returns once the socket exists.

    A daemon started on a workspace of Python modules manages a code server of its own, which
    measured 6.1 CPU-s a minute idle against 3.6 for this one (docs/benchmarks.md, "Idle floor").
    """
    sock = folder / "code.sock"
    child = start_child("code server", [sys.executable, "-m", "dagster", "code-server", "start", "-m",
                                        "familiar_pipeline.definitions", "--location-name", CODE_LOCATION,
                                        "-d", str(REPO_ROOT), "-s", str(sock)], env=env, log_path=log_path)
    workspace = folder / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - grpc_server:\n      socket: {json.dumps(str(sock))}\n"
                         f"      location_name: {CODE_LOCATION}\n")
    started = time.monotonic()
    while not sock.exists():
        if not child.running():
            raise ChildExited(child.describe_exit())
        if time.monotonic() - started > timeout:
            raise ChildExited(f"the code server made no socket within {timeout:.0f}s")
        time.sleep(0.1)
    return child, workspace


# What the daemon logs when the turn sensor is evaluated: the code location loaded and memory is watched.
DAEMON_READY_LINE = b"Checking for new runs for sensor: turn_watermark_sensor"


def start_dagster_daemon(*, env: dict[str, str], log_path: Path,
                         workspace: Path = REPO_ROOT / "workspace.yaml") -> tuple[Child, Callable[[], bool]]:
    """The Dagster daemon alone (sensors, run queue), without the webserver: the small-host group
    (`familiar up --no-ui`), on `workspace` (`start_code_server`'s). With it, a probe that is true
    once its log (from this start on) shows the turn sensor evaluated: there is no page to ask."""
    private_dir(env["DAGSTER_HOME"])
    offset = log_path.stat().st_size if log_path.exists() else 0
    child = start_child("dagster daemon", dagster_daemon_argv(workspace), env=env, log_path=log_path)
    return child, lambda: log_shows(log_path, DAEMON_READY_LINE, offset)


def log_shows(path: Path, line: bytes, offset: int = 0) -> bool:
    """Whether the log at `path`, from byte `offset` on, holds `line`."""
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return line in log.read()
    except OSError:
        return False


WILDCARD_HOSTS = ("0.0.0.0", "", "::")


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the UI on this machine (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: reachable from elsewhere, as far as we know
        return False


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def local_host(host: str) -> str:
    """Where a process on this machine reaches a server bound to `host` (the wildcard via loopback)."""
    if host in WILDCARD_HOSTS:
        return "::1" if host == "::" else "127.0.0.1"
    return host


def local_address(host: str, port: int) -> str:
    return _url(local_host(host), port)


def machine_address() -> str | None:
    """This machine's address on its default route, as others would reach it (None: unknown).

    A UDP socket's connect() only picks a route: no packet is sent.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed, only used to choose an interface
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith(("0.", "127.")) else address


def ui_address(host: str, port: int) -> str:
    """The UI's address as bound: the given host, or for the wildcard this machine's address."""
    if host in WILDCARD_HOSTS:
        return _url(machine_address() or socket.gethostname(), port)
    return _url(host, port)


def wait_until_ready(url: str | Callable[[], bool], children: Sequence[Child], timeout: float = READY_TIMEOUT_S,
                     should_stop: Callable[[], bool] = lambda: False) -> float:
    """Poll `url` until it answers 200 (or, a callable, until it returns true); seconds waited.
    Raises if a child dies first."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for child in children:
            if not child.running():
                raise ChildExited(child.describe_exit())
        if should_stop():
            raise InterruptedError("stop requested while waiting for the UI")
        if callable(url):
            if url():
                return time.monotonic() - started
        else:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
        time.sleep(0.2)
    raise ChildExited(f"{'the daemon' if callable(url) else url} did not answer within {timeout:.0f}s")


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


def watch_children(children: Sequence[Child], stop: threading.Event, say: Callable[[str], None],
                   poll_s: float) -> int:
    """Wait until asked to stop (0) or until a child exits (1, its exit said): a command's main loop."""
    while not stop.wait(poll_s):
        gone = next((c for c in children if not c.running()), None)
        if gone is not None:
            say(gone.describe_exit())
            return 1
    return 0


def shut_down(children: Sequence[Child], previous_handlers: dict, say: Callable[[str], None]) -> None:
    """Stop the children (saying how long it took) and put the signal handlers back."""
    took = stop_children(children)
    if children:
        say(f"stopped in {took:.1f}s")
    for sig, handler in previous_handlers.items():
        signal.signal(sig, handler)


def leftovers(sessions: Sequence[int], home: Path | str) -> list[int]:
    """Pids still alive in `sessions` that run with this DAGSTER_HOME: what a killed `familiar up` left.

    A `familiar up` killed with SIGKILL cannot stop its children (each leads a session of
    its own), so its `dagster dev` (webserver, daemon, code servers) lives on, on the same
    DAGSTER_HOME. Only processes whose environment names that DAGSTER_HOME are counted, so
    a session id reused by anything else is never touched.
    """
    wanted = f"DAGSTER_HOME={Path(home).resolve()}".encode()
    found = []
    for pid in processes_in_sessions(set(sessions)):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if wanted in environ:
            found.append(pid)
    return found


def stop_pids(pids: Sequence[int], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM each, wait up to `grace` for them to go, SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_proc_stat(p) is not None and not _zombie(p) for p in pids):
            time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:].startswith("Z")


# --------------------------------------------------------------------------- restarting


@dataclass
class Backoff:
    """Waits before each restart: `first_s`, doubling up to `max_s`; a child that stayed up
    `stable_s` starts the sequence over (it was a one-off, not a crash loop)."""

    first_s: float = 1.0
    max_s: float = 60.0
    stable_s: float = 120.0
    failures: int = 0

    def next_delay(self, ran_for: float) -> float:
        if ran_for >= self.stable_s:
            self.failures = 0
        delay = min(self.max_s, self.first_s * 2 ** self.failures)
        self.failures += 1
        return delay


class Restarter:
    """Starts one child again, with backoff, whenever it exits on its own, until a stop is asked.

    `start` makes a fresh child; `ready_url` must answer 200 (a callable: return true) before the new one counts as
    back (a start that dies first counts as another failure and waits longer). Whatever
    is left of the dead child's process group is stopped first, so its port is free.
    Every step is said (`say`): a restart is never silent.
    """

    def __init__(self, name: str, start: Callable[[], Child], ready_url: str | Callable[[], bool], *,
                 say: Callable[[str], None],
                 backoff: Backoff | None = None, ready_timeout: float = READY_TIMEOUT_S):
        self.name, self.start, self.ready_url, self.say = name, start, ready_url, say
        self.backoff = backoff or Backoff()
        self.ready_timeout = ready_timeout
        self.restarts = 0

    def again(self, dead: Child, stop: threading.Event) -> Child | None:
        """A running replacement of `dead` (ready), or None when a stop was asked meanwhile."""
        ran_for = time.monotonic() - dead.started_at
        stop_children([dead])
        while True:
            delay = self.backoff.next_delay(ran_for)
            self.restarts += 1
            self.say(f"restarting {self.name} in {delay:.0f}s (restart {self.restarts}); the chat stays up")
            if stop.wait(delay):
                return None
            child = self.start()
            try:
                waited = wait_until_ready(self.ready_url, [child], timeout=self.ready_timeout,
                                          should_stop=stop.is_set)
            except ChildExited as exc:
                self.say(f"{self.name} did not come back: {exc}")
                stop_children([child])
                ran_for = 0.0
                continue
            except InterruptedError:
                stop_children([child])
                return None
            self.say(f"{self.name} is back (restart {self.restarts}, ready in {waited:.1f}s)")
            return child


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
    pids = group_pids(root_pid)
    return sum(rss_bytes(p) for p in pids), len(pids)


def group_pids(root_pid: int) -> set[int]:
    """`root_pid` and every process in a session led by one of its children: a `familiar up` group."""
    return {root_pid, *processes_in_sessions(child_sessions(root_pid))}
