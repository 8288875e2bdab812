"""gpuopt::decode_qkv_attention and gpuopt.llm.attention.fuse_steps: an attention layer's decode step (the fused
q/k/v projection with a folded norm, then the causal attention with the new key and value appended) as one
operator. On the CPU it is its two operators: checked against a float64 reference of the projection and the
attention, for typed errors naming the argument, with opcheck and torch.compile, and inside OPT through the
Decoder (the same tokens as the unfused step, the model restored). On a GPU its one kernel against the two
operators' kernels, for each dtype, head size, norm and batch it takes, captured in a CUDA graph, and the
fast path's compiled step with one kernel per layer fewer."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt.llm import attention as llm_attention
from gpuopt.llm import cache as llm_cache

ops = torch.ops.gpuopt


def _norm(x: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    x = x.double()
    if norm == "layer":
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    if norm == "rms":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x


def _inputs(b, h, d, k, keys, position, dtype, g, *, device="cpu", norm="none", bias=True):
    x = torch.randn(b, 1, k, generator=g).to(dtype)
    w = (torch.randn(3 * h * d, k, generator=g) / k ** 0.5).to(dtype)
    bias_t = (torch.randn(3 * h * d, generator=g) * 0.1).to(dtype) if bias else None
    kc = torch.randn(b, h, keys, d, generator=g).to(dtype)
    vc = torch.randn(b, h, keys, d, generator=g).to(dtype)
    sums = w.float().sum(1) if norm == "layer" else None
    pos = torch.tensor([position])
    counters = torch.zeros(h, dtype=torch.int32)
    t = [x, w, bias_t, kc, vc, pos, counters, sums]
    return [None if v is None else v.to(device) for v in t]


def _reference(x, w, bias, kc, vc, position, norm, eps, scale):
    """float64: qkv of the normalized x, the new row written, softmax over the rows [0, position]."""
    b, h, _, d = kc.shape
    qkv = _norm(x.cpu(), norm, eps) @ w.double().cpu().T
    if bias is not None:
        qkv = qkv + bias.double().cpu()
    q, k, v = (qkv[..., i * h * d:(i + 1) * h * d].reshape(b, h, d) for i in range(3))
    kd, vd = kc.double().cpu().clone(), vc.double().cpu().clone()
    kd[:, :, position], vd[:, :, position] = k, v
    scores = torch.einsum("bhd,bhld->bhl", q, kd[:, :, :position + 1]) * scale
    out = torch.einsum("bhl,bhld->bhd", scores.softmax(-1), vd[:, :, :position + 1])
    return out.reshape(b, 1, h, d), k, v


def _check(got, kc, vc, args, norm, eps=1e-5, scale=None, tol=None):
    x, w, bias, kc0, vc0, pos = args[:6]
    position = int(pos)
    d = kc.shape[3]
    s = d ** -0.5 if scale is None else scale
    want, k_new, v_new = _reference(x, w, bias, kc0, vc0, position, norm, eps, s)
    assert got.shape == want.shape and got.dtype == x.dtype and got.device == x.device
    tol = tol or (2e-5 if x.dtype == torch.float32 else 8 * torch.finfo(x.dtype).eps)
    err = float((got.double().cpu() - want).abs().max())
    assert err <= tol * max(1.0, float(want.abs().max())), f"output: max error {err:.3g}"
    row_tol = tol * max(1.0, float(k_new.abs().max()))
    assert float((kc[:, :, position].double().cpu() - k_new).abs().max()) <= row_tol
    assert float((vc[:, :, position].double().cpu() - v_new).abs().max()) <= row_tol
    # every other row as it was
    others = [i for i in range(kc.shape[2]) if i != position]
    assert torch.equal(kc[:, :, others].cpu(), kc0[:, :, others].cpu())
    assert torch.equal(vc[:, :, others].cpu(), vc0[:, :, others].cpu())


@pytest.mark.parametrize("norm", ["none", "layer", "rms"])
@pytest.mark.parametrize("b,h,d,k,keys,position", [(1, 4, 16, 64, 9, 4), (2, 3, 32, 96, 12, 11), (3, 2, 8, 32, 5, 0)])
def test_the_step_on_the_cpu_is_the_projection_then_the_attention(norm, b, h, d, k, keys, position, rng):
    args = _inputs(b, h, d, k, keys, position, torch.float32, rng, norm=norm, bias=b != 3)
    x, w, bias, kc, vc, pos, counters, sums = args
    kc0, vc0 = kc.clone(), vc.clone()
    got = ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters, norm, sums, 1e-5, None)
    _check(got, kc, vc, [x, w, bias, kc0, vc0, pos], norm)
    assert not counters.any()


def test_the_scale_is_given_or_one_over_the_square_root_of_the_head_size(rng):
    args = _inputs(1, 2, 16, 32, 6, 3, torch.float32, rng)
    x, w, bias, kc, vc, pos, counters, _ = args
    for scale in (None, 1.0, 0.3):
        k1, v1 = kc.clone(), vc.clone()
        got = ops.decode_qkv_attention(x, w, bias, k1, v1, pos, counters, "none", None, 1e-5, scale)
        _check(got, k1, v1, [x, w, bias, kc, vc, pos], "none", scale=scale)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_inputs_are_typed_errors_naming_the_argument(device, rng):
    x, w, bias, kc, vc, pos, counters, _ = _inputs(2, 4, 16, 64, 8, 3, torch.float32, rng, device=device)
    with pytest.raises(ValueError, match=r"decode_qkv_attention: x must have shape \[batch, 1, K\] \(one new token\), "
                                         r"got sizes \[2, 2, 64\]"):
        ops.decode_qkv_attention(x.expand(2, 2, 64), w, bias, kc, vc, pos, counters)
    with pytest.raises(ValueError, match=r"weight must have shape \[3 \* heads \* head_dim, K\] = \[192, K\] "
                                         r"\(q's rows, then k's, then v's; heads and head_dim the caches'\), "
                                         r"got sizes \[128, 64\]"):
        ops.decode_qkv_attention(x, w[:128], bias, kc, vc, pos, counters)
    with pytest.raises(ValueError, match=r"k_cache must have x's batch \(2\), got sizes \[1, 4, 8, 16\]"):
        ops.decode_qkv_attention(x, w, bias, kc[:1], vc[:1], pos, counters)
    with pytest.raises(ValueError, match=r"k_cache must have shape \[batch, heads, keys, head_dim\], got sizes"):
        ops.decode_qkv_attention(x, w, bias, kc[0], vc[0], pos, counters)
    with pytest.raises(TypeError, match="counters must be int32, got int64"):
        ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters.long())
    with pytest.raises(ValueError, match=r"counters must be 1-D with at least heads = 4 elements, got sizes \[3\]"):
        ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters[:3])
    if device == "cpu":
        # the parts' own checks, as the parts raise them
        with pytest.raises(ValueError, match="decode_linear: x's last dimension must equal weight's K"):
            ops.decode_qkv_attention(x[..., :32], w, bias, kc, vc, pos, counters)
        with pytest.raises(IndexError, match=r"position must be in \[0, 8\)"):
            ops.decode_qkv_attention(x, w, bias, kc, vc, torch.tensor([8]), counters)
        with pytest.raises(ValueError, match="norm"):
            ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters, "batch")
    else:
        assert ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters).shape == (2, 1, 4, 16)


def test_opcheck_and_compile_on_the_cpu(rng):
    args = _inputs(2, 4, 16, 64, 10, 6, torch.float32, rng, norm="layer")
    x, w, bias, kc, vc, pos, counters, sums = args
    torch.library.opcheck(ops.decode_qkv_attention.default, (x, w, bias, kc, vc, pos, counters, "layer", sums))
    k2, v2 = kc.clone(), vc.clone()

    def fn(x, kc, vc):
        return ops.decode_qkv_attention(x * 2, w, bias, kc, vc, pos, counters, "layer", sums).sum(-1)

    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True)(x, kc, vc)
    torch.testing.assert_close(got, fn(x, k2, v2))
    assert torch.equal(kc, k2) and torch.equal(vc, v2)  # the compiled call wrote the caches in place too


# ---- inside OPT, through the Decoder -----------------------------------------------------------------------

pytest.importorskip("transformers")
from gpuopt.llm import Models  # noqa: E402
from gpuopt.llm.paths import Decoder  # noqa: E402


@pytest.fixture(scope="module")
def tiny_opt():
    return Models("tiny-opt", "cpu", seed=3)


def _decoder(models, prompt, n, **kw):
    return Decoder(models.candidate("fp32", fused=True), "static", prompt, n, gpuopt._C.StepClock(-1, n),
                   torch.float32, attention="gpuopt", **kw)


def test_the_decoder_runs_each_layers_step_as_one_operator_with_the_same_tokens(tiny_opt):
    """fp32 on the CPU: the fused step is the same two operators, so the same tokens and logits as the unfused
    step (within fp32 rounding: the projection's norm is folded in both); each one-token step of each layer
    went through it; close() gives the modules their own forward back."""
    models = tiny_opt
    prompt = models.prompt(2, 7)
    n = 6
    layers = models.config.num_hidden_layers
    ref_tokens, _ = models.reference_run(prompt, n)
    out = {}
    for fuse in (False, True):
        calls = llm_attention.step_calls
        d = _decoder(models, prompt, n, fuse_attention=fuse)
        try:
            assert d.causal_in_kernel == layers
            assert d.fused_attention == (layers if fuse else 0)
            out[fuse] = d.forced_logits(ref_tokens, n)
            # the two warm-up steps and n - 1 teacher-forced steps, each through every layer
            assert llm_attention.step_calls - calls == ((2 + n - 1) * layers if fuse else 0)
        finally:
            d.close()
        assert not any("forward" in m.__dict__ for m in d.model.modules())
    assert torch.equal(out[True][0], out[False][0]) and torch.equal(out[True][0], ref_tokens)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-5, atol=1e-5)


def test_a_step_that_does_not_apply_runs_the_modules_own_forward(tiny_opt, monkeypatch):
    """The prefill (several tokens), attention weights asked for, and a layer that is not causal go to OPT's
    forward; a module without fused projections is never given the fused forward."""
    models = tiny_opt
    assert llm_attention.fuse_steps(models.reference) == 0  # unfused: q, k and v apart
    prompt = models.prompt(1, 5)
    d = _decoder(models, prompt, 4)
    try:
        module = next(m for m in d.model.modules() if type(m).__name__ == "OPTAttention")
        layer = getattr(module, llm_cache.ATTRIBUTE)
        hidden = torch.randn(1, 3, models.config.hidden_size)
        assert llm_attention._fused_step(module, hidden) is None  # a prefill
        one = hidden[:, :1]
        with torch.inference_mode():
            assert llm_attention._fused_step(module, one, output_attentions=True) is None
            monkeypatch.setattr(layer, "causal", False)
            assert llm_attention._fused_step(module, one) is None
            monkeypatch.setattr(layer, "causal", True)
            calls = llm_attention.step_calls
            assert llm_attention._fused_step(module, one) is not None
            assert llm_attention.step_calls == calls + 1
        assert llm_attention._fused_step(module, one) is None  # grad enabled: the model's own forward
    finally:
        d.close()


def test_the_compiled_step_has_one_fused_operator_per_layer_and_no_attention_call(tiny_opt):
    from torch._inductor.utils import run_and_get_code

    models = tiny_opt
    prompt = models.prompt(1, 6)
    d = _decoder(models, prompt, 5)
    try:
        with torch.inference_mode():
            d._prefill()
            eager = d._decode_step().clone()
            d._prefill()
            torch._dynamo.reset()
            compiled, codes = run_and_get_code(torch.compile(d._decode_step, fullgraph=True, dynamic=False))
    finally:
        d.close()
    code = "\n".join(codes)
    layers = models.config.num_hidden_layers
    assert code.count("torch.ops.gpuopt.decode_qkv_attention.default(") == layers
    assert "decode_attention_append" not in code
    assert "clone" not in code  # the caches and counters written in place
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_measure_decode_checks_fuse_attention_and_records_it(tiny_opt):
    kw = dict(path="static", precision="fp32", prompt_len=6, new_tokens=4, max_time_s=0.2, parity=False)
    with pytest.raises(TypeError, match="fuse_attention must be True, False or None, got 'yes'"):
        gpuopt.measure_decode(tiny_opt, fuse_attention="yes", **kw)
    with pytest.raises(ValueError, match=r"fuse_attention=True needs fuse and attention='gpuopt'.*attention='model'"):
        gpuopt.measure_decode(tiny_opt, fuse_attention=True, attention="model", **kw)
    r = gpuopt.measure_decode(tiny_opt, attention="gpuopt", **kw)
    assert r.fused_attention == tiny_opt.config.num_hidden_layers
    assert gpuopt.measure_decode(tiny_opt, attention="gpuopt", fuse_attention=False, **kw).fused_attention == 0
    assert r.llm_dict()["fused_attention"] == r.fused_attention


# ---- the CUDA kernel ------------------------------------------------------------------------------------------


def _cuda_pair(b, h, d, k, keys, position, dtype, rng, norm="none", bias=True):
    """The same inputs twice on the GPU: for the fused kernel and for the two operators' kernels."""
    args = _inputs(b, h, d, k, keys, position, dtype, rng, device="cuda", norm=norm, bias=bias)
    x, w, bias_t, kc, vc, pos, counters, sums = args
    return args, (kc.clone(), vc.clone())


def _two_ops(x, w, bias, kc, vc, pos, norm, sums, eps=1e-5, scale=None):
    qkv = ops.decode_linear(x, w, bias, "none", None, norm, sums, eps)
    b, h, _, d = kc.shape
    q, k, v = (qkv[..., i * h * d:(i + 1) * h * d].view(b, 1, h, d).transpose(1, 2) for i in range(3))
    return ops.decode_attention_append(q, kc, vc, k, v, pos, None, scale, True)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm", ["none", "layer", "rms"])
@pytest.mark.parametrize("b,h,d,k,keys,position", [(1, 32, 64, 2048, 384, 200), (1, 32, 64, 2048, 384, 0),
                                                   (1, 32, 64, 2048, 384, 383), (2, 16, 128, 2048, 100, 57),
                                                   (8, 4, 64, 4096, 1024, 1000), (3, 40, 64, 2560, 64, 9)])
def test_the_kernel_gives_the_two_operators_answer(dtype, norm, b, h, d, k, keys, position, kernels_run, rng):
    """One kernel (the profile says so) with the projection's bits and the attention within the output's
    rounding of the two operators' kernels; the same cache rows; the counters left zero for the next call."""
    args, (k2, v2) = _cuda_pair(b, h, d, k, keys, position, dtype, rng, norm=norm, bias=b != 3)
    x, w, bias, kc, vc, pos, counters, sums = args
    kc0, vc0 = kc.clone(), vc.clone()
    out = {}
    names = kernels_run(lambda: out.setdefault("got", ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters, norm,
                                                                            sums)))
    assert len(names) == 1 and "decode_qkv_attention<" in names[0], names
    want = _two_ops(x, w, bias, k2, v2, pos, norm, sums)
    got = out["got"]
    assert not counters.any()
    assert torch.equal(kc, k2) and torch.equal(vc, v2)  # the same row written (the same projection bits)
    tol = 2 * torch.finfo(dtype).eps * max(1.0, float(want.abs().max()))
    assert float((got.float() - want.float()).abs().max()) <= tol
    _check(got, kc, vc, [x, w, bias, kc0, vc0, pos], norm)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("case", ["k below 2048", "head size 32", "cache over 1024 keys", "float32", "9 rows",
                                  "cublas"])
