"""Quantized precisions (issue 17 targets), on one GPU, in one run:

- linear: one 4096 x 4096 linear layer over 8192 tokens, bf16 against fp8 (activations quantized per
  row by gpuopt's kernel at every call, torch._scaled_mm), dynamic int8 and int8 weight-only, each
  compared interleaved with the bf16 layer (gpuopt.compare): fp8 >= 1.6x;
- kernel: gpuopt's quantize_rowwise (absmax + cast in one pass) on the same activations, bytes read and
  written per second against the device's measured copy bandwidth: >= 80%;
- vit: ViT-B/16 batch 256, the fp8 config against bf16 (gpuopt.benchmark, parity and top-1 agreement
  with fp32 reported): >= 1.3x;
- bert: BERT-base batch 64, sequence 512, fp8 against bf16: >= 1.2x.

Both model parts also time ``fp8+no-fold`` (the norms and activations that feed quantized layers not
folded into their quantization, no shared quantizations: gpuopt.quant.prologue), the fold's ablation.

A part that fails is recorded with its reason and the others still run.
"""

from __future__ import annotations

import time
import traceback

import torch
from _common import Target, parse_args, require_gpu, write

import gpuopt
from gpuopt.quant import Fp8Linear, Int8Linear, Int8WeightOnlyLinear
from gpuopt.run import zoo


def _extra(p):
    p.add_argument("--parts", default="linear,kernel,vit,bert")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--width", type=int, default=4096)


