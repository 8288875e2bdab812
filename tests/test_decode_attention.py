"""gpuopt::decode_attention and gpuopt.llm.attention: the operator against torch's SDPA (float64) on the
CPU and, on a GPU, its CUDA kernel for every head size, dtype, grouped-query layout and mask layout it
takes, also captured in a CUDA graph; typed errors naming the argument; torch.library.opcheck and
torch.compile; inside Hugging Face models through transformers' attention interface, the same tokens
and logits as the model's own attention, and the model restored afterwards."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

import gpuopt
from gpuopt.llm import attention as llm_attention
from gpuopt.llm import cache as llm_cache

ops = torch.ops.gpuopt


def _inputs(b, h, hkv, keys, d, dtype, g, *, device="cpu", mask="row"):
    """q [b, h, 1, d] as a Hugging Face model hands it over (a transposed view of [b, 1, h, d]), k and v
    [b, hkv, keys, d] (a static cache), and a bool mask: "row" [b, 1, 1, keys] with a valid prefix per
    row (a decode step), "heads" [b, h, 1, keys] random, "shared" [1, 1, 1, keys], or None."""
    q = torch.randn(b, 1, h, d, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(b, hkv, keys, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, keys, d, generator=g).to(dtype)
    if mask == "row":
        lengths = torch.randint(1, keys + 1, (b,), generator=g)
        m = (torch.arange(keys)[None, :] < lengths[:, None])[:, None, None, :]
    elif mask == "heads":
        m = torch.rand(b, h, 1, keys, generator=g) < 0.6
        m[..., 0] = True
    elif mask == "shared":
        m = (torch.arange(keys) % 3 != 1)[None, None, None, :]
    else:
        m = None
    return tuple(None if t is None else t.to(device) for t in (q, k, v, m))


def _reference(q, k, v, mask, scale=None) -> torch.Tensor:
    """torch's SDPA in float64 on the CPU, as [b, 1, h, d]."""
    group = q.shape[1] // k.shape[1]
    kd = k.double().cpu().repeat_interleave(group, 1)
    vd = v.double().cpu().repeat_interleave(group, 1)
    m = None if mask is None else mask.cpu()
    out = torch.nn.functional.scaled_dot_product_attention(q.double().cpu(), kd, vd, attn_mask=m, scale=scale)
    return out.transpose(1, 2)


def _check(got, q, k, v, mask, scale=None) -> None:
    b, h, _, d = q.shape
    assert got.shape == (b, 1, h, d) and got.dtype == q.dtype and got.device == q.device and got.is_contiguous()
    want = _reference(q, k, v, mask, scale)
    # float32 accumulation: fp32 inputs within a few ulps of the float64 result; 16-bit inputs within
    # the output's rounding (the result is written in the input dtype) plus a little.
    tol = 2e-5 if q.dtype == torch.float32 else 2 * torch.finfo(q.dtype).eps
    err = float((got.double().cpu() - want).abs().max())
    assert err <= tol * max(1.0, float(want.abs().max())), f"max error {err:.3g}"


