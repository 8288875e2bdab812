"""What gpuopt's decode linear operators do around the matmul (csrc/cuda/linear_epilogue.cuh): a residual
added, a layer or RMS norm folded in. Values of gpuopt::decode_linear and gpuopt::int8_weight_only_linear
against float64 formulas on the CPU and, on a GPU, from each kernel; typed errors naming the argument;
opcheck; gpuopt.llm.fuse.fold_norms and NormLinear on OPT and Llama layers, the modules that keep the norm
(DecodeLinear, Int8WeightOnlyLinear); the compiled step's FuseResidual pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpuopt  # noqa: F401  (loading gpuopt._C registers the operators)
from gpuopt import _C
from gpuopt.llm import fuse as F
from gpuopt.llm import linear as L

ops = torch.ops.gpuopt
EPS = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7, torch.float32: 2 ** -20}


def _x(lead, k, dtype, g, device="cpu", offset=1.5):
    # an offset mean, so that a layer norm's mean correction is exercised (and would be missed)
    return (torch.randn(*lead, k, generator=g) * 2 + offset).to(dtype).to(device)


def _normed(x: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    xd = x.double().cpu()
    if norm == "layer":
        mean = xd.mean(-1, keepdim=True)
        return (xd - mean) / ((xd - mean).pow(2).mean(-1, keepdim=True) + eps).sqrt()
    if norm == "rms":
        return xd / (xd.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return xd


def _want(x, w, b, *, relu=False, residual=None, norm="none", eps=1e-5, scales=None) -> torch.Tensor:
    wd = w.double().cpu() * (scales.double().cpu()[:, None] if scales is not None else 1.0)
    y = _normed(x, norm, eps) @ wd.t()
    if b is not None:
        y = y + b.double().cpu()
    if relu:
        y = y.clamp_min(0)
    return y if residual is None else y + residual.double().cpu()


def _close(got, want, dtype, k):
    # fp32 sums, the output rounded once; a norm's output rounded to the dtype before the matmul (the
    # reference path; k > 0) adds about one rounding per product, sqrt(k) of them at random; the kernels
    # (k = 0) normalize in fp32 and round the output only
    assert got.dtype == dtype and got.shape == want.shape
    tol = 4 * EPS[dtype] * (float(want.abs().max()) + 1.0) * (1 + k ** 0.5 / 16)
    err = float((got.double().cpu() - want).abs().max())
    assert err <= tol, (err, tol)


def _decode_args(lead, n, k, dtype, g, device="cpu"):
    x = _x(lead, k, dtype, g, device)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device)
    r = torch.randn(*lead, n, generator=g).to(dtype).to(device)
    return x, w, b, r


def _int8_args(lead, n, k, dtype, g, device="cpu"):
    x = _x(lead, k, dtype, g, device)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8).to(device)
    s = (torch.rand(n, generator=g) * 0.02 / k ** 0.5 * 8 + 0.001).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device)
    r = torch.randn(*lead, n, generator=g).to(dtype).to(device)
    return x, w, s, b, r


CASES = [  # (norm, relu, residual)
    ("none", False, True), ("none", True, True), ("layer", False, False), ("layer", True, True),
    ("rms", False, True), ("rms", True, False),
]


# ---- CPU -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm,relu,residual", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_linear_on_cpu(norm, relu, residual, dtype, rng):
    x, w, b, r = _decode_args((2, 3), 24, 64, dtype, rng)
    sums = w.float().sum(1) if norm == "layer" else None
    got = ops.decode_linear(x, w, b, "relu" if relu else "none", r if residual else None, norm, sums, 1e-5)
    _close(got, _want(x, w, b, relu=relu, residual=r if residual else None, norm=norm), dtype, 64)


@pytest.mark.parametrize("norm,relu,residual", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_weight_only_linear_on_cpu(norm, relu, residual, dtype, rng):
    x, w, s, b, r = _int8_args((3,), 24, 64, dtype, rng)
    sums = F.norm_row_sums(w, s) if norm == "layer" else None
    got = ops.int8_weight_only_linear(x, w, s, b, "relu" if relu else "none", r if residual else None, norm, sums)
    _close(got, _want(x, w, b, relu=relu, residual=r if residual else None, norm=norm, scales=s), dtype, 64)


def test_opcheck_with_residual_and_norm(rng):
    x, w, b, r = _decode_args((3,), 16, 32, torch.float32, rng)
    torch.library.opcheck(ops.decode_linear.default, (x, w, b, "relu", r, "layer", w.sum(1), 1e-5))
    torch.library.opcheck(ops.decode_linear.default, (x, w, None, "none", None, "rms", None, 1e-6))
    x, w, s, b, r = _int8_args((3,), 16, 32, torch.float32, rng)
    torch.library.opcheck(ops.int8_weight_only_linear.default, (x, w, s, b, "none", r, "layer", F.norm_row_sums(w, s)))


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("op", ["decode", "int8"])
@pytest.mark.parametrize("case,exc,words", [
    ("norm name", ValueError, ["norm", "'batch'", "'layer'"]),
    ("layer without sums", ValueError, ["norm_sum", "layer"]),
    ("sums without layer", ValueError, ["norm_sum", "'rms'"]),
    ("sums dtype", TypeError, ["norm_sum", "float32", "float16"]),
    ("sums shape", ValueError, ["norm_sum", "[N]", "[7]"]),
    ("residual shape", ValueError, ["residual", "[3, 8]", "[3, 9]"]),
    ("residual dtype", TypeError, ["residual", "float32", "float64"]),
    ("eps", ValueError, ["eps", "-1"]),
])
def test_bad_extras_name_the_argument(device, op, case, exc, words, rng):
    x, w, b, r = _decode_args((3,), 8, 32, torch.float32, rng)
    q, s = torch.zeros(8, 32, dtype=torch.int8), torch.ones(8)
    args = {"residual": r, "norm": "layer", "norm_sum": torch.ones(8), "eps": 1e-5}
    bad = {"norm name": {"norm": "batch"}, "layer without sums": {"norm_sum": None},
           "sums without layer": {"norm": "rms"}, "sums dtype": {"norm_sum": torch.ones(8, dtype=torch.float16)},
           "sums shape": {"norm_sum": torch.ones(7)}, "residual shape": {"residual": torch.ones(3, 9)},
           "residual dtype": {"residual": r.double()}, "eps": {"eps": -1.0}}[case]
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in {**args, **bad}.items()}
    x, w, b, q, s = (t.to(device) for t in (x, w, b, q, s))
    with pytest.raises(exc) as info:
        if op == "decode":
            ops.decode_linear(x, w, b, "none", kw["residual"], kw["norm"], kw["norm_sum"], kw["eps"])
        else:
            ops.int8_weight_only_linear(x, q, s, b, "none", kw["residual"], kw["norm"], kw["norm_sum"], kw["eps"])
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# ---- folding norms into modules ----------------------------------------------------------------------


def _tiny(kind: str, seed: int = 0):
    from gpuopt.llm.models import build_model

    model = build_model(kind, device="cpu", seed=seed)
    with torch.no_grad():  # non-trivial norm affines: random ones fold into weight and bias
        for m in model.modules():
            if isinstance(m, nn.LayerNorm) or type(m).__name__.endswith("RMSNorm"):
                m.weight.uniform_(0.5, 1.5)
                if getattr(m, "bias", None) is not None:
                    m.bias.uniform_(-0.5, 0.5)
    return model


@pytest.mark.parametrize("kind,expected", [("tiny-opt", 2), ("tiny-llama", 2)])
def test_fold_norms_keeps_the_logits(kind, expected, rng):
    model = _tiny(kind).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=rng)
    with torch.no_grad():
        want = model(ids).logits
        F.fuse_projections(model)
        layers = model.config.num_hidden_layers
        assert F.fold_norms(model) == expected * layers
        got = model(ids).logits
    names = [type(m).__name__ for m in model.modules()]
    assert names.count("NormLinear") == expected * layers
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_fold_norms_needs_every_reader_of_the_norm(rng):
    """Unfused q/k/v read the attention's norm three times: that norm stays; OPT's fc1 alone reads its norm."""
    model = _tiny("tiny-opt").eval()
    assert F.fold_norms(model) == model.config.num_hidden_layers
    layer = model.model.decoder.layers[0]
    assert isinstance(layer.self_attn_layer_norm, nn.LayerNorm) and isinstance(layer.final_layer_norm, nn.Identity)
    model = _tiny("tiny-opt").eval()
    for layer in model.model.decoder.layers:
        layer.do_layer_norm_before = False  # opt-350m: the norm after the residual add cannot fold
    F.fuse_projections(model)
    assert F.fold_norms(model) == 0


@pytest.mark.parametrize("precision", ["fp16", "int8wo"])
def test_modules_from_a_norm_linear_keep_the_norm(precision, rng):
    from gpuopt.quant import Int8WeightOnlyLinear

    norm, linear = nn.LayerNorm(64), nn.Linear(64, 24)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    folded = F.NormLinear(linear, "layer", norm.eps, norm.weight, norm.bias)
    x = _x((3,), 64, torch.float32, rng)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), linear(norm(x)), rtol=1e-5, atol=1e-5)
        if precision == "fp16":
            mod = L.DecodeLinear(folded.half())
            assert mod.norm_sum.dtype == torch.float32
            torch.testing.assert_close(mod.norm_sum, mod.weight.float().sum(1))
            mod.float()  # cast back: the sums follow the weight, in float32
            torch.testing.assert_close(mod.norm_sum, mod.weight.sum(1))
            mod.half()
        else:
            mod = Int8WeightOnlyLinear.from_float(folded, torch.float32)
            assert mod.folded_norm == "layer" and mod.norm_sum.dtype == torch.float32
            torch.testing.assert_close(mod.norm_sum, mod.weight.float().sum(1) * mod.scales.float())
        assert "folded_norm=layer" in repr(mod)
        got = mod(x.to(torch.float16 if precision == "fp16" else torch.float32)).float()
    torch.testing.assert_close(got, linear(norm(x)), rtol=0.05, atol=0.05)


def test_fuse_residual_moves_the_add_into_the_operator(rng):
    """add(linear(..), r) in either order becomes the operator with residual=r; a broadcast add, an add of
    an output read twice and a type-promoting add stay."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from gpuopt.llm.passes import FuseResidual

    x, w, b, r = _decode_args((2,), 8, 32, torch.float32, rng)
    q, s = torch.randint(-127, 128, (8, 32), dtype=torch.int8, generator=rng), torch.rand(8) * 0.01

    def f(x, w, b, r, q, s):
        y1 = r + ops.decode_linear(x, w, b, "relu")
        y2 = ops.int8_weight_only_linear(x, q, s, b) + r
        y3 = ops.decode_linear(x, w, b) + b  # broadcast: stays
        z = ops.decode_linear(x, w, None)
        y4 = z + r  # z read twice: stays
        y5 = ops.decode_linear(x, w, b) + r.double()  # promotes: stays
        y6 = ops.decode_linear(x, w, b, "none", r) + r  # has a residual already: stays
        y7 = torch.add(ops.decode_linear(x, w, b), r, alpha=2)  # alpha: stays
        y8 = ops.decode_linear(x, w, b, "none", None, "rms") + r  # residual=None passed: fused
        y = ops.decode_linear(x, w, b)
        return y1, y2, y3, y4 + z, y5, y6, y7, y8, y + y  # y + y: no other value to add in the epilogue

    args = (x, w, b, r, q, s)
    gm = make_fx(f, tracing_mode="fake")(*args)
    fuse = FuseResidual()
    fuse(gm.graph)
    gm.recompile()
    assert fuse.fused == 3
    with_residual = [n for n in gm.graph.nodes if n.op == "call_function" and (
        n.kwargs.get("residual") is not None or (len(n.args) > 4 and n.args[4] is not None))]
    assert {n.target for n in with_residual} == {ops.decode_linear.default, ops.int8_weight_only_linear.default}
    assert len(with_residual) == 4  # the three fused and y6's own
    for got, want in zip(gm(*args), f(*args)):
        torch.testing.assert_close(got, want)

    def g(x, w, b, r):
        y = ops.decode_linear(x, w, b)
        x.add_(1)  # x changes after the linear: moved to the add, the linear would read the new x
        return y + r

    gm = make_fx(g, tracing_mode="fake")(x.clone(), w, b, r)
    fuse(gm.graph)
    assert fuse.fused == 0


