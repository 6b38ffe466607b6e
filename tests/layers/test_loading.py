"""The routes the layers declare cover exactly the tensors transformers writes, each to its parameter and part."""

import torch
from safetensors.torch import load_file

from qwen3_runtime.config import ModelConfig
from qwen3_runtime.layers.loading import routes
from qwen3_runtime.loader import load_model


def test_routes_name_every_checkpoint_tensor_once(make_checkpoint):
    path = make_checkpoint(tie_word_embeddings=False)
    model = load_model(ModelConfig(path=str(path)), torch.device("cpu"), torch.float32)
    expected = dict(routes(model))
    assert set(expected) == set(load_file(path / "model.safetensors"))
    layer = model.model.layers[1]
    fused = {
        "self_attn.q_proj": (layer.self_attn.qkv_proj, 0),
        "self_attn.k_proj": (layer.self_attn.qkv_proj, 1),
        "self_attn.v_proj": (layer.self_attn.qkv_proj, 2),
        "mlp.gate_proj": (layer.mlp.gate_up_proj, 0),
        "mlp.up_proj": (layer.mlp.gate_up_proj, 1),
    }
    for name, (target, part) in fused.items():
        route = expected[f"model.layers.1.{name}.weight"]
        assert (route.target, route.suffix, route.part) == (target, "weight", part), name
    route = expected["model.layers.1.self_attn.k_norm.weight"]
    assert (route.target, route.suffix, route.part) == (layer.self_attn.k_norm, "weight", None)
