"""Text embedders: the vectors behind fact retrieval's cosine signal.

Three backends, chosen by ``[providers.embedding].backend``:

* ``off``: no embedder; retrieval runs on BM25, recency and importance alone.
* ``hash``: signed feature hashing of word tokens. No dependencies, deterministic
  across processes and hosts, and good at one thing: texts sharing words score higher.
* ``fastembed``: a real ONNX sentence model. For hosts without internet access a
  local model folder (``fastembed_model_path`` / ``FAMILIAR_FASTEMBED_MODEL_PATH``)
  replaces the download.

Third parties add backends with ``register_embedder``.

An embedder's ``name`` identifies its vector space: stored vectors are keyed
``(fact_id, model=name)`` and reads use only the active name, so two models (or one
hash embedder at two sizes) never mix in a cosine. The API is synchronous because the
pipeline is; the bot calls ``embed`` through ``asyncio.to_thread``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Hashable, Mapping, Sequence
from hashlib import blake2b
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from familiar_pipeline.config import catalogue

if TYPE_CHECKING:
    from fastembed import TextEmbedding

    from familiar_pipeline.config import EmbeddingConfig

MODEL_PATH_ENV = "FAMILIAR_FASTEMBED_MODEL_PATH"
FASTEMBED_MISSING = (
    "embedding backend 'fastembed' requires the 'local-embed' extra. "
    "Install it with `uv sync --extra local-embed`."
)


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 rows, one per text, in input order.

    ``embed([])`` returns shape ``(0, dim)``; blank text never raises.
    """

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def cosine(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Cosine similarity; 0.0 when lengths differ or either vector is zero.

    A length mismatch means the vectors come from different models, which is no
    evidence either way, so it scores like an unrelated pair rather than raising.
    """
    va = np.asarray(a, dtype=np.float64).ravel()
    vb = np.asarray(b, dtype=np.float64).ravel()
    if va.shape != vb.shape or va.size == 0:
        return 0.0
    norm = float(np.linalg.norm(va)) * float(np.linalg.norm(vb))
    if norm == 0.0 or not np.isfinite(norm):
        return 0.0
    return float(va @ vb) / norm


def row_dots(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``matrix @ vector`` on the calling thread, without the BLAS thread pool.

    numpy hands a large matrix-vector product to OpenBLAS, whose worker threads
    then spin for a while after every call. In the bot that is one product per
    reply (the cue against up to 20k turn vectors): the spinning threads doubled
    the process's CPU time per reply and competed with onnxruntime's threads for
    the next cue (docs/benchmarks.md). ``einsum`` runs numpy's own vectorised
    loop on one core: as fast as the threaded product at this size, nothing left spinning.
    """
    return np.einsum("ij,j->i", matrix, np.asarray(vector, dtype=matrix.dtype))


K = TypeVar("K", bound=Hashable)


def cosines(query: Sequence[float] | np.ndarray, rows: Mapping[K, Sequence[float] | np.ndarray]) -> dict[K, float]:
    """``{key: cosine(query, row)}`` for every row, as one matrix product.

    The same values and rules as :func:`cosine` (0.0 for another length or a zero
    vector), without a Python call and two norms per row: a reply scores every
    candidate fact against its cue this way.
    """
    q = np.asarray(query, dtype=np.float64).ravel()
    out = dict.fromkeys(rows, 0.0)
    same = [key for key, row in rows.items() if np.size(row) == q.size]
    q_norm = float(np.linalg.norm(q))
    if not same or q.size == 0 or q_norm == 0.0 or not np.isfinite(q_norm):
        return out
    matrix = np.asarray([np.asarray(rows[key], dtype=np.float64).ravel() for key in same])
    norms = np.linalg.norm(matrix, axis=1) * q_norm
    dots = row_dots(matrix, q)
    ok = (norms > 0) & np.isfinite(norms)
    values = np.divide(dots, norms, out=np.zeros_like(dots), where=ok)
    out.update(zip(same, values.tolist()))
    return out


def _as_texts(texts: Sequence[str]) -> list[str]:
    """Validate the input: a lone string would otherwise be embedded character by character."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("embed() takes a sequence of texts, not a single string; wrap it in a list")
    items = list(texts)
    for position, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"embed() text #{position} is {type(text).__name__}, expected str")
    return items


def _l2_normalise(matrix: np.ndarray) -> np.ndarray:
    """Row-normalise in float32; all-zero rows stay zero instead of becoming NaN."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    return matrix


# ---------------------------------------------------------------------------- hash

_WORD = re.compile(r"\w+")


def fold_text(text: str) -> str:
    """Casefold and strip accents, so "Café", "CAFE" and "café" hash alike.

    NFKD splits "é" into "e" plus a combining accent, which is then dropped. Casefold
    runs first because it can itself produce combining marks (e.g. "İ").
    """
    if text.isascii():
        return text.lower()  # same as casefold for ASCII, and much cheaper
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def hash_tokens(text: str) -> list[str]:
    """The tokens the hash embedder counts: ``\\w+`` runs of the folded text."""
    return _WORD.findall(fold_text(text))


def _token_hash(token: str) -> tuple[int, float]:
    """(bucket seed, sign) of one token, from blake2b so it is stable across processes."""
    digest = blake2b(token.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest[0:2], "big"), (1.0 if (digest[2] & 1) == 0 else -1.0)


class HashEmbedder:
    """Signed feature hashing of folded word tokens, L2-normalised.

    Each token adds ±1 to one of ``dim`` buckets. Unrelated texts land near
    orthogonal; texts that share words score higher. It knows nothing of meaning
    ("dog" and "puppy" are unrelated), which is what fastembed is for.
    """

    def __init__(self, dim: int = 256) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"HashEmbedder dim must be an int, got {type(dim).__name__}")
        if dim < 8:
            raise ValueError(f"HashEmbedder dim must be >= 8, got {dim}")
        self.dim = dim
        # The dim is part of the name: vectors of another size are another space.
        self.name = f"hash-v1-d{dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = _as_texts(texts)
        n = len(items)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Hash each distinct token once per call, then scatter every count with one
        # np.add.at: big batches (a backfill embeds every fact) stay fast.
        vocabulary: dict[str, int] = {}
        token_ids: list[int] = []
        per_text: list[int] = []
        for text in items:
            tokens = hash_tokens(text)
            per_text.append(len(tokens))
            token_ids.extend(vocabulary.setdefault(tok, len(vocabulary)) for tok in tokens)
        if not token_ids:
            return np.zeros((n, self.dim), dtype=np.float32)
        hashed = [_token_hash(tok) for tok in vocabulary]
        buckets = np.fromiter((seed % self.dim for seed, _ in hashed), dtype=np.int64, count=len(hashed))
        signs = np.fromiter((sign for _, sign in hashed), dtype=np.float32, count=len(hashed))
        ids = np.asarray(token_ids, dtype=np.int64)
        rows = np.repeat(np.arange(n, dtype=np.int64), per_text)
        matrix = np.zeros((n, self.dim), dtype=np.float32)
        np.add.at(matrix, (rows, buckets[ids]), signs[ids])
        return _l2_normalise(matrix)

    def __repr__(self) -> str:
        return f"HashEmbedder(dim={self.dim})"


