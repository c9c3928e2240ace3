"""Which Dagster webserver serves this checkout: the marker `familiar up` leaves in DAGSTER_HOME.

A webserver answering on 127.0.0.1:3000 may belong to another checkout, another data
root, another user's familiar. Submitting a run to it would rebuild someone else's
memory, so commands that talk to a webserver (`familiar backfill`) never pick one by
port. `familiar up` writes ``familiar-up.json`` into its DAGSTER_HOME once the UI
answers, naming the address, its own pid, the data root and the repository it runs
from, and removes it when it stops. A command trusts a webserver only when the
marker in *its own* DAGSTER_HOME names *its own* data root and repository, the
launcher is alive and the address answers.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from familiar_pipeline.storage.paths import REPO_ROOT, data_root
from familiar_pipeline.storage.private import private_file

MARKER_NAME = "familiar-up.json"


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
