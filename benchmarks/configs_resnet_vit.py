"""ResNet-50 and ViT-B/16 (torchvision, random weights) under gpuopt's configs, one run, one device.

Per model, batch size and config: img/s (throughput mode: pipelined calls, host overhead included),
batch-1 latency as device time (latency mode), prepare/compile time, first call, peak memory and
parity against fp32 (every config must pass). Then gpuopt against hand-written PyTorch for the same
paths (fp16 + channels_last eager, CUDA graph replay), measured interleaved: gpuopt's prepared
runners must be within 5% (issue 4: no overhead of ours in the timed path). max-autotune (minutes of
autotuning per shape) runs only with --max-autotune.
"""

from __future__ import annotations

import torch
from _common import Target, parse_args, require_gpu, write

import gpuopt

RESNET = ["fp32", "tf32", "fp16-amp", "fp16-amp+channels_last", "bf16-amp+channels_last", "fp16+channels_last",
          "fp16+channels_last+cudagraph", "fp32+torchscript", "fp16-amp+torchscript"]
VIT = ["fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16", "fp16+cudagraph", "fp32+torchscript"]
COMPILE = {  # compile is slow to prepare: only where the seeds report it
    ("resnet50", 1): ["fp16+channels_last+compile:reduce-overhead"],
    ("resnet50", 256): ["fp16-amp+channels_last+compile"],
    ("vit_b_16", 128): ["fp16-amp+compile"],
}


def extra(p):
    p.add_argument("--max-autotune", action="store_true", help="also run compile:max-autotune (slow)")
    p.add_argument("--overhead-only", action="store_true",
                   help="only the gpuopt-vs-hand-written comparisons (results file *-overhead-*.json)")


def main() -> int:
    import torchvision

    args = parse_args("configs_resnet_vit", extra)
    require_gpu(args.name)
    plan = {
        "resnet50": (torchvision.models.resnet50, [1, 32] if args.quick else [1, 32, 256], RESNET),
        "vit_b_16": (torchvision.models.vit_b_16, [1, 32] if args.quick else [1, 32, 128], VIT),
    }
    if args.overhead_only:
        plan = {}
        args.name = "configs_resnet_vit-overhead"
    rows, targets = [], []
    for name, (make, batches, configs) in plan.items():
        # ViT-B/16's head is zero-initialised: re-initialised (seeded) so that parity compares real outputs.
        model = gpuopt.prepare.with_signal(make(weights=None), torch.randn(2, 3, 224, 224)).model
        for batch in batches:
            x = torch.randn(batch, 3, 224, 224)
            ref = gpuopt.Config("fp32").apply(model, x)
            cfgs = list(configs) + COMPILE.get((name, batch), [])
            if args.max_autotune and batch > 1:
                cfgs.append("fp16-amp+channels_last+compile:max-autotune")
            for text in cfgs:
                row = {"model": name, "batch": batch, "config": text}
                p = gpuopt.Config.parse(text).apply(model, x)
                row.update(p.to_dict())
                if p.ok:
                    par = gpuopt.parity(p, ref, torch.randn(batch, 3, 224, 224))
                    row["parity"] = par.to_dict()
                    run = p.runner(x)
                    m = gpuopt.measure(run, mode="throughput", max_time_s=3)
                    row.update(ms=m.p50, img_per_s=batch / (m.p50 * 1e-3), ci_rel=m.ci_rel, memory=m.memory,
                               warnings=m.warnings)
                    if batch == 1:
                        row["latency_ms"] = gpuopt.measure(run, mode="latency", max_time_s=3).p50
                    targets.append(Target(f"{name} b{batch} {text}: parity rel. L2 error", par.worst_rel_l2 or 0.0,
                                          "<=", par.tolerance, "", "fp32 reference"))
                print(f"{name:9s} b{batch:<4d} {text:42s} "
                      + (f"{row['img_per_s']:9.0f} img/s  {row['ms']:8.3f} ms  parity {row['parity']['passed']}"
                         if p.ok else f"FAILED: {p.error}"), flush=True)
                rows.append(row)
                del p
                torch.cuda.empty_cache()

    # gpuopt's prepared runners against the same PyTorch code written by hand, interleaved.
    overhead = {}
    model = torchvision.models.resnet50(weights=None)
    batch = 64 if args.quick else 256
    x = torch.randn(batch, 3, 224, 224)
    hand = model.cuda().half().to(memory_format=torch.channels_last).eval()
    xh = x.cuda().half().to(memory_format=torch.channels_last)

    def plain():
        with torch.inference_mode():
            hand(xh)

    p = gpuopt.Config.parse("fp16+channels_last").apply(model, x)
    overhead["resnet50_fp16_channels_last_eager"] = gpuopt.compare(plain, p.runner(x), labels=("plain", "gpuopt"))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    small = xh[:1].clone()
    torch.backends.cudnn.benchmark = True  # as the config does: the same cuDNN algorithms are captured
    with torch.cuda.stream(s), torch.inference_mode():
        for _ in range(3):
            hand(small)
    torch.cuda.current_stream().wait_stream(s)
    with torch.inference_mode(), torch.cuda.graph(g):
        hand(small)
    torch.backends.cudnn.benchmark = False
    pg = gpuopt.Config.parse("fp16+channels_last+cudagraph").apply(model, x[:1])
    overhead["resnet50_b1_fp16_cudagraph"] = gpuopt.compare(g.replay, pg.runner(x[:1]), labels=("plain", "gpuopt"),
                                                            mode="latency")
    for key, c in overhead.items():
        print(key, c)
        targets.append(Target(f"{key}: plain PyTorch time / gpuopt time", c.speedup, ">=", 0.95, "x",
                              "hand-written PyTorch, interleaved"))
    results = {"rows": rows, "overhead": {k: c.to_dict() for k, c in overhead.items()}}
    return write(args, results, targets)


if __name__ == "__main__":
    raise SystemExit(main())
