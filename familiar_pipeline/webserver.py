"""Which Dagster webserver serves this checkout: the marker `familiar up` leaves in DAGSTER_HOME.

A webserver answering on 127.0.0.1:3000 may belong to another checkout, another data
root, another user's familiar. Submitting a run to it would rebuild someone else's
memory, so commands that talk to a webserver (`familiar backfill`) never pick one by
port. `familiar up` writes ``familiar-up.json`` into its DAGSTER_HOME once the UI
answers, naming the address, its own pid, the data root and the repository it runs
from, and removes it when it stops. A command trusts a webserver only when the
marker in *its own* DAGSTER_HOME names *its own* data root and repository, the
launcher is alive and the address answers.

Only one `familiar up` may live per DAGSTER_HOME and per data root (`InstanceLock`):
two daemons on one instance race each other's sensors and runs, and a second
launcher used to overwrite the first one's marker and then delete it on exit. The
lock is an `flock` on ``familiar-up.lock`` in each of the two folders, so it dies with
its process (a killed launcher leaves nothing to clean up by hand), and the file
names its holder (pid, address, familiar, child process groups) for the refusal.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from familiar_pipeline.storage.paths import REPO_ROOT, data_root
from familiar_pipeline.storage.private import private_dir, private_file

MARKER_NAME = "familiar-up.json"
LOCK_NAME = "familiar-up.lock"


class UnverifiedWebserver(RuntimeError):
    """A `familiar up` is running on this DAGSTER_HOME for another data root or checkout, or is not ready."""


@dataclass(frozen=True)
class WebserverMarker:
    url: str
    pid: int
    data_root: str
    repo: str
    dagster_home: str


def marker_path(dagster_home: Path | str) -> Path:
    return Path(dagster_home) / MARKER_NAME


def write_marker(dagster_home: Path | str, url: str, *, data_root_dir: Path | str,
                 pid: int | None = None) -> Path:
    """Record that this process serves `url` for `data_root_dir` from this checkout (atomic write)."""
    home = Path(dagster_home).resolve()
    marker = WebserverMarker(url=url, pid=pid if pid is not None else os.getpid(),
                             data_root=str(Path(data_root_dir).resolve()), repo=str(REPO_ROOT), dagster_home=str(home))
    path = marker_path(home)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(json.dumps(asdict(marker), indent=2) + "\n")
    os.replace(staging, path)
    return path


def remove_marker(dagster_home: Path | str, pid: int | None = None) -> None:
    """Remove the marker if it is this process's (a newer launcher's marker is left alone)."""
    marker = read_marker(dagster_home)
    if marker is not None and marker.pid == (pid if pid is not None else os.getpid()):
        marker_path(dagster_home).unlink(missing_ok=True)


def read_marker(dagster_home: Path | str) -> WebserverMarker | None:
    try:
        raw = json.loads(marker_path(dagster_home).read_text())
        return WebserverMarker(url=str(raw["url"]), pid=int(raw["pid"]), data_root=str(raw["data_root"]),
                               repo=str(raw["repo"]), dagster_home=str(raw["dagster_home"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no marker, or not one we can trust: treat as no webserver


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process reused the pid
        return False
    return True


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def verified_webserver(dagster_home: Path | str, data_root_dir: Path | str | None = None) -> WebserverMarker | None:
    """The webserver serving this checkout and data root from `dagster_home`, or None if none runs.

    None: no marker, or its launcher is gone (a stale marker from a killed run).
    Raises UnverifiedWebserver, naming both sides, when a live launcher on this
    DAGSTER_HOME serves another data root or repository, or does not answer: a run
    started here would then race or land in the wrong place.
    """
    marker = read_marker(dagster_home)
    if marker is None or not pid_alive(marker.pid):
        return None
    ours = (str(Path(data_root_dir or data_root()).resolve()), str(REPO_ROOT))
    if (marker.data_root, marker.repo) != ours:
        raise UnverifiedWebserver(
            f"the Dagster webserver at {marker.url} (familiar up, pid {marker.pid}, DAGSTER_HOME {marker.dagster_home}) "
            f"serves data root {marker.data_root} from {marker.repo}, but this command's data root is {ours[0]} "
            f"from {ours[1]}; stop it, or give this checkout a DAGSTER_HOME of its own"
        )
    if not answers(marker.url):
        raise UnverifiedWebserver(
            f"familiar up (pid {marker.pid}) owns DAGSTER_HOME {marker.dagster_home} but {marker.url} does not "
            "answer yet; try again when it is ready, or stop it"
        )
    return marker


# --------------------------------------------------------------------------- one live instance


# A probe (`running_instance`) holds a free lock for a moment to learn that it is free; a launcher
# that meets the lock held by no live process retries for this long before it believes a holder.
PROBE_RETRY_S = 1.0


class InstanceRunning(RuntimeError):
    """Another live `familiar up` holds the DAGSTER_HOME or the data root; `holder` is what it wrote."""

    def __init__(self, holder: dict, path: Path):
        self.holder, self.path = holder, path
        super().__init__(describe_holder(holder, path))


def lock_paths(dagster_home: Path | str, data_root_dir: Path | str) -> list[Path]:
    """The lock files of one instance: in DAGSTER_HOME (Dagster's run state) and in the data root (the familiars)."""
    both = [Path(dagster_home).resolve() / LOCK_NAME, Path(data_root_dir).resolve() / LOCK_NAME]
    return list(dict.fromkeys(both))  # one file when both are the same folder (a second flock would refuse us)


def read_holder(path: Path) -> dict:
    """What the lock file says of its (last) holder; {} when unreadable (a write under way, or no file)."""
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe_holder(holder: dict, path: Path) -> str:
    """`familiar up` (pid N, http://127.0.0.1:3000, familiar 'x') on DAGSTER_HOME ... and data root ...: one phrase."""
    pid = holder.get("pid", "unknown")
    address = holder.get("address") or "address unknown"
    familiar = f", familiar {holder['familiar']!r}" if holder.get("familiar") else ""
    home = holder.get("dagster_home") or path.parent
    root = holder.get("data_root") or "?"
    return f"familiar up (pid {pid}, {address}{familiar}) on DAGSTER_HOME {home} and data root {root}"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@dataclass
class InstanceLock:
    """The running `familiar up`'s hold on its DAGSTER_HOME and data root (an `flock` in each).

    `previous`: what the files named before this launcher took them; a launcher that was
    killed leaves its entry (its pid, its children's process groups) for the next one to
    clean up after (`familiar up` stops what is left of them).
    """

    paths: list[Path]
    fds: list[int]
    info: dict
    previous: dict = field(default_factory=dict)

    @classmethod
    def acquire(cls, dagster_home: Path | str, data_root_dir: Path | str, info: dict,
                retry_s: float = PROBE_RETRY_S) -> "InstanceLock":
        """Take both locks, or raise InstanceRunning naming the live holder (nothing is changed then)."""
        paths = lock_paths(dagster_home, data_root_dir)
        fds: list[int] = []
        previous: dict = {}
        try:
            for path in paths:
                private_dir(path.parent)
                fd = os.open(private_file(path), os.O_RDWR | os.O_CLOEXEC)
                fds.append(fd)
                deadline = time.monotonic() + retry_s
                while not _try_lock(fd):
                    holder = read_holder(path)
                    # A holder whose pid is alive is believed at once; otherwise the lock may be a
                    # probe's moment (`running_instance`), or a holder still writing its name.
                    if (holder.get("pid") and pid_alive(int(holder["pid"]))) or time.monotonic() >= deadline:
                        raise InstanceRunning(holder, path)
                    time.sleep(0.05)
                previous = previous or read_holder(path)
        except BaseException:
            for fd in fds:
                os.close(fd)  # closing releases what was taken
            raise
        lock = cls(paths, fds, dict(info, pid=os.getpid()), previous)
        lock.update()
        return lock

    def update(self, **info) -> None:
        """Rewrite what the lock files say of this holder (its children change when dagster dev restarts)."""
        self.info.update(info)
        data = (json.dumps(self.info, sort_keys=True) + "\n").encode()
        for fd in self.fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def release(self) -> None:
        """Let the next `familiar up` in. The files are emptied first: one that still names a holder
        after its lock is free was left by a launcher that was killed (`previous`)."""
        for fd in self.fds:
            os.ftruncate(fd, 0)
            os.close(fd)
        self.fds = []


def running_instance(dagster_home: Path | str, data_root_dir: Path | str | None = None) -> dict | None:
    """What the live `familiar up` on this DAGSTER_HOME (or, given, this data root) wrote of itself; None if none runs.

    Probes each lock without waiting: a free lock is taken and given back at once.
    """
    homes = [Path(dagster_home).resolve() / LOCK_NAME]
    if data_root_dir is not None:
        homes.append(Path(data_root_dir).resolve() / LOCK_NAME)
    for path in homes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # never locked
        try:
            if _try_lock(fd):
                continue  # closing below gives it back
            return read_holder(path) or {"pid": None}
        finally:
            os.close(fd)
    return None


# --------------------------------------------------------------------------- a sharded deployment

CONTROL_PLANE_MARKER = "familiar-control-plane.json"


def write_control_plane_marker(dagster_home: Path | str, url: str, shards: dict[str, str]) -> Path:
    """What `familiar control-plane` leaves in its DAGSTER_HOME: the UI's address, its pid, shard -> code server."""
    path = Path(dagster_home) / CONTROL_PLANE_MARKER
    staging = private_file(path.with_name(f".{path.name}.{os.getpid()}"))
    staging.write_text(json.dumps({"url": url, "pid": os.getpid(), "shards": shards}, indent=2) + "\n")
    os.replace(staging, path)
    return path


def read_control_plane_marker(dagster_home: Path | str) -> dict | None:
    """The marker of a live `familiar control-plane` on this DAGSTER_HOME, else None."""
    try:
        marker = json.loads((Path(dagster_home) / CONTROL_PLANE_MARKER).read_text())
        if pid_alive(int(marker["pid"])) and isinstance(marker["shards"], dict) and isinstance(marker["url"], str):
            return marker
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None
