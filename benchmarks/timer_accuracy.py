"""How gpuopt's timer compares with the usual ways of timing GPU work, in one run on one device.

Baselines, same run: triton's do_bench (median), torch.utils.benchmark's blocked_autorange, per-call
CUDA events + synchronize, back-to-back events (pipelined), and a CUDA graph of 100 ops timed by
hand. GPUs drift (a power-capped H100 swings ~6% over a second), so methods are compared in
interleaved rounds -- each round times every method once -- and targets use the median per-round
ratio. Targets (issue 3): medians within 2% of do_bench for device-bound work of 0.1 ms or more
(a 256 MiB copy and a 4096^3 bf16 GEMM; ResNet-50 fp16 b32 where it is not launch-bound);
latency-mode time on a tiny kernel no higher than do_bench's; graph mode per op no slower than
PyTorch's own CUDA graph (the H200 reference: 0.96 us, target 1.1 us); A/A "no significant
difference" >= 38/40; a real 5% difference detected; run-to-run spread of the median over 5
measurements <= 1% for ResNet-50 fp16 batch 256.
"""

from __future__ import annotations

import statistics

import torch
import torch.utils.benchmark as tbench
from _common import Target, parse_args, require_gpu, write

import gpuopt


def do_bench(fn) -> float:
    from triton.testing import do_bench as triton_do_bench

    return float(triton_do_bench(fn, warmup=100, rep=300, return_mode="median"))


def utils_benchmark(fn) -> float:
    return tbench.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.3).median * 1e3


def events_sync_per_call(fn, reps=200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out)


def events_pipelined(fn, reps=200) -> float:
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def torch_graph_per_op(fn, ops=100, reps=100) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(ops):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / ops)
    return statistics.median(times)


def rounds(methods: dict, n: int) -> dict:
    """Run every method once per round, n rounds; per method the list of per-round results."""
    out = {k: [] for k in methods}
    for _ in range(n):
        for name, method in methods.items():
            out[name].append(method())
    return out


def ratio_stats(num: list[float], den: list[float]) -> dict:
    ratios = [a / b for a, b in zip(num, den)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "per_round": ratios}


def resnet50_fp16(batch: int):
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda().half().eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16)

    def run():
        with torch.inference_mode():
            model(x)

    return run


