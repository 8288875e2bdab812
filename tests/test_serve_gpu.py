"""The serving engine on a GPU: the CUDA-graph path replayed from C++ (no GIL), bucketed sequences,
several instances, the Python path on CUDA, a soak of many requests checked one by one."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt.serving import Server

pytestmark = pytest.mark.gpuopt_gpu


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))


@pytest.mark.parametrize("config", ["fp32+cudagraph", "fp16+cudagraph", "fp32+compile"])
def test_graph_path_answers_equal_direct_calls(config, rng):
    model = _mlp()
    xs = [torch.randn(32, generator=rng) for _ in range(100)]
    with Server(model, config, xs[0], max_batch_size=16, instances=2, max_queue_delay_us=500) as s:
        assert s.path == "cuda-graph" and s.graph_sizes == [1, 2, 4, 8, 16]
        outs = [f.result(30) for f in [s.submit(x) for x in xs]]
        st = s.stats()
    dtype = torch.float16 if "fp16" in config else torch.float32
    ref = model.cuda().to(dtype)(torch.stack(xs).cuda().to(dtype)).float().cpu()
    tol = 1e-2 if dtype == torch.float16 else 1e-4
    for o, r in zip(outs, ref):
        torch.testing.assert_close(o.float(), r, rtol=tol, atol=tol)
    assert st["ok"] == 100 and st["path"] == "cuda-graph" and sum(st["batches_per_instance"]) == st["batches"]


def test_graph_path_runs_without_the_gil():
    """A request submitted just before the main thread holds the GIL in one long C call is answered
    during that call: the graph path needs no GIL (the Python path could not run its model)."""
    model = _mlp()
    x = torch.randn(32)
    with Server(model, "fp32+cudagraph", x, max_batch_size=8) as s:
        s.infer(x)
        fut = s.submit(x)
        sum(range(30_000_000))  # one C call: the GIL stays with this thread for its whole length
        done = fut.done()
        assert done and fut.status == "ok"


def test_bucketed_bert_matches_unpadded_calls(rng):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=256, max_position_embeddings=256)
    model = transformers.BertModel(cfg).eval()
    lengths = [5, 16, 17, 40, 64, 100, 128, 3]
    samples = [{"input_ids": torch.randint(0, cfg.vocab_size, (n,), generator=rng),
                "attention_mask": torch.ones(n, dtype=torch.long)} for n in lengths]
    with Server(model, "fp32+cudagraph", samples[0], max_batch_size=4, buckets=[16, 32, 64, 128],
                max_queue_delay_us=2000) as s:
        outs = [f.result(30) for f in [s.submit(x) for x in samples]]
    model = model.cuda()
    with torch.no_grad():
        for x, o in zip(samples, outs):
            ref = model(**{k: v[None].cuda() for k, v in x.items()}).last_hidden_state[0].cpu()
            assert o.shape == ref.shape
            torch.testing.assert_close(o, ref, rtol=1e-4, atol=1e-4)


def test_python_path_on_cuda_and_model_errors():
    class Flaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 2)

        def forward(self, x):
            if bool((x[:, 0] > 100).any()):
                raise RuntimeError("bad row")
            return self.lin(x)

    with Server(Flaky(), "fp16-amp", torch.zeros(8), max_batch_size=4, instances=2) as s:
        assert s.path == "python"
        bad = torch.zeros(8)
        bad[0] = 1000
        with pytest.raises(gpuopt.RequestFailed, match="bad row"):
            s.infer(bad)
        assert s.infer(torch.zeros(8)).shape == (2,)


def test_soak_every_answer_checked():
    """2 x 10^5 requests from 512 closed-loop clients through two graph instances: every answer's output
    checksum equals its own sample's direct call; none lost or duplicated. (benchmarks/serving.py runs
    10^6.)"""
    torch.manual_seed(0)
    samples = [torch.randn(32) * (1 + i % 5) for i in range(256)]
    with Server(_mlp(), "fp32+cudagraph", samples[0], max_batch_size=128, checksums=True) as s:
        s.add_samples(samples)
        r = s.run_load(scenario="closed-loop", concurrency=512, min_queries=200_000, duration_s=0.0, verify=True)
    v = r.verification
    assert v["answered"] == 200_000 and v["mismatched"] == 0 and v["lost"] == 0 and v["duplicated"] == 0, v
    assert r.valid, r.summary()


def test_checksums_on_the_gpu_tell_large_fp16_outputs_apart(rng):
    """Answer checksums computed on the GPU, on the executor's stream, for bucketed CUDA-graph batches
    of LayerNorm'd fp16 outputs of >= 100k elements: every answer passes, swaps would show."""

    class TokenNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(1000, 512)
            self.norm = torch.nn.LayerNorm(512)

        def forward(self, ids):
            return self.norm(self.emb(ids))

    torch.manual_seed(0)
    samples = [torch.randint(1, 1000, (int(n),), generator=rng) for n in torch.randint(196, 257, (64,), generator=rng)]
    with Server(TokenNorm(), "fp16+cudagraph", samples[0], max_batch_size=8, instances=2, buckets=[224, 256],
                checksums=True) as s:
        s.add_samples(samples)
        r = s.run_load(scenario="offline", min_queries=500, duration_s=0.0, verify=True, records=True)
    v = r.verification
    assert v["answered"] == 500 and v["mismatched"] == 0 and v["lost"] == 0, v
    assert v["conclusive"] and v["swap_detection"] >= 0.99, v
    assert bool(r.records["checksum"].isfinite().all())


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