def test_what_the_kernel_does_not_take_runs_the_two_operators(case, kernels_run, rng):
    shape = dict(b=1, h=8, d=64, k=2048, keys=64, position=5)
    dtype = torch.float16
    if case == "k below 2048":
        shape["k"] = 1024
    elif case == "head size 32":
        shape["d"] = 32
    elif case == "cache over 1024 keys":
        shape["keys"], shape["position"] = 1500, 1200
    elif case == "float32":
        dtype = torch.float32
    elif case == "9 rows":
        shape["b"] = 9
    args, (k2, v2) = _cuda_pair(**shape, dtype=dtype, rng=rng)
    x, w, bias, kc, vc, pos, counters, sums = args
    before = gpuopt._C.decode_linear_kernel("cublas") if case == "cublas" else None
    try:
        out = {}
        names = kernels_run(lambda: out.setdefault("got", ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters)))
        want = _two_ops(x, w, bias, k2, v2, pos, "none", None)
    finally:
        if before is not None:
            gpuopt._C.decode_linear_kernel(before)
    assert not any("decode_qkv_attention<" in n for n in names), names
    assert torch.equal(out["got"], want) and torch.equal(kc, k2) and torch.equal(vc, v2)


@pytest.mark.gpuopt_gpu
def test_captured_in_a_cuda_graph_it_follows_the_position_and_input_in_place(kernels_run, rng):
    """Replays with the position and x changed in place: each writes its row and attends to [0, position];
    the counters return to zero after every replay."""
    args, _ = _cuda_pair(1, 32, 64, 2048, 384, 0, torch.float16, rng, norm="layer")
    x, w, bias, kc, vc, pos, counters, sums = args
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters, "layer", sums)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.decode_qkv_attention(x, w, bias, kc, vc, pos, counters, "layer", sums)
    for position in (1, 2, 200, 383):
        pos.fill_(position)
        x.normal_()
        kc0, vc0 = kc.clone(), vc.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert not counters.any()
        _check(out, kc, vc, [x, w, bias, kc0, vc0, pos], "layer")