def test_norm_sums_follow_load_state_dict(rng):
    """norm_sum is derived from the weight: loading another state recomputes it (DecodeLinear, int8)."""
    from gpuopt.quant import Int8WeightOnlyLinear

    norm = nn.LayerNorm(64)
    for make in (L.DecodeLinear, lambda m: Int8WeightOnlyLinear.from_float(m, torch.float32)):
        # DecodeLinear shares its NormLinear's weight, which loading writes: new layers each time
        fa = F.NormLinear(nn.Linear(64, 16), "layer", 1e-5, norm.weight, norm.bias)
        fb = F.NormLinear(nn.Linear(64, 16), "layer", 1e-5, norm.weight, None)
        ma, mb = make(fa), make(fb)
        assert not torch.equal(ma.norm_sum, mb.norm_sum)
        ma.load_state_dict(mb.state_dict())
        torch.testing.assert_close(ma.norm_sum, mb.norm_sum)


def test_compiled_layers_fuse_their_residual_adds_on_cpu(rng):
    """torch.compile with gpuopt's options: both residual adds of each tiny-opt layer go into the decode
    linear layers' epilogues (out_proj, fc2), and the logits stay."""
    from gpuopt.llm.passes import FuseResidual, compile_options

    model = _tiny("tiny-opt").eval()
    F.fuse_projections(model)
    F.fold_norms(model)
    L.use_decode_linear(model.float())  # float32 layers stay nn.Linear: swap them by hand for the CPU
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) in (nn.Linear, F.NormLinear) and name != "lm_head":
                setattr(module, name, L.DecodeLinear(child))
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=rng)
    options = compile_options("cpu")
    assert isinstance(options["post_grad_custom_post_pass"], FuseResidual)
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph skips the pass
        want = model(ids).logits
        compiled = torch.compile(model, fullgraph=True, options=options)
        got = compiled(ids).logits
    assert options["post_grad_custom_post_pass"].fused == 2 * model.config.num_hidden_layers
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ---- CUDA ------------------------------------------------------------------------------------------------