@pytest.mark.parametrize("b,h,hkv,keys,d", [(1, 4, 4, 9, 16), (2, 8, 2, 33, 64), (3, 6, 3, 1, 32), (1, 2, 1, 70, 80)])
@pytest.mark.parametrize("mask", ["row", "heads", "shared", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_on_cpu(b, h, hkv, keys, d, mask, dtype, rng):
    q, k, v, m = _inputs(b, h, hkv, keys, d, dtype, rng, mask=mask)
    _check(ops.decode_attention(q, k, v, m), q, k, v, m)


def test_scale_defaults_to_one_over_sqrt_head_dim_and_can_be_given(rng):
    q, k, v, m = _inputs(2, 4, 2, 12, 64, torch.float32, rng)
    _check(ops.decode_attention(q, k, v, m, 0.3), q, k, v, m, scale=0.3)
    torch.testing.assert_close(ops.decode_attention(q, k, v, m), ops.decode_attention(q, k, v, m, 64 ** -0.5))


def test_a_query_with_every_key_masked_gets_zeros(rng):
    q, k, v, m = _inputs(2, 4, 4, 8, 16, torch.float32, rng, mask="heads")
    m[1, 2] = False
    out = ops.decode_attention(q, k, v, m)
    assert torch.equal(out[1, 0, 2], torch.zeros(16))
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[1, 2] = False
    want = _reference(q, k, v, m)[:, 0]
    torch.testing.assert_close(out[:, 0][keep].double(), want[keep], rtol=0, atol=2e-5)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_inputs_are_typed_errors_naming_the_argument(device, rng):
    q, k, v, m = (t.to(device) for t in _inputs(2, 4, 2, 8, 16, torch.float32, rng))
    with pytest.raises(TypeError, match="q must be float16, bfloat16 or float32, got float64"):
        ops.decode_attention(q.double(), k, v, m)
    with pytest.raises(TypeError, match=r"k and v must have q's dtype \(float32\), got float16 and float32"):
        ops.decode_attention(q, k.half(), v, m)
    with pytest.raises(ValueError, match=r"q must have shape \[batch, heads, 1, head_dim\] \(one query token\)"):
        ops.decode_attention(q.expand(2, 4, 3, 16), k, v, m)
    with pytest.raises(ValueError, match="k and v must have one shape"):
        ops.decode_attention(q, k, v[:, :, :5], m)
    with pytest.raises(ValueError, match="q's heads must be a multiple of k's kv_heads, got 4 and 3"):
        ops.decode_attention(q, torch.zeros(2, 3, 8, 16, device=device), torch.zeros(2, 3, 8, 16, device=device), m)
    with pytest.raises(ValueError, match="k's batch and head_dim must equal q's"):
        ops.decode_attention(q, k[:1], v[:1], m)
    with pytest.raises(TypeError, match=r"mask must be bool \(True: attend\), got float32"):
        ops.decode_attention(q, k, v, m.float())
    with pytest.raises(ValueError, match=r"mask must be broadcastable to \[batch, heads, 1, keys\] = \[2, 4, 1, 8\]"):
        ops.decode_attention(q, k, v, m[..., :7])
    with pytest.raises(ValueError, match="scale must be finite, got inf"):
        ops.decode_attention(q, k, v, m, float("inf"))


def test_meta_gives_the_output_shape(rng):
    q, k, v, m = (t.to("meta") for t in _inputs(3, 8, 2, 20, 64, torch.bfloat16, rng))
    out = ops.decode_attention(q, k, v, m)
    assert out.shape == (3, 1, 8, 64) and out.dtype == torch.bfloat16 and out.device.type == "meta"


@pytest.mark.parametrize("mask", ["row", None])
def test_opcheck_on_cpu(mask, rng):
    q, k, v, m = _inputs(2, 4, 2, 10, 32, torch.float32, rng, mask=mask)
    torch.library.opcheck(ops.decode_attention.default, (q, k, v, m, None))
    torch.library.opcheck(ops.decode_attention.default, (q, k, v, m, 0.5))


def test_torch_compile_fullgraph_on_cpu(rng):
    q, k, v, m = _inputs(2, 4, 2, 10, 32, torch.float32, rng)

    def fn(q: torch.Tensor) -> torch.Tensor:
        return ops.decode_attention(q * 2, k, v, m).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(q), fn(q))


# ---- decode_attention_append: the cache update and the attention in one call -------------------------------


def _append_inputs(b, h, hkv, keys, d, dtype, g, position, *, device="cpu"):
    """q, caches k and v [b, hkv, keys, d], the new token's key and value [b, hkv, 1, d] (views of a
    projection's output, as a model hands them over), position (int64, one element) and the decode
    step's mask: every row attends to positions <= position."""
    q, k, v, _ = _inputs(b, h, hkv, keys, d, dtype, g)
    kv = torch.randn(b, 1, 2 * hkv * d, generator=g).to(dtype)
    k_new = kv[..., :hkv * d].view(b, 1, hkv, d).transpose(1, 2)
    v_new = kv[..., hkv * d:].view(b, 1, hkv, d).transpose(1, 2)
    pos = torch.tensor([position])
    m = (torch.arange(keys) <= position)[None, None, None, :].expand(b, 1, 1, keys)
    return tuple(t.to(device) for t in (q, k, v, k_new, v_new, pos, m))


def _check_append(q, k, v, k_new, v_new, pos, m, dtype):
    # The row to be written holds NaN before the call: a block that read it instead of the new key and
    # value (or before the write) would spread the NaN into its output.
    k[:, :, int(pos)] = float("nan")
    v[:, :, int(pos)] = float("nan")
    want_k, want_v = k.clone(), v.clone()
    want_k[:, :, int(pos)] = k_new[:, :, 0]
    want_v[:, :, int(pos)] = v_new[:, :, 0]
    got = ops.decode_attention_append(q, k, v, k_new, v_new, pos, m)
    assert torch.equal(k.cpu(), want_k.cpu()) and torch.equal(v.cpu(), want_v.cpu())  # the row, nothing else
    _check(got, q, want_k, want_v, m)


@pytest.mark.parametrize("b,h,hkv,keys,d,position", [(1, 4, 4, 9, 16, 4), (2, 8, 2, 33, 64, 32), (3, 6, 3, 1, 32, 0),
                                                     (1, 2, 1, 70, 80, 0)])
def test_append_writes_the_row_and_attends_to_it_on_cpu(b, h, hkv, keys, d, position, rng):
    _check_append(*_append_inputs(b, h, hkv, keys, d, torch.float32, rng, position), torch.float32)


def test_append_checks_its_new_rows_and_position(rng):
    q, k, v, kn, vn, pos, m = _append_inputs(2, 4, 2, 8, 16, torch.float32, rng, 3)
    with pytest.raises(TypeError, match=r"k and v must have the caches' dtype \(float32\), got float16 and float32"):
        ops.decode_attention_append(q, k, v, kn.half(), vn, pos, m)
    with pytest.raises(ValueError, match=r"k and v must have shape \[batch, kv_heads, 1, head_dim\] = \[2, 2, 1, 16\] "
                                         r"\(one new token\), got sizes \[2, 2, 2, 16\]"):
        ops.decode_attention_append(q, k, v, kn.expand(2, 2, 2, 16), vn.expand(2, 2, 2, 16), pos, m)
    with pytest.raises(TypeError, match="position must be int64, got int32"):
        ops.decode_attention_append(q, k, v, kn, vn, pos.int(), m)
    with pytest.raises(ValueError, match=r"position must hold one element, got sizes \[2\]"):
        ops.decode_attention_append(q, k, v, kn, vn, torch.tensor([1, 2]), m)
    with pytest.raises(IndexError, match=r"position must be in \[0, 8\) \(the caches' keys\), got 8"):
        ops.decode_attention_append(q, k, v, kn, vn, torch.tensor([8]), m)
    with pytest.raises(IndexError, match=r"position must be in \[0, 8\) \(the caches' keys\), got -1"):
        ops.decode_attention_append(q, k, v, kn, vn, torch.tensor([-1]), m)
    # decode_attention's checks, naming this operator's arguments
    with pytest.raises(ValueError, match="decode_attention_append: q's heads must be a multiple of k_cache's kv_heads"):
        ops.decode_attention_append(q[:, :3], k, v, kn, vn, pos, m)
    with pytest.raises(TypeError, match=r"k_cache and v_cache must have q's dtype \(float32\), got float16"):
        ops.decode_attention_append(q, k.half(), v, kn, vn, pos, m)
    meta = [t.to("meta") for t in (q, k, v, kn, vn, pos, m)]
    assert ops.decode_attention_append(*meta).shape == (2, 1, 4, 16)
    with pytest.raises(TypeError, match="position must be int64"):
        ops.decode_attention_append(*meta[:5], meta[5].int(), meta[6])


def test_append_opcheck_and_compile_on_cpu(rng):
    args = _append_inputs(2, 4, 2, 10, 32, torch.float32, rng, 6)
    torch.library.opcheck(ops.decode_attention_append.default, (*args, None))
    q, k, v, kn, vn, pos, m = args
    k2, v2 = k.clone(), v.clone()

    def fn(q, k, v):
        return ops.decode_attention_append(q * 2, k, v, kn, vn, pos, m).sum(-1)

    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True)(q, k, v)
    torch.testing.assert_close(got, fn(q, k2, v2))
    assert torch.equal(k, k2) and torch.equal(v, v2)  # the compiled call wrote the caches in place too