# ---------------------------------------------------------------------- fastembed

# Sizes of common models, so `dim` is right before the model is loaded. Anything
# else learns its size from the first vector it produces.
KNOWN_FASTEMBED_DIMS: Mapping[str, int] = {
    "BAAI/bge-small-en-v1.5": 384,
    "BAAI/bge-base-en-v1.5": 768,
    "BAAI/bge-large-en-v1.5": 1024,
    "sentence-transformers/all-MiniLM-L6-v2": 384,
    "intfloat/e5-small-v2": 384,
    "intfloat/multilingual-e5-small": 384,
}

_REGISTRATION_LOCK = threading.Lock()


def fastembed_available() -> bool:
    return importlib.util.find_spec("fastembed") is not None


LENGTH_SORTED_BATCH = 16


class FastEmbedEmbedder:
    """A fastembed ONNX sentence model, loaded on first use.

    ``model_name`` names the vector space and must be the model the files really
    are. With ``model_path`` the files come from that local folder instead of a
    download, and the name stays what the operator configured, so a host loading
    ``sentence-transformers/all-MiniLM-L6-v2`` from disk and one that downloaded it
    store vectors under the same model key. Model names in fastembed's catalogue use
    the catalogue's pooling; other names are registered from the folder itself
    (``config.json`` for the size, sentence-transformers ``1_Pooling`` for pooling,
    mean pooling when absent).
    """

    def __init__(
        self,
        model_name: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        model_path: str | os.PathLike[str] | None = None,
        batch_size: int = 256,
    ) -> None:
        if not isinstance(model_name, str) or not model_name.strip():
            raise ValueError("FastEmbedEmbedder needs a non-empty model name")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_name = model_name.strip()
        self.name = f"fastembed:{self.model_name}"
        self.dim = KNOWN_FASTEMBED_DIMS.get(self.model_name, 0)
        self.cache_dir = str(Path(cache_dir).expanduser()) if cache_dir else None
        self.model_path = Path(model_path).expanduser().resolve() if model_path else None
        if self.model_path is not None and not self.model_path.is_dir():
            raise FileNotFoundError(
                f"fastembed model folder {self.model_path} does not exist "
                f"(set by [providers.embedding].fastembed_model_path or ${MODEL_PATH_ENV})"
            )
        self.batch_size = batch_size
        self._model = None
        self._load_lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = _as_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._loaded_model()
        # Texts go to the model shortest first, in batches of at most LENGTH_SORTED_BATCH: a batch is
        # padded to its longest text, so mixed lengths (context windows beside one-word turns) waste
        # most of the work (measured ~25% faster on LoCoMo windows; the vectors are identical).
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        batch = min(self.batch_size, LENGTH_SORTED_BATCH)
        ordered = np.vstack(list(model.embed([items[i] for i in order], batch_size=batch)))
        vectors = np.empty_like(ordered)
        vectors[order] = ordered
        if self.dim == 0:
            self.dim = int(vectors.shape[1])
        elif vectors.shape[1] != self.dim:
            raise RuntimeError(
                f"model {self.model_name!r} produced {vectors.shape[1]}-dimensional vectors, "
                f"expected {self.dim}: the model files are not the model this name says"
            )
        return _l2_normalise(vectors)

    def _loaded_model(self):
        if self._model is None:
            with self._load_lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> TextEmbedding:
        try:
            from fastembed import TextEmbedding
        except ImportError as exc:
            raise RuntimeError(FASTEMBED_MISSING) from exc
        kwargs: dict[str, Any] = {}  # cache_dir and fastembed's own specific_model_path (its **kwargs)
        if self.cache_dir:
            kwargs["cache_dir"] = self.cache_dir
        if self.model_path is not None:
            _prepare_local_model(TextEmbedding, self.model_name, self.model_path)
            kwargs["specific_model_path"] = str(self.model_path)
        try:
            model = TextEmbedding(model_name=self.model_name, **kwargs)
        except Exception as exc:  # fastembed raises bare ValueError/OSError/HTTP errors
            hint = (
                ""
                if self.model_path is not None
                else f"; on a host without internet access set ${MODEL_PATH_ENV} to a local model folder"
            )
            raise RuntimeError(f"could not load fastembed model {self.model_name!r}: {exc}{hint}") from exc
        quiet_onnx_session(model)
        return model

    def __repr__(self) -> str:
        where = f", model_path={str(self.model_path)!r}" if self.model_path else ""
        return f"FastEmbedEmbedder({self.model_name!r}{where})"


