"""A BERT encoder as an ONNX graph, written from safetensors weights with the ``onnx`` package alone.

Why by hand: the usual exporters trace the model through torch, which these hosts
neither have nor need. A BERT encoder is a short, fixed recipe (embeddings, then N
blocks of self-attention and a GELU feed-forward, each with a residual and a
LayerNorm), so the graph is spelled out node by node here and the weights become
its initializers. The output is ``last_hidden_state``; mean pooling and the L2
normalisation of a sentence model are the loader's job (fastembed does both).

The graph takes the three inputs fastembed feeds a BERT model (``input_ids``,
``attention_mask``, ``token_type_ids``, int64, ``[batch, tokens]``). The embeddings
use opset 17 (``LayerNormalization``); each block is written with onnxruntime's
fused ``com.microsoft`` operators: ``Attention`` (one packed query/key/value
product, the scaled dot-product, the padding mask and the softmax in one kernel),
``SkipLayerNormalization`` (residual + bias + LayerNorm) and ``BiasGelu`` (the
exact erf GELU). Why fused: the bot embeds one short cue per reply, and there
the graph's node count, not its arithmetic, set much of the cost. Written with
plain ops (MatMul, Reshape, Transpose, Softmax per head split), onnxruntime's own
optimiser left the attention unfused: 24 Reshape/Transpose and 6 Softmax nodes
per run. The fused graph computes the same function (the test compares it with a
plain numpy BERT); it needs onnxruntime, which is what fastembed runs it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

OPSET = 17
CONTRIB = "com.microsoft"  # onnxruntime's contributed operators (Attention, SkipLayerNormalization, BiasGelu)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "last_hidden_state"
# Bumped whenever the graph this module writes changes, so folders built earlier are rebuilt
# (minilm.py compares it with the stamp a build leaves beside model.onnx).
GRAPH_VERSION = 2


@dataclass(frozen=True)
class BertShape:
    """The hyperparameters the graph depends on, as `config.json` states them."""

    hidden: int
    heads: int
    layers: int
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_config(cls, config: Mapping) -> "BertShape":
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only the exact (erf) GELU is supported, not {config['hidden_act']!r}")
        return cls(hidden=int(config["hidden_size"]), heads=int(config["num_attention_heads"]),
                   layers=int(config["num_hidden_layers"]),
                   layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class _Graph:
    """Collects nodes and initializers; every node gets a unique output name."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.initializers: list = []
        self._count = 0

    def constant(self, name: str, value) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, *inputs: str, domain: str | None = None, **attributes) -> str:
        from onnx import helper

        self._count += 1
        output = f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], domain=domain, **attributes))
        return output


def _weight_for_graph(name: str, tensor: np.ndarray) -> np.ndarray:
    """Linear layers are stored ``[out, in]`` (torch's convention); MatMul wants ``[in, out]``.

    Embedding tables are looked up row by row with Gather, so they stay as stored.
    """
    if tensor.ndim == 2 and not name.startswith("embeddings."):
        return np.ascontiguousarray(tensor.T)
    return tensor


QKV = ("query", "key", "value")


def _is_qkv(name: str) -> bool:
    """``encoder.layer.N.attention.self.{query,key,value}.{weight,bias}``."""
    parts = name.split(".")
    return len(parts) >= 3 and parts[-3] == "self" and parts[-2] in QKV


def bert_encoder(weights: Mapping[str, np.ndarray], shape: BertShape):
    """The encoder graph over `weights` (a BERT state dict by name); returns an ``onnx.ModelProto``."""
    import onnx
    from onnx import TensorProto, helper

    g = _Graph()
    for name, tensor in weights.items():
        # position_ids is a buffer, not a weight; the pooler is unused by sentence models; query,
        # key and value go in packed below, as the Attention operator takes them.
        if name == "embeddings.position_ids" or name.startswith("pooler.") or _is_qkv(name):
            continue
        g.constant(name, _weight_for_graph(name, tensor))

    idx0 = g.constant("c_idx0", np.array([0], np.int64))
    idx1 = g.constant("c_idx1", np.array([1], np.int64))
    idx2 = g.constant("c_idx2", np.array([2], np.int64))

    # Embeddings: word + position (the first `tokens` rows) + token type, then LayerNorm.
    tokens = g.op("Slice", g.op("Shape", "input_ids"), idx1, idx2)
    positions = g.op("Slice", "embeddings.position_embeddings.weight", idx0, tokens, idx0)
    x = g.op("Add", g.op("Gather", "embeddings.word_embeddings.weight", "input_ids"), positions)
    x = g.op("Add", x, g.op("Gather", "embeddings.token_type_embeddings.weight", "token_type_ids"))
    x = g.op("LayerNormalization", x, "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias",
             axis=-1, epsilon=shape.layer_norm_eps)

    # Attention's raw 2-D mask (1 keep, 0 padding) as int32; scale 1/sqrt(head_dim) is its default.
    mask = g.op("Cast", "attention_mask", to=TensorProto.INT32)

    def dense_add_norm(x_in: str, residual: str, dense: str, norm: str) -> str:
        """``LayerNorm(residual + x_in @ W + b)``: a MatMul and one SkipLayerNormalization."""
        return g.op("SkipLayerNormalization", g.op("MatMul", x_in, f"{dense}.weight"), residual,
                    f"{norm}.weight", f"{norm}.bias", f"{dense}.bias",
                    domain=CONTRIB, epsilon=shape.layer_norm_eps)

    for i in range(shape.layers):
        block = f"encoder.layer.{i}"
        attn = f"{block}.attention.self"
        qkv_weight = g.constant(f"{attn}.qkv.weight", np.concatenate(
            [_weight_for_graph(f"{attn}.{p}.weight", weights[f"{attn}.{p}.weight"]) for p in QKV], axis=1))
        qkv_bias = g.constant(f"{attn}.qkv.bias", np.concatenate([weights[f"{attn}.{p}.bias"] for p in QKV]))
        context = g.op("Attention", x, qkv_weight, qkv_bias, mask, domain=CONTRIB, num_heads=shape.heads)
        x = dense_add_norm(context, x, f"{block}.attention.output.dense", f"{block}.attention.output.LayerNorm")
        hidden = g.op("BiasGelu", g.op("MatMul", x, f"{block}.intermediate.dense.weight"),
                      f"{block}.intermediate.dense.bias", domain=CONTRIB)
        x = dense_add_norm(hidden, x, f"{block}.output.dense", f"{block}.output.LayerNorm")
    g.nodes.append(helper.make_node("Identity", [x], [OUTPUT]))

    graph = helper.make_graph(
        g.nodes, "bert_encoder",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"]) for name in INPUTS],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", "tokens", shape.hidden])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(CONTRIB, 1)])
    onnx.checker.check_model(model)
    return model