@pytest.mark.parametrize("position", [0, 5, 9])
@pytest.mark.parametrize("with_mask", [False, True])
def test_causal_append_attends_to_the_rows_up_to_the_position_on_cpu(position, with_mask, rng):
    """causal=True: the rows [0, position] (and the mask's, if one is given), whatever the rows past the
    position hold."""
    q, k, v, kn, vn, pos, causal_mask = _append_inputs(2, 4, 2, 10, 16, torch.float32, rng, position)
    extra = torch.rand(2, 4, 1, 10, generator=rng) < 0.7 if with_mask else None
    if extra is not None:
        extra[..., position] = True
    want_mask = causal_mask if extra is None else causal_mask & extra
    clean_k, clean_v = k.clone(), v.clone()
    clean_k[:, :, position] = kn[:, :, 0]
    clean_v[:, :, position] = vn[:, :, 0]
    clean_k[:, :, position + 1:] = 0
    clean_v[:, :, position + 1:] = 0
    k[:, :, position + 1:] = float("nan")  # rows past the position: attended, or even multiplied by 0, they give NaN
    v[:, :, position + 1:] = float("nan")
    got = ops.decode_attention_append(q, k, v, kn, vn, pos, extra, None, True)
    assert torch.equal(k[:, :, :position + 1], clean_k[:, :, :position + 1])
    _check(got, q, clean_k, clean_v, want_mask)
    torch.library.opcheck(ops.decode_attention_append.default, (q, k, v, kn, vn, pos, extra, None, True))


def test_is_causal_mask_accepts_exactly_the_causal_mask():
    pos = torch.tensor([4])
    causal = (torch.arange(9) <= 4)[None, None, None, :]
    assert llm_attention.is_causal_mask(causal, pos, 9)
    assert llm_attention.is_causal_mask(causal.expand(3, 2, 1, 9).contiguous(), pos, 9)
    assert not llm_attention.is_causal_mask(causal, torch.tensor([5]), 9)  # another position
    holed = causal.expand(3, 1, 1, 9).clone()
    holed[1, 0, 0, 2] = False  # a padded row
    assert not llm_attention.is_causal_mask(holed, pos, 9)
    assert not llm_attention.is_causal_mask(None, pos, 9)  # no mask: every key, not the causal ones
    assert not llm_attention.is_causal_mask(causal.float(), pos, 9)
    assert not llm_attention.is_causal_mask(causal[..., :8], pos, 9)


