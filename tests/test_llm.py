"""LLM prefill/decode on the CPU: models and their byte/FLOP facts, parity, the static-cache decode step
against transformers' generate, the measurement's definitions, sweeps that record failures."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

import gpuopt  # noqa: E402
from gpuopt.llm import parity as llm_parity  # noqa: E402
from gpuopt.llm.measure import Models  # noqa: E402
from gpuopt.llm.models import (  # noqa: E402
    Shape,
    build_model,
    decode_weight_bytes,
    model_config,
    prefill_flops,
)
from gpuopt.llm.paths import Decoder, cache_tensors  # noqa: E402

TINY = ("tiny-llama", "tiny-opt", "tiny-gpt2")


@pytest.fixture(scope="module")
def tiny_models():
    return {name: Models(name, "cpu", seed=1) for name in TINY}


# -- models ------------------------------------------------------------------------------------------

def test_built_in_names_build_random_causal_lms():
    for name in gpuopt.llm.LLM_MODELS:
        cfg = model_config(name)
        assert cfg.vocab_size > 0 and cfg.eos_token_id is None
    m = build_model("tiny-llama", seed=3)
    again = build_model("tiny-llama", seed=3)
    other = build_model("tiny-llama", seed=4)
    w = m.model.layers[0].mlp.up_proj.weight
    assert torch.equal(w, again.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(w, other.model.layers[0].mlp.up_proj.weight)
    assert 0.005 < float(w.detach().std()) < 0.05  # transformers' own initialisation, not zeros


def test_llama_1b_has_about_a_billion_parameters():
    cfg = model_config("llama-1b")
    s = Shape.of(cfg)
    per_layer = 2 * s.hidden * s.heads * s.head_dim + 2 * s.hidden * s.kv_heads * s.head_dim + 3 * s.hidden * 8192
    total = s.layers * per_layer + s.vocab * s.hidden  # tied output layer
    assert 1.1e9 < total < 1.4e9 and s.kv_heads == 8


def test_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match=r"unknown model 'opt-13b'.*opt-125m, opt-1.3b, gpt2, llama-1b"):
        model_config("opt-13b")
    with pytest.raises(ValueError, match="unknown model"):
        gpuopt.measure_decode("opt-13b", device="cpu")


def test_a_module_that_is_not_a_causal_lm_is_a_type_error():
    with pytest.raises(TypeError, match=r"model must be a Hugging Face causal LM.*got Linear"):
        gpuopt.measure_decode(torch.nn.Linear(4, 4), device="cpu")
    with pytest.raises(TypeError, match=r"models must be a Hugging Face causal LM.*got Sequential"):
        gpuopt.decode_sweep([torch.nn.Sequential()], device="cpu")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"prompt_len": 0}, ValueError, "prompt_len must be an integer >= 1, got 0"),
    ({"new_tokens": -3}, ValueError, "new_tokens must be an integer >= 1, got -3"),
    ({"prompt_len": True}, TypeError, "prompt_len must be an integer"),
    ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1, got 0"),
    ({"prompt_len": 200, "new_tokens": 100}, ValueError,
     r"prompt_len \+ new_tokens = 200 \+ 100 = 300 exceeds tiny-gpt2's maximum positions \(256\)"),
    ({"path": "vllm"}, ValueError, "path must be one of hf-generate, hf-static-compile, static"),
    ({"path": "static-graph"}, ValueError, "needs a CUDA device"),
    ({"precision": "int4"}, ValueError, "precision must be one of fp32, fp16, bf16, int8wo"),
])
def test_bad_cells_are_named(tiny_models, kwargs, error, match):
    args = {"path": "static", "precision": "fp32", "prompt_len": 8, "new_tokens": 4, **kwargs}
    with pytest.raises(error, match=match):
        gpuopt.measure_decode(tiny_models["tiny-gpt2"], **args)


def test_sweeps_check_every_cell_before_running():
    with pytest.raises(ValueError, match="exceeds tiny-opt's maximum positions"):
        gpuopt.decode_sweep("tiny-opt", paths="static", precisions="fp32", prompt_lens=[8, 250], new_tokens=16,
                            device="cpu")
    with pytest.raises(ValueError, match="batch_sizes must not repeat"):
        gpuopt.decode_sweep("tiny-opt", paths="static", batch_sizes=[1, 1], device="cpu")
    with pytest.raises(ValueError, match="max_time_s"):
        gpuopt.decode_sweep("tiny-opt", paths="static", device="cpu", max_time_s=-1)


@pytest.mark.parametrize("name", TINY)
def test_kv_bytes_per_token_match_the_static_cache(tiny_models, name):
    models = tiny_models[name]
    prompt = models.prompt(3, 8)
    d = Decoder(models.reference, "static", prompt, 5, gpuopt._C.StepClock(-1, 5), torch.float32)
    allocated = sum(t.numel() * t.element_size() for t in cache_tensors(d.cache))
    assert allocated == models.shape.kv_bytes_per_token(4) * 3 * (8 + 5)
    assert d.kv_cache_bytes() == allocated


def test_decode_weight_bytes_count_lookup_tables_by_the_row():
    opt = build_model("tiny-opt")
    every = sum(p.numel() * p.element_size() for p in opt.parameters())
    positions = opt.model.decoder.embed_positions.weight
    row = positions.shape[1] * positions.element_size()
    # The input embedding is the tied output layer (read whole); the position table is looked up.
    assert decode_weight_bytes(opt, 1) == every - positions.numel() * positions.element_size() + row
    assert decode_weight_bytes(opt, 4) == decode_weight_bytes(opt, 1) + 3 * row
    llama = build_model("tiny-llama")
    assert decode_weight_bytes(llama, 2) == sum(p.numel() * p.element_size() for p in llama.parameters())


def test_prefill_flops_match_torch_flop_counter_for_the_linear_layers():
    from torch.utils.flop_counter import FlopCounterMode

    m = build_model("tiny-llama")
    b, p = 2, 16
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        m(input_ids=torch.randint(0, 512, (b, p)), logits_to_keep=1)
    shape = Shape.of(m.config)
    attention = 4 * shape.layers * shape.heads * shape.head_dim * b * p * (p + 1) / 2
    linear = prefill_flops(m, shape, b, p) - attention
    # torch's counter sees the matmuls; the CPU's attention kernel is not counted by it
    assert linear == pytest.approx(counter.get_total_flops(), rel=1e-6)


# -- parity -------------------------------------------------------------------------------------------

def _logits(n, b, v, gen):
    return torch.randn(n, b, v, generator=gen)


def test_parity_identical_passes_and_counts_every_token():
    g = torch.Generator().manual_seed(0)
    ref = _logits(6, 3, 50, g)
    toks = ref.argmax(-1).t()
    p = llm_parity.compare(toks, ref, toks.clone(), ref.clone(), precision="fp16", teacher_forced=True)
    assert p.passed and p.tokens_equal == p.tokens_compared == 18 and p.first_mismatch is None
    assert p.matched_prefix == 6 and p.worst_logits_rel_err == 0.0


def test_parity_excuses_a_flip_only_at_a_near_tie():
    g = torch.Generator().manual_seed(1)
    ref = _logits(4, 1, 20, g)
    ref[2, 0, 3], ref[2, 0, 7] = 5.0, 4.999  # step 2 is a near-tie between tokens 3 and 7
    toks = ref.argmax(-1).t()
    cand = ref.clone()
    cand[2, 0, 7] += 0.002  # an error of 0.002 flips it
    ctoks = cand.argmax(-1).t()
    p = llm_parity.compare(toks, ref, ctoks, cand, precision="fp16", teacher_forced=True)
    assert p.first_mismatch == 2 and p.excused == 1 and p.unexcused == 0 and p.passed
    assert p.tokens_equal == 3 and p.matched_prefix == 2
    # The same flip where the reference was decided is not excused.
    ref2 = ref.clone()
    ref2[2, 0, 7] = 3.0
    cand2 = ref2.clone()
    cand2[2, 0, 7] += 2.5
    p2 = llm_parity.compare(ref2.argmax(-1).t(), ref2, cand2.argmax(-1).t(), cand2, precision="fp16",
                            teacher_forced=True)
    assert p2.unexcused == 1 and not p2.passed


def test_parity_free_running_stops_at_the_first_difference():
    g = torch.Generator().manual_seed(2)
    ref = _logits(8, 2, 30, g)
    toks = ref.argmax(-1).t()
    cand = ref.clone()
    cand[3:] = _logits(5, 2, 30, g)  # the histories part at step 3
    p = llm_parity.compare(toks, ref, cand.argmax(-1).t(), cand, precision="bf16", teacher_forced=False)
    assert p.steps <= 4 and p.first_mismatch == 3
    assert p.tokens_compared == 2 * p.steps


def test_parity_fails_on_a_logits_error_beyond_the_tolerance():
    g = torch.Generator().manual_seed(3)
    ref = _logits(3, 2, 40, g)
    cand = ref * 1.2  # same argmax, 20% off
    toks = ref.argmax(-1).t()
    p = llm_parity.compare(toks, ref, toks, cand, precision="fp16", teacher_forced=True)
    assert p.unexcused == 0 and not p.passed and p.worst_logits_rel_err == pytest.approx(0.2, rel=1e-5)


# -- decode paths on the CPU ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_static_step_generates_what_generate_does(tiny_models, name):
    models = tiny_models[name]
    prompt = models.prompt(2, 7)
    n = 9
    clock = gpuopt._C.StepClock(-1, n)
    d = Decoder(models.reference, "static", prompt, n, clock, torch.float32)
    d.request()
    hf = Decoder(models.reference, "hf-generate", prompt, n, clock, torch.float32)
    hf.request()
    assert torch.equal(d.tokens(), hf.tokens()), (d.tokens(), hf.tokens())
    ref_tokens, ref_logits = models.reference_run(prompt, n)
    assert torch.equal(ref_tokens, hf.tokens())
    tokens, logits = d.forced_logits(ref_tokens, n)
    assert torch.equal(tokens, ref_tokens)
    assert float((logits - ref_logits).abs().max() / ref_logits.abs().max()) < 1e-4
    reqs = clock.requests()
    assert reqs["tokens"] == [n, n]


@pytest.mark.parametrize("name", TINY)
def test_fused_projections_generate_the_same_tokens_and_count_each_weight_once(tiny_models, name):
    """gpuopt's static paths run q/k/v (and a gated MLP's gate/up) as one linear layer: same tokens,
    logits within fp32 rounding, the same bytes per step; GPT-2's attention is fused already."""
    models = tiny_models[name]
    fused = models.candidate("fp32", fused=True)
    layers = models.config.num_hidden_layers
    assert models.fused_groups["fp32"] == {"tiny-llama": 2 * layers, "tiny-opt": layers, "tiny-gpt2": 0}[name]
    assert decode_weight_bytes(fused, 1) == decode_weight_bytes(models.reference, 1)
    # OPT scales its query after the projection: folded into the fused weights, its scaling now 1.0
    scaled = [m for m in fused.modules() if type(m).__name__ == "OPTAttention"]
    assert len(scaled) == (layers if name == "tiny-opt" else 0)
    head_dim = models.config.hidden_size // models.config.num_attention_heads
    assert all(m.scaling == 1.0 and m.q_proj.first_scale == head_dim ** -0.5 for m in scaled)
    prompt = models.prompt(2, 7)
    n = 9
    ref_tokens, ref_logits = models.reference_run(prompt, n)
    d = Decoder(fused, "static", prompt, n, gpuopt._C.StepClock(-1, n), torch.float32)
    tokens, logits = d.forced_logits(ref_tokens, n)
    assert torch.equal(tokens, ref_tokens)
    assert float((logits - ref_logits).abs().max() / ref_logits.abs().max()) < 1e-4


