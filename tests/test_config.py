"""Configs, their guards and the parity gate on the CPU (CI)."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch

import gpuopt
from gpuopt import Config, parity
from gpuopt._ext import _C
from gpuopt.prepare.config import (
    BACKENDS,
    COMPILE_MODES,
    MEMORY_FORMATS,
    PRECISIONS,
    default_preset,
)


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5),
    )


@pytest.mark.parametrize(
    "precision, memory_format, backend",
    list(itertools.product(PRECISIONS, MEMORY_FORMATS, BACKENDS)),
)
def test_parse_and_str_round_trip(precision, memory_format, backend):
    if backend in ("onnxruntime", "tensorrt") and (precision.endswith("-amp") or precision in ("int8-wo", "int8", "fp8")):
        with pytest.raises(ValueError, match=f"precision {precision!r} does not survive the export of backend"):
            Config(precision, memory_format, backend)
        return
    if backend == "onnxruntime" and precision == "bf16":
        with pytest.raises(ValueError, match="ONNX Runtime's providers lack bfloat16 kernels"):
            Config(precision, memory_format, backend)
        return
    modes = COMPILE_MODES if backend == "compile" else (None,)
    for mode in modes:
        for bench in (True, False):
            c = Config(precision, memory_format, backend, mode, bench)
            assert Config.parse(str(c)) == c
    assert Config.parse("fp16-amp+channels_last+compile:max-autotune") == Config(
        "fp16-amp", "channels_last", "compile", "max-autotune")


def test_tokens_may_come_in_any_order_and_defaults_fill_in():
    assert Config.parse("compile+channels_last+bf16") == Config("bf16", "channels_last", "compile", "default")
    assert Config.parse("torchscript") == Config(backend="torchscript")
    assert Config.parse("fp32", name="baseline").label == "baseline"


@pytest.mark.parametrize(
    "text, match",
    [
        ("fp4", "unknown config token 'fp4'.*allowed: fp32, tf32"),
        ("fp16+bf16", "sets precision twice"),
        ("compile:turbo", "compile_mode must be one of"),
        ("", "non-empty string"),
        ("fp16++eager", "unknown config token ''"),
    ],
)
def test_parse_errors_name_the_problem(text, match):
    with pytest.raises(ValueError, match=match):
        Config.parse(text)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"precision": "int4"}, "precision must be one of 'fp32', 'tf32', 'fp16-amp', 'bf16-amp', 'fp16', 'bf16', "
         "'int8-wo', 'int8', 'fp8'; got 'int4'"),
        ({"memory_format": "nhwc"}, "memory_format must be one of 'contiguous', 'channels_last'"),
        ({"backend": "openvino"}, "backend must be one of 'eager', 'torchscript', 'compile', 'cudagraph', "
                                  "'onnxruntime', 'tensorrt'"),
        ({"backend": "eager", "compile_mode": "default"}, "compile_mode applies to backend='compile' only"),
    ],
)
def test_bad_config_values_list_the_allowed_ones(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Config(**kwargs)


def test_presets_include_the_seeds():
    p = gpuopt.presets()
    assert [str(c) for c in p["fp16-torchscript"]] == ["fp32", "fp16-amp", "fp32+torchscript"]
    assert [str(c) for c in p["amp-channels-last-compile"]] == ["fp32", "fp16-amp+channels_last+compile"]
    assert gpuopt.preset("bench")[0] == Config("fp32")
    with pytest.raises(ValueError, match="unknown preset 'nope'; presets: fp16-torchscript"):
        gpuopt.preset("nope")


def test_training_presets_hold_no_inference_only_backend():
    assert default_preset("cuda") == "bench" and default_preset("cpu") == "bench-cpu"
    for device in ("cuda", "cpu"):
        inference = gpuopt.preset(default_preset(device))
        training = gpuopt.preset(default_preset(device, train=True))
        assert training == [c for c in inference if c.backend not in ("torchscript", "cudagraph")]
        assert len(training) < len(inference)


class KeywordOnly(torch.nn.Module):
    """Inputs only by keyword, an optional one left out, a dict output."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask=None, scale=None):
        h = self.lin(self.embed(input_ids))
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        return {"hidden": h, "pooled": h.mean(1)}


def _bert_tiny():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(cfg).eval()