def test_the_check_records_a_mask_that_is_not_the_causal_one_and_hands_it_over(monkeypatch, rng):
    """On the check step, a mask with a hole (padding) is recorded as not causal; a layer not set causal
    hands the mask to the operator."""
    layer = llm_cache.layer_class()(max_cache_len=8, length=torch.tensor(3))
    module = torch.nn.Module()
    module.__dict__[llm_cache.ATTRIBUTE] = layer
    first = torch.randn(1, 2, 3, 16, generator=rng)
    layer.update(first, first + 1)
    layer.defer = layer.check_mask = True
    mask = (torch.arange(8) <= 3)[None, None, None, :].clone()
    mask[..., 1] = False
    seen = []
    real = ops.decode_attention_append

    def spy(*args):
        seen.append(args)
        return real(*args)

    monkeypatch.setattr(torch.ops.gpuopt, "decode_attention_append", spy)
    kn = torch.randn(1, 2, 1, 16, generator=rng)
    keys, values = layer.update(kn, kn)
    llm_attention.attention(module, torch.randn(1, 4, 1, 16, generator=rng), keys, values, mask)
    assert layer.mask_is_causal is False and not layer.causal
    assert seen[0][6] is mask and seen[0][8] is False


def test_a_decoder_whose_masks_are_not_all_causal_keeps_reading_them(tiny_models, monkeypatch):
    """When the check step sees any layer's mask differ from the causal one, no layer drops its mask: the
    Decoder records 0 causal layers and still generates the reference's tokens."""
    models = tiny_models["tiny-opt"]
    seen = iter([True, False] + [True] * 100)  # the second layer's mask is not the causal one
    monkeypatch.setattr(llm_attention, "is_causal_mask", lambda *a: next(seen))
    prompt = models.prompt(1, 6)
    n = 5
    ref_tokens, _ = models.reference_run(prompt, n)
    d = Decoder(models.reference, "static", prompt, n, gpuopt._C.StepClock(-1, n), torch.float32, attention="gpuopt")
    try:
        assert d.deferred_writes == models.config.num_hidden_layers >= 2
        assert d.causal_in_kernel == 0 and not any(layer.causal for layer in d.cache.layers)
        tokens, _ = d.forced_logits(ref_tokens, n)
    finally:
        d.close()
    assert torch.equal(tokens, ref_tokens)


# ---- the attention function inside transformers' models ------------------------------------------------

pytest.importorskip("transformers")
from gpuopt.llm import Models  # noqa: E402
from gpuopt.llm.paths import Decoder  # noqa: E402

TINY = ("tiny-llama", "tiny-opt", "tiny-gpt2")


@pytest.fixture(scope="module")
def tiny_models():
    return {name: Models(name, "cpu", seed=1) for name in TINY}


@pytest.mark.parametrize("name", TINY)
def test_the_static_step_with_gpuopts_attention_matches_the_model_and_restores_it(tiny_models, name):
    """On the CPU the operator runs its float32 reference: the plumbing (interface, mask, grouped KV
    heads, the layout handed back) is what is checked -- the same tokens, logits within fp32 rounding."""
    models = tiny_models[name]
    model = models.reference
    before = model.config._attn_implementation
    prompt = models.prompt(2, 7)
    n = 9
    ref_tokens, ref_logits = models.reference_run(prompt, n)
    calls = llm_attention.calls
    d = Decoder(model, "static", prompt, n, gpuopt._C.StepClock(-1, n), torch.float32, attention="gpuopt")
    layers = models.config.num_hidden_layers
    try:
        assert d.attention == "gpuopt" and not d.attention_note
        assert model.config._attn_implementation == "gpuopt"
        # every layer's cache update is the kernel's (decode_attention_append), from one shared fill level
        assert d.deferred_writes == layers
        # the eager check step saw each layer's mask be the causal one: the operator bounds the keys by
        # the position instead of reading a mask (the tokens below are the reference's all the same)
        assert d.causal_in_kernel == layers and all(layer.causal for layer in d.cache.layers)
        assert len({id(layer.cumulative_length) for layer in d.cache.layers}) == 1
        tokens, logits = d.forced_logits(ref_tokens, n)
        # the check step, the two warm-up steps, then n - 1 teacher-forced steps, each through every layer
        # (the prefills run SDPA)
        assert llm_attention.calls - calls == (1 + 2 + n - 1) * layers
    finally:
        d.close()
    assert model.config._attn_implementation == before
    assert not any(hasattr(m, llm_cache.ATTRIBUTE) for m in model.modules())  # the writes handed back
    assert torch.equal(tokens, ref_tokens)
    assert float((logits - ref_logits).abs().max() / ref_logits.abs().max()) < 1e-5