def test_a_fused_projection_called_on_another_input_computes_its_own_output():
    from gpuopt.llm.fuse import FusedProjections, ProjectionPart, fuse_projections

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4, bias=False)
            self.v_proj = torch.nn.Linear(8, 4)

    a = Attn()
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    want = [a.q_proj(x), a.k_proj(y), a.v_proj(x)]
    assert fuse_projections(a) == 1
    assert isinstance(a.q_proj, FusedProjections) and isinstance(a.k_proj, ProjectionPart)
    assert [n for n, _ in a.named_parameters()] == ["q_proj.linear.weight", "q_proj.linear.bias"]
    got = [a.q_proj(x), a.k_proj(y), a.v_proj(x)]  # k on y: not the fused call's input
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # The same tensor changed in place since the fused call (a static buffer of the next step): the
    # parts are computed afresh, never the stale ones.
    a.q_proj(x)
    x.add_(1.0)
    torch.testing.assert_close(a.k_proj(x), x @ a.q_proj.linear.weight[8:12].T)
    # Once every part was taken, nothing of the call is kept (no activations held until the next call).
    a.q_proj(y), a.k_proj(y), a.v_proj(y)
    assert a.q_proj._last is None


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fused_projections_trace_in_one_graph_under_torch_compile(backend):
    """The static-graph-compile path compiles the decode step with fullgraph=True: the fused layer's
    bookkeeping must trace without a graph break (a version-counter read once broke it on the H100)."""
    from gpuopt.llm.fuse import fuse_projections

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(8, 8), torch.nn.Linear(8, 4),
                                                     torch.nn.Linear(8, 4))
            self.ln = torch.nn.LayerNorm(8)

        def forward(self, x):
            h = self.ln(x)
            return self.q_proj(h).sum(-1) + self.k_proj(h).sum(-1) + self.v_proj(h).sum(-1)

    a, x = Attn(), torch.randn(3, 8)
    want = a(x)
    assert fuse_projections(a) == 1
    torch._dynamo.reset()
    compiled = torch.compile(a, backend=backend, fullgraph=True)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), want)
        torch.testing.assert_close(compiled(x + 1.0), a(x + 1.0))