def main() -> int:
    args = parse_args("timer_accuracy")
    require_gpu(args.name)
    n_rounds = 3 if args.quick else 5
    results: dict = {"rounds": n_rounds}
    targets: list[Target] = []
    meas = {}

    def gp(fn, key, **kw):
        def run():
            m = gpuopt.measure(fn, **kw)
            meas.setdefault(key, []).append(m)
            return m.p50
        return run

    # Large memory-bound kernel: a 256 MiB copy (~0.15 ms; not power-capped).
    src = torch.randn(64 << 20, device="cuda")
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    r = rounds({
        "do_bench": lambda: do_bench(copy),
        "gpuopt_latency": gp(copy, "copy_latency", mode="latency"),
        "gpuopt_graph": gp(copy, "copy_graph", mode="graph"),
        "events_pipelined": lambda: events_pipelined(copy),
    }, n_rounds)
    r["latency_over_do_bench"] = ratio_stats(r["gpuopt_latency"], r["do_bench"])
    r["gbps_gpuopt_latency"] = 2 * src.numel() * 4 / (statistics.median(r["gpuopt_latency"]) * 1e-3) / 1e9
    results["copy_256mib"] = r
    targets.append(Target("copy 256 MiB: |gpuopt latency / do_bench - 1| (median of rounds)",
                          abs(r["latency_over_do_bench"]["median"] - 1) * 100, "<=", 2.0, "%", "do_bench"))

    # Large compute-bound kernel: 4096^3 bf16 matmul. On a power-capped GPU its speed depends on the
    # load pattern (isolated calls run cooler than back-to-back ones); clocks are recorded.
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    mm = lambda: a @ b  # noqa: E731
    r = rounds({
        "do_bench": lambda: do_bench(mm),
        "gpuopt_latency": gp(mm, "mm_latency", mode="latency"),
        "gpuopt_throughput": gp(mm, "mm_throughput", mode="throughput"),
        "gpuopt_graph": gp(mm, "mm_graph", mode="graph"),
        "torch_utils_benchmark": lambda: utils_benchmark(mm),
        "events_sync_per_call": lambda: events_sync_per_call(mm),
        "events_pipelined": lambda: events_pipelined(mm),
    }, 2 * n_rounds + 1)
    r["latency_over_do_bench"] = ratio_stats(r["gpuopt_latency"], r["do_bench"])
    r["graph_over_do_bench"] = ratio_stats(r["gpuopt_graph"], r["do_bench"])
    r["tflops_gpuopt_latency"] = 2 * 4096**3 / (statistics.median(r["gpuopt_latency"]) * 1e-3) / 1e12
    r["clocks_sm_mhz"] = {k: [(m.clocks or {}).get("sm_mhz_median") for m in meas[f"mm_{k}"]]
                          for k in ("latency", "throughput", "graph")}
    results["matmul_4096_bf16"] = r
    targets.append(Target("matmul 4096^3 bf16: |gpuopt latency / do_bench - 1| (median of rounds)",
                          abs(r["latency_over_do_bench"]["median"] - 1) * 100, "<=", 2.0, "%", "do_bench"))

    # A model: ResNet-50 fp16, batch 32.
    rn32 = resnet50_fp16(32)
    r = rounds({
        "do_bench": lambda: do_bench(rn32),
        "gpuopt_latency": gp(rn32, "rn32_latency", mode="latency", max_time_s=3),
        "gpuopt_throughput": gp(rn32, "rn32_throughput", mode="throughput", max_time_s=3),
    }, n_rounds)
    lat = meas["rn32_latency"]
    r["gpuopt_latency_enqueue_ms"] = [m.enqueue["p50"] for m in lat]
    r["diagnosis"] = [m.diagnosis for m in lat]
    r["latency_over_do_bench"] = ratio_stats(r["gpuopt_latency"], r["do_bench"])
    r["throughput_over_do_bench"] = ratio_stats(r["gpuopt_throughput"], r["do_bench"])
    results["resnet50_fp16_b32"] = r
    launch_bound = sum(d == "launch-bound" for d in r["diagnosis"]) > len(lat) / 2
    targets.append(Target(
        "ResNet-50 fp16 b32: |gpuopt latency / do_bench - 1| (median of rounds)",
        abs(r["latency_over_do_bench"]["median"] - 1) * 100, "<=", 2.0, "%", "do_bench",
        not_applicable=(
            f"launch-bound on this host: enqueue {statistics.median(r['gpuopt_latency_enqueue_ms']):.2f} ms > "
            f"device {statistics.median(r['gpuopt_latency']):.2f} ms, so do_bench's figure is host time; "
            f"gpuopt throughput (host-bound pipeline) / do_bench = "
            f"{r['throughput_over_do_bench']['median']:.3f}") if launch_bound else ""))

    # Tiny kernel: a one-element add.
    x = torch.zeros(1, device="cuda")
    add = lambda: x.add_(1)  # noqa: E731
    r = rounds({
        "do_bench": lambda: do_bench(add),
        "gpuopt_latency": gp(add, "add_latency", mode="latency"),
        "gpuopt_graph_per_op": gp(add, "add_graph", mode="graph"),
        "torch_graph_100_ops_per_op": lambda: torch_graph_per_op(add),
        "gpuopt_throughput": gp(add, "add_throughput", mode="throughput"),
        "events_sync_per_call": lambda: events_sync_per_call(add),
        "events_pipelined": lambda: events_pipelined(add, 2000),
    }, n_rounds)
    r["gpuopt_graph_calls_per_graph"] = meas["add_graph"][-1].calls_per_sample
    r["latency_over_do_bench"] = ratio_stats(r["gpuopt_latency"], r["do_bench"])
    r["graph_over_torch_graph"] = ratio_stats(r["gpuopt_graph_per_op"], r["torch_graph_100_ops_per_op"])
    results["tiny_add"] = r
    targets.append(Target("tiny add: gpuopt latency / do_bench (median of rounds)",
                          r["latency_over_do_bench"]["median"], "<=", 1.0, "x", "do_bench"))
    targets.append(Target("tiny add: gpuopt graph per op / PyTorch CUDA graph per op",
                          r["graph_over_torch_graph"]["median"], "<=", 1.0, "x", "torch.cuda.CUDAGraph, 100 ops"))
    results["tiny_add"]["gpuopt_graph_per_op_us"] = statistics.median(r["gpuopt_graph_per_op"]) * 1e3

    # A/A: identical workloads. Interleaved compare (the recommended path) carries the target;
    # separate measurements compared afterwards are recorded too: on a drifting GPU they show why.
    n_aa = 20 if args.quick else 40
    inter = [gpuopt.compare(mm, mm) for _ in range(n_aa)]
    sep = [gpuopt.compare(gpuopt.measure(mm), gpuopt.measure(mm)) for _ in range(n_aa)]
    results["a_a"] = {
        "interleaved": [c.to_dict() for c in inter],
        "separate": [c.to_dict() for c in sep],
        "interleaved_no_significant_difference": sum(not c.significant for c in inter),
        "separate_no_significant_difference": sum(not c.significant for c in sep),
    }
    targets.append(Target(f"A/A interleaved: 'no significant difference' of {n_aa}",
                          results["a_a"]["interleaved_no_significant_difference"], ">=", round(0.95 * n_aa)))
    # Not a target: separate runs of a power-capped GEMM differ by the device's drift (a few %), which
    # no single run can see; recorded to show why compare(fn_a, fn_b) interleaves.
    results["a_a"]["separate_note"] = ("separate measurements taken seconds apart; their differences are "
                                       "device drift, which interleaving cancels")

    # A/B: a real 5% difference (copying 5% more bytes) must be detected, both ways of comparing.
    n = 64 << 20
    src_a, src_b = torch.randn(n, device="cuda"), torch.randn(int(n * 1.05), device="cuda")
    dst_a, dst_b = torch.empty_like(src_a), torch.empty_like(src_b)
    big = lambda: dst_b.copy_(src_b)  # noqa: E731
    small = lambda: dst_a.copy_(src_a)  # noqa: E731
    ci = gpuopt.compare(big, small, labels=("copy 1.05x", "copy 1.00x"))
    cs = gpuopt.compare(gpuopt.measure(big, label="copy 1.05x"), gpuopt.measure(small, label="copy 1.00x"))
    results["a_b_5pct"] = {"interleaved": ci.to_dict(), "separate": cs.to_dict()}
    targets.append(Target("A/B 5% more bytes, interleaved: detected as faster (1 = yes)",
                          float(ci.verdict == "faster"), ">=", 1))
    targets.append(Target("A/B 5% more bytes, separate: detected as faster (1 = yes)",
                          float(cs.verdict == "faster"), ">=", 1))

    # Run-to-run spread on a real model: ResNet-50 fp16 batch 256, 5 repeated measurements.
    rn256 = resnet50_fp16(64 if args.quick else 256)
    ms = [gpuopt.measure(rn256) for _ in range(5)]
    medians = [m.p50 for m in ms]
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    results["resnet50_fp16_b256_repeat"] = {"medians_ms": medians, "spread": spread,
                                             "ci_rel": [m.ci_rel for m in ms]}
    targets.append(Target("ResNet-50 fp16 b256: spread of 5 medians", spread * 100, "<=", 1.0, "%"))

    for key in ("copy_256mib", "matmul_4096_bf16", "resnet50_fp16_b32", "tiny_add"):
        print(key, {k: round(statistics.median(v), 5) for k, v in results[key].items()
                    if isinstance(v, list) and v and isinstance(v[0], float)})
    return write(args, results, targets)


if __name__ == "__main__":
    raise SystemExit(main())