def test_a_deferred_write_reaches_the_cache_whichever_attention_runs(rng):
    """A DecodeLayer with ``defer`` keeps a one-token update for the attention function: one query token
    goes to decode_attention_append (the kernel writes it), anything else (two query tokens here) to SDPA
    after the write."""
    layer = llm_cache.layer_class()(max_cache_len=8, length=torch.tensor(3))
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, False  # what transformers' SDPA function reads
    module.__dict__[llm_cache.ATTRIBUTE] = layer
    first = torch.randn(1, 2, 3, 16, generator=rng)
    layer.update(first, first + 1)  # the prefill: written at once, rows 3..5 (the fill level is the owner's)
    assert torch.equal(layer.keys[:, :, 3:6], first) and layer.pending is None
    layer.defer = True
    mask = (torch.arange(8) <= 3)[None, None, None, :]
    for queries in (1, 2):
        kn, vn = torch.randn(1, 2, 1, 16, generator=rng), torch.randn(1, 2, 1, 16, generator=rng)
        keys, values = layer.update(kn, vn)
        assert layer.pending is not None and not torch.equal(keys[:, :, 3:4], kn)  # not written yet
        q = torch.randn(1, 4, queries, 16, generator=rng)
        m = mask.expand(1, 1, queries, 8)
        out, _ = llm_attention.attention(module, q, keys, values, m, scaling=0.25)
        assert layer.pending is None and llm_cache.pending_layers(SimpleNamespace(layers=[layer])) == 0
        assert torch.equal(layer.keys[:, :, 3:4], kn) and torch.equal(layer.values[:, :, 3:4], vn)
        want = torch.nn.functional.scaled_dot_product_attention(
            q, keys.repeat_interleave(2, 1), values.repeat_interleave(2, 1), attn_mask=m, scale=0.25)
        torch.testing.assert_close(out, want.transpose(1, 2))


def test_the_compiled_step_writes_the_cache_only_through_the_kernel(tiny_models):
    """torch.compile of a decode step with gpuopt's attention: one decode_attention_append per layer on the
    cache tensors themselves (inductor re-inplaces the mutation: no copy of a cache), no index_copy_ into
    them, and the same logits as the eager step."""
    from torch._inductor.utils import run_and_get_code

    models = tiny_models["tiny-opt"]
    prompt = models.prompt(1, 6)
    d = Decoder(models.reference, "static", prompt, 5, gpuopt._C.StepClock(-1, 5), torch.float32, attention="gpuopt")
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
    calls = [line for line in code.splitlines() if "torch.ops.gpuopt.decode_attention_append.default(" in line]
    assert len(calls) == layers, calls
    # no mask handed over: causal, the keys bounded by the position (mask None, causal True)
    assert all(re.search(r", None, [^,()]+, True\)", line) for line in calls), calls
    assert "clone" not in code
    # the only index_copy left is the Decoder's own token record
    assert code.count("index_copy") == sum(line.count("index_copy") for line in code.splitlines()
                                           if "argmax" in line), [ln for ln in code.splitlines() if "index_copy" in ln]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_the_prefill_and_everything_else_go_to_sdpa(rng):
    """One query token on the operator; several (a prefill), dropout, a float mask or a softcap to SDPA."""
    q, k, v, m = _inputs(1, 4, 2, 6, 16, torch.float32, rng)
    assert llm_attention.takes(q, k, v, m) and llm_attention.takes(q, k, v, None)
    assert not llm_attention.takes(q.expand(1, 4, 3, 16), k, v, m)
    assert not llm_attention.takes(q, k, v, m, dropout=0.1)
    assert not llm_attention.takes(q, k, v, m.float())
    assert not llm_attention.takes(q, k, v, m, softcap=30.0)
    assert not llm_attention.takes(q.half(), k, v, m)


def test_shapes_the_operator_would_refuse_go_to_sdpa(rng):
    q, k, v, m = _inputs(1, 4, 2, 6, 16, torch.float32, rng)
    assert not llm_attention.takes(q, k, v[..., :8], m)  # a value head size of its own (MLA-like)
    assert not llm_attention.takes(q, k[..., :8], v[..., :8], m)  # q's head size is not k's
    assert not llm_attention.takes(q, k, v, m[..., :5])  # a mask over other keys
    assert not llm_attention.takes(q[:, :3], k, v, m)  # 3 query heads over 2 KV heads
    assert not llm_attention.takes(q.requires_grad_(), k, v, m)  # no backward
    with torch.no_grad():
        assert llm_attention.takes(q, k, v, m)


def test_the_default_attention_is_gpuopts_on_cuda_for_the_head_sizes_it_takes(tiny_models):
    from types import SimpleNamespace

    from gpuopt.llm.measure import default_attention
    from gpuopt.llm.models import Shape

    model = tiny_models["tiny-opt"].reference

    def models(heads, kv_heads, head_dim=64, device="cuda"):
        return SimpleNamespace(device=torch.device(device), reference=model,
                               shape=Shape(2, heads * head_dim, heads, kv_heads, head_dim, 512))

    assert default_attention(models(32, 32), "static-graph") == "gpuopt"
    assert default_attention(models(32, 8), "static-graph") == "gpuopt"  # grouped KV heads too
    assert default_attention(models(4, 4, head_dim=16), "static-graph") == "model"  # a head size it lacks
    assert default_attention(models(32, 32), "hf-generate") == "model"
    assert default_attention(models(32, 32, device="cpu"), "static") == "model"


def test_a_model_whose_attention_never_reaches_the_kernel_is_recorded_as_its_own(tiny_models, monkeypatch):
    models = tiny_models["tiny-opt"]
    monkeypatch.setattr(llm_attention, "takes", lambda *a, **k: False)
    d = Decoder(models.reference, "static", models.prompt(1, 5), 4, gpuopt._C.StepClock(-1, 4), torch.float32,
                attention="gpuopt")
    try:
        assert d.attention == "model" and "did not apply to OPTForCausalLM" in d.attention_note
        assert models.reference.config._attn_implementation == "sdpa"  # switched back at once
    finally:
        d.close()