NO_SPINNING = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
# Each operator's work cut into small blocks that whichever pool thread is free takes next, so a
# thread the OS descheduled (a busy 2-core host) holds up less of the run. Same vectors, bit for bit.
DYNAMIC_BLOCKS = {"session.dynamic_block_base": "4"}


def quiet_onnx_session(text_embedding) -> bool:
    """Reopen fastembed's ONNX session with threads that sleep when idle; True when it did.

    onnxruntime's pool threads spin for a while after every run by default. The
    bot embeds one short cue per reply and then does its own CPU work (BM25,
    the turn-vector product, reading turns); on a 2-core host the spinning
    threads took the cores from that work: the work right after an embedding
    ran ~3x slower (docs/benchmarks.md, "Assembly latency with turn vectors"), and
    the embedding itself was not faster for it (6.2 ms without spinning, 8.2 with). fastembed does not expose the setting, so the session
    it built is replaced by one from the same file with the same options plus
    ``NO_SPINNING`` and ``DYNAMIC_BLOCKS`` (p95 of a cue 2-12% lower at load 2.4-5.5,
    docs/benchmarks.md). A fastembed that keeps its session elsewhere is left as it is.
    """
    impl = getattr(text_embedding, "model", None)
    session = getattr(impl, "model", None)
    path = getattr(session, "_model_path", None)
    if impl is None or session is None or not isinstance(path, str) or not hasattr(session, "get_session_options"):
        return False
    import onnxruntime as ort

    used = session.get_session_options()
    options = ort.SessionOptions()
    options.graph_optimization_level = used.graph_optimization_level
    options.intra_op_num_threads = used.intra_op_num_threads
    options.inter_op_num_threads = used.inter_op_num_threads
    options.enable_cpu_mem_arena = used.enable_cpu_mem_arena
    for key, value in {**NO_SPINNING, **DYNAMIC_BLOCKS}.items():
        options.add_session_config_entry(key, value)
    impl.model = ort.InferenceSession(path, sess_options=options, providers=session.get_providers())
    return True