def test_fuse_applies_to_gpuopts_paths_only(tiny_models):
    with pytest.raises(ValueError, match="fuse=True applies to gpuopt's static paths"):
        gpuopt.measure_decode(tiny_models["tiny-opt"], path="hf-generate", precision="fp32", fuse=True)
    with pytest.raises(TypeError, match="fuse must be True, False or None, got 'yes'"):
        gpuopt.measure_decode(tiny_models["tiny-opt"], path="static", precision="fp32", fuse="yes")


def test_teacher_forcing_feeds_the_reference_history(tiny_models):
    models = tiny_models["tiny-opt"]
    prompt = models.prompt(1, 5)
    d = Decoder(models.reference, "static", prompt, 6, gpuopt._C.StepClock(-1, 6), torch.float32)
    other = torch.randint(0, models.shape.vocab, (1, 6))
    _, forced = d.forced_logits(other, 6)
    _, free = d.forced_logits(None, 6)
    assert torch.equal(forced[0], free[0])  # the prefill does not depend on the fed tokens
    assert not torch.allclose(forced[1:], free[1:])


@pytest.mark.parametrize("name", TINY)
def test_static_steps_trace_without_host_synchronization(tiny_models, name):
    """What a CUDA graph capture needs of the steps -- no .item(), no data-dependent Python branch --
    is what torch.compile(fullgraph=True) needs too: traced here on the CPU with the eager backend."""
    models = tiny_models[name]
    d = Decoder(models.reference, "static", models.prompt(2, 6), 4, gpuopt._C.StepClock(-1, 4), torch.float32)
    torch._dynamo.reset()
    prefill = torch.compile(d._prefill_step, backend="eager", fullgraph=True, dynamic=False)
    step = torch.compile(d._decode_step, backend="eager", fullgraph=True, dynamic=False)
    with torch.inference_mode():
        eager_first = d._prefill_step().clone()
        eager_logits = d._decode_step().clone()
        traced_first = prefill()
        traced_logits = step()
    assert torch.allclose(eager_first, traced_first, atol=1e-5)
    assert torch.allclose(eager_logits, traced_logits, atol=1e-5)