def part_linear(args, results: dict, targets: list[Target]) -> None:
    tokens, width = (2048, 2048) if args.quick else (args.tokens, args.width)
    lin = torch.nn.Linear(width, width, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    flops = 2 * tokens * width * width
    layers = {"fp8": Fp8Linear.from_float(lin), "int8": Int8Linear.from_float(lin),
              "int8-wo": Int8WeightOnlyLinear.from_float(lin)}
    out: dict = {"tokens": tokens, "width": width}
    results["linear"] = out
    with torch.inference_mode():
        ref = lin(x).float()
        for name, layer in layers.items():
            err = float((layer(x).float() - ref).norm() / ref.norm())
            # Interleaved (A B, B A, ...): each call alone between events -- a GEMM of this size keeps the GPU
            # busy for far longer than its launch, so latency mode is its device time.
            c = gpuopt.compare(lambda: lin(x), lambda layer=layer: layer(x), mode="latency", max_time_s=3.0,
                               labels=("bf16", name))
            out[name] = {"speedup_vs_bf16": c.speedup, "ci": list(c.ci), "verdict": c.verdict,
                         "bf16_ms": c.baseline_ms, "ms": c.candidate_ms, "rel_l2_vs_bf16": err,
                         "tflops": flops / (c.candidate_ms * 1e-3) / 1e12,
                         "bf16_tflops": flops / (c.baseline_ms * 1e-3) / 1e12}
            print(f"REPORT linear {tokens}x{width}x{width} {name}: {c.speedup:.3f}x bf16 [{c.ci[0]:.3f}, {c.ci[1]:.3f}] "
                  f"({c.baseline_ms:.3f} -> {c.candidate_ms:.3f} ms, {out[name]['tflops']:.0f} TFLOP/s; "
                  f"rel. L2 vs bf16 {err:.2e})", flush=True)
    targets.append(Target(f"linear {tokens}x{width}: fp8 speedup over bf16", out["fp8"]["speedup_vs_bf16"], ">=",
                          1.6, "x", "the bf16 layer, interleaved, same run"))


def part_kernel(args, results: dict, targets: list[Target]) -> None:
    tokens, width = (2048, 2048) if args.quick else (args.tokens, args.width)
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    nbytes = x.numel() * (2 + 1) + tokens * 4  # read bf16, write one byte per value and a scale per row
    copy = gpuopt._ext._C.time_device_copy(x.numel() * 2, 50, torch.cuda.current_device())
    out: dict = {"tokens": tokens, "width": width, "bytes": nbytes, "copy_gbps": copy["gbps"]}
    results["kernel"] = out
    for dtype in (torch.float8_e4m3fn, torch.int8):
        m = gpuopt.measure(lambda dtype=dtype: torch.ops.gpuopt.quantize_rowwise(x, dtype), mode="throughput",
                           max_time_s=2.0)
        gbps = nbytes / (m.p50 * 1e-3) / 1e9
        out[str(dtype).replace("torch.", "")] = {"ms": m.p50, "gbps": gbps, "share_of_copy": gbps / copy["gbps"]}
        print(f"REPORT quantize_rowwise {tokens}x{width} bf16 -> {dtype}: {m.p50 * 1e3:.1f} us, {gbps:,.0f} GB/s = "
              f"{gbps / copy['gbps']:.1%} of the measured copy bandwidth ({copy['gbps']:,.0f} GB/s)", flush=True)
    targets.append(Target("quantize_rowwise (fp8) bandwidth / measured copy bandwidth",
                          out["float8_e4m3fn"]["share_of_copy"], ">=", 0.8, "", "device-to-device copy, same run"))


def _model_part(args, results: dict, targets: list[Target], *, key: str, model, batch: int, target: float,
                input_fn=None) -> None:
    configs = ["fp32", "bf16", "fp8", "fp8+no-fold"]
    r = gpuopt.benchmark(model, input_fn=input_fn, configs=configs, batch_sizes=[batch], modes=["throughput"],
                         progress=False, max_time_s=3.0, min_time_s=1.0)
    out: dict = {"batch_size": batch, "configs": {}}
    results[key] = out
    rows = {row.config: row for row in r.rows}
    # A config that fails the gate is still timed (the gate off) so that its speed is known beside its
    # error; the result says it failed parity.
    gated = [c for c in configs if rows.get(c) is not None and not rows[c].ok and "parity failed" in (rows[c].error or "")]
    ungated = {}
    if gated:
        u = gpuopt.benchmark(model, input_fn=input_fn, configs=gated, batch_sizes=[batch], modes=["throughput"],
                             progress=False, max_time_s=3.0, min_time_s=1.0, parity=False)
        ungated = {row.config: row for row in u.rows if row.ok}
    for cfg in configs:
        row = rows.get(cfg)
        if cfg in ungated:
            par = rows[cfg].parity or {}
            out["configs"][cfg] = {"items_s": ungated[cfg].throughput_items_per_s,
                                   "p50_ms": ungated[cfg].measurement.p50, "parity_passed": False,
                                   "parity_error": rows[cfg].error, "rel_l2_vs_fp32": par.get("worst_rel_l2"),
                                   "top1_agreement": par.get("top1_agreement"),
                                   "notes": ungated[cfg].notes, "timed_without_gate": True}
            print(f"{key} {cfg}: {rows[cfg].error}; timed with the gate off", flush=True)
            continue
        if row is None or not row.ok:
            out["configs"][cfg] = {"error": getattr(row, "error", "missing")}
            print(f"{key} {cfg}: failed: {out['configs'][cfg]['error']}", flush=True)
            continue
        par = row.parity or {}
        out["configs"][cfg] = {"items_s": row.throughput_items_per_s, "p50_ms": row.measurement.p50,
                               "parity_passed": par.get("passed"), "rel_l2_vs_fp32": par.get("worst_rel_l2"),
                               "top1_agreement": par.get("top1_agreement"), "notes": row.notes}
    bf16, fp8 = out["configs"].get("bf16", {}), out["configs"].get("fp8", {})
    if bf16.get("items_s") and fp8.get("items_s"):
        fp8["speedup_vs_bf16"] = fp8["items_s"] / bf16["items_s"]
        print(f"REPORT {key} b{batch}: fp8 {fp8['items_s']:,.0f}/s = {fp8['speedup_vs_bf16']:.3f}x bf16 "
              f"({bf16['items_s']:,.0f}/s); parity {fp8['parity_passed']} (rel. L2 vs fp32 {fp8['rel_l2_vs_fp32']}, "
              f"top-1 agreement {fp8['top1_agreement']}); {'; '.join(n for n in fp8['notes'] if 'quantized' in n)}",
              flush=True)
    plain = out["configs"].get("fp8+no-fold", {})
    if fp8.get("items_s") and plain.get("items_s") and bf16.get("items_s"):
        plain["speedup_vs_bf16"] = plain["items_s"] / bf16["items_s"]
        fp8["speedup_vs_no_fold"] = fp8["items_s"] / plain["items_s"]
        print(f"REPORT {key} b{batch}: fp8 folded {fp8['speedup_vs_no_fold']:.3f}x fp8+no-fold "
              f"({plain['items_s']:,.0f}/s = {plain['speedup_vs_bf16']:.3f}x bf16); "
              f"{'; '.join(n for n in fp8['notes'] if 'fold' in n)}", flush=True)
    gate = "" if fp8.get("parity_passed") else " (fp8 failed parity: timed with the gate off)"
    targets.append(Target(f"{key} b{batch}: fp8 throughput over bf16{gate}", fp8.get("speedup_vs_bf16", 0.0), ">=",
                          target, "x", "the bf16 config, same run"))


def part_vit(args, results: dict, targets: list[Target]) -> None:
    _model_part(args, results, targets, key="vit_b_16", model="vit_b_16", batch=32 if args.quick else 256,
                target=1.3)


def part_bert(args, results: dict, targets: list[Target]) -> None:
    seq = 128 if args.quick else 512
    model, _ = zoo.get("bert-base")

    def inputs(b: int) -> dict:
        ids = torch.randint(0, 30522, (b, seq))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    _model_part(args, results, targets, key=f"bert-base-s{seq}", model=model, batch=16 if args.quick else 64,
                target=1.2, input_fn=inputs)


def main() -> int:
    args = parse_args("quantization", _extra)
    require_gpu("quantization")
    results: dict = {"errors": {}}
    targets: list[Target] = []
    parts = {"linear": part_linear, "kernel": part_kernel, "vit": part_vit, "bert": part_bert}
    for name in args.parts.split(","):
        if name not in parts:
            raise SystemExit(f"unknown part {name!r}; parts: {', '.join(parts)}")
        t0 = time.perf_counter()
        try:
            parts[name](args, results, targets)
        except Exception as exc:  # noqa: BLE001 - recorded; the other parts still run
            traceback.print_exc()
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
            targets.append(Target(f"{name}: ran without error", 0.0, ">=", 1.0, "", str(exc)[:200]))
        print(f"[{name}: {time.perf_counter() - t0:.0f}s]", flush=True)
        write(args, results, targets, final=False)
    return write(args, results, targets)


if __name__ == "__main__":
    raise SystemExit(main())