@two_gpus
@pytest.mark.parametrize("config", ["fp32+cudagraph", "fp32"])
def test_two_gpus_each_serve_batches_and_answers_equal_direct_calls(config, rng):
    """A replica per GPU, `instances` executors per GPU (graphs captured on their GPU, or the Python path
    calling the replica of the batch's GPU): every answer right, both GPUs busy, per-GPU figures summing
    to the server's."""
    model = _mlp()
    xs = [torch.randn(32, generator=rng) for _ in range(400)]
    with Server(model, config, xs[0], devices=[0, 1], instances=2, max_batch_size=8, max_queue_delay_us=200) as s:
        assert [str(d) for d in s.devices] == ["cuda:0", "cuda:1"]
        outs = [f.result(60) for f in [s.submit(x) for x in xs]]
        s.add_samples(xs[:32])
        r = s.run_load(scenario="closed-loop", concurrency=64, min_queries=4000, duration_s=0.0)
        st = s.stats()
    ref = model.cuda()(torch.stack(xs).cuda()).cpu()
    for o, want in zip(outs, ref):
        torch.testing.assert_close(o, want, rtol=1e-4, atol=1e-4)
    assert st["devices"] == [0, 1] and len(st["batches_per_instance"]) == 4
    assert sum(st["batches_per_device"]) == st["batches"] and min(st["batches_per_device"]) > 0
    assert all(b <= st["busy_s"] + 1e-6 for b in st["busy_s_per_device"])
    busy = r.gpu_busy_per_device
    assert set(busy) == {"cuda:0", "cuda:1"} and all(0 < b <= 1 for b in busy.values())
    assert sum(r.batches_per_device.values()) > 0 and "cuda:1" in r.summary()


@two_gpus
def test_serve_over_all_gpus_from_the_one_call():
    r = gpuopt.serve("tiny-cnn", "fp16+cudagraph", devices="all", scenario="offline", min_queries=2000,
                     duration_s=0.0, max_batch_size=16)
    assert r.result["ok"] >= 2000 and r.settings["devices"][:2] == ["cuda:0", "cuda:1"]
    assert r.serving()["gpu_busy_per_device"] is not None


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA device")
def test_devices_beyond_the_visible_gpus_name_the_count():
    n = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"devices=\[0, {n}\] names GPU\(s\) \[{n}\]; {n} visible"):
        Server(_mlp(), "fp32", torch.randn(32), devices=[0, n])
