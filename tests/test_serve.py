"""The dynamic batcher and the load generator from Python, on CPU (the Python executor path): answers
match direct calls, bucketing pads and cuts back, queue policies, failures stay in their batch,
shutdown never hangs, bad settings are named. GPU paths: tests/test_serve_gpu.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import gpuopt
from gpuopt.serving import LoadSpec, QueueFullError, RequestFailed, Server
from gpuopt.serving.load import CHECKSUMS, _ambiguous_pairs, checksum_weights, verify_checksums


class Shared:
    """State a served model shares with its test: the server prepares a deep copy of the model, and
    this survives the copy as the same object."""

    def __init__(self):
        self.open = threading.Event()
        self.open.set()
        self.batches: list[list[float]] = []

    def __deepcopy__(self, memo):
        return self


class Gate(torch.nn.Module):
    """A linear model that waits at a gate the test can close (bounded), so a test can fill the
    queue; it raises on a batch containing a row whose first value is ``poison``."""

    def __init__(self, d: int = 8, poison: float = 1234.0):
        super().__init__()
        self.lin = torch.nn.Linear(d, 3)
        self.shared = Shared()
        self.poison = poison

    @property
    def open(self) -> threading.Event:
        return self.shared.open

    @property
    def batches(self) -> list[list[float]]:
        return self.shared.batches

    def forward(self, x):
        assert self.open.wait(10.0), "the test never opened the gate"
        if bool((x[:, 0] == self.poison).any()):
            raise ValueError("poisoned batch")
        self.batches.append(x[:, 1].tolist())
        return self.lin(x)


class MaskedSum(torch.nn.Module):
    """A sequence model whose padded positions do not matter when masked: per token an embedding, output
    per position (B, L, 4) and a masked mean."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4)

    def forward(self, ids, mask):
        return self.emb(ids) * mask.unsqueeze(-1).to(torch.float32)


class TokenNorm(torch.nn.Module):
    """A sequence model with large normalised outputs, as a transformer's last hidden state: per token
    an embedding, LayerNorm'd, (B, L, width). Padded positions (id 0) give nonzero outputs, so an
    answer's checksum must leave its padded tail out."""

    def __init__(self, width: int, norm: bool = True):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, width)
        self.norm = torch.nn.LayerNorm(width) if norm else torch.nn.Identity()

    def forward(self, ids):
        return self.norm(self.emb(ids))


def _server(model, sample, **kw):
    kw.setdefault("device", "cpu")
    return Server(model, "fp32", sample, **kw)


def test_answers_equal_direct_calls(rng):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    xs = [torch.randn(16, generator=rng) for _ in range(40)]
    with _server(model, xs[0], max_batch_size=8, max_queue_delay_us=2000, instances=2) as s:
        futures = [s.submit(x) for x in xs]
        outs = [f.result(10) for f in futures]
        stats = s.stats()
    with torch.no_grad():
        want = model(torch.stack(xs))
    for i, (o, w) in enumerate(zip(outs, want)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-6, msg=f"request {i}")
    assert stats["ok"] == 40 and stats["failed"] == 0 and stats["path"] == "python"
    assert stats["batches"] < 40, "requests waiting together must share batches"
    counts = stats["queue"]["batch_size_counts"]
    assert sum(b * c for b, c in enumerate(counts)) == 40 and max(b for b, c in enumerate(counts) if c) <= 8
    assert all(f.timings["batch_size"] >= 1 for f in futures)


def test_buckets_pad_and_cut_back(rng):
    model = MaskedSum()
    lengths = [3, 17, 30, 31, 64, 5, 50]
    samples = [(torch.randint(0, 50, (n,), generator=rng), torch.ones(n, dtype=torch.long)) for n in lengths]
    with _server(model, samples[0], max_batch_size=4, max_queue_delay_us=5000, buckets=[8, 32, 64]) as s:
        outs = [f.result(10) for f in [s.submit(x) for x in samples]]
        with pytest.raises(ValueError, match="65"):
            s.submit((torch.zeros(65, dtype=torch.long), torch.ones(65, dtype=torch.long)))
        with pytest.raises(ValueError, match="same length"):
            s.submit((torch.zeros(5, dtype=torch.long), torch.ones(6, dtype=torch.long)))
    with torch.no_grad():
        for (ids, mask), o in zip(samples, outs):
            assert o.shape == (len(ids), 4), "the sequence axis is cut back to the request's length"
            torch.testing.assert_close(o, model(ids[None], mask[None])[0])


