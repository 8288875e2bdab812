"""Quantized precisions on the CPU: gpuopt's quantize operator (reference arithmetic, opcheck), the
quantized linear layers and attention, the fp8 / int8 / int8-wo configs through the parity gate, and
their refusals."""

from __future__ import annotations

import copy

import pytest
import torch

import gpuopt
from gpuopt import Config
from gpuopt.quant import (
    Fp8Linear,
    Int8Linear,
    QuantizedSelfAttention,
    fp8_refusal,
    quantize_linears,
)
from gpuopt.quant import linear as quant_linear
from gpuopt.run import zoo

QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
# fp8 matmuls on the CPU need a torch whose _scaled_mm runs there (2.14 does; older ones refuse fp8 there).
NO_CPU_FP8 = fp8_refusal(torch.device("cpu"))
needs_cpu_fp8 = pytest.mark.skipif(NO_CPU_FP8 is not None, reason=f"this torch: {NO_CPU_FP8}")


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("xtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_rowwise_scales_each_row_by_its_absmax(dtype, xtype, np_rng):
    x = torch.from_numpy(np_rng.standard_normal((3, 5, 48)).astype("float32")).to(xtype)
    x[1, 2] = 0  # an all-zero row: scale 1, zeros
    q, s = torch.ops.gpuopt.quantize_rowwise(x, dtype)
    assert q.dtype == dtype and q.shape == x.shape and s.dtype == torch.float32 and s.shape == (3, 5, 1)
    amax = x.float().abs().amax(-1, keepdim=True)
    want = torch.where(amax > 0, amax / QMAX[dtype], torch.ones_like(amax))
    assert torch.equal(s, want)
    assert float(s[1, 2]) == 1.0 and not q[1, 2].float().any()
    assert torch.equal(q.float().abs().amax(-1, keepdim=True)[amax > 0], torch.full_like(amax[amax > 0], QMAX[dtype]))
    err = (q.float() * s - x.float()).abs()
    # Round to nearest: half a step of int8 (amax / 254); e4m3 keeps 3 mantissa bits (1/16 relative).
    bound = amax / 254 if dtype == torch.int8 else torch.maximum(x.float().abs() / 16, amax / 448 * 2**-9)
    assert bool((err <= bound * 1.0001 + 1e-7).all())


def test_quantize_rowwise_is_a_well_behaved_operator():
    for args in [(torch.randn(4, 32), torch.int8), (torch.randn(2, 3, 16, dtype=torch.bfloat16), torch.float8_e4m3fn)]:
        torch.library.opcheck(torch.ops.gpuopt.quantize_rowwise, args)
    with pytest.raises(TypeError, match="x must be float16, bfloat16 or float32, got Int"):
        torch.ops.gpuopt.quantize_rowwise(torch.ones(2, 4, dtype=torch.int32), torch.int8)
    with pytest.raises(TypeError, match="dtype must be torch.int8 or torch.float8_e4m3fn, got Half"):
        torch.ops.gpuopt.quantize_rowwise(torch.ones(2, 4), torch.float16)
    with pytest.raises(ValueError, match="x must have shape \\[..., K\\], got a 0-dim tensor"):
        torch.ops.gpuopt.quantize_rowwise(torch.tensor(1.0), torch.int8)


@pytest.mark.parametrize("cls, rtol", [pytest.param(Fp8Linear, 0.06, marks=needs_cpu_fp8), (Int8Linear, 0.015)])
def test_quantized_linear_layers_match_the_float_layer(cls, rtol):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32).to(torch.bfloat16)
    x = torch.randn(2, 7, 64, dtype=torch.bfloat16)
    q = cls.from_float(lin)
    with torch.no_grad():
        want, got = lin(x).float(), q(x).float()
    assert got.shape == (2, 7, 32) and q(x).dtype == torch.bfloat16
    assert float((got - want).norm() / want.norm()) < rtol


def test_attention_is_quantized_around_sdpa_in_either_layout():
    torch.manual_seed(0)
    for batch_first in (True, False):
        mha = torch.nn.MultiheadAttention(64, 4, batch_first=batch_first).eval()
        x = torch.randn(2, 9, 64) if batch_first else torch.randn(9, 2, 64)
        pad = torch.zeros(2, 9, dtype=torch.bool)
        pad[:, -2:] = True
        q = QuantizedSelfAttention(copy.deepcopy(mha), "int8")
        for kwargs in ({}, {"key_padding_mask": pad}):
            want = mha(x, x, x, need_weights=False, **kwargs)[0]
            got, weights = q(x, x, x, need_weights=False, **kwargs)
            assert weights is None and float((got - want).norm() / want.norm()) < 0.03
    with pytest.raises(ValueError, match="does not compute attention weights: call it with need_weights=False"):
        q(x, x, x)