@pytest.mark.parametrize("name", TINY)
def test_static_steps_read_nothing_back_to_the_host_under_capture(tiny_models, name, monkeypatch):
    """A CUDA graph capture fails on any device value read on the host. Simulated on the CPU:
    transformers is told a stream is capturing (it then takes its capture-safe branches, as it does on
    the GPU), and every way of reading a tensor's value into Python raises."""
    import transformers.utils.import_utils as iu

    models = tiny_models[name]
    d = Decoder(models.reference, "static", models.prompt(2, 6), 4, gpuopt._C.StepClock(-1, 4), torch.float32)
    monkeypatch.setattr(iu, "is_cuda_stream_capturing", lambda: True)

    def host_read(*_args, **_kwargs):
        raise AssertionError("a tensor's value was read on the host: a CUDA graph capture would fail here")

    with torch.inference_mode():
        for attr in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            monkeypatch.setattr(torch.Tensor, attr, host_read)
        try:
            d._prefill_step()
            d._decode_step()
        finally:
            monkeypatch.undo()


def test_compiled_static_path_warms_up_within_the_cache_and_compiles_per_decoder(tiny_models, monkeypatch):
    """static-graph-compile's set-up on the CPU (the capture stubbed, aot_eager instead of inductor): its
    warm-up requests start at position 0 each (the cache holds one request), and decoders built one
    after another do not run into dynamo's recompile limit."""
    import functools

    models = tiny_models["tiny-llama"]
    monkeypatch.setattr(Decoder, "_capture", lambda self: None)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    prompt = models.prompt(2, 16)
    eager = Decoder(models.reference, "static", prompt, 8, gpuopt._C.StepClock(-1, 8), torch.float32)
    eager.request()
    for _ in range(4):
        d = Decoder(models.reference, "static-graph-compile", prompt, 8, gpuopt._C.StepClock(-1, 8), torch.float32)
        with torch.inference_mode():
            d._prefill()
            for _ in range(7):
                d._decode()
        assert torch.equal(d.tokens(), eager.tokens())
        d.close()