def test_model_error_fails_only_its_batch():
    model = Gate()
    good = torch.zeros(8)
    bad = torch.zeros(8)
    bad[0] = model.poison
    with _server(model, good, max_batch_size=4, instances=1) as s:
        model.open.clear()
        first = s.submit(good)  # rides alone, blocked at the gate
        time.sleep(0.2)
        f_bad = [s.submit(bad), s.submit(good)]  # one batch with the poisoned row
        model.open.set()
        assert first.result(10).shape == (3,)
        for f in f_bad:
            with pytest.raises(RequestFailed, match="poisoned batch"):
                f.result(10)
        assert s.infer(good).shape == (3,), "the server keeps serving after a failed batch"
        st = s.stats()
    assert st["failed"] == 2 and st["failed_batches"] == 1 and st["ok"] == 2


def test_full_queue_rejects_and_counts():
    model = Gate()
    with _server(model, torch.zeros(8), max_batch_size=1, instances=1, max_queue_size=2) as s:
        model.open.clear()
        held = s.submit(torch.zeros(8))
        time.sleep(0.2)  # the executor holds it at the gate: the queue is empty again
        waiting = [s.submit(torch.zeros(8)) for _ in range(2)]
        t0 = time.perf_counter()
        with pytest.raises(QueueFullError, match="max_queue_size=2"):
            s.submit(torch.zeros(8))
        assert time.perf_counter() - t0 < 1.0, "a full queue answers at once"
        model.open.set()
        for f in [held, *waiting]:
            f.result(10)
        assert s.stats()["rejected"] == 1


def test_priority_and_timeouts():
    model = Gate()
    with _server(model, torch.zeros(8), max_batch_size=1, instances=1, priority_levels=2) as s:
        model.batches.clear()  # preparing the config called the model once
        model.open.clear()
        s.submit(torch.zeros(8))
        time.sleep(0.2)
        tagged = []
        for i, prio in enumerate([1, 1, 0]):
            x = torch.zeros(8)
            x[1] = i
            tagged.append(s.submit(x, priority=prio))
        expired = s.submit(torch.zeros(8), timeout_ms=50)
        time.sleep(0.3)
        model.open.set()
        for f in tagged:
            f.result(10)
        with pytest.raises(TimeoutError, match="timed out"):
            expired.result(10)
        with pytest.raises(ValueError, match="priority"):
            s.submit(torch.zeros(8), priority=2)
    order = [b[0] for b in model.batches[1:]]  # after the request that held the gate
    assert order == [2.0, 0.0, 1.0], f"level 0 first, then FIFO within level 1; got {order}"


def test_shutdown_cancels_or_drains_without_hanging():
    model = Gate()
    s = _server(model, torch.zeros(8), max_batch_size=1, instances=1)
    model.open.clear()
    s.submit(torch.zeros(8))
    time.sleep(0.2)
    queued = [s.submit(torch.zeros(8)) for _ in range(5)]
    threading.Timer(0.3, model.open.set).start()
    t0 = time.perf_counter()
    s.close(drain=False)
    assert time.perf_counter() - t0 < 5
    for f in queued:
        with pytest.raises(RequestFailed, match="shut down"):
            f.result(1)
    with pytest.raises(RequestFailed, match="closed"):
        s.submit(torch.zeros(8))
    s2 = _server(Gate(), torch.zeros(8), max_batch_size=2, instances=1)
    fs = [s2.submit(torch.zeros(8)) for _ in range(7)]
    s2.close(drain=True, timeout_s=10)
    assert all(f.result(1).shape == (3,) for f in fs)