def _tokens(vocab: int, batch: int = 2, seq: int = 16, mask: bool = True) -> dict:
    ids = torch.randint(0, vocab, (batch, seq))
    return {"input_ids": ids, "attention_mask": (torch.rand(batch, seq) > 0.2).long()} if mask else {"input_ids": ids}


@pytest.mark.parametrize("which", ["keyword-only", "tiny-transformer", "bert"])
def test_torchscript_traces_models_that_take_keyword_inputs(which):
    if which == "keyword-only":
        model, make = KeywordOnly().eval(), lambda: _tokens(50)
    elif which == "tiny-transformer":
        model, make_inputs = gpuopt.zoo.get("tiny-transformer")
        make = lambda: make_inputs(2)  # noqa: E731
    else:
        model, make = _bert_tiny(), lambda: _tokens(100)
    p = Config.parse("fp32+torchscript").apply(model, make(), device="cpu")
    assert p.ok, p.error
    assert isinstance(p.module, torch.jit.ScriptModule)
    x = make()  # fresh inputs: the traced graph is not specialised to the example's values
    got, want = p(x), model(**x)
    if which == "bert":
        want = {"last_hidden_state": want.last_hidden_state, "pooler_output": want.pooler_output}
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert set(got) == set(want)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)
    assert gpuopt.parity(p, model, make()).passed


def test_apply_leaves_the_callers_model_and_global_state_alone():
    model = small_cnn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = _C.state()
    x = torch.randn(2, 3, 16, 16)
    for text in ("bf16+channels_last", "bf16-amp+channels_last+torchscript", "tf32", "fp32+no-cudnn-benchmark"):
        p = Config.parse(text).apply(model, x, device="cpu")
        assert p.ok, p.error
        p(x)
        assert _C.state() == state
    for k, v in model.state_dict().items():
        assert v.dtype == before[k].dtype and torch.equal(v, before[k])
    assert model[0].weight.is_contiguous()


def test_channels_last_converts_parameters_and_nested_inputs_in_cpp():
    p = Config.parse("fp32+channels_last").apply(small_cnn(), torch.randn(1, 3, 8, 8), device="cpu")
    assert p.eager_module[0].weight.is_contiguous(memory_format=torch.channels_last)
    nested = (torch.randn(2, 3, 4, 4), [torch.randn(2, 3, 4, 4, 4)], {"k": torch.randn(5, 5), "s": "text"})
    (out, changed) = _C.convert_nested(nested, None, None, True)
    assert changed == 2
    assert out[0].is_contiguous(memory_format=torch.channels_last)
    assert out[1][0].is_contiguous(memory_format=torch.channels_last_3d)
    assert out[2]["k"].is_contiguous() and out[2]["s"] == "text"
    Point = collections.namedtuple("Point", "x y")
    (pt, _) = _C.convert_nested(Point(torch.ones(2), 3), None, torch.bfloat16, False)
    assert isinstance(pt, Point) and pt.x.dtype == torch.bfloat16 and pt.y == 3


def test_channels_last_without_4d_tensors_is_a_noop_with_a_note():
    p = Config.parse("fp32+channels_last").apply(torch.nn.Linear(4, 4), torch.randn(2, 4), device="cpu")
    assert p.ok and any("no-op" in n for n in p.notes)