def test_a_decoder_that_fails_to_set_up_restores_the_models_attention(tiny_models, monkeypatch):
    models = tiny_models["tiny-opt"]

    def boom(self):
        raise RuntimeError("set-up failed")

    monkeypatch.setattr(Decoder, "_check_attention", boom)
    with pytest.raises(RuntimeError, match="set-up failed"):
        Decoder(models.reference, "static", models.prompt(1, 5), 4, gpuopt._C.StepClock(-1, 4), torch.float32,
                attention="gpuopt")
    assert models.reference.config._attn_implementation == "sdpa"


def test_a_second_decoder_on_a_switched_model_is_refused(tiny_models):
    models = tiny_models["tiny-opt"]
    first = Decoder(models.reference, "static", models.prompt(1, 5), 4, gpuopt._C.StepClock(-1, 4), torch.float32,
                    attention="gpuopt")
    try:
        with pytest.raises(RuntimeError, match="runs gpuopt's decode attention for another Decoder"):
            Decoder(models.reference, "static", models.prompt(1, 5), 4, gpuopt._C.StepClock(-1, 4), torch.float32)
    finally:
        first.close()
    assert models.reference.config._attn_implementation == "sdpa"


def test_the_fp32_reference_itself_as_candidate_keeps_a_pristine_reference(tiny_models):
    """fp32, unfused: the candidate is the reference model; its reference run comes first."""
    models = tiny_models["tiny-llama"]
    r = gpuopt.measure_decode(models, path="static", precision="fp32", fuse=False, prompt_len=5, new_tokens=4,
                              attention="gpuopt", max_time_s=0.2)
    assert r.attention == "gpuopt" and r.parity is not None and r.parity.passed, r.parity
    assert r.kv_writes_in_attention == models.config.num_hidden_layers
    assert models.reference.config._attn_implementation == "sdpa"


def test_a_failing_reference_run_is_the_cells_parity_error(tiny_models, monkeypatch):
    models = tiny_models["tiny-gpt2"]

    def fail(*_a, **_k):
        raise torch.OutOfMemoryError("out of memory in the fp32 reference")

    monkeypatch.setattr(models, "reference_run", fail)
    r = gpuopt.measure_decode(models, path="static", precision="fp32", prompt_len=7, new_tokens=3,
                              attention="gpuopt", max_time_s=0.2)
    assert r.parity is None and "the fp32 reference run failed: OutOfMemoryError" in r.parity_error
    assert r.tpot_ms["p50"] > 0  # the timings stand


def test_attention_is_checked_and_applies_to_gpuopts_paths_only(tiny_models):
    with pytest.raises(ValueError, match="attention must be one of model, gpuopt, got 'flash'"):
        gpuopt.measure_decode(tiny_models["tiny-opt"], path="static", precision="fp32", attention="flash")
    with pytest.raises(ValueError, match="attention='gpuopt' applies to gpuopt's static paths"):
        gpuopt.measure_decode(tiny_models["tiny-opt"], path="hf-generate", precision="fp32", attention="gpuopt")


def test_measure_decode_records_the_attention_that_ran(tiny_models):
    models = tiny_models["tiny-opt"]
    r = gpuopt.measure_decode(models, path="static", precision="fp32", prompt_len=6, new_tokens=4,
                              attention="gpuopt", max_time_s=0.2)
    assert r.attention == "gpuopt" and r.parity is not None and r.parity.passed, r.parity
    assert r.llm_dict()["attention"] == "gpuopt"
    r = gpuopt.measure_decode(models, path="static", precision="fp32", prompt_len=6, new_tokens=4, max_time_s=0.2)
    assert r.attention == "model"  # the default on the CPU
    assert models.reference.config._attn_implementation == "sdpa"


def test_a_model_outside_the_attention_interface_is_refused(tiny_models, monkeypatch):
    models = tiny_models["tiny-opt"]
    monkeypatch.setattr(type(models.reference), "_can_set_attn_implementation", classmethod(lambda cls: False))
    with pytest.raises(ValueError, match="attention='gpuopt' needs a model that dispatches through transformers' "
                                         "attention interface; tiny-opt"):
        gpuopt.measure_decode(models, path="static", precision="fp32", attention="gpuopt")


# ---- CUDA ------------------------------------------------------------------------------------------------


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("d", [32, 64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,h,hkv,keys", [(1, 32, 32, 384), (2, 8, 2, 1), (3, 4, 1, 1000), (1, 2, 2, 5000),
                                          (2, 4, 2, 2049)])
def test_cuda_kernel_matches_sdpa(d, dtype, b, h, hkv, keys, rng):
    # 5000 and 2049 keys over few heads are split over several blocks per head (split-KV), the others not.
    q, k, v, m = _inputs(b, h, hkv, keys, d, dtype, rng, device="cuda")
    _check(ops.decode_attention(q, k, v, m), q, k, v, m)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("mask", ["heads", "shared", None])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_kernel_takes_each_mask_layout(mask, dtype, rng):
    q, k, v, m = _inputs(2, 8, 4, 77, 64, dtype, rng, device="cuda", mask=mask)
    _check(ops.decode_attention(q, k, v, m, 0.2), q, k, v, m, scale=0.2)