@pytest.mark.parametrize("kw, match", [
    ({"max_batch_size": 0}, "max_batch_size"),
    ({"max_queue_delay_us": -1}, "max_queue_delay_us"),
    ({"preferred_batch_sizes": [4, 2]}, "preferred_batch_sizes"),
    ({"preferred_batch_sizes": [64]}, "preferred_batch_sizes"),
    ({"buckets": [0, 8]}, r"buckets\[0\]"),
    ({"instances": 0}, "instances"),
    ({"max_queue_size": -1}, "max_queue_size"),
    ({"timeout_ms": -5}, "timeout_ms"),
    ({"timeout_action": "drop"}, "timeout_action"),
])
def test_bad_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        _server(torch.nn.Linear(8, 3), torch.zeros(8), **kw)


@pytest.mark.parametrize("kw", [{"max_batch_size": "8"}, {"instances": 2.0}, {"max_queue_delay_us": True},
                                {"max_queue_size": None}])
def test_settings_of_the_wrong_type_are_type_errors(kw):
    name, value = next(iter(kw.items()))
    with pytest.raises(TypeError, match=f"{name} must be an integer >= [01], got {value!r}"):
        _server(torch.nn.Linear(8, 3), torch.zeros(8), **kw)


@pytest.mark.parametrize("kw, match", [
    ({"scenario": "burst"}, "scenario"),
    ({"scenario": "server"}, "rate"),
    ({"scenario": "server", "rate": 1e9}, "rate"),
    ({"scenario": "server", "rate": -3.0}, "rate"),
    ({"scenario": "closed-loop", "concurrency": 0}, "concurrency"),
    ({"scenario": "server", "rate": 10.0, "arrival": "ramp"}, "ramp"),
    ({"scenario": "server", "rate": 10.0, "arrival": "gamma", "burstiness": 0.0}, "burstiness"),
    ({"scenario": "offline", "min_queries": 0}, "min_queries"),
    ({"scenario": "offline", "percentile": 1.5}, "percentile"),
])
def test_bad_load_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        LoadSpec(**kw).options()


def test_serve_scenarios_on_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    sample_fn = lambda i: torch.randn(16)  # noqa: E731
    common = dict(device="cpu", max_batch_size=16, samples=16, duration_s=0.0)
    r = gpuopt.serve(model, "fp32", sample_fn, scenario="closed-loop", concurrency=8, min_queries=500,
                     records=True, **common)
    assert r.result["ok"] == 500 and r.result["lost"] == 0 and r.valid, r.summary()
    rec = r.records
    assert torch.unique(rec["id"]).numel() == 500 and int(rec["batch_size"].max()) <= 16
    done = rec["completed_s"] - rec["scheduled_s"]
    assert bool((done > 0).all()) and r.latency_ms["p50"] > 0
    row = r.row()
    assert row.mode == "serve:closed-loop @8 clients" and row.item_unit == "requests" and row.throughput_items_per_s > 0
    assert gpuopt.Row.from_dict(row.to_dict()) == row
    single = gpuopt.serve(model, "fp32", sample_fn, scenario="single-stream", min_queries=64, **common)
    assert set(single.result["batch_size_counts"][2:]) <= {0}, "single-stream never batches"
    assert single.result["early_stop"]["enough"] and single.valid
    off = gpuopt.serve(model, "fp32", sample_fn, scenario="offline", min_queries=800, **common)
    assert off.result["ok"] == 800 and max(b for b, c in enumerate(off.result["batch_size_counts"]) if c) == 16
    naive = gpuopt.serve(model, "fp32", sample_fn, scenario="offline", min_queries=300, batcher="naive", **common)
    assert naive.result["ok"] == 300 and naive.settings["path"] == "naive-python"