def test_hf_static_compile_reuses_one_cache_and_generates_the_eager_tokens(tiny_models, monkeypatch):
    """hf-static-compile on the CPU (aot_eager instead of inductor): generate's own compile of the decode
    step runs on the one StaticCache the decoder passes in, reset between requests, so every request
    gives hf-generate's tokens; a second decoder compiles afresh and close() takes the compiled step off
    the model."""
    models = tiny_models["tiny-llama"]
    real = torch.compile
    compiled = []

    def compile_(fn, **kw):
        compiled.append(kw)
        return real(fn, backend="aot_eager", fullgraph=kw.get("fullgraph", False), dynamic=kw.get("dynamic"))

    monkeypatch.setattr(torch, "compile", compile_)
    prompt = models.prompt(2, 12)
    eager = Decoder(models.reference, "hf-generate", prompt, 6, gpuopt._C.StepClock(-1, 6), torch.float32)
    eager.request()
    for _ in range(2):
        d = Decoder(models.reference, "hf-static-compile", prompt, 6, gpuopt._C.StepClock(-1, 6), torch.float32)
        assert models.reference._compiled_call is not None
        assert d.kv_cache_bytes() > 0
        for _ in range(2):
            d.request()
            assert torch.equal(d.tokens(), eager.tokens())
        d.close()
        assert "_compiled_call" not in models.reference.__dict__
    assert [(kw["mode"], kw["fullgraph"]) for kw in compiled] == [("reduce-overhead", True)] * 2


# -- measurement ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["static", "hf-generate"])
def test_measure_decode_on_cpu_follows_the_definitions(tiny_models, path):
    r = gpuopt.measure_decode(tiny_models["tiny-llama"], path=path, precision="fp32", batch_size=2, prompt_len=8,
                              new_tokens=6, iters=3, max_time_s=60)  # 3 requests, however slow the machine
    assert r.requests == r.measurement.n >= 3
    assert r.ttft_ms["p50"] > 0 and r.tpot_ms["p50"] > 0 and r.itl_ms["n"] == r.requests * 5
    assert r.e2e_ms["mean"] == pytest.approx(r.ttft_ms["mean"] + 5 * r.tpot_ms["mean"], rel=1e-6)
    assert r.output_tokens_per_s == pytest.approx(2 * 6 * 1e3 / r.e2e_ms["mean"])
    assert r.decode_tokens_per_s == pytest.approx(2 * 1e3 / r.tpot_ms["mean"])
    # each request's first-to-last token interval lies inside the engine's timed call (host mode)
    assert r.e2e_ms["p50"] <= r.measurement.p50 and r.e2e_ms["max"] <= r.measurement.max
    assert r.parity is not None and r.parity.passed and r.parity.steps == 6, r.parity.summary()
    assert r.parity.teacher_forced == (path == "static")
    assert r.fused_projections == (0 if path == "hf-generate" else 2 * tiny_models["tiny-llama"].config.num_hidden_layers)
    assert r.kv_bytes_per_token == tiny_models["tiny-llama"].shape.kv_bytes_per_token(4)
    assert (r.kv_cache_bytes is None) == (path == "hf-generate")
    assert r.hbm_read_gbps is None and "CPU" in r.diagnosis
    row = r.to_row()
    assert row.mode == "llm:p8+n6" and row.config == f"fp32+{path}" and row.item_unit == "tokens"
    assert row.latency_ms["p50"] == r.tpot_ms["p50"] and row.throughput_items_per_s == r.decode_tokens_per_s
    back = gpuopt.Row.from_dict(json.loads(json.dumps(row.to_dict(), default=str)))
    assert back.llm["ttft_ms"] == r.ttft_ms and back.is_llm