@pytest.mark.gpuopt_gpu
def test_cuda_kernel_reads_a_strided_cache_and_gives_zeros_to_a_fully_masked_query(rng):
    # A slice of a longer cache (row stride larger than head_dim * keys), masks with every key off.
    q, k, v, m = _inputs(2, 4, 4, 64, 64, torch.float16, rng, device="cuda", mask="heads")
    k, v = k[:, :, :40], v[:, :, :40]
    m = m[..., :40].clone()
    m[0, 1] = False
    out = ops.decode_attention(q, k, v, m)
    assert torch.equal(out[0, 0, 1], torch.zeros(64, device="cuda", dtype=torch.float16))
    m[0, 1, 0, 0] = True  # one key left: SDPA's answer again
    _check(ops.decode_attention(q, k, v, m), q, k, v, m)


@pytest.mark.gpuopt_gpu
def test_split_kv_runs_its_combine_kernel_and_gives_zeros_to_a_fully_masked_query(rng):
    # 2 (batch, head) pairs over 4,096 keys: split over several blocks per pair, then combined.
    q, k, v, m = _inputs(1, 2, 2, 4096, 64, torch.float16, rng, device="cuda", mask="heads")
    m[0, 1] = False  # every split of head 1 sees no key
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = ops.decode_attention(q, k, v, m)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("decode_attention_combine<" in n for n in names), names
    assert torch.equal(out[0, 0, 1], torch.zeros(64, device="cuda", dtype=torch.float16))
    m[0, 1, 0, 4000] = True  # one key, in the last split
    _check(ops.decode_attention(q, k, v, m), q, k, v, m)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("d", [16, 80])
def test_other_head_sizes_and_strided_rows_take_the_reference_on_cuda(d, rng):
    q, k, v, m = _inputs(2, 4, 2, 30, d, torch.float16, rng, device="cuda")
    _check(ops.decode_attention(q, k, v, m), q, k, v, m)
    q2 = torch.randn(2, 4, 1, 2 * d, device="cuda", dtype=torch.float16)[..., ::2]  # head_dim stride 2
    _check(ops.decode_attention(q2, k, v, m), q2, k, v, m)


@pytest.mark.gpuopt_gpu
def test_cuda_kernel_runs_where_it_applies(rng):
    q, k, v, m = _inputs(1, 32, 32, 384, 64, torch.float16, rng, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        ops.decode_attention(q, k, v, m)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("decode_attention<" in n for n in names), names


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("keys", [256, 4096])  # one block per head; split-KV with its workspace
def test_captured_in_a_cuda_graph_follows_the_mask_in_place(keys, rng):
    q, k, v, m = _inputs(1, 32, 8, keys, 64, torch.float16, rng, device="cuda", mask=None)
    mask = torch.zeros(1, 1, 1, keys, dtype=torch.bool, device="cuda")
    mask[..., :10] = True
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.decode_attention(q, k, v, mask)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.decode_attention(q, k, v, mask)
    for length in (10, 11, 200, keys - 1):
        mask[..., :length] = True
        graph.replay()
        torch.cuda.synchronize()
        _check(out, q, k, v, mask)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_opcheck_on_cuda(dtype, rng):
    q, k, v, m = _inputs(2, 8, 2, 100, 64, dtype, rng, device="cuda")
    torch.library.opcheck(ops.decode_attention.default, (q, k, v, m, None))


@pytest.mark.gpuopt_gpu
def test_bad_inputs_on_cuda_are_typed_errors(rng):
    q, k, v, m = _inputs(1, 4, 4, 8, 64, torch.float16, rng, device="cuda")
    with pytest.raises(ValueError, match=r"k and v must be on q's device \(cuda:0\), got cpu and cuda:0"):
        ops.decode_attention(q, k.cpu(), v, m)
    with pytest.raises(ValueError, match=r"mask must be on q's device \(cuda:0\), got cpu"):
        ops.decode_attention(q, k, v, m.cpu())


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,h,hkv,keys,d,position", [(1, 32, 32, 384, 64, 200), (2, 32, 8, 100, 128, 0),
                                                     (1, 8, 2, 5000, 64, 3000),  # split-KV: a later split writes
                                                     (1, 8, 2, 5000, 64, 1250), (3, 4, 4, 64, 32, 63),
                                                     (1, 16, 16, 300, 256, 299), (2, 4, 2, 40, 80, 7)])  # 80: reference
def test_cuda_append_writes_the_row_and_attends_to_it(dtype, b, h, hkv, keys, d, position, rng):
    _check_append(*_append_inputs(b, h, hkv, keys, d, dtype, rng, position, device="cuda"), dtype)


