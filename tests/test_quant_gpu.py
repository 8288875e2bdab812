"""Quantized precisions on a GPU: the quantize kernel against the CPU reference (each code path: a row
held by a thread group, held by a block, or read twice; every input type), opcheck on CUDA, and the fp8 /
int8 / int8-wo configs through the parity gate, composed with CUDA graphs and torch.compile."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt import Config
from gpuopt.run import zoo

pytestmark = pytest.mark.gpuopt_gpu


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("rows, k, xtype", [
    (4096, 4096, torch.bfloat16),   # held in registers, one chunk per thread
    (4099, 768, torch.bfloat16),    # a row per 16 threads, three chunks each; a last block part empty
    (1001, 1024, torch.float16),    # a row per warp, two chunks each
    (37, 640, torch.bfloat16),      # 40 chunks: 16 threads, the last chunk on some only
    (5, 16, torch.float32),         # one chunk: 8 threads, seven of them idle
    (64, 12288, torch.float16),     # held, three chunks
    (33, 100, torch.float32),       # odd K: the two-pass path
    (7, 20000, torch.bfloat16),     # too long to hold: the two-pass path
])
def test_the_kernel_matches_the_cpu_reference(dtype, rows, k, xtype):
    torch.manual_seed(0)
    x = (torch.randn(rows, k) * torch.logspace(-3, 3, rows)[:, None]).to(xtype)
    x[0] = 0
    q, s = torch.ops.gpuopt.quantize_rowwise(x.cuda(), dtype)
    q_ref, s_ref = torch.ops.gpuopt.quantize_rowwise(x, dtype)
    torch.testing.assert_close(s.cpu(), s_ref, rtol=1e-6, atol=0)
    differ = (q.cpu().float() != q_ref.float())
    # The same arithmetic; a value exactly between two steps may round apart (FMA contraction): rare, one step.
    assert float(differ.double().mean()) < 1e-3
    step = (q.cpu().float() - q_ref.float()).abs()[differ]
    if dtype == torch.int8:
        assert bool((step <= 1).all())
    else:
        assert bool((step <= q_ref.float().abs()[differ] / 8 + 1e-6).all())


def test_the_operator_is_well_behaved_on_cuda():
    for dtype in (torch.int8, torch.float8_e4m3fn):
        torch.library.opcheck(torch.ops.gpuopt.quantize_rowwise,
                              (torch.randn(16, 64, device="cuda", dtype=torch.bfloat16), dtype))


@pytest.mark.parametrize("config", ["fp8", "fp8+cudagraph", "int8", "int8-wo", "fp8+compile"])
def test_quantized_configs_pass_parity_on_the_gpu(config):
    model, make = zoo.get("tiny-transformer")
    x = make(8)
    ref = Config("fp32").apply(model, x, device="cuda")
    p = Config.parse(config).apply(model, x, device="cuda")
    assert p.ok, p.error
    result = gpuopt.parity(p, ref, x)
    assert result.passed, result
    assert any("linear layers quantized" in n for n in p.notes), p.notes
    m = gpuopt.measure(p.runner(x), mode="latency", max_time_s=0.3)
    assert m.p50 > 0