def test_one_new_token_has_no_tpot(tiny_models):
    r = gpuopt.measure_decode(tiny_models["tiny-opt"], path="static", precision="fp32", prompt_len=4, new_tokens=1,
                              max_time_s=0.2, min_iters=3)
    assert r.tpot_ms is None and r.itl_ms is None and r.decode_tokens_per_s is None
    assert r.ttft_ms["p50"] == pytest.approx(r.e2e_ms["p50"])


@pytest.mark.parametrize("precision", ["bf16", "int8wo"])
def test_lower_precisions_keep_parity_on_cpu(tiny_models, precision):
    r = gpuopt.measure_decode(tiny_models["tiny-llama"], path="static", precision=precision, prompt_len=8,
                              new_tokens=8, max_time_s=0.2, min_iters=3)
    p = r.parity
    assert p is not None and p.worst_logits_rel_err > 0, r.parity_error
    assert p.passed, p.summary()
    if precision == "int8wo":
        assert r.weight_bytes_per_step < 0.5 * gpuopt.measure_decode(
            tiny_models["tiny-llama"], path="static", precision="fp32", prompt_len=8, new_tokens=2, max_time_s=0.1,
            min_iters=3, parity=False).weight_bytes_per_step


def test_sweep_records_failures_and_goes_on(tmp_path, monkeypatch):
    from gpuopt.llm import api

    real = api.measure_decode

    def flaky(models, **kw):
        if kw["batch_size"] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        if kw["batch_size"] == 3:
            raise RuntimeError("capture failed")
        return real(models, **kw)

    monkeypatch.setattr(api, "measure_decode", flaky)
    msgs = []
    res = gpuopt.decode_sweep("tiny-gpt2", paths="static", precisions="fp32", batch_sizes=[1, 2, 3, 4], prompt_lens=4,
                              new_tokens=3, device="cpu", out=tmp_path, progress=msgs.append, max_time_s=0.1,
                              min_iters=3)
    rows = {r.batch_size: r for r in res.rows}
    assert rows[1].ok and rows[4].ok
    assert rows[2].status == "failed" and rows[2].error.startswith("out of memory: CUDA out of memory")
    assert rows[3].error == "RuntimeError: capture failed"
    saved = gpuopt.Results.load(tmp_path / "results.json")
    assert len(saved.rows) == 4 and saved.spec["kind"] == "llm"
    assert len(msgs) == 4
    assert "tiny-gpt2" in str(res.table()) and "LLM decode" in res.to_markdown()


