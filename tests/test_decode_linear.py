"""gpuopt::decode_linear and gpuopt.llm.linear: values against a float64 reference, typed errors naming
the argument, torch.library.opcheck, the process-wide settings, the module swap with its ReLU fusion; on a
GPU the tensor-core kernel (1 to 8 rows, each layout) and its cuBLAS fallback against the reference, the
kernel that ran, a CUDA graph and torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpuopt  # noqa: F401  (loading gpuopt._C registers the operators)
from gpuopt import _C
from gpuopt.llm import linear as L

ops = torch.ops.gpuopt


def _inputs(lead, n, k, dtype, g, *, bias=True, device="cpu"):
    x = torch.randn(*lead, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x.to(device), w.to(device), None if b is None else b.to(device)


def _reference(x, w, b, relu=False) -> torch.Tensor:
    y = x.double().cpu() @ w.double().cpu().t()
    if b is not None:
        y = y + b.double().cpu()
    return y.clamp_min(0) if relu else y


def _check(got, x, w, b, relu=False) -> None:
    want = _reference(x, w, b, relu)
    assert got.shape == want.shape and got.dtype == x.dtype
    # fp32 sums of k products, rounded once to the output type: the output's rounding dominates.
    eps = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7, torch.float32: 2 ** -20}[x.dtype]
    tol = 2 * eps * (float(want.abs().max()) + 1.0)
    err = float((got.cpu().double() - want).abs().max())
    assert err <= tol, (err, tol)


# ---- CPU -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lead", [(1,), (5,), (2, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("relu", [False, True])
def test_cpu_matches_the_reference(lead, dtype, relu, rng):
    x, w, b = _inputs(lead, 40, 64, dtype, rng, bias=lead != (5,))
    _check(ops.decode_linear(x, w, b, "relu" if relu else "none"), x, w, b, relu)


@pytest.mark.parametrize("relu", [False, True])
def test_opcheck(relu, rng):
    x, w, b = _inputs((3,), 16, 32, torch.float32, rng)
    torch.library.opcheck(ops.decode_linear.default, (x, w, b, "relu" if relu else "none"))
    torch.library.opcheck(ops.decode_linear.default, (x, w, None))


@pytest.mark.parametrize("case,exc,words", [
    ("x int", TypeError, ["x must be float16, bfloat16 or float32", "int64"]),
    ("weight dtype", TypeError, ["weight must have x's dtype (float32)", "float16"]),
    ("weight 1-D", ValueError, ["weight must be 2-D [N, K]", "[32]"]),
    ("k mismatch", ValueError, ["x's last dimension must equal weight's K", "[3, 32]", "[16, 31]"]),
    ("bias dtype", TypeError, ["bias must have x's dtype", "float16"]),
    ("bias shape", ValueError, ["bias must have shape [N] with N = weight.size(0) = 16", "[15]"]),
    ("activation", ValueError, ["activation must be 'none' or 'relu'", "'gelu'"]),
    ("x 0-dim", ValueError, ["x must have shape [..., K]"]),
])
def test_bad_arguments_name_the_argument(case, exc, words, rng):
    x, w, b = _inputs((3,), 16, 32, torch.float32, rng)
    args = {"x int": (x.long(), w, b), "weight dtype": (x, w.half(), b), "weight 1-D": (x, w[0], b),
            "k mismatch": (x, w[:, :31], b), "bias dtype": (x, w, b.half()), "bias shape": (x, w, b[:15]),
            "activation": (x, w, b, "gelu"), "x 0-dim": (x[0, 0], w, b)}[case]
    for fn in (lambda a: ops.decode_linear(*a), lambda a: ops.decode_linear(*(t.to("meta") if isinstance(
            t, torch.Tensor) else t for t in a))):
        with pytest.raises(exc) as info:
            fn(args)
        for word in ("decode_linear", *words):
            assert word in str(info.value), (word, str(info.value))


def test_meta_gives_the_shape(rng):
    x, w, b = _inputs((2, 5), 16, 32, torch.float32, rng)
    out = ops.decode_linear(x.to("meta"), w.to("meta"), b.to("meta"))
    assert out.shape == (2, 5, 16) and out.device.type == "meta"


def test_settings_are_process_wide_and_checked():
    assert _C.decode_linear_kernel() == "auto"
    try:
        assert _C.decode_linear_kernel("cublas") == "auto" and _C.decode_linear_kernel() == "cublas"
        with pytest.raises(ValueError, match="'auto' or 'cublas', got 'simt'"):
            _C.decode_linear_kernel("simt")
        assert _C.decode_linear_kernel() == "cublas"  # a refused name changes nothing
    finally:
        _C.decode_linear_kernel("auto")
    assert _C.decode_linear_layout() == (0, 0)
    try:
        assert _C.decode_linear_layout(8, 2) == (0, 0) and _C.decode_linear_layout() == (8, 2)
        assert _C.decode_linear_layout(warps=16) == (8, 2) and _C.decode_linear_layout() == (16, 2)
        for bad, match in (((12, 1), "warps must be 0 \\(chosen from K\\), 4, 8, 16 or 32, got 12"),
                           ((4, 3), "vector must be 0 \\(chosen\\), 1, 2 or 4, got 3")):
            with pytest.raises(ValueError, match=match):
                _C.decode_linear_layout(*bad)
        assert _C.decode_linear_layout() == (16, 2)  # a refused value changes nothing
    finally:
        _C.decode_linear_layout(0, 0)


class _Layer(nn.Module):
    """OPT's MLP shape: fc1, a ReLU, fc2; and an attention-like projection called first."""

    def __init__(self, d: int, act: nn.Module):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.activation_fn = act
        self.fc2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.fc2(self.activation_fn(self.fc1(self.proj(x))))