def _catalogue_entry(text_embedding_cls, model_name: str) -> dict | None:
    for entry in text_embedding_cls.list_supported_models():
        if entry["model"].lower() == model_name.lower():
            return entry
    return None


def _prepare_local_model(text_embedding_cls, model_name: str, folder: Path) -> None:
    """Make fastembed able to load ``model_name`` from ``folder``, or say why it cannot.

    A catalogue model must find the ONNX file the catalogue names (a mismatch almost
    always means the folder holds a different model than configured). A model
    outside the catalogue is registered once per process from the folder's own files.
    """
    with _REGISTRATION_LOCK:
        entry = _catalogue_entry(text_embedding_cls, model_name)
        if entry is not None:
            expected = folder / entry["model_file"]
            if not expected.is_file():
                raise RuntimeError(
                    f"fastembed model folder {folder} has no {entry['model_file']}, the file "
                    f"fastembed expects for {model_name!r}. Set [providers.embedding].fastembed_model "
                    "to the model that folder holds (e.g. sentence-transformers/all-MiniLM-L6-v2 "
                    "for a folder built by `familiar models minilm`)."
                )
            return
        from fastembed.common.model_description import ModelSource, PoolingType

        model_file = next(
            (f for f in ("model.onnx", "onnx/model.onnx") if (folder / f).is_file()), None
        )
        if model_file is None:
            raise RuntimeError(f"fastembed model folder {folder} has no model.onnx")
        pooling = PoolingType.CLS if _folder_pooling(folder) == "cls" else PoolingType.MEAN
        text_embedding_cls.add_custom_model(
            model=model_name,
            pooling=pooling,
            normalization=True,
            sources=ModelSource(hf=model_name),  # never fetched: specific_model_path wins
            dim=_folder_dim(folder),
            model_file=model_file,
        )


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read {path}: {exc}") from exc


def _folder_dim(folder: Path) -> int:
    config = _read_json(folder / "config.json")
    dim = config.get("hidden_size") or config.get("dim")
    if not isinstance(dim, int) or dim <= 0:
        raise RuntimeError(
            f"cannot tell the vector size of the model in {folder}: config.json has no hidden_size"
        )
    return dim