def test_the_naive_baseline_runs_every_batch_size_once_before_it_is_measured():
    """Like the C++ server, which captures its graphs first, the naive batcher runs the model at every
    batch size 1..max_batch_size before its first measured run (cuDNN autotuning and lazy kernel
    loading would otherwise land in its first batches of each size), and only once -- on the thread that
    serves: PyTorch keeps cuDNN's autotuning results per thread, so the warm-up and every run share one
    worker thread."""
    from gpuopt.serving import NaiveBatcher
    from gpuopt.serving.server import SampleLayout

    class Sizes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)
            self.seen: list[int] = []
            self.threads: set[int] = set()

        def forward(self, x):
            self.seen.append(x.shape[0])
            self.threads.add(threading.get_ident())
            return self.lin(x)

    model = Sizes()
    prepared = gpuopt.Config.parse("fp32").apply(model, torch.randn(1, 8))
    sample = torch.randn(8)
    nb = NaiveBatcher(prepared, SampleLayout.of(sample), max_batch_size=5, max_wait_ms=0.5)
    with pytest.raises(ValueError, match="add samples first"):
        nb.warm_up()
    nb.add_samples([torch.randn(8) for _ in range(4)])
    copy = next(m for m in nb.module.modules() if isinstance(m, Sizes))  # the config's copy
    seen = copy.seen
    seen.clear()
    copy.threads.clear()
    r = nb.run_load(scenario="offline", min_queries=40, duration_s=0.0)
    assert seen[:5] == [1, 2, 3, 4, 5] and r.result["ok"] == 40 and r.settings["warmed_up"]
    assert len(seen) - 5 == r.server["batches"]
    before = len(seen)
    again = nb.run_load(scenario="offline", min_queries=40, duration_s=0.0)
    assert len(seen) - before == again.server["batches"], "the second run warms up no more"
    assert len(copy.threads) == 1 and threading.get_ident() not in copy.threads
    worker = nb._thread
    nb.close(timeout_s=10)
    assert worker is not None and not worker.is_alive()
    # Closed, it still serves (on a new worker thread); a close() with no thread running leaves nothing
    # behind that would end the next thread at once (its warm-up or run would wait for ever).
    nb.close(timeout_s=10)
    nb.close(timeout_s=10)
    third = nb.run_load(scenario="offline", min_queries=20, duration_s=0.0)
    assert third.result["ok"] == 20 and nb._thread is not None and nb._thread.is_alive()
    assert nb._thread is not worker
    nb.close(timeout_s=10)


def test_server_scenario_counts_from_schedule():
    """A server slower than its arrivals: latency is counted from each query's scheduled time, so the
    backlog shows (no coordinated omission) and the run is invalid."""
    model = Gate()
    service_s = 0.004

    def slow(x):
        time.sleep(service_s)
        return model.lin(x)

    class Slow(torch.nn.Module):
        def forward(self, x):
            return slow(x)

    r = gpuopt.serve(Slow(), "fp32", lambda i: torch.randn(8), device="cpu", max_batch_size=1, instances=1,
                     scenario="server", rate=500.0, min_queries=300, duration_s=0.0, samples=4)
    # 300 queries arrive in ~0.6 s; one at a time at >= 4 ms each they take >= 1.2 s to serve.
    assert not r.valid and any("keep up" in m for m in r.invalid_reasons), r.summary()
    assert r.latency_ms["p99"] > 400, "the last queries waited behind the backlog since their arrival"


def _swap_two(recs, sums, scales, rtol):
    """The records with the checksums of answer 0 and of an answer to a sample that differs from its
    sample by more than the tolerance swapped."""
    recs = dict(recs)
    sa = int(recs["sample"][0])
    others = sums[recs["sample"]]
    apart = ((others - sums[sa]).abs() > 2 * rtol * torch.maximum(scales[recs["sample"]], scales[sa])).any(dim=1)
    b = int(apart.nonzero()[0])
    recs["checksum"] = recs["checksum"].clone()
    recs["checksum"][[0, b]] = recs["checksum"][[b, 0]]
    return recs