class _Net(nn.Module):
    def __init__(self, d: int = 32, act: type = nn.ReLU):
        super().__init__()
        self.layers = nn.ModuleList([_Layer(d, act()) for _ in range(2)])
        self.head = nn.Linear(d, 10, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


@pytest.mark.parametrize("act,fused", [(nn.ReLU, True), (nn.GELU, False)])
def test_use_decode_linear_swaps_and_fuses_relu(act, fused, rng):
    torch.manual_seed(0)
    net = _Net(act=act).to(torch.bfloat16).eval()
    x = torch.randn(3, 32, generator=rng).to(torch.bfloat16)
    with torch.inference_mode():
        want = net(x)
    weights = [net.layers[0].proj.weight, net.layers[0].fc1.weight]
    assert L.use_decode_linear(net) == 7
    assert all(type(m) is not nn.Linear for m in net.modules())
    assert net.layers[0].proj.weight is weights[0] and net.layers[0].fc1.weight is weights[1]  # shared, not copied
    assert net.layers[0].fc1.activation == "none"  # _Layer is not a known ReLU MLP layer (RELU_MLP_LAYERS)
    assert L.fuse_relu(net, layers=("_Layer",)) == (2 if fused else 0)
    assert (net.layers[0].fc1.activation == "relu") is fused
    assert isinstance(net.layers[0].activation_fn, nn.Identity) is fused
    assert len(list(net.parameters())) == 7 * 2 - 3  # three without bias
    with torch.inference_mode():
        torch.testing.assert_close(net(x), want)


def test_use_decode_linear_leaves_float32_layers():
    net = _Net().eval()
    assert L.use_decode_linear(net) == 0
    assert isinstance(net.layers[0].fc1, nn.Linear) and isinstance(net.layers[0].activation_fn, nn.ReLU)


def test_decode_linear_module_refuses_an_unknown_activation_and_other_layers():
    with pytest.raises(ValueError, match="activation must be 'none' or 'relu', got 'tanh'"):
        L.DecodeLinear(nn.Linear(4, 4), "tanh")
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear .*got Conv1d"):
        L.DecodeLinear(nn.Conv1d(4, 4, 1))


def test_decode_linear_keeps_nn_linear_state_dict_keys():
    lin = nn.Linear(8, 4)
    m = L.DecodeLinear(lin)
    assert list(m.state_dict()) == ["weight", "bias"]
    m.load_state_dict(nn.Linear(8, 4).state_dict())
    assert m.weight is lin.weight  # loaded in place into the shared parameter


def test_fused_llm_copies_run_decode_linears_with_the_same_logits(rng):
    from gpuopt.llm.measure import Models

    models = Models("opt-125m")
    fused = models.candidate("bf16", fused=True)
    plain = models.candidate("bf16")
    # OPT-125m: q/k/v as one, out_proj, fc1 (with its ReLU), fc2 per layer, and the LM head.
    assert models.decode_linears["bf16"] == 12 * 4 + 1
    layer = fused.model.decoder.layers[0]
    assert layer.fc1.activation == "relu" and isinstance(layer.activation_fn, nn.Identity)
    assert isinstance(fused.lm_head, L.DecodeLinear) and fused.lm_head.weight is fused.model.decoder.embed_tokens.weight
    assert isinstance(plain.model.decoder.layers[0].fc1, nn.Linear)
    from gpuopt.llm.models import linear_params

    assert linear_params(fused) == linear_params(plain) > 0  # FLOPs and the roofline count gpuopt's layers
    ids = torch.randint(0, 1000, (1, 6), generator=rng).to(fused.device)  # the models are on the GPU where there is one
    with torch.inference_mode():
        a = fused(input_ids=ids, use_cache=False).logits.float()
        b = plain(input_ids=ids, use_cache=False).logits.float()
    torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)


