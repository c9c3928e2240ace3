"""A BERT encoder as an ONNX graph, written from safetensors weights with the ``onnx`` package alone.

Why by hand: the usual exporters trace the model through torch, which these hosts
neither have nor need. A BERT encoder is a short, fixed recipe (embeddings, then N
blocks of self-attention and a GELU feed-forward, each with a residual and a
LayerNorm), so the graph is spelled out node by node here and the weights become
its initializers. The output is ``last_hidden_state``; mean pooling and the L2
normalisation of a sentence model are the loader's job (fastembed does both).

The graph takes the three inputs fastembed feeds a BERT model (``input_ids``,
``attention_mask``, ``token_type_ids``, int64, ``[batch, tokens]``) and uses
opset 17 (``LayerNormalization``), which onnxruntime runs natively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "last_hidden_state"


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

    def op(self, op_type: str, *inputs: str, **attributes) -> str:
        from onnx import helper

        self._count += 1
        output = f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attributes))
        return output


def _weight_for_graph(name: str, tensor: np.ndarray) -> np.ndarray:
    """Linear layers are stored ``[out, in]`` (torch's convention); MatMul wants ``[in, out]``.

    Embedding tables are looked up row by row with Gather, so they stay as stored.
    """
    if tensor.ndim == 2 and not name.startswith("embeddings."):
        return np.ascontiguousarray(tensor.T)
    return tensor


def bert_encoder(weights: Mapping[str, np.ndarray], shape: BertShape):
    """The encoder graph over `weights` (a BERT state dict by name); returns an ``onnx.ModelProto``."""
    import onnx
    from onnx import TensorProto, helper

    g = _Graph()
    for name, tensor in weights.items():
        # position_ids is a buffer, not a weight; the pooler is unused by sentence models.
        if name == "embeddings.position_ids" or name.startswith("pooler."):
            continue
        g.constant(name, _weight_for_graph(name, tensor))

    one = g.constant("c_one", np.array(1.0, np.float32))
    half = g.constant("c_half", np.array(0.5, np.float32))
    sqrt2 = g.constant("c_sqrt2", np.array(np.sqrt(2.0), np.float32))
    attention_scale = g.constant("c_attention_scale", np.array(np.sqrt(shape.head_dim), np.float32))
    masked = g.constant("c_masked", np.array(-1e9, np.float32))
    idx0 = g.constant("c_idx0", np.array([0], np.int64))
    idx1 = g.constant("c_idx1", np.array([1], np.int64))
    idx2 = g.constant("c_idx2", np.array([2], np.int64))
    mask_axes = g.constant("c_mask_axes", np.array([1, 2], np.int64))
    to_heads = g.constant("c_to_heads", np.array([0, 0, shape.heads, shape.head_dim], np.int64))
    from_heads = g.constant("c_from_heads", np.array([0, 0, shape.hidden], np.int64))

    def layer_norm(x: str, prefix: str) -> str:
        return g.op("LayerNormalization", x, f"{prefix}.weight", f"{prefix}.bias",
                    axis=-1, epsilon=shape.layer_norm_eps)

    def dense(x: str, prefix: str) -> str:
        return g.op("Add", g.op("MatMul", x, f"{prefix}.weight"), f"{prefix}.bias")

    def heads(x: str) -> str:  # [b, t, hidden] -> [b, heads, t, head_dim]
        return g.op("Transpose", g.op("Reshape", x, to_heads), perm=[0, 2, 1, 3])

    def gelu(x: str) -> str:  # x * 0.5 * (1 + erf(x / sqrt(2)))
        return g.op("Mul", g.op("Mul", x, half), g.op("Add", one, g.op("Erf", g.op("Div", x, sqrt2))))

    # Embeddings: word + position (the first `tokens` rows) + token type, then LayerNorm.
    tokens = g.op("Slice", g.op("Shape", "input_ids"), idx1, idx2)
    positions = g.op("Slice", "embeddings.position_embeddings.weight", idx0, tokens, idx0)
    x = g.op("Add", g.op("Gather", "embeddings.word_embeddings.weight", "input_ids"), positions)
    x = g.op("Add", x, g.op("Gather", "embeddings.token_type_embeddings.weight", "token_type_ids"))
    x = layer_norm(x, "embeddings.LayerNorm")

    # Padding positions get a large negative score before the softmax: [b, 1, 1, t].
    keep = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    score_bias = g.op("Mul", g.op("Sub", one, g.op("Unsqueeze", keep, mask_axes)), masked)

    for i in range(shape.layers):
        block = f"encoder.layer.{i}"
        q, k, v = (heads(dense(x, f"{block}.attention.self.{part}")) for part in ("query", "key", "value"))
        scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), attention_scale)
        attention = g.op("Softmax", g.op("Add", scores, score_bias), axis=-1)
        context = g.op("Reshape", g.op("Transpose", g.op("MatMul", attention, v), perm=[0, 2, 1, 3]), from_heads)
        x = layer_norm(g.op("Add", x, dense(context, f"{block}.attention.output.dense")),
                       f"{block}.attention.output.LayerNorm")
        feed_forward = dense(gelu(dense(x, f"{block}.intermediate.dense")), f"{block}.output.dense")
        x = layer_norm(g.op("Add", x, feed_forward), f"{block}.output.LayerNorm")
    g.nodes.append(helper.make_node("Identity", [x], [OUTPUT]))

    graph = helper.make_graph(
        g.nodes, "bert_encoder",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"]) for name in INPUTS],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", "tokens", shape.hidden])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model