def test_verify_checksums_catches_a_swapped_answer(rng):
    """Outputs of a LayerNorm sum to zero whatever the input: a plain sum could not tell samples apart,
    the weighted checksums do; two answers swapped between samples show as exactly two mismatches."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
    samples = [torch.randn(16, generator=rng) for _ in range(32)]
    with Server(model, "fp32", samples[0], device="cpu", max_batch_size=8, checksums=True) as s:
        s.add_samples(samples)
        r = s.run_load(scenario="offline", min_queries=400, duration_s=0.0, verify=True, records=True)
        expected = s.expected_checksums()
    v = r.verification
    assert v["answered"] == 400 and v["mismatched"] == 0 and v["lost"] == 0 and v["duplicated"] == 0, v
    assert v["conclusive"] and v["swap_detection"] >= 0.99, v
    sums, scales = expected
    assert sums.shape == scales.shape == (32, CHECKSUMS) and r.records["checksum"].shape == (400, CHECKSUMS)
    assert float(sums.abs().max()) > 1e-3, "the weighted checksum of a zero-sum output is not zero"
    assert verify_checksums(_swap_two(r.records, sums, scales, v["rtol"]), expected, "fp32")["mismatched"] == 2


def test_checksum_weights_are_the_documented_hash():
    """checksum_weights (torch integer ops) against lowbias32 in plain Python integers."""

    def mix32(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    n = 5000
    w = checksum_weights(n)
    assert w.shape == (n, CHECKSUMS) and w.dtype == torch.float64
    for k in [0, 1, 2, 777, n - 1]:
        for j in range(CHECKSUMS):
            assert float(w[k, j]) == mix32(k * CHECKSUMS + j) / 2**32 * 2 - 1, (k, j)
    assert float(w.min()) >= -1 and float(w.max()) < 1 and abs(float(w.mean())) < 0.03
    corr = torch.corrcoef(w.T)
    assert float((corr - torch.eye(CHECKSUMS, dtype=torch.float64)).abs().max()) < 0.05, "independent sequences"


def test_server_checksums_equal_the_python_formula(rng):
    """The C++ server's checksums of each answer (bucketed: padded rows cut to the request's length)
    equal the Python weights applied to a direct call's output, to double rounding: an embedding
    lookup is exact however it is batched."""
    model = TokenNorm(24, norm=False)
    lengths = [int(n) for n in torch.randint(1, 64, (20,), generator=rng)]
    samples = [torch.randint(1, 1000, (n,), generator=rng) for n in lengths]
    with _server(model, samples[0], max_batch_size=8, buckets=[16, 32, 64], checksums=True) as s:
        s.add_samples(samples)
        r = s.run_load(scenario="offline", min_queries=200, duration_s=0.0, records=True)
    got = r.records["checksum"]
    assert bool((r.records["status"] == 1).all()) and got.shape == (200, CHECKSUMS)
    with torch.no_grad():
        for q in range(200):
            out = model(samples[int(r.records["sample"][q])][None])[0].double().flatten()
            w = checksum_weights(out.numel())
            want = out @ w
            scale = (out.square() @ w.square()).sqrt()
            assert bool(((got[q] - want).abs() <= 1e-12 * scale).all()), (q, got[q], want)


def test_bucketed_large_normalised_outputs_tell_swaps_apart(rng):
    """The BERT failure in small: LayerNorm'd outputs of >= 100k elements (L in 196..256, width 512),
    bucketed. One checksum scaled by the L1 norm of its terms told no two samples apart at fp16's
    tolerance; K=3 checksums scaled by their L2 norm tell apart (nearly) all pairs, and still pass
    every honest answer and catch a swapped one."""
    model = TokenNorm(512)
    samples = [torch.randint(1, 1000, (int(n),), generator=rng) for n in torch.randint(196, 257, (48,), generator=rng)]
    with _server(model, samples[0], max_batch_size=8, buckets=[208, 224, 240, 256], checksums=True) as s:
        s.add_samples(samples)
        r = s.run_load(scenario="offline", min_queries=200, duration_s=0.0, verify=True, records=True)
        expected = s.expected_checksums()
    v = r.verification
    assert v["answered"] == 200 and v["mismatched"] == 0 and v["lost"] == 0, v
    assert v["swap_detection"] >= 0.99 and v["conclusive"], v
    at_fp16 = verify_checksums(r.records, expected, "fp16")  # the BERT case: fp16's tolerance
    assert at_fp16["mismatched"] == 0 and at_fp16["swap_detection"] >= 0.99, at_fp16
    sums, scales = expected
    with torch.no_grad():  # what the old design (one checksum, L1 scale) would have said
        l1 = torch.stack([(model(x[None])[0].double().flatten() * checksum_weights(len(x) * 512)[:, 0]).abs().sum()
                          for x in samples])
    assert _ambiguous_pairs(sums[:, 0], l1, 2 * at_fp16["rtol"])[0] > 0.9 * 48 * 47 // 2
    assert verify_checksums(_swap_two(r.records, sums, scales, 2e-2), expected, "fp16")["mismatched"] == 2


def test_swap_detection_counts_pairs_within_the_tolerance():
    sums = torch.tensor([0.0, 1.0, 1.00001, 5.0, 5.0, 5.0], dtype=torch.float64)
    mags = torch.ones(6, dtype=torch.float64)
    # pairs within 1e-3: (1, 1.00001) and the three pairs among the 5.0s; 15 pairs in all
    assert _ambiguous_pairs(sums, mags, 1e-3) == (4, 15)
    assert _ambiguous_pairs(sums, mags * 1e-9, 1e-3) == (3, 15)  # 1e-5 apart is far at this magnitude
    assert _ambiguous_pairs(sums[:1], mags[:1], 1e-3) == (0, 0)
    n = 2000
    brute = torch.randn(n, dtype=torch.float64)
    m = torch.rand(n, dtype=torch.float64) + 0.5
    d = (brute[:, None] - brute[None, :]).abs() <= 1e-3 * torch.maximum(m[:, None], m[None, :])
    assert _ambiguous_pairs(brute, m, 1e-3) == ((int(d.sum()) - n) // 2, n * (n - 1) // 2)


def test_swap_detection_with_three_checksums_matches_brute_force(rng):
    """A pair is ambiguous only when all K checksums are within the tolerance: against the O(n^2)
    count, on values whose first checksums clash often and whose others clash a third of the time."""
    n, tol = 1500, 1e-3
    s = torch.empty(n, CHECKSUMS, dtype=torch.float64)
    s[:, 0] = torch.randn(n, generator=rng, dtype=torch.float64) * 0.3
    s[:, 1:] = torch.randint(0, 3, (n, CHECKSUMS - 1), generator=rng).double() * 0.1
    s[:, 1:] += torch.rand(n, CHECKSUMS - 1, generator=rng, dtype=torch.float64) * 1e-4
    m = torch.rand(n, CHECKSUMS, generator=rng, dtype=torch.float64) + 0.5
    close = ((s[:, None, :] - s[None, :, :]).abs() <= tol * torch.maximum(m[:, None, :], m[None, :, :])).all(dim=2)
    want = (int(close.sum()) - n) // 2
    assert want > 50, "the check needs ambiguous pairs"
    assert _ambiguous_pairs(s, m, tol) == (want, n * (n - 1) // 2)
    assert _ambiguous_pairs(s[:, :1], m[:, :1], tol)[0] > want, "one checksum alone is ambiguous more often"


def test_max_rate_finds_a_valid_rate_on_cpu():
    model = torch.nn.Linear(16, 4)
    s, name = gpuopt.serving.build(model, "fp32", lambda i: torch.randn(16), device="cpu", max_batch_size=32,
                                 samples=8, max_queue_delay_us=200)
    try:
        search = gpuopt.max_rate(s, slo_ms=50.0, duration_s=0.3, min_queries=500, max_steps=5)
    finally:
        s.close()
    assert search.best is not None and search.best.valid, search.summary()
    assert search.max_rate > 100 and len(search.steps) >= 2
    assert all(st.load.rate <= search.offline.throughput * 1.05 + 1e-6 for st in search.steps)