@pytest.mark.parametrize("n", [50272, 32000, 50257, 1031, 64])
def test_split_argmax_is_argmax_with_its_first_index(n, rng):
    """The compiled step's two-level argmax: the same index as argmax, the first of tied maxima (within a
    chunk, across chunks, across the whole row), for vocabularies with and without a usable divisor."""
    from gpuopt.llm.paths import split_argmax

    x = torch.randn(3, n, generator=rng).half()
    torch.testing.assert_close(split_argmax(x), x.argmax(-1), rtol=0, atol=0)
    x[0] = 0
    x[1, [n // 3, n // 3 + 1, n - 1]] = 100  # a tie inside a chunk and one in the last chunk
    x[2, [n - 1, n // 2]] = 100
    got = split_argmax(x)
    assert got.tolist() == [0, n // 3, n // 2] == x.argmax(-1).tolist()
    assert split_argmax(x[0]).shape == () and split_argmax(x[:, None]).shape == (3, 1)
    x[1, n // 2] = float("nan")  # argmax counts NaN as the maximum
    assert split_argmax(x)[1] == x.argmax(-1)[1] == n // 2


def test_split_argmax_compiled_keeps_the_first_index(rng):
    """The compiled step runs inductor's lowering of the two reductions: ties and all, argmax's answer."""
    from gpuopt.llm.paths import split_argmax

    x = torch.randn(4, 50272, generator=rng)
    x[0] = 0
    x[1, [7, 8, 50271]] = 50
    x[2, [50271, 3000]] = 50
    torch._dynamo.reset()
    got = torch.compile(split_argmax, fullgraph=True, dynamic=False)(x)
    assert got.tolist() == x.argmax(-1).tolist() == [0, 7, 3000, int(x[3].argmax())]


def test_a_query_scale_is_folded_into_the_fused_weights_of_the_classes_named(rng):
    """q_proj(x) * scaling, with scaling a power of two, gives the same bits from the fused layer with the
    scale folded in and scaling 1.0; a class not named keeps its scale and its weights."""
    from gpuopt.llm.fuse import fuse_projections

    class OPTAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(16, 16) for _ in range(3))
            self.scaling = 0.125

        def forward(self, x):
            return self.q_proj(x) * self.scaling, self.k_proj(x), self.v_proj(x)

    class OtherAttention(OPTAttention):
        pass

    torch.manual_seed(0)
    a, b = OPTAttention(), OtherAttention()
    x = torch.randn(3, 16, generator=rng)
    want_a, want_b = a(x), b(x)
    assert fuse_projections(a) == 1 and fuse_projections(b) == 1
    assert a.scaling == 1.0 and a.q_proj.first_scale == 0.125
    assert b.scaling == 0.125 and b.q_proj.first_scale == 1.0
    for got, want in ((a(x), want_a), (b(x), want_b)):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    with pytest.raises(TypeError, match="scaled_query must be a tuple of class names, got 'OPTAttention'"):
        fuse_projections(OPTAttention(), scaled_query="OPTAttention")


def test_compile_options_turn_on_inductors_programmatic_launch_only_where_gpuopts_kernels_use_it():
    """triton.enable_pdl only for a CUDA device on which gpuopt's kernels launch programmatically
    (_C.programmatic_launch_runs) and an inductor that has the option; never on the CPU, nor without a
    device."""
    from torch._inductor import config

    from gpuopt import _C
    from gpuopt.llm.passes import DropMulByOne, FuseResidual, compile_options

    for device in (None, "cpu", torch.device("cpu")):
        options = compile_options(device)
        assert set(options) == {"joint_custom_post_pass", "post_grad_custom_post_pass"}, device
        assert isinstance(options["joint_custom_post_pass"], DropMulByOne)
        assert isinstance(options["post_grad_custom_post_pass"], FuseResidual)
    if not torch.cuda.is_available():
        return
    runs = _C.programmatic_launch_runs(0) and hasattr(config.triton, "enable_pdl")
    assert compile_options("cuda:0").get("triton.enable_pdl", False) is runs
    assert compile_options(torch.device("cuda")).get("triton.enable_pdl", False) is runs  # the current device
    before = _C.programmatic_launch(False)
    try:
        assert "triton.enable_pdl" not in compile_options("cuda:0")
    finally:
        _C.programmatic_launch(before)


def test_drop_mul_by_one_removes_only_a_multiplication_that_changes_nothing():
    """The compiled step's pass (gpuopt.llm.passes): x * 1 and 1.0 * x go; x * 2, an int tensor times 1.0
    (a float product) and a product whose input is later written in place stay."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from gpuopt.llm.passes import DropMulByOne

    def f(x, i):
        a = x * 1.0
        b = 1 * x
        c = x * 2.0
        d = i * 1.0  # int64 -> float32: not x
        return a + b + c + d

    def g(x):
        y = x * 1.0  # a copy: x is written below
        x.add_(1)
        return y

    def h(x):
        return x * 1.0 + 0, x * 1.0  # the second is the graph's output: it would be the input itself

    x, i = torch.randn(4), torch.arange(4)
    gm = make_fx(f, tracing_mode="fake")(x, i)
    drop = DropMulByOne()
    drop(gm.graph)
    gm.recompile()
    assert drop.removed == 2
    assert len(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)) == 2
    torch.testing.assert_close(gm(x, i), f(x, i))
    gm = make_fx(g, tracing_mode="fake")(x.clone())
    drop(gm.graph)
    assert drop.removed == 0
    gm = make_fx(h, tracing_mode="fake")(x)
    drop(gm.graph)
    gm.recompile()
    assert drop.removed == 1 and gm(x)[1] is not x
    # inductor's FX graph cache keys on it: the same for the same pass
    assert drop.uuid() == DropMulByOne().uuid() and len(drop.uuid()) >= 16
