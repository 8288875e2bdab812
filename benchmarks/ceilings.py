"""gpuopt's measured ceilings against plain PyTorch measured in the same run, datasheet beside.

Targets (issue 8): each of gpuopt's micro-benchmarks reaches >= 90% of what plain PyTorch reaches on
the same device: bf16/fp16/tf32/fp32 GEMM (8192^3, torch.matmul timed with events back to back),
device copy (Tensor.copy_, bytes read + written), pinned and pageable host-to-device copies.
"""

from __future__ import annotations

import statistics

import torch
from _common import Target, parse_args, require_gpu, write

import gpuopt
from gpuopt.analysis.device_ceilings import format_ceilings, table


def events_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def main() -> int:
    args = parse_args("ceilings")
    require_gpu(args.name)
    doc = gpuopt.ceilings(refresh=True, quick=args.quick)
    m = doc["measured"]
    n = 4096 if args.quick else 8192
    plain = {}
    for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("fp16", torch.float16, False), ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        plain[f"gemm_{name}_tflops"] = 2 * n**3 / (events_ms(lambda a=a, b=b: a @ b, 10) * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    nbytes = doc["sizes"]["hbm_bytes"]
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    plain["copy_gbps"] = 2 * nbytes / (events_ms(lambda: dst.copy_(src), 10) * 1e-3) / 1e9
    h = (64 if args.quick else 256) << 20
    dev = torch.empty(h, dtype=torch.uint8, device="cuda")
    for kind, pinned in (("pinned", True), ("pageable", False)):
        host = torch.ones(h, dtype=torch.uint8, pin_memory=pinned)
        plain[f"h2d_{kind}_gbps"] = h / (events_ms(lambda host=host: dev.copy_(host, non_blocking=True), 5) * 1e-3) / 1e9

    pairs = [("GEMM bf16", m["gemm_tflops"]["bf16"], plain["gemm_bf16_tflops"]),
             ("GEMM fp16", m["gemm_tflops"]["fp16"], plain["gemm_fp16_tflops"]),
             ("GEMM tf32", m["gemm_tflops"]["tf32"], plain["gemm_tf32_tflops"]),
             ("GEMM fp32", m["gemm_tflops"]["fp32"], plain["gemm_fp32_tflops"]),
             ("device copy (own kernel)", m["hbm_copy_gbps"], plain["copy_gbps"]),
             ("H2D pinned", m["h2d_pinned_gbps"], plain["h2d_pinned_gbps"]),
             ("H2D pageable", m["h2d_pageable_gbps"], plain["h2d_pageable_gbps"])]
    targets = [Target(f"{label}: gpuopt / plain PyTorch", ours / ref, ">=", 0.9, "x", "plain PyTorch, same run")
               for label, ours, ref in pairs]
    print(format_ceilings(doc))
    for label, ours, ref in pairs:
        print(f"{label:28s} gpuopt {ours:10.1f}  plain PyTorch {ref:10.1f}")
    results = {"ceilings": doc, "plain_pytorch": plain, "table": table(doc)}
    return write(args, results, targets)


if __name__ == "__main__":
    raise SystemExit(main())
