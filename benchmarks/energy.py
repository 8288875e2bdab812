"""Energy per inference (issue 18 targets), on one GPU, in one run:

- gemm: a long bf16 GEMM loop measured by gpuopt (NVML's energy counter read by the C++ loop at the
  timed region's edges, aligned to the counter's steps) against the integral of the power readings a
  20 ms monitor took beside it over the same window: within 5%;
- resnet: ResNet-50 at batch 256, joules per image for fp32, fp16-amp+channels_last and the compiled
  config, with their ratios to fp32 and the throughput beside (every config in the same run).

A part that fails is recorded with its reason and the others still run.
"""

from __future__ import annotations

import time
import traceback

import torch
from _common import Target, parse_args, require_gpu, write

import gpuopt
from gpuopt.timing import nvml

RESNET_CONFIGS = ("fp32", "fp16-amp+channels_last", "fp16-amp+channels_last+compile")


def _extra(p):
    p.add_argument("--parts", default="gemm,resnet")
    p.add_argument("--gemm-s", type=float, default=5.0, help="seconds of GEMM loop")
    p.add_argument("--batch", type=int, default=256)


def part_gemm(args, results: dict, targets: list[Target]) -> None:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    seconds = 1.5 if args.quick else args.gemm_s
    monitor = nvml.clock_monitor(torch.cuda.current_device(), interval_ms=20.0)
    t0 = time.monotonic()
    with monitor:
        m = gpuopt.measure(lambda: a @ b, mode="throughput", min_time_s=seconds, max_time_s=2 * seconds,
                           min_energy_s=seconds, label="bf16 8192^3 GEMM")
        total = time.monotonic() - t0
    e = m.energy
    if not e or e["joules"] is None:
        raise RuntimeError(f"no energy measured: {(e or {}).get('reason')}")
    # The counter's window is the last window_s seconds of the monitor's span (measure returns at its end).
    readings = monitor.summary(skip_s=max(0.0, total - e["window_s"]))
    power_j, span = readings["power_energy_j"], readings["power_span_s"]
    power_w = power_j / span if power_j and span else None
    d = {"method": e["method"], "aligned": e["aligned"], "window_s": e["window_s"], "counter_j": e["joules"],
         "counter_avg_w": e["avg_power_w"], "readings": readings["power_samples"], "readings_span_s": span,
         "readings_avg_w": power_w, "power_limit_w": e["power_limit_w"], "share_of_power_limit":
         e["share_of_power_limit"], "idle_power_w": e["idle_power_w"], "tflops": 2 * n**3 / (m.p50 * 1e-3) / 1e12,
         "sm_mhz_median": (m.clocks or {}).get("sm_mhz_median"), "throttle_reasons": (m.clocks or {}).get(
             "throttle_reasons"), "gemm_ms_p50": m.p50}
    results["gemm"] = d
    print(f"gemm: counter {e['joules']:.1f} J over {e['window_s']:.2f} s = {e['avg_power_w']:.1f} W "
          f"({e['method']}, aligned={e['aligned']}); {d['readings']} power readings: "
          f"{power_w if power_w is None else round(power_w, 1)} W; idle {e['idle_power_w']} W, "
          f"limit {e['power_limit_w']} W, {d['tflops']:.0f} TFLOP/s at {d['sm_mhz_median']} MHz", flush=True)
    if power_w is None:
        raise RuntimeError("the monitor took no power readings over the window")
    targets.append(Target("bf16 GEMM loop: |counter energy / integral of power readings - 1|",
                          abs(e["avg_power_w"] / power_w - 1), "<=", 0.05, "",
                          "20 ms power readings over the same window, same run"))


def part_resnet(args, results: dict, targets: list[Target]) -> None:
    b = 64 if args.quick else args.batch
    r = gpuopt.benchmark("resnet50", configs=list(RESNET_CONFIGS), batch_sizes=[b], modes=["throughput"],
                         parity=False, progress=False, max_time_s=3.0, min_time_s=2.0, min_energy_s=2.0)
    out: dict = {"batch_size": b, "configs": {}}
    results["resnet"] = out
    base = None
    for cfg in RESNET_CONFIGS:
        row = r.find("resnet50", cfg, b, "throughput")
        if row is None or not row.ok:
            out["configs"][cfg] = {"error": getattr(row, "error", "missing")}
            continue
        e = row.energy or {}
        cell = {"img_s": row.throughput_items_per_s, "j_per_image": e.get("joules_per_item"),
                "images_per_j": e.get("items_per_joule"), "avg_power_w": e.get("avg_power_w"),
                "share_of_power_limit": e.get("share_of_power_limit"), "method": e.get("method"),
                "reason": e.get("reason")}
        if cfg == "fp32":
            base = cell
        elif base and base.get("j_per_image") and cell["j_per_image"]:
            cell["energy_ratio_vs_fp32"] = base["j_per_image"] / cell["j_per_image"]
            cell["speedup_vs_fp32"] = cell["img_s"] / base["img_s"]
        out["configs"][cfg] = cell
        print(f"resnet50 b{b} {cfg}: {cell['img_s']:,.0f} img/s, {cell['j_per_image']} J/image, "
              f"{cell['avg_power_w']} W ({cell['method']})", flush=True)
    for cfg, cell in out["configs"].items():
        if "energy_ratio_vs_fp32" in cell:
            print(f"REPORT resnet50 b{b} {cfg}: {cell['energy_ratio_vs_fp32']:.2f}x fewer joules per image than fp32 "
                  f"({cell['speedup_vs_fp32']:.2f}x the throughput), same run", flush=True)
    measured = [c for c in out["configs"].values() if c.get("j_per_image")]
    targets.append(Target(f"resnet50 b{b}: configs with a measured energy per image", len(measured), ">=",
                          len(RESNET_CONFIGS), "", "every config of the run"))


def main() -> int:
    args = parse_args("energy", _extra)
    require_gpu("energy")
    results: dict = {"errors": {}}
    targets: list[Target] = []
    parts = {"gemm": part_gemm, "resnet": part_resnet}
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