def _needs_mma():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("gpuopt's decode kernels need compute capability 8.0+")


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("norm,relu,residual", CASES)
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(40, 160), (2048, 2048), (1000, 8192)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_linear_kernel(norm, relu, residual, m, n, k, dtype, rng, kernels_run):
    _needs_mma()
    x, w, b, r = _decode_args((m,), n, k, dtype, rng, device="cuda")
    sums = F.norm_row_sums(w) if norm == "layer" else None
    if m == 3:
        x[1] = 0.75  # a constant row: variance 0, eps alone under the square root
    args = (x, w, b, "relu" if relu else "none", r if residual else None, norm, sums, 1e-5)
    names = kernels_run(lambda: ops.decode_linear(*args))
    assert len(names) == 1 and "decode_linear_mma" in names[0], names
    assert (", true>" in names[0]) is (norm != "none"), names[0]  # statistics taken for a norm only
    _close(ops.decode_linear(*args), _want(x, w, b, relu=relu, residual=r if residual else None, norm=norm),
           dtype, 0)


@pytest.fixture(params=["simt", "tensor-core"])
def int8_kernel(request):
    before = _C.int8_linear_kernel(request.param)
    yield request.param
    _C.int8_linear_kernel(before)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("norm,relu,residual", CASES)
@pytest.mark.parametrize("m", [1, 5, 12])
@pytest.mark.parametrize("n,k", [(40, 192), (6144, 2048), (1000, 8192)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_int8_kernels(norm, relu, residual, m, n, k, dtype, int8_kernel, rng, kernels_run):
    _needs_mma()
    x, w, s, b, r = _int8_args((m,), n, k, dtype, rng, device="cuda")
    sums = F.norm_row_sums(w, s) if norm == "layer" else None
    args = (x, w, s, b, "relu" if relu else "none", r if residual else None, norm, sums, 1e-5)
    names = kernels_run(lambda: ops.int8_weight_only_linear(*args))
    want_name = "int8_linear_mma<" if int8_kernel == "tensor-core" else "int8_linear<"
    assert len(names) == 1 and want_name in names[0], names
    assert (", true>" in names[0]) is (norm != "none"), names[0]
    _close(ops.int8_weight_only_linear(*args),
           _want(x, w, b, relu=relu, residual=r if residual else None, norm=norm, scales=s), dtype, 0)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("precision", ["fp16", "int8wo"])
def test_a_compiled_decode_step_runs_no_layer_norm_but_the_last(precision, kernels_run):
    """tiny-opt's fused copy in fp16 / int8wo, one decode step compiled with gpuopt's options: the layers'
    norms run inside the linear kernels (with their statistics), the residual adds in their epilogues --
    one layer-norm kernel is left, the decoder's last; the logits match the eager step's and the unfolded
    copy's."""
    from gpuopt.llm import Models
    from gpuopt.llm.passes import compile_options

    _needs_mma()
    models = Models("tiny-opt", "cuda")
    model = models.candidate(precision, fused=True)
    layers = model.config.num_hidden_layers
    assert models.folded_norms[precision] == 2 * layers
    ids = torch.randint(0, model.config.vocab_size, (1, 1), device="cuda")
    options = compile_options("cuda")
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph skips the pass
        want = model(ids).logits
        step = torch.compile(model, fullgraph=True, options=options)
        step(ids)
        names = kernels_run(lambda: step(ids))
        got = step(ids).logits
    assert options["post_grad_custom_post_pass"].fused == 2 * layers
    stats = [n for n in names if ("decode_linear_mma" in n or "int8_linear" in n) and ", true>" in n]
    assert len(stats) == 2 * layers, names
    assert len([n for n in names if "layer_norm" in n]) == 1, names
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    unfolded = models.candidate(precision, fused=True, fold=False)
    with torch.no_grad():
        torch.testing.assert_close(unfolded(ids).logits.float(), want.float(), rtol=2e-2, atol=2e-2)