def _folder_pooling(folder: Path) -> str:
    """``"cls"`` or ``"mean"``, from a sentence-transformers ``1_Pooling/config.json``."""
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    if pooling.get("pooling_mode_cls_token") and not pooling.get("pooling_mode_mean_tokens"):
        return "cls"
    return "mean"


# ----------------------------------------------------------------------- registry

EmbedderFactory = Callable[["EmbeddingConfig"], Embedder]


def _hash_factory(cfg: EmbeddingConfig) -> Embedder:
    return HashEmbedder(dim=cfg.dim)


def _fastembed_factory(cfg: EmbeddingConfig) -> Embedder:
    # Fail at startup, not at the first fact embedded hours later.
    if not fastembed_available():
        raise RuntimeError(FASTEMBED_MISSING)
    return FastEmbedEmbedder(
        cfg.fastembed_model, cache_dir=cfg.fastembed_cache_dir, model_path=cfg.fastembed_model_path
    )


OFF = "off"
_BUILTIN_FACTORIES: Mapping[str, EmbedderFactory] = {"hash": _hash_factory, "fastembed": _fastembed_factory}
_factories: dict[str, EmbedderFactory] = dict(_BUILTIN_FACTORIES)
# Config validates `backend` against its catalogue, which names the built-ins without importing this module.
assert {OFF, *_BUILTIN_FACTORIES} == set(catalogue.BUILTIN_EMBEDDING_BACKENDS), "config's built-in backends"
_registry_lock = threading.Lock()
_BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def register_embedder(name: str, factory: EmbedderFactory, *, replace: bool = False) -> None:
    """Add a backend selectable as ``[providers.embedding].backend = "<name>"``.

    ``factory(cfg)`` receives the whole EmbeddingConfig and returns an Embedder.
    Built-in names cannot be taken over; re-registering a third-party name needs
    ``replace=True`` so two plugins cannot silently shadow each other.
    """
    if not isinstance(name, str) or not _BACKEND_NAME.fullmatch(name):
        raise ValueError(f"invalid embedding backend name {name!r}: use letters, digits, '_', '.', ':' or '-'")
    if not callable(factory):
        raise TypeError(f"embedding backend {name!r}: factory must be callable")
    with _registry_lock:
        if name == OFF or name in _BUILTIN_FACTORIES:
            raise ValueError(f"embedding backend {name!r} is built in and cannot be replaced")
        if name in _factories and not replace:
            raise ValueError(f"embedding backend {name!r} is already registered (pass replace=True)")
        _factories[name] = factory
        catalogue.register_embedding_backend(name)


def unregister_embedder(name: str) -> None:
    """Remove a third-party backend (plugins unloading, tests cleaning up)."""
    with _registry_lock:
        if name == OFF or name in _BUILTIN_FACTORIES:
            raise ValueError(f"embedding backend {name!r} is built in and cannot be removed")
        _factories.pop(name, None)
        catalogue.unregister_embedding_backend(name)


def known_embedders() -> tuple[str, ...]:
    """Every valid ``backend`` value, sorted, ``off`` included."""
    with _registry_lock:
        return tuple(sorted({OFF, *_factories}))


def create_embedder(cfg: EmbeddingConfig, env: Mapping[str, str] = os.environ) -> Embedder | None:
    """The embedder the config asks for, or None for ``off``.

    ``$FAMILIAR_FASTEMBED_MODEL_PATH`` overrides ``fastembed_model_path``: the folder
    is a fact about the host, while the model name belongs to the familiar's config.
    """
    backend = cfg.backend
    if backend == OFF:
        return None
    with _registry_lock:
        factory = _factories.get(backend)
    if factory is None:
        raise ValueError(f"unknown embedding backend {backend!r}; valid: {', '.join(known_embedders())}")
    override = (env.get(MODEL_PATH_ENV) or "").strip()
    if override:
        cfg = dataclasses.replace(cfg, fastembed_model_path=override)
    embedder = factory(cfg)
    if not isinstance(embedder, Embedder):
        raise TypeError(
            f"embedding backend {backend!r} returned {type(embedder).__name__}, "
            "which lacks name, dim and embed()"
        )
    return embedder