def _rel(got, want):
    return float((got - want).norm() / want.norm())


def test_attention_masks_follow_multihead_attention():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    q = QuantizedSelfAttention(copy.deepcopy(mha), "int8")
    x = torch.randn(2, 9, 64)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[:, -2:] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(9)  # float, -inf above the diagonal
    bias = torch.randn(9, 9)  # a float mask is added, whatever its values
    per_head = torch.randn(2 * 4, 9, 9)  # [batch * heads, L, S]
    cases = [
        {"attn_mask": causal, "is_causal": True},
        {"attn_mask": causal.isinf(), "is_causal": True, "key_padding_mask": pad},
        {"attn_mask": bias, "key_padding_mask": pad},
        {"attn_mask": per_head},
        {"key_padding_mask": pad.float().masked_fill(pad, float("-inf"))},
    ]
    for kwargs in cases:
        want = mha(x, x, x, need_weights=False, **kwargs)[0]
        got, _ = q(x, x, x, need_weights=False, **kwargs)
        assert _rel(got, want) < 0.03, kwargs


def test_cross_attention_and_sequence_first_inputs():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4).eval()  # batch_first=False: [T, B, E]
    q = QuantizedSelfAttention(copy.deepcopy(mha), "int8")
    x, mem = torch.randn(9, 2, 64), torch.randn(5, 2, 64)
    assert _rel(q(x, mem, mem, need_weights=False)[0], mha(x, mem, mem, need_weights=False)[0]) < 0.03
    calls = []
    q.in_proj.register_forward_hook(lambda *a: calls.append(1))
    q(x, x, x, need_weights=False)
    assert len(calls) == 1  # self-attention: one projection of [3E, E], also with sequence-first inputs


def test_an_encoder_with_padded_inputs_runs_quantized():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(2, 9, 64)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, -3:] = True
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        quantize_linears(enc, "int8")
        got = enc(x, src_key_padding_mask=pad)
    keep = ~pad  # the padded positions' outputs are not defined alike (nested tensors leave them 0)
    assert _rel(got[keep], want[keep]) < 0.05


def test_quantize_linears_says_what_it_replaced_and_what_it_kept():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    report = quantize_linears(model, "fp8")
    assert report.quantized == ["0"] and report.kept == {"2": "128x10: not multiples of 16"}
    assert isinstance(model[0], Fp8Linear) and isinstance(model[2], torch.nn.Linear)
    assert report.describe().startswith("fp8: 1 of 2 linear layers quantized; kept in 16-bit: 2 (128x10")
    with pytest.raises(ValueError, match="precision must be one of int8-wo, int8, fp8, got 'fp16'"):
        quantize_linears(model, "fp16")


@pytest.mark.parametrize("precision", ["int8-wo", "int8", pytest.param("fp8", marks=needs_cpu_fp8)])
def test_quantized_configs_pass_parity_and_name_the_layers(precision):
    model, make = zoo.get("tiny-transformer")
    x = make(4)
    ref = Config("fp32").apply(model, x, device="cpu")
    p = Config.parse(precision).apply(model, x, device="cpu")
    assert p.ok, p.error
    assert any(n.startswith(f"{precision}: ") and "linear layers quantized" in n for n in p.notes), p.notes
    assert isinstance(p.eager_module.encoder.layers[0].self_attn, QuantizedSelfAttention)
    result = gpuopt.parity(p, ref, x)
    assert result.passed and result.tolerance == {"int8-wo": 3e-2, "int8": 5e-2, "fp8": 1e-1}[precision], result


def test_parity_reports_top1_agreement_for_a_classifier():
    model, make = zoo.get("tiny-cnn")
    x = make(32)
    ref = Config("fp32").apply(model, x, device="cpu")
    p = Config("int8-wo").apply(model, x, device="cpu")  # its one linear layer: the head
    result = gpuopt.parity(p, ref, x)
    assert result.top1_agreement is not None and 0.8 <= result.top1_agreement <= 1.0
    assert f"top-1 agreement {result.top1_agreement:.1%}" in str(result)
    assert result.to_dict()["top1_agreement"] == result.top1_agreement