# ---- CUDA ------------------------------------------------------------------------------------------------


def _needs_mma():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("gpuopt's decode linear kernel needs compute capability 8.0+")


@pytest.fixture(params=[(0, 0), (4, 1), (32, 1), (8, 2), (16, 4), (32, 4)], ids=lambda p: f"w{p[0]}v{p[1]}")
def layout(request):
    """Layouts of the kernel in turn (warps, vector; the process-wide setting, restored after the test)."""
    before = _C.decode_linear_layout(*request.param)
    yield request.param
    _C.decode_linear_layout(*before)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(3, 32), (1000, 2048), (2048, 8192), (40, 160), (6144, 2048), (40, 192),
                                 (1000, 2368)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_kernel_matches_the_reference(m, n, k, dtype, layout, rng, kernels_run):
    # n = 3, 1000 and 40 leave a partial 16-column tile; k = 32 is one chunk (3 idle warps of 4; 2 or 4 loads
    # per row fall back to 1 there and for 160, five chunks: no whole batch), 8192 whole batches per warp;
    # 8 rows fill the MMA's N.
    _needs_mma()
    lead = (m,) if k != 2048 else (1, m)
    relu = n == 1000
    x, w, b = _inputs(lead, n, k, dtype, rng, bias=m != 3, device="cuda")
    act = "relu" if relu else "none"
    names = kernels_run(lambda: ops.decode_linear(x, w, b, act))
    assert len(names) == 1 and "decode_linear_mma" in names[0], names
    assert ", false>" in names[0], names[0]  # no norm: no row statistics taken
    warps, vector = layout
    v = vector or 2  # the largest of the loads asked for (2 unless set) whose chunk divides K
    while v > 1 and k % (32 * v):
        v //= 2
    assert f", {v}, " in names[0], names[0]
    if warps:
        assert f", {warps}, {v}, " in names[0], names[0]
    _check(ops.decode_linear(x, w, b, act), x, w, b, relu)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("case", ["9 rows", "k % 32", "unaligned x", "float32", "cublas setting", "strided weight"])
def test_cases_the_kernel_does_not_take_run_atens_linear(case, rng, monkeypatch, kernels_run):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    dtype = torch.float32 if case == "float32" else torch.float16
    m, k = (9, 64) if case == "9 rows" else (2, 48 if case == "k % 32" else 64)
    x, w, b = _inputs((m,), 24, k, dtype, rng, device="cuda")
    if case == "unaligned x":
        base = torch.empty(m * k + 1, dtype=dtype, device="cuda")
        x = base[1:].view(m, k).copy_(x)
    if case == "strided weight":
        w = torch.cat([w, w], dim=1)[:, ::2]
    before = _C.decode_linear_kernel("cublas" if case == "cublas setting" else "auto")
    try:
        names = kernels_run(lambda: ops.decode_linear(x, w, b, "relu"))
        got = ops.decode_linear(x, w, b, "relu")
    finally:
        _C.decode_linear_kernel(before)
    assert not any("kernels::decode_linear" in n for n in names), names
    _check(got, x, w, b, relu=True)


@pytest.mark.gpuopt_gpu
def test_a_cuda_graph_replays_the_kernel(rng, kernels_run):
    _needs_mma()
    x, w, b = _inputs((2,), 2048, 2048, torch.float16, rng, device="cuda")
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.decode_linear(static_x, w, b, "relu")  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            out = ops.decode_linear(static_x, w, b, "relu")
    torch.cuda.current_stream().wait_stream(stream)
    assert kernels_run(graph.replay, "kernels::decode_linear"), "the graph runs gpuopt's kernel"
    for _ in range(2):
        static_x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ops.decode_linear(static_x, w, b, "relu"))
        _check(out, static_x, w, b, relu=True)


@pytest.mark.gpuopt_gpu
def test_weight_on_another_device_is_refused(rng):
    x, w, b = _inputs((1,), 16, 32, torch.float16, rng, device="cuda")
    with pytest.raises(ValueError, match="decode_linear: weight must be on x's device"):
        ops.decode_linear(x, w.cpu(), b)


@pytest.mark.gpuopt_gpu
def test_compiled_module_runs_the_kernel(rng, kernels_run):
    _needs_mma()
    net = _Net(d=64).to("cuda", torch.float16).eval()
    L.use_decode_linear(net)
    x = torch.randn(1, 64, generator=rng).to("cuda", torch.float16)
    with torch.inference_mode():
        eager = net(x)
        compiled = torch.compile(net, fullgraph=True)
        got = compiled(x)
        names = kernels_run(lambda: compiled(x))
    assert sum("kernels::decode_linear" in n for n in names) == 7, names
    torch.testing.assert_close(got, eager, rtol=1e-2, atol=1e-2)