@pytest.mark.gpuopt_gpu
def test_cuda_append_runs_the_kernel_and_a_position_outside_the_cache_writes_nothing(rng):
    q, k, v, kn, vn, pos, m = _append_inputs(1, 8, 2, 64, 64, torch.float16, rng, 10, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        ops.decode_attention_append(q, k, v, kn, vn, pos, m)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(names) == 1 and "kernels::decode_attention<" in names[0], names  # no index_copy, no reference
    before = (k.clone(), v.clone())
    out = ops.decode_attention_append(q, k, v, kn, vn, torch.tensor([64], device="cuda"), m)
    torch.cuda.synchronize()
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])
    _check(out, q, k, v, m)  # the cache as it is: the new row takes no part


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("keys", [256, 4096])  # one block per head; split-KV
@pytest.mark.parametrize("causal", [False, True])  # the mask read, or the keys bounded by the position
def test_cuda_append_captured_in_a_graph_follows_the_position_in_place(keys, causal, rng):
    q, k, v, kn, vn, pos, _ = _append_inputs(1, 32, 8, keys, 64, torch.float16, rng, 0, device="cuda")
    mask = (torch.arange(keys, device="cuda") <= pos)[None, None, None, :]
    args = (None, None, True) if causal else (mask,)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.decode_attention_append(q, k, v, kn, vn, pos, *args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.decode_attention_append(q, k, v, kn, vn, pos, *args)
    for position in (1, 2, 1500 % keys, keys - 1):
        pos.fill_(position)
        mask.copy_((torch.arange(keys, device="cuda") <= position)[None, None, None, :])
        kn.normal_()
        vn.normal_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(k[:, :, position], kn[:, :, 0]) and torch.equal(v[:, :, position], vn[:, :, 0])
        _check(out, q, k, v, mask)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,h,hkv,keys,d,position", [(1, 32, 32, 384, 64, 200), (1, 32, 32, 384, 64, 0),
                                                     (1, 32, 32, 384, 64, 383), (2, 8, 2, 100, 128, 57),
                                                     (1, 4, 4, 1000, 256, 999), (1, 2, 1, 70, 32, 3),
                                                     (1, 8, 2, 5000, 64, 3000), (4, 32, 32, 700, 64, 650),
                                                     (2, 4, 2, 40, 80, 7)])  # 80: the reference on CUDA
@pytest.mark.parametrize("with_mask", [False, True])
def test_cuda_causal_append_reads_no_row_past_the_position(dtype, b, h, hkv, keys, d, position, with_mask, rng):
    """causal=True: the answer of the causal mask (and the given mask, if any), with the rows past the
    position NaN (a block that read one would spread it), with and without split-KV (5,000 keys), and
    through the float32 reference (head size 80)."""
    q, k, v, kn, vn, pos, m = _append_inputs(b, h, hkv, keys, d, dtype, rng, position, device="cuda")
    extra = None
    if with_mask:
        extra = torch.rand(b, h, 1, keys, generator=rng).to("cuda") < 0.7
        extra[..., position] = True
        m = m & extra
    want_k, want_v = k.clone(), v.clone()
    want_k[:, :, position] = kn[:, :, 0]
    want_v[:, :, position] = vn[:, :, 0]
    k[:, :, position:] = float("nan")
    v[:, :, position:] = float("nan")
    got = ops.decode_attention_append(q, k, v, kn, vn, pos, extra, None, True)
    assert torch.equal(k[:, :, :position + 1], want_k[:, :, :position + 1])
    assert torch.equal(v[:, :, :position + 1], want_v[:, :, :position + 1])
    want_k[:, :, position + 1:] = 0  # masked: any value gives the reference's answer
    want_v[:, :, position + 1:] = 0
    _check(got, q, want_k, want_v, m)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("keys", [384, 5000])  # one block per head; split-KV
def test_cuda_causal_append_outside_the_cache_writes_nothing(keys, rng):
    """A position past the end attends to the whole cache, a negative one to no key (zeros); neither writes."""
    q, k, v, kn, vn, _, _ = _append_inputs(1, 8, 2, keys, 64, torch.float16, rng, 0, device="cuda")
    before = (k.clone(), v.clone())
    out = ops.decode_attention_append(q, k, v, kn, vn, torch.tensor([keys], device="cuda"), None, None, True)
    torch.cuda.synchronize()
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])
    _check(out, q, k, v, None)
    out = ops.decode_attention_append(q, k, v, kn, vn, torch.tensor([-1], device="cuda"), None, None, True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(k, before[0])


@pytest.mark.gpuopt_gpu
def test_cuda_append_opcheck_and_bad_inputs(rng):
    args = _append_inputs(2, 8, 2, 100, 64, torch.float16, rng, 50, device="cuda")
    torch.library.opcheck(ops.decode_attention_append.default, (*args, None))
    q, k, v, kn, vn, pos, m = args
    with pytest.raises(ValueError, match="k, v and position must be on the caches' device"):
        ops.decode_attention_append(q, k, v, kn, vn, pos.cpu(), m)
    with pytest.raises(RuntimeError, match="unsupported operation"):  # an expanded cache: its rows overlap
        ops.decode_attention_append(q, k[:1].expand(2, -1, -1, -1), v, kn, vn, pos, m)