def test_a_model_without_linear_layers_fails_the_config_with_the_reason():
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    p = Config("int8").apply(conv, torch.randn(1, 3, 8, 8), device="cpu")
    assert not p.ok and "int8 quantizes linear layers and this model has none it can take" in p.error


def test_fp8_is_refused_on_gpus_before_compute_capability_8_9(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    why = fp8_refusal(torch.device("cuda", 0))
    assert why == ("fp8 needs FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper); "
                   "NVIDIA A100-SXM4-80GB has 8.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(quant_linear, "_rowwise_refusal", lambda device_type, index, bias=False: None)
    assert fp8_refusal(torch.device("cuda", 0)) is None


def test_fp8_is_refused_where_this_torch_refuses_row_wise_scaled_matmuls(monkeypatch):
    # torch before 2.7 on an L4 (8.9): FP8 tensor cores, but no row-wise scaling in _scaled_mm.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    asked = []

    def refusal(device_type, index, bias=False):
        asked.append((device_type, index, bias))
        return "RuntimeError: Rowwise scaling is not supported"

    monkeypatch.setattr(quant_linear, "_rowwise_refusal", refusal)
    why = fp8_refusal(torch.device("cuda", 1))
    assert asked == [("cuda", 1, False)]
    assert why == ("fp8 needs row-wise scaled FP8 matmuls (torch._scaled_mm with per-row scales), which torch "
                   f"{torch.__version__} refuses on NVIDIA L4 (RuntimeError: Rowwise scaling is not supported)")


def test_the_row_wise_probe_reports_what_the_matmul_raises(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("Rowwise scaling is not supported")

    monkeypatch.setattr(quant_linear, "_ROWWISE", {})  # the real answers again for the tests after
    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    assert quant_linear._rowwise_refusal("cpu", None) == "RuntimeError: Rowwise scaling is not supported"
    assert fp8_refusal(torch.device("cpu")) == ("fp8 on the CPU needs a torch whose _scaled_mm runs there "
                                                "(RuntimeError: Rowwise scaling is not supported)")


def test_the_row_wise_probe_raises_what_says_nothing_about_fp8(monkeypatch):
    # Out of memory, or a CUDA error left by earlier work: raised, and not kept as the device's answer.
    monkeypatch.setattr(quant_linear, "_ROWWISE", {})
    # a CUDA error is torch.AcceleratorError from torch 2.8 on, a RuntimeError known by its text before
    cuda_error = getattr(torch, "AcceleratorError", RuntimeError)("CUDA error: an illegal memory access")
    for error in (torch.OutOfMemoryError("CUDA out of memory"), cuda_error):
        def fail(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(torch, "_scaled_mm", fail)
        with pytest.raises(type(error), match=str(error)):
            quant_linear._rowwise_refusal("cpu", None)
    assert quant_linear._ROWWISE == {}


def test_the_row_wise_probe_keeps_other_errors_as_the_devices_answer(monkeypatch):
    # With torch's CUDA error type there, a RuntimeError is this torch's answer about fp8, whatever its text;
    # before it (torch < 2.8), the text tells a CUDA error apart.
    monkeypatch.setattr(quant_linear, "_ROWWISE", {})

    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA error: not supported for this scaling (a message naming CUDA)")

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    if getattr(torch, "AcceleratorError", None) is None:
        with pytest.raises(RuntimeError, match="CUDA error"):
            quant_linear._rowwise_refusal("cpu", None)
    else:
        assert quant_linear._rowwise_refusal("cpu", None) == ("RuntimeError: CUDA error: not supported for this "
                                                              "scaling (a message naming CUDA)")


@needs_cpu_fp8
def test_a_benchmark_records_quantized_rows_beside_the_others(tmp_path):
    res = gpuopt.benchmark("tiny-transformer", configs=["bf16", "int8", "fp8"], batch_sizes=[2], modes=["host"],
                           device="cpu", output_dir=str(tmp_path), max_time_s=0.1, min_time_s=0.0, progress=False)
    rows = {r.config: r for r in res.rows}
    assert set(rows) == {"bf16", "int8", "fp8"} and all(r.ok for r in rows.values()), [r.error for r in res.rows]
    assert rows["fp8"].precision == "fp8" and rows["fp8"].parity["passed"]
    assert any("linear layers quantized" in n for n in rows["int8"].notes)
