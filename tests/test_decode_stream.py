"""The static-megakernel path's checks that need no GPU: which models and shapes its persistent step takes
(gpuopt.llm.stream.unsupported, each refusal naming what is wrong), the path's place among the paths and its
errors before anything is built. What it computes is tested on a GPU (test_decode_stream_gpu.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from gpuopt import _C  # noqa: E402
from gpuopt.llm import PATHS, stream  # noqa: E402
from gpuopt.llm.measure import measure_decode  # noqa: E402
from gpuopt.llm.models import build_model  # noqa: E402
from gpuopt.llm.paths import GRAPH_PATHS, check_attention  # noqa: E402


@pytest.fixture(scope="module")
def opt125():
    return build_model("opt-125m")


def test_the_path_is_a_graph_path():
    assert "static-megakernel" in PATHS
    assert "static-megakernel" in GRAPH_PATHS


def test_opt_at_batch_one_in_half_precision_is_taken(opt125):
    for dtype in (torch.float16, torch.bfloat16):
        assert stream.unsupported(opt125, 1, dtype, 256) is None


@pytest.mark.parametrize(("batch", "dtype", "length", "words"), [
    (2, torch.float16, 256, "batch_size must be 1, got 2"),
    (1, torch.float32, 256, "fp16 or bf16"),
    (1, torch.float16, stream.MAX_LEN + 1, f"at most {stream.MAX_LEN}"),
])
def test_a_shape_it_cannot_run_is_named(opt125, batch, dtype, length, words):
    assert words in stream.unsupported(opt125, batch, dtype, length)


def test_other_architectures_are_named():
    why = stream.unsupported(build_model("gpt2"), 1, torch.float16, 64)
    assert "OPT-architecture" in why and "gpt2" in why


def test_opt_variants_it_does_not_take_are_named(opt125):
    config = opt125.config
    for attribute, value, words in (("do_layer_norm_before", False, "pre-norm"),
                                    ("activation_function", "gelu", "relu"),
                                    ("enable_bias", False, "enable_bias")):
        before = getattr(config, attribute)
        setattr(config, attribute, value)
        try:
            assert words in stream.unsupported(opt125, 1, torch.float16, 64)
        finally:
            setattr(config, attribute, before)


def test_the_path_refuses_what_it_does_not_run():
    with pytest.raises(ValueError, match="attention='gpuopt' does not apply to path 'static-megakernel'"):
        check_attention("gpuopt", "static-megakernel")
    assert check_attention("model", "static-megakernel") == "model"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the errors of a machine without a GPU")
def test_without_a_gpu_the_path_and_the_program_say_so():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        measure_decode("opt-125m", path="static-megakernel", device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        _C.DecodeProgram(0, torch.float16)


def test_a_quantized_or_fused_layer_is_named(opt125):
    layer = opt125.model.decoder.layers[0]
    for name in ("fc1", "q_proj"):  # q_proj: the first, whose kind the others are held to
        owner = layer if name == "fc1" else layer.self_attn
        before = getattr(owner, name)
        setattr(owner, name, torch.nn.Sequential(before))
        try:
            why = stream.unsupported(opt125, 1, torch.float16, 64)
            assert f"layer 0's {name} is a Sequential" in why and "plain nn.Linear layers" in why
            assert "where" not in why or name == "fc1"
        finally:
            setattr(owner, name, before)


def test_an_int8_weight_only_model_is_taken_and_a_mix_is_named(opt125):
    """int8 weight-only layers as quantize_int8_weight_only makes them (the LM head included) are taken; one
    layer of another kind among them, or one with an activation moved into it, is named."""
    import copy

    from gpuopt.quant import Int8WeightOnlyLinear, quantize_int8_weight_only

    model = quantize_int8_weight_only(copy.deepcopy(opt125), torch.float16)
    assert isinstance(model.lm_head, Int8WeightOnlyLinear)
    assert stream.unsupported(model, 1, torch.float16, 256) is None
    layer = model.model.decoder.layers[1]
    before = layer.fc2
    layer.fc2 = torch.nn.Linear(before.in_features, before.out_features)
    try:
        why = stream.unsupported(model, 1, torch.float16, 256)
        assert "layer 1's fc2 is a Linear where layer 0's q_proj is a Int8WeightOnlyLinear" in why
    finally:
        layer.fc2 = before
    layer.fc1.activation = "relu"
    try:
        assert "layer 1's fc1 has activation 'relu'" in stream.unsupported(model, 1, torch.float16, 256)
    finally:
        layer.fc1.activation = "none"
    layer.fc2.folded_norm = "layer"
    try:
        assert "layer 1's fc2 has activation 'none' and folded_norm 'layer'" in stream.unsupported(
            model, 1, torch.float16, 256)
    finally:
        layer.fc2.folded_norm = "none"
    model.lm_head = torch.nn.Linear(8, 8)
    assert "lm_head is a Linear" in stream.unsupported(model, 1, torch.float16, 256)
