"""LLM decode on a GPU: the CUDA-graph token loop driven from C++ produces the eager step's tokens, keeps
parity with the fp32 reference in every precision, and its timings follow the definitions; the
compile paths run; a KV cache that cannot fit is a recorded out-of-memory cell."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import gpuopt  # noqa: E402
from gpuopt.llm import Models  # noqa: E402
from gpuopt.llm.paths import Decoder  # noqa: E402

pytestmark = pytest.mark.gpuopt_gpu


@pytest.fixture(scope="module")
def opt125():
    return Models("opt-125m", "cuda", seed=0)


@pytest.fixture(scope="module")
def tiny():
    return Models("tiny-llama", "cuda", seed=0)


def test_graph_loop_from_cpp_generates_the_eager_steps_tokens(opt125):
    prompt = opt125.prompt(2, 32)
    n = 24
    model = opt125.candidate("fp16")
    eager = Decoder(model, "static", prompt, n, gpuopt._C.StepClock(0, n), torch.float16)
    eager.request()
    graph = Decoder(model, "static-graph", prompt, n, gpuopt._C.StepClock(0, n), torch.float16)
    assert graph.loop is not None
    graph.loop.run()
    torch.cuda.synchronize()
    assert torch.equal(graph.tokens(), eager.tokens())
    graph.loop.run()  # a second request from the same graphs: the same tokens (nothing left over)
    torch.cuda.synchronize()
    assert torch.equal(graph.tokens(), eager.tokens())
    reqs = graph.clock.requests()
    assert reqs["tokens"] == [n, n] and len(reqs["itl_ms"]) == 2 * (n - 1)
    assert all(g > 0 for g in reqs["itl_ms"])


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8wo"])
def test_static_graph_keeps_parity_with_the_fp32_reference(opt125, precision):
    r = gpuopt.measure_decode(opt125, path="static-graph", precision=precision, prompt_len=64, new_tokens=32,
                              parity_tokens=32, max_time_s=1.0)
    assert r.parity is not None, r.parity_error
    assert r.parity.passed and r.parity.teacher_forced and r.parity.steps == 32, r.parity.summary()
    assert r.attention == "gpuopt"  # the default for an MHA model with head size 64 on CUDA
    assert r.kv_writes_in_attention == 12  # every layer's cache update in gpuopt's kernel
    assert r.requests == r.measurement.n >= 5
    assert r.e2e_ms["mean"] == pytest.approx(r.ttft_ms["mean"] + 31 * r.tpot_ms["mean"], rel=1e-6)
    # the engine's whole-request samples and the token clock's end-to-end times are the same requests
    assert r.measurement.p50 == pytest.approx(r.e2e_ms["p50"], rel=0.05)
    assert r.hbm_read_gbps and 0 < r.pct_of_hbm_read < 100
    assert r.kv_cache_bytes == r.kv_bytes_per_token * 1 * (64 + 32)
    assert r.prefill_roofline["achieved_tflops"] > 0 and r.decode_roofline["bound"] in (
        "memory-bound", "latency/launch-bound", "compute-bound")


def test_hf_generate_on_gpu_is_timed_per_token(opt125):
    r = gpuopt.measure_decode(opt125, path="hf-generate", precision="fp16", prompt_len=16, new_tokens=16,
                              max_time_s=1.0)
    assert r.tpot_ms["p50"] > 0 and r.itl_ms["n"] == r.requests * 15
    assert r.parity is not None and not r.parity.teacher_forced and r.parity.unexcused == 0, r.parity.summary()


@pytest.mark.parametrize("path", ["hf-static-compile", "static-graph-compile"])
def test_compile_paths_run_and_keep_parity(tiny, path):
    r = gpuopt.measure_decode(tiny, path=path, precision="fp16", prompt_len=16, new_tokens=8, max_time_s=0.5)
    assert r.tpot_ms["p50"] > 0
    assert r.parity is not None and r.parity.passed, (r.parity_error, r.parity and r.parity.summary())


@pytest.fixture(scope="module")
def gqa32():
    """A small Llama with grouped KV heads (8 query heads over 2 KV heads) of head size 32, one the
    decode attention kernel takes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=256, num_hidden_layers=2, intermediate_size=512,
                                             num_attention_heads=8, num_key_value_heads=2, vocab_size=1024,
                                             max_position_embeddings=512))
    return Models(model, "cuda", seed=0)


@pytest.mark.parametrize("path", ["static-graph", "static-graph-compile"])
def test_grouped_kv_heads_run_gpuopts_attention_and_keep_parity(gqa32, path):
    r = gpuopt.measure_decode(gqa32, path=path, precision="fp16", prompt_len=40, new_tokens=24, parity_tokens=24,
                              max_time_s=0.5)
    assert r.attention == "gpuopt" and r.kv_writes_in_attention == 2, r.warnings
    assert r.parity is not None and r.parity.passed and r.parity.steps == 24, (r.parity_error,
                                                                                r.parity and r.parity.summary())


def test_int8_operator_matches_the_dequantized_matmul_in_the_model(opt125):
    from gpuopt.quant import Int8WeightOnlyLinear

    lin = opt125.reference.model.decoder.layers[0].fc1
    q = Int8WeightOnlyLinear.from_float(lin, torch.float16)
    x = torch.randn(3, lin.in_features, device="cuda", dtype=torch.float16)
    want = (x.float() @ (q.weight.float() * q.scales.float()[:, None]).t() + q.bias.float())
    got = q(x).float()
    assert float((got - want).abs().max() / want.abs().max()) < 2e-3


def test_a_kv_cache_that_cannot_fit_is_a_recorded_out_of_memory_cell():
    res = gpuopt.decode_sweep("opt-125m", paths="static-graph", precisions="fp16", batch_sizes=[1, 100_000],
                              prompt_lens=1024, new_tokens=8, parity=False, progress=None, max_time_s=0.2)
    rows = {r.batch_size: r for r in res.rows}
    assert rows[1].ok, rows[1].error
    assert rows[100_000].status == "failed" and rows[100_000].error.startswith("out of memory: the KV cache")
