"""Exported backends (issue 17): ONNX Runtime beside eager fp32, ResNet-50 and BERT-base, in one run.

ONNX Runtime runs where its provider runs: the CUDA provider on the GPU where onnxruntime-gpu is
installed, else its CPU provider, measured on the CPU beside eager fp32 on the CPU (``--device``
overrides). The record names the provider, the exporter, the export time and parity with fp32; the
ratio to eager is reported, not targeted (it depends on the provider and the host). ``--quick`` is the
CI-sized form (batch 1, BERT at sequence 32). A part that fails is recorded with its reason and the
others still run.
"""

from __future__ import annotations

import time
import traceback

import torch
from _common import Target, parse_args, write

import gpuopt
from gpuopt.run import zoo


def _extra(p):
    p.add_argument("--parts", default="resnet50,bert")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where onnxruntime has its CUDA "
                                                  "provider, else cpu)")


def _device(args) -> str:
    if args.device:
        return args.device
    try:
        import onnxruntime
    except ImportError:
        return "cpu"
    ok = torch.cuda.is_available() and "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    return "cuda" if ok else "cpu"


def _part(args, results: dict, targets: list[Target], key: str, model, input_fn, batch: int) -> None:
    device = _device(args)
    mode = "latency" if device == "cuda" else "host"
    configs = ["fp32", "fp32+onnxruntime"]
    r = gpuopt.benchmark(model, input_fn=input_fn, configs=configs, batch_sizes=[batch], modes=[mode],
                         device=device, progress=False, max_time_s=1.0 if args.quick else 5.0, min_time_s=0.2)
    rows = {row.config: row for row in r.rows}
    out: dict = {"device": device, "mode": mode, "batch_size": batch, "configs": {}}
    results[key] = out
    for cfg in configs:
        row = rows.get(cfg)
        if row is None or not row.ok:
            out["configs"][cfg] = {"error": getattr(row, "error", "missing")}
            print(f"{key} {cfg}: failed: {out['configs'][cfg]['error']}", flush=True)
            continue
        out["configs"][cfg] = {"p50_ms": row.measurement.p50, "items_s": row.throughput_items_per_s,
                               "prepare_s": row.prepare_s, "parity": (row.parity or {}).get("passed"),
                               "rel_l2_vs_fp32": (row.parity or {}).get("worst_rel_l2"), "notes": row.notes}
    eager, ort = out["configs"].get("fp32", {}), out["configs"].get("fp32+onnxruntime", {})
    if eager.get("p50_ms") and ort.get("p50_ms"):
        ort["speedup_vs_eager"] = eager["p50_ms"] / ort["p50_ms"]
        how = "; ".join(n for n in ort["notes"] if n.startswith("onnxruntime:"))
        print(f"REPORT {key} b{batch} on {device} ({mode} mode): onnxruntime {ort['p50_ms']:.2f} ms = "
              f"{ort['speedup_vs_eager']:.2f}x eager fp32 ({eager['p50_ms']:.2f} ms); parity {ort['parity']} "
              f"(rel. L2 {ort['rel_l2_vs_fp32']:.1e}); {how}", flush=True)
    targets.append(Target(f"{key}: onnxruntime ran and passed parity with fp32", float(bool(ort.get("parity"))),
                          ">=", 1.0, "", "eager fp32, same run"))


def part_resnet50(args, results: dict, targets: list[Target]) -> None:
    model, make = zoo.get("resnet50")
    _part(args, results, targets, "resnet50", model, make, 1 if args.quick else 8)


def part_bert(args, results: dict, targets: list[Target]) -> None:
    model, _ = zoo.get("bert-base")
    seq = 32 if args.quick else 128

    def inputs(b: int) -> dict:
        ids = torch.randint(0, 30522, (b, seq))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    _part(args, results, targets, f"bert-base-s{seq}", model, inputs, 1 if args.quick else 8)


def main() -> int:
    args = parse_args("exported", _extra)
    results: dict = {"errors": {}}
    targets: list[Target] = []
    parts = {"resnet50": part_resnet50, "bert": part_bert}
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