class Recorder(torch.nn.Module):
    """Records the autocast and grad state it runs under."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        self.seen.append((torch.is_autocast_enabled("cpu"), torch.is_inference_mode_enabled()))
        return self.lin(x)


def test_configs_override_an_outer_autocast_and_restore_it():
    x = torch.randn(2, 4)
    p = Config("fp32").apply(Recorder(), x, device="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        p(x)
        assert torch.is_autocast_enabled("cpu")
    assert p.eager_module.seen[-1] == (False, True)
    amp = Config("bf16-amp").apply(Recorder(), x, device="cpu")
    assert amp(x).dtype == torch.bfloat16 and amp.eager_module.seen[-1] == (True, True)
    assert not torch.is_autocast_enabled("cpu")


def test_cpp_autocast_guard_matches_torch_autocast():
    model = small_cnn().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref = model(x)
        with gpuopt.autocast(torch.bfloat16, device_type="cpu"):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            with gpuopt.autocast(device_type="cpu", enabled=False):  # nested: off, then back on
                assert not torch.is_autocast_enabled("cpu")
            assert torch.is_autocast_enabled("cpu")
            ours = model(x)
    assert ours.dtype == ref.dtype == torch.bfloat16
    assert torch.equal(ours, ref)
    assert not torch.is_autocast_enabled("cpu")


def test_precision_context_sets_and_restores_tf32():
    before = torch.get_float32_matmul_precision()
    with gpuopt.precision("tf32", cudnn_benchmark=True):
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cudnn.benchmark
        with gpuopt.precision("fp32"):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(ValueError, match="mode must be one of 'fp32', 'tf32'"):
        gpuopt.precision("fp64")
    with pytest.raises(ValueError, match="autocast dtype must be torch.float16 or torch.bfloat16"):
        gpuopt.autocast(torch.float64)
    g = gpuopt.autocast(torch.bfloat16, device_type="cpu")
    with g, pytest.raises(RuntimeError, match="already active"):
        g.__enter__()


class TupleLabel(torch.nn.Module):
    def forward(self, x):
        return x * 2, "not a tensor"


def test_a_config_that_cannot_apply_is_a_failed_record_or_raises_when_strict():
    p = Config("fp32", backend="torchscript").apply(TupleLabel(), torch.randn(2), device="cpu")
    assert not p.ok and p.error.startswith("fp32+torchscript: RuntimeError")
    with pytest.raises(RuntimeError, match="could not be prepared"):
        p(torch.randn(2))
    with pytest.raises(RuntimeError):
        Config("fp32", backend="torchscript").apply(TupleLabel(), torch.randn(2), device="cpu", strict=True)
    g = Config("fp32", backend="cudagraph").apply(torch.nn.Linear(2, 2), torch.randn(1, 2), device="cpu")
    assert not g.ok and "needs a CUDA device" in g.error


def test_inputs_that_do_not_fit_raise_the_models_error_with_the_config_name():
    p = Config("fp32").apply(torch.nn.Linear(4, 2), torch.randn(3, 4), device="cpu")
    with pytest.raises(RuntimeError, match=r"\[config fp32\] mat1 and mat2 shapes cannot be multiplied"):
        p(torch.randn(3, 7))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        Config("fp32").apply(lambda x: x, torch.randn(2))


class NestedIO(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x, extra):
        h = self.a(x) + extra["bias"]
        return {"hidden": h, "pair": (self.b(h), h.abs().sum())}  # a sum far from 0: a well-posed relative error


def test_nested_inputs_and_outputs_through_apply_and_parity():
    model = NestedIO()
    inputs = {"x": torch.randn(3, 4), "extra": {"bias": torch.randn(4)}}
    ref = Config("fp32").apply(model, inputs, device="cpu")
    cand = Config("bf16").apply(model, inputs, device="cpu")
    assert cand.ok, cand.error
    res = parity(cand, ref, inputs)
    assert res.passed, res
    assert [o.path for o in res.outputs] == ["hidden", "pair[0]", "pair[1]"]
    assert 1e-4 < res.worst_rel_l2 < 2e-2


def test_parity_fails_on_nan_and_on_drift_and_respects_rtol():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    ref = Config("fp32").apply(model, x, device="cpu")
    nan = parity(lambda t: model(t) * float("nan"), ref, x)
    assert not nan.passed and "non-finite" in nan.note
    drift = parity(lambda t: model(t) * 1.001, ref, x)
    assert not drift.passed and drift.tolerance == 1e-5
    assert parity(lambda t: model(t) * 1.001, ref, x, rtol=1e-2).passed
    assert parity(lambda t: model(t) * 1.001, ref, x, precision="tf32").tolerance == 5e-3
    with pytest.raises(ValueError, match="rtol must be a positive number"):
        parity(ref, ref, x, rtol=0)
    with pytest.raises(ValueError, match="precision must be one of"):
        parity(ref, ref, x, precision="fp64")
    mismatch = parity(lambda t: (model(t), model(t)), ref, x)
    assert not mismatch.passed and "structures differ" in mismatch.note


def test_prepared_records_times_and_serialises():
    p = Config.parse("fp32+torchscript").apply(small_cnn(), torch.randn(1, 3, 8, 8), device="cpu")
    d = p.to_dict()
    assert d["ok"] and d["prepare_s"] > 0 and d["first_call_ms"] > 0 and d["config"] == "fp32+torchscript"
    run = p.runner(torch.randn(1, 3, 8, 8))
    assert run().shape == (1, 5)
