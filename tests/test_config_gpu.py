"""Every precision and backend on a real GPU: parity against fp32, guards against torch.autocast."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt import Config, parity
from gpuopt._ext import _C
from gpuopt.run import zoo

pytestmark = pytest.mark.gpuopt_gpu


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    )


def transformer() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


MODELS = {
    "cnn": (cnn, lambda: torch.randn(8, 3, 32, 32)),
    "transformer": (transformer, lambda: torch.randn(4, 16, 128)),
}
EAGER_CONFIGS = ["fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16", "fp16-amp+channels_last",
                 "bf16+channels_last", "fp32+torchscript", "fp16-amp+torchscript", "fp16+cudagraph",
                 "bf16-amp+cudagraph"]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("config", EAGER_CONFIGS)
def test_every_precision_and_backend_passes_parity(name, config):
    make, inputs = MODELS[name]
    model, x = make(), inputs()
    ref = Config("fp32").apply(model, x)
    p = Config.parse(config).apply(model, x)
    assert p.ok, p.error
    fresh = inputs()  # not the input it was prepared with: a CUDA graph must replay the new one
    res = parity(p, ref, fresh)
    assert res.passed, res
    assert not any(o.degenerate for o in res.outputs) and res.note == "", res
    if p.config.autocast_dtype or p.config.cast_dtype:  # it really ran in fp16/bf16, not silently in fp32
        assert res.worst_rel_l2 > 1e-5, res
    assert p.prepare_s > 0 and p.first_call_ms > 0


@pytest.mark.slow
@pytest.mark.parametrize("name, config", [("cnn", "fp16-amp+channels_last+compile"),
                                          ("transformer", "bf16-amp+compile:reduce-overhead")])
def test_compile_backends_pass_parity(name, config):
    make, inputs = MODELS[name]
    model, x = make(), inputs()
    ref = Config("fp32").apply(model, x)
    p = Config.parse(config).apply(model, x)
    assert p.ok, p.error
    assert parity(p, ref, x).passed


ZOO_CONFIGS = [(name, config) for name in ("efficientnet_b0", "mobilenet_v3_large", "resnet50", "vit_b_16")
               for config in ("fp16-amp", "fp16", "fp16-amp+channels_last")]
ZOO_CONFIGS += [("resnet50", "bf16-amp"), ("vit_b_16", "bf16-amp"), ("vit_b_16", "fp16-amp+torchscript"),
                ("vit_b_16", "fp16+cudagraph")]


@pytest.mark.slow
@pytest.mark.parametrize("name, config", ZOO_CONFIGS)
def test_zoo_models_pass_parity_in_fp16_on_their_real_outputs(name, config):
    pytest.importorskip("torchvision")
    model, make_inputs = zoo.get(name)
    x = make_inputs(8)
    ref = Config("fp32").apply(model, x)
    p = Config.parse(config).apply(model, x)
    assert p.ok, p.error
    res = parity(p, ref, make_inputs(8))
    assert res.passed and res.note == "", f"{name} {config}: {res}"
    assert not res.outputs[0].degenerate and res.outputs[0].ref_max_abs > 1e-2, res
    assert res.worst_rel_l2 > 1e-5, res  # fp16 arithmetic really ran


def test_fp16_underflow_of_an_uncalibrated_efficientnet_is_named():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.efficientnet_b0(weights=None).eval()  # default BatchNorm statistics
    x = torch.randn(8, 3, 224, 224)
    ref = Config("fp32").apply(model, x)
    largest = float(ref(x).abs().max())
    assert 0 < largest < torch.finfo(torch.float16).tiny, "the outputs of about 1e-14 this test is about"
    res = parity(Config("fp16-amp").apply(model, x), ref, x)
    assert not res.passed, res
    assert (f"underflow: reference output 'output' magnitudes (max {largest:.2g}) lie below fp16's smallest "
            "normal number 6.1e-05") in res.note


def test_cudagraph_replays_new_inputs_and_rejects_other_shapes():
    model, x = cnn(), torch.randn(8, 3, 32, 32)
    ref = Config("fp32").apply(model, x)
    g = Config("fp32", backend="cudagraph").apply(model, x)
    for _ in range(3):
        y = torch.randn(8, 3, 32, 32)
        torch.testing.assert_close(g(y), ref(y), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"\[config fp32\+cudagraph\] a cudagraph config replays fixed shapes"):
        g(torch.randn(4, 3, 32, 32))


def test_cpp_autocast_guard_is_equivalent_to_torch_autocast_on_cuda():
    model = cnn().cuda().eval()
    x = torch.randn(8, 3, 32, 32, device="cuda")
    with torch.no_grad():
        with torch.autocast("cuda", dtype=torch.float16):
            ref = model(x)
        with gpuopt.autocast(torch.float16):
            ours = model(x)
    assert ours.dtype == torch.float16 and torch.equal(ours, ref)
    assert not torch.is_autocast_enabled("cuda")


def test_global_state_restored_after_gpu_configs():
    state = _C.state()
    model, x = cnn(), torch.randn(2, 3, 32, 32)
    for c in ("tf32", "fp16-amp+cudagraph", "bf16+channels_last+no-cudnn-benchmark"):
        p = Config.parse(c).apply(model, x)
        assert p.ok, p.error
        p(x)
        p.runner(x)()
        assert _C.state() == state


def test_prepared_runner_is_measurable():
    model, x = cnn(), torch.randn(64, 3, 32, 32)
    p = Config.parse("fp16-amp+channels_last").apply(model, x)
    m = gpuopt.measure(p.runner(x), max_time_s=1)
    assert m.p50 > 0 and m.target_met