@pytest.mark.gpuopt_gpu
def test_the_fast_path_runs_one_kernel_per_layer_fewer_with_the_same_tokens(kernels_run):
    """OPT-1.3B's shapes (hidden 2048, 32 heads of 64; two layers) through static-graph-compile in fp16: every
    layer's step fused, parity with fp32 passed, the same greedy tokens as without the fusion, and the captured
    step's kernels one per layer fewer, none of them decode_attention."""
    from transformers import OPTConfig, OPTForCausalLM

    from gpuopt.llm.paths import Decoder

    config = OPTConfig(hidden_size=2048, num_attention_heads=32, ffn_dim=8192, num_hidden_layers=2,
                       word_embed_proj_dim=2048, max_position_embeddings=512, vocab_size=4096)
    torch.manual_seed(0)
    models = Models(OPTForCausalLM(config).eval(), "cuda")
    kw = dict(path="static-graph-compile", precision="fp16", prompt_len=32, new_tokens=16, max_time_s=0.5)
    on = gpuopt.measure_decode(models, **kw)
    off = gpuopt.measure_decode(models, fuse_attention=False, **kw)
    assert on.fused_attention == 2 and off.fused_attention == 0, on.warnings
    assert on.parity is not None and on.parity.passed, on.parity.summary()
    counts = {}
    for fuse in (True, False):
        prompt = models.prompt(1, 32)
        d = Decoder(models.candidate("fp16", fused=True), "static-graph-compile", prompt, 16,
                    gpuopt._C.StepClock(0, 16), torch.float16, attention="gpuopt", fuse_attention=fuse)
        try:
            prefill, graph = d._graphs
            prefill.replay()
            names = kernels_run(graph.replay)
            d.request()
            counts[fuse] = (names, d.tokens().clone())
        finally:
            d.close()
    fused, plain = counts[True][0], counts[False][0]
    assert len(fused) == len(plain) - 2, (fused, plain)
    assert sum("decode_qkv_attention<" in n for n in fused) == 2
    assert not any("decode_attention<" in n for n in fused)
    assert torch.equal(counts[True][1], counts[False][1])
