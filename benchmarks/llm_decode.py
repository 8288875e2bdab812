"""LLM decode: gpuopt's fast path (static KV cache, a CUDA-graph step or one persistent kernel, token
loop in C++) against transformers' generate, in one run on one device (issue 14 targets):

- OPT-1.3B fp16, batch 1, prompt 128, 256 new tokens: the fast path reads >= 70% of the measured HBM
  read bandwidth per decode step and is >= 7x faster per token than ``hf-generate`` measured in the
  same run, its greedy tokens identical to fp16 ``hf-generate``'s (a difference is reported with the
  reference's top-2 margin there);
- int8 weight-only >= 1.5x the fp16 fast path at batch 1, parity reported;
- batch 32: tokens/s of ``static-graph`` (the fast path's graph form that takes any batch) >= 10x its
  batch-1 tokens/s;
- timer check: TPOT from gpuopt's engine within 3% of a plain CUDA-event loop around the same graph
  replays.

Parts (``--parts``): ``opt`` (hf-generate, static-graph, static-graph-compile and static-megakernel in fp16 at
batch 1, the fastest of them the fast path, its int8wo form and the faster graph path's, token identity and the
timer check), ``gemv`` (the int8 operator's kernel settings in a CUDA graph of 24 layers' calls, against each
other and fp16 cuBLAS on the model's decode-step matrices, interleaved), ``linear`` (gpuopt's fp16 decode
linear kernel in each of its layouts against cuBLAS on the same matrices, interleaved), ``chain`` (24 layers' fp16
linear layers chained in a CUDA graph, launched plainly and programmatically, interleaved), ``attention`` (gpuopt's decode
attention operator against transformers' SDPA function on decode-step shapes, interleaved), ``paths`` (the other paths
at batch 1), ``batch`` (batch sizes), ``sweep`` (a Results
sweep of the built-in models with plots). A part that fails is recorded with its reason and the others
still run; the JSON is checkpointed after every cell (``"complete": false`` until the end).
"""

from __future__ import annotations

import argparse
import gc
import math
import time
import traceback

import torch
from _common import RESULTS, Target, parse_args, require_gpu, slug, write

import gpuopt
from gpuopt.llm import Models, measure_decode
from gpuopt.llm.measure import default_attention, default_fuse, token_times
from gpuopt.llm.paths import Decoder

# What the opt part measures the faster graph path (static-graph or static-graph-compile) without (each a cell
# right after that path's, since the H100's clocks drift under its power cap over a run): fusing the sibling
# projections, gpuopt's decode attention, its decode linear kernel, programmatic dependent launch of its kernels
# (fp16 and int8wo), the norms folded into the linear layers with the residual adds in their epilogues (fp16 and
# int8wo).
ABLATIONS = ("unfused", "model-attention", "cublas-linears", "no-pdl", "no-fold")


def _ablations(text: str) -> set[str]:
    """``--ablations``: checked when the arguments are parsed, before anything is measured."""
    chosen = {a for a in text.split(",") if a}
    unknown = chosen - set(ABLATIONS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {sorted(unknown)}; allowed: {', '.join(ABLATIONS)} "
                                         "(a comma list, empty for none)")
    return chosen


def _extra(p):
    p.add_argument("--parts", default="opt,paths,batch,sweep")
    p.add_argument("--model", default="opt-1.3b")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--ablations", type=_ablations, default=",".join(ABLATIONS),
                   help="what the opt part also measures the faster graph path without, right after it (comma "
                        "list of " + ", ".join(ABLATIONS) + "; empty for none)")
    p.add_argument("--extra-paths", default="static,hf-static-compile,static-graph-compile",
                   help="paths of the 'paths' part, at batch 1 in fp16 (comma list)")


def _cell(r) -> dict:
    d = r.llm_dict()
    d["summary"] = r.summary()
    d["measurement_p50_ms"] = r.measurement.p50
    return d


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _event_loop_tpot(decoder, reps: int) -> float:
    """TPOT of a plain CUDA-event loop around the same graph replays (the timer check's baseline)."""
    n = decoder.new_tokens
    prefill, decode = decoder._graphs
    start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    out = []
    for _ in range(reps):
        start.record()
        prefill.replay()
        mid.record()
        for _ in range(n - 1):
            decode.replay()
        end.record()
        end.synchronize()
        out.append(mid.elapsed_time(end) / (n - 1))
    out.sort()
    return out[len(out) // 2]


def _runner(args, ceilings, results: dict, key: str, models, b: int, p: int, n: int, targets: list[Target]):
    """A function measuring one cell into results[key]["cells"], checkpointing the JSON after it."""
    budget = {"max_time_s": 3.0 if args.quick else 10.0}
    cells = results[key]["cells"]

    def run(path, precision, label=None, **kw):
        t0 = time.perf_counter()
        label = label or f"{precision}+{path}"
        try:
            r = measure_decode(models, path=path, precision=precision, batch_size=b, prompt_len=p, new_tokens=n,
                               ceilings=ceilings, **budget, **kw)
        except Exception as exc:  # noqa: BLE001 - recorded; the part goes on
            traceback.print_exc()
            cells[label] = {"error": f"{type(exc).__name__}: {exc}"}
            r = None
        else:
            print(r.summary(), f"[{time.perf_counter() - t0:.0f}s]", flush=True)
            cells[label] = _cell(r)
        _release()
        write(args, results, targets, final=False)
        return r

    return run


def part_opt(args, ceilings, results: dict, targets: list[Target]) -> None:
    b, p, n = 1, args.prompt, (32 if args.quick else args.new_tokens)
    models = Models(args.model, "cuda")
    results["opt"] = {"model": args.model, "batch_size": b, "prompt_len": p, "new_tokens": n, "cells": {}}
    run = _runner(args, ceilings, results, "opt", models, b, p, n, targets)
    base = run("hf-generate", "fp16")
    # gpuopt's fast path: the CUDA-graph step driven from C++, its step eager (captured as is) or compiled
    # by inductor before the capture, or (9.0+) one persistent kernel of gpuopt's (static-megakernel,
    # gpuopt.llm.stream, measured after the ablations); the targets take the fastest in fp16, and its int8wo
    # form. The ablations apply to the faster graph path (the megakernel has none of those parts to take out).
    graph_paths = {path: run(path, "fp16") for path in ("static-graph", "static-graph-compile")}
    graphs_done = {path: r for path, r in graph_paths.items() if r is not None}
    graph_best = min(graphs_done, key=lambda path: graphs_done[path].tpot_ms["mean"]) if graphs_done else None
    graph_fast = graphs_done.get(graph_best)
    results["opt"]["graph_fast_path"] = graph_best
    # What fusing the sibling projections (q/k/v; on by default in gpuopt's static paths) brings: the
    # faster graph path without it, in the same run and right after the fused paths (the H100's clocks drift
    # under its power cap over a run: the two are compared close together).
    ablations = args.ablations
    unfused = (run(graph_best, "fp16", label=f"fp16+{graph_best}+unfused", fuse=False)
               if graph_best and "unfused" in ablations else None)
    # The same for gpuopt's decode attention (on by default where the model takes it): that path with the
    # model's own attention (SDPA), right after.
    own_attention = (run(graph_best, "fp16", label=f"fp16+{graph_best}+model-attention", attention="model")
                     if graph_fast is not None and graph_fast.attention == "gpuopt" and "model-attention" in ablations
                     else None)
    # gpuopt's decode linear kernel (on by default in the fp16/bf16 static paths): that path with cuBLAS
    # linear layers instead, right after (the setting is read when the step is captured).
    cublas_linears = None
    if graph_fast is not None and graph_fast.decode_linears and "cublas-linears" in ablations:
        before = gpuopt._C.decode_linear_kernel("cublas")
        try:
            cublas_linears = run(graph_best, "fp16", label=f"fp16+{graph_best}+cublas-linears")
        finally:
            gpuopt._C.decode_linear_kernel(before)
    # Programmatic dependent launch of gpuopt's decode kernels and, with them, inductor's (on by default where
    # the device and this build's code are 9.0+): that path without either, right after (the setting is
    # read when the step is compiled and captured), and the same for its int8wo form.
    pdl = "no-pdl" in ablations and gpuopt._C.programmatic_launch_runs(torch.cuda.current_device())

    def without_pdl(precision):
        before = gpuopt._C.programmatic_launch(False)
        try:
            return run(graph_best, precision, label=f"{precision}+{graph_best}+no-pdl")
        finally:
            gpuopt._C.programmatic_launch(before)

    no_pdl = without_pdl("fp16") if graph_fast is not None and pdl else None
    # The norms folded into the linear layers after them and the residual adds moved into the epilogues of
    # those before (gpuopt.llm.fuse.fold_norms, passes.FuseResidual; on by default): without, right after.
    fold = "no-fold" in ablations and graph_fast is not None and graph_fast.folded_norms > 0
    no_fold = run(graph_best, "fp16", label=f"fp16+{graph_best}+no-fold", fold=False) if fold else None
    hopper = torch.cuda.get_device_capability()[0] >= 9
    mega = run("static-megakernel", "fp16") if hopper else None
    done = dict(graphs_done, **({"static-megakernel": mega} if mega is not None else {}))
    best = min(done, key=lambda path: done[path].tpot_ms["mean"]) if done else None
    fast = done.get(best)
    results["opt"]["fast_path"] = best
    int8 = run(best, "int8wo") if best else None
    # The faster graph path's int8wo too where the megakernel is the fast path (the ablations' int8 cells are
    # the graph path's).
    graph_int8 = int8 if best == graph_best else (run(graph_best, "int8wo") if graph_best else None)
    int8_no_pdl = without_pdl("int8wo") if graph_int8 is not None and pdl else None
    int8_no_fold = (run(graph_best, "int8wo", label=f"int8wo+{graph_best}+no-fold", fold=False)
                    if fold and graph_int8 else None)
    # The persistent kernel against the faster graph path of the same run, in fp16 and int8wo.
    for label, m, g in (("", mega, graph_fast), ("_int8",
                        int8 if best == "static-megakernel" else None, graph_int8)):
        if m is not None and g is not None:
            results["opt"][f"megakernel_speedup{label}"] = g.tpot_ms["mean"] / m.tpot_ms["mean"]
            print(f"static-megakernel{label.replace('_', ' ')}: TPOT {m.tpot_ms['mean']:.3f} ms"
                  + (f" ({m.pct_of_hbm_read:.1f}% of HBM read)" if m.pct_of_hbm_read is not None else "")
                  + f" against {graph_best}'s {g.tpot_ms['mean']:.3f} "
                  f"({results['opt'][f'megakernel_speedup{label}']:.3f}x)", flush=True)
    for label, on, off in (("fp16", graph_fast, no_fold), ("int8wo", graph_int8, int8_no_fold)):
        if on is not None and off is not None:
            results["opt"][f"fold_speedup_{label}"] = off.tpot_ms["mean"] / on.tpot_ms["mean"]
            print(f"folded norms and residual adds, {label}: {on.folded_norms} norms, TPOT {off.tpot_ms['mean']:.3f} "
                  f"(without) -> {on.tpot_ms['mean']:.3f} ms ({results['opt'][f'fold_speedup_{label}']:.3f}x)",
                  flush=True)
    for label, on, off in (("fp16", graph_fast, no_pdl), ("int8wo", graph_int8, int8_no_pdl)):
        if on is not None and off is not None:
            results["opt"][f"pdl_speedup_{label}"] = off.tpot_ms["mean"] / on.tpot_ms["mean"]
            print(f"programmatic launch, {label}: TPOT {off.tpot_ms['mean']:.3f} (without) -> "
                  f"{on.tpot_ms['mean']:.3f} ms ({results['opt'][f'pdl_speedup_{label}']:.3f}x)", flush=True)
    g = graph_fast
    if g is not None and cublas_linears is not None:
        results["opt"]["decode_linear_speedup"] = cublas_linears.tpot_ms["mean"] / g.tpot_ms["mean"]
        print(f"gpuopt's decode linear kernel: {g.decode_linears} layers, TPOT {cublas_linears.tpot_ms['mean']:.3f} "
              f"(cuBLAS) -> {g.tpot_ms['mean']:.3f} ms ({results['opt']['decode_linear_speedup']:.3f}x)", flush=True)
    if g is not None and unfused is not None:
        results["opt"]["fusion_speedup"] = unfused.tpot_ms["mean"] / g.tpot_ms["mean"]
        print(f"fused projections: {g.fused_projections} groups, TPOT {unfused.tpot_ms['mean']:.3f} -> "
              f"{g.tpot_ms['mean']:.3f} ms ({results['opt']['fusion_speedup']:.3f}x)", flush=True)

    if g is not None and own_attention is not None:
        results["opt"]["attention_speedup"] = own_attention.tpot_ms["mean"] / g.tpot_ms["mean"]
        print(f"gpuopt's decode attention: TPOT {own_attention.tpot_ms['mean']:.3f} (model's own) -> "
              f"{g.tpot_ms['mean']:.3f} ms ({results['opt']['attention_speedup']:.3f}x)", flush=True)

    if fast is not None:
        floor = (f"floor {fast.floor_tpot_ms:.3f} ms/token at {fast.hbm_read_gbps:.0f} GB/s ({fast.hbm_read_source})"
                 if fast.floor_tpot_ms is not None else "no HBM read figure (ceilings or datasheet)")
        targets.append(Target(f"{args.model} fp16 bs1 {best}: share of the measured HBM read bandwidth",
                              fast.pct_of_hbm_read or 0.0, ">=", 70.0, "%", floor))
        if base is not None:
            targets.append(Target(f"{args.model} fp16 bs1: hf-generate TPOT / {best} TPOT",
                                  base.tpot_ms["mean"] / fast.tpot_ms["mean"], ">=", 7.0, "x",
                                  "hf-generate, same run"))
    if fast is not None and int8 is not None:
        targets.append(Target(f"{args.model} bs1: int8wo {best} speed-up over fp16 {best}",
                              fast.tpot_ms["mean"] / int8.tpot_ms["mean"], ">=", 1.5, "x",
                              f"fp16 {best}, same run" + (f"; int8 {int8.parity.summary()}"
                                                          if int8.parity else "")))
    if fast is not None and fast.parity is not None:
        targets.append(Target(f"{args.model} fp16 {best}: parity with the fp32 reference "
                              f"({fast.parity.steps} tokens, teacher-forced)", float(fast.parity.passed), ">=", 1.0,
                              "", fast.parity.summary()))
    checks = [(_timer_check, fast is not None), (_token_identity, fast is not None and base is not None),
              (_step_breakdown, bool(done))]
    for check, applies in checks:
        if not applies:
            continue
        try:
            check(args, models, b, p, n, results, targets)
        except Exception as exc:  # noqa: BLE001 - recorded; the other check still runs
            traceback.print_exc()
            results["errors"][check.__name__.strip("_")] = f"{type(exc).__name__}: {exc}"
            targets.append(Target(f"{check.__name__.strip('_')}: ran without error", 0.0, ">=", 1.0, "",
                                  str(exc)[:200]))
        write(args, results, targets, final=False)


GEMV_SHAPES = {  # (N, K) of a decode step's linear layers: OPT-1.3B's, q/k/v fused
    "qkv": (6144, 2048), "out_proj": (2048, 2048), "fc1": (8192, 2048), "fc2": (2048, 8192),
    "lm_head": (50272, 2048)}


GEMV_VARIANTS = {  # int8 kernel settings compared (gpuopt._C.int8_linear_kernel, int8_linear_warps)
    "simt": ("simt", 0), "tc-4": ("tensor-core", 4), "tc-8": ("tensor-core", 8),
    "tc-16": ("tensor-core", 16), "tc-32": ("tensor-core", 32)}


def part_gemv(args, ceilings, results: dict, targets: list[Target]) -> None:
    """The int8 weight-only operator on each matrix of OPT-1.3B's decode step as the step runs it: 24
    layers' calls, each with a weight of its own (2.4 GB in all for the LM head, beyond the L2), captured
    in one CUDA graph (gpuopt's graph mode), per kernel setting (``gpuopt._C.int8_linear_kernel``:
    SIMT; the tensor-core kernel with 4, 8, 16 or 32 warps per block, ``gpuopt._C.int8_linear_warps``),
    each interleaved with the auto choice (the C++ bootstrap); and fp16
    ``F.linear`` (cuBLAS), also against auto. GB/s = the weight's bytes / time per call."""
    g = torch.Generator(device="cuda").manual_seed(0)
    layers = 24
    out = results["gemv"] = {"shapes": {}, "rows": [1, 4], "layers": layers, "variants": list(GEMV_VARIANTS)}
    for name, (n, k) in GEMV_SHAPES.items():
        try:
            w8 = [torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g) for _ in range(layers)]
            sc = [torch.rand(n, device="cuda", generator=g) * 0.01 for _ in range(layers)]
            w16 = [(w.half() * s.half()[:, None]).contiguous() for w, s in zip(w8, sc)]
            for m in out["rows"]:
                x = torch.randn(m, k, device="cuda", generator=g).half()
                row = out["shapes"][f"{name} m{m}"] = _gemv_in_graph(x, w8, sc, w16, args.quick)
                us = row["us"]
                print(f"GEMV {name} {n}x{k} m={m}, {layers} layers in a graph, us per call: "
                      + ", ".join(f"{lbl} {v:.2f}" for lbl, v in us.items())
                      + (f"; best int8 {row['best']} ({n * k / us[row['best']] / 1e3:.0f} GB/s)" if "best" in row
                         else ""), flush=True)
                write(args, results, targets, final=False)
        except Exception as exc:  # noqa: BLE001 - recorded; the other shapes still run
            traceback.print_exc()
            out["shapes"].setdefault(name, {})["error"] = f"{type(exc).__name__}: {exc}"
        w8 = sc = w16 = None
        _release()


def _gemv_in_graph(x, w8, sc, w16, quick) -> dict:
    """One shape of :func:`part_gemv`: each setting of GEMV_VARIANTS and fp16 cuBLAS against auto."""
    from gpuopt import _C

    ops = torch.ops.gpuopt
    n, k = w8[0].shape
    layers = len(w8)
    opts = {"mode": "graph", "calls_per_sample": 1, "max_time_s": 0.4 if quick else 1.0}

    def setting(kernel="auto", warps=0):
        def call():  # read at capture: the graph keeps the kernel it captured
            _C.int8_linear_kernel(kernel)
            _C.int8_linear_warps(warps)
            for w, s in zip(w8, sc):
                ops.int8_weight_only_linear(x, w, s)
        return call

    def fp16():
        for w in w16:
            torch.nn.functional.linear(x, w)

    row: dict = {"n": n, "k": k, "rows": x.shape[0], "us": {}, "vs_auto": {}}
    for label, fn in [*((lbl, setting(*v)) for lbl, v in GEMV_VARIANTS.items()), ("fp16-cublas", fp16)]:
        try:
            cmp = gpuopt.compare(setting(), fn, labels=("auto", label), **opts)
        except Exception as exc:  # noqa: BLE001 - recorded; the other settings still run
            traceback.print_exc()
            row.setdefault("errors", {})[label] = f"{type(exc).__name__}: {exc}"
            continue
        finally:
            _C.int8_linear_kernel("auto")
            _C.int8_linear_warps(0)
        row["us"]["auto"] = cmp.baseline_ms * 1e3 / layers
        row["us"][label] = cmp.candidate_ms * 1e3 / layers
        row["vs_auto"][label] = {"speedup": cmp.speedup, "ci": list(cmp.ci), "verdict": cmp.verdict}
    int8 = {lbl: v for lbl, v in row["us"].items() if lbl != "fp16-cublas"}
    if int8:
        row["best"] = min(int8, key=int8.get)
        row["best_gbps"] = n * k / int8[row["best"]] / 1e3
    return row


LINEAR_LAYOUTS = {  # gpuopt._C.decode_linear_layout(warps, vector) settings compared; "auto" is (0, 0)
    "auto": (0, 0), "w8v1": (8, 1), "w16v1": (16, 1), "w8v2": (8, 2), "w16v2": (16, 2), "w32v2": (32, 2),
    "w8v4": (8, 4), "w16v4": (16, 4), "w32v4": (32, 4)}


def part_linear(args, ceilings, results: dict, targets: list[Target]) -> None:
    """gpuopt's 16-bit decode linear kernel (``torch.ops.gpuopt.decode_linear``) on each matrix of OPT-1.3B's
    decode step, 24 layers' calls with a weight each in one CUDA graph as in :func:`part_gemv`, in each
    layout of LINEAR_LAYOUTS (warps per block, 16-byte loads per row and chunk), against fp16 cuBLAS
    (``F.linear``), interleaved. GB/s = the weight's bytes / time per call."""
    g = torch.Generator(device="cuda").manual_seed(0)
    layers = 24
    rows = [1]  # the batch-1 step's rows (the kernel's MMA costs the same for up to 8)
    out = results["linear"] = {"shapes": {}, "rows": rows, "layers": layers, "layouts": LINEAR_LAYOUTS}
    opts = {"mode": "graph", "calls_per_sample": 1, "max_time_s": 0.3 if args.quick else 0.8}
    for name, (n, k) in GEMV_SHAPES.items():
        try:
            w16 = [(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).half() for _ in range(layers)]
            for m in rows:
                x = torch.randn(m, k, device="cuda", generator=g).half()
                row = out["shapes"][f"{name} m{m}"] = _linear_layouts_in_graph(x, w16, opts)
                ours_us = {lbl: v for lbl, v in row["us"].items() if lbl != "cublas"}
                if ours_us:
                    row["best"] = min(ours_us, key=ours_us.get)
                print(f"LINEAR fp16 {name} {n}x{k} m={m}, {layers} layers in a graph, us per call (GB/s): "
                      + ", ".join(f"{lbl} {v:.2f} ({n * k * 2 / v / 1e3:.0f})" for lbl, v in row["us"].items())
                      + f"; best {row.get('best')}", flush=True)
                write(args, results, targets, final=False)
        except Exception as exc:  # noqa: BLE001 - recorded; the other shapes still run
            traceback.print_exc()
            out["shapes"].setdefault(name, {})["error"] = f"{type(exc).__name__}: {exc}"
        w16 = None
        _release()


def _linear_layouts_in_graph(x, w16, opts) -> dict:
    """One shape of :func:`part_linear`: each layout of LINEAR_LAYOUTS against cuBLAS."""
    from gpuopt import _C

    ops = torch.ops.gpuopt
    n, k = w16[0].shape
    layers = len(w16)
    row: dict = {"n": n, "k": k, "rows": x.shape[0], "us": {}, "vs_cublas": {}}

    def cublas():
        for w in w16:
            torch.nn.functional.linear(x, w)

    def ours(layout):
        def call():  # read at capture: the graph keeps the layout it captured
            _C.decode_linear_layout(*layout)
            for w in w16:
                ops.decode_linear(x, w)
        return call

    for label, layout in LINEAR_LAYOUTS.items():
        try:
            cmp = gpuopt.compare(cublas, ours(layout), labels=("cublas", label), **opts)
        except Exception as exc:  # noqa: BLE001 - recorded; the other layouts still run
            traceback.print_exc()
            row.setdefault("errors", {})[label] = f"{type(exc).__name__}: {exc}"
            continue
        finally:
            _C.decode_linear_layout(0, 0)
        row["us"]["cublas"] = cmp.baseline_ms * 1e3 / layers  # the last comparison's; each in vs_cublas
        row["us"][label] = cmp.candidate_ms * 1e3 / layers
        row["vs_cublas"][label] = {"speedup": cmp.speedup, "ci": list(cmp.ci), "verdict": cmp.verdict,
                                   "cublas_us": cmp.baseline_ms * 1e3 / layers}
    return row


def part_chain(args, ceilings, results: dict, targets: list[Target]) -> None:
    """The decode step's chain of fp16 linear layers without the rest: 24 OPT-1.3B layers' q/k/v, out_proj,
    fc1 (ReLU) and fc2, each reading the output of the one before, captured in one CUDA graph, launched
    plainly and programmatically (each kernel's blocks start while the one before finishes, and wait for
    it before any load), interleaved. What the step's linear layers cost without the rest of the step: us
    per layer against its 101 MB at the measured HBM read bandwidth (the floor)."""
    from gpuopt import _C

    ops = torch.ops.gpuopt
    g = torch.Generator(device="cuda").manual_seed(0)
    layers = 24
    shapes = [GEMV_SHAPES[name] for name in ("qkv", "out_proj", "fc1", "fc2")]
    weights = [[(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).half() for n, k in shapes]
               for _ in range(layers)]
    h0 = torch.randn(1, 2048, device="cuda", generator=g).half()
    layer_bytes = sum(n * k * 2 for n, k in shapes)
    hbm = results.get("hbm_read_gbps")
    out = results["chain"] = {"layers": layers, "layer_bytes": layer_bytes, "us_per_layer": {}, "vs": {}}
    if hbm:
        out["floor_us_per_layer"] = layer_bytes / hbm / 1e3

    def chain(programmatic):
        def call():  # the setting is read at capture: the graph keeps it
            before = _C.programmatic_launch(programmatic)
            try:
                h = h0
                for w_qkv, w_out, w_fc1, w_fc2 in weights:
                    qkv = ops.decode_linear(h, w_qkv, None, "none")
                    a = ops.decode_linear(qkv[:, :2048], w_out, None, "none")
                    f = ops.decode_linear(a, w_fc1, None, "relu")
                    h = ops.decode_linear(f, w_fc2, None, "none")
                return h
            finally:
                _C.programmatic_launch(before)
        return call

    calls = {"plain": chain(False), "pdl": chain(True)}
    if not torch.equal(calls["pdl"](), calls["plain"]()):
        out.setdefault("errors", {})["pdl"] = "output differs from the plain launch's"
    opts = {"mode": "graph", "calls_per_sample": 1, "max_time_s": 0.5 if args.quick else 1.5}
    cmp = gpuopt.compare(calls["plain"], calls["pdl"], labels=("plain", "pdl"), **opts)
    us = {"plain": cmp.baseline_ms * 1e3 / layers, "pdl": cmp.candidate_ms * 1e3 / layers}
    out["us_per_layer"] = us
    out["vs"]["pdl vs plain"] = {"speedup": cmp.speedup, "ci": list(cmp.ci), "verdict": cmp.verdict}
    share = {k: layer_bytes / v / 1e3 / hbm * 100 for k, v in us.items()} if hbm else {}
    out["pct_of_hbm_read"] = share
    print(f"CHAIN {layers} layers' q/k/v, out_proj, fc1, fc2 in a graph: plain {us['plain']:.2f} us per layer, "
          f"pdl {us['pdl']:.2f} ({cmp.speedup:.3f}x, {cmp.verdict})"
          + (f"; {share['pdl']:.1f}% of HBM read, floor {out['floor_us_per_layer']:.2f} us" if hbm else ""),
          flush=True)


# (batch, heads, kv heads, cache length): decode steps of OPT-1.3B-like (32 heads) and Llama-1B-like
# (32 query, 8 KV heads) layers, two thirds of the cache attended.
ATTENTION_SHAPES = {f"b{b} h{h}/{hkv} L{cache}": (b, h, hkv, cache, cache - cache // 3)
                    for b in (1, 8, 32) for cache in (384, 1024, 4096) for h, hkv in ((32, 32), (32, 8))}


def part_attention(args, ceilings, results: dict, targets: list[Target]) -> None:
    """One decode step's attention of one layer (head size 64, fp16, a static cache with a bool mask
    over its first keys, as a Hugging Face model hands it over): gpuopt's operator against transformers'
    SDPA function with the same mask (the model's own attention: grouped KV heads copied per query head,
    then torch's SDPA), interleaved, the L2 flushed before each call;
    and on how many shapes gpuopt's was the faster (gpuopt.llm.attention runs it on every decode shape
    with a head size it takes)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ops = torch.ops.gpuopt
    g = torch.Generator(device="cuda").manual_seed(0)
    opts = {"flush_l2": True, "max_time_s": 0.5 if args.quick else 1.5}
    out = results["attention"] = {"shapes": {}}
    for name, (b, h, hkv, cache, keys) in ATTENTION_SHAPES.items():
        try:
            q = torch.randn(b, 1, h, 64, device="cuda", generator=g).half().transpose(1, 2)
            k = torch.randn(b, hkv, cache, 64, device="cuda", generator=g).half()
            v = torch.randn(b, hkv, cache, 64, device="cuda", generator=g).half()
            mask = (torch.arange(cache, device="cuda") < keys)[None, None, None, :].expand(b, 1, 1, cache)
            group = h // hkv

            module = _AttentionStub(group)

            def sdpa(q=q, k=k, v=v, mask=mask, module=module):
                # the model's own attention: transformers' SDPA function, as a model calls it (with a mask
                # and grouped KV heads, transformers 5.17 copies K and V per query head first)
                return sdpa_attention_forward(module, q, k, v, mask, scaling=None)[0]

            def ours(q=q, k=k, v=v, mask=mask):
                return ops.decode_attention(q, k, v, mask)

            err = float((ours().float() - sdpa().float()).abs().max())
            cmp = gpuopt.compare(sdpa, ours, labels=("sdpa", "gpuopt"), **opts)
        except Exception as exc:  # noqa: BLE001 - recorded; the other shapes still run
            traceback.print_exc()
            out["shapes"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        read = 2 * b * hkv * keys * 64 * 2  # K and V rows attended, fp16
        out["shapes"][name] = {"batch": b, "heads": h, "kv_heads": hkv, "cache": cache, "keys": keys,
                               "sdpa_ms": cmp.baseline_ms, "gpuopt_ms": cmp.candidate_ms, "speedup": cmp.speedup,
                               "ci": list(cmp.ci), "verdict": cmp.verdict, "max_abs_diff": err,
                               "gpuopt_gbps": read / cmp.candidate_ms / 1e6}
        print(f"attention {name}: SDPA {cmp.baseline_ms * 1e3:.1f} us, gpuopt {cmp.candidate_ms * 1e3:.1f} us "
              f"({cmp.speedup:.2f}x [{cmp.ci[0]:.2f}, {cmp.ci[1]:.2f}], {read / cmp.candidate_ms / 1e6:.0f} GB/s "
              f"of K and V), max |diff| {err:.2g}", flush=True)
        write(args, results, targets, final=False)
        _release()
    for name in ("b1 h32/32 L384", "b1 h32/8 L384", "b8 h32/32 L1024"):
        try:
            out.setdefault("in_graph", {})[name] = row = _attention_in_graph(*ATTENTION_SHAPES[name], g, args.quick)
        except Exception as exc:  # noqa: BLE001 - recorded; the others still run
            traceback.print_exc()
            out.setdefault("in_graph", {})[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        print(f"attention in a CUDA graph, {name}, 24 layers: SDPA {row['sdpa_us_per_call']:.2f} us per call, "
              f"gpuopt {row['gpuopt_us_per_call']:.2f} ({row['speedup']:.2f}x [{row['ci'][0]:.2f}, "
              f"{row['ci'][1]:.2f}])", flush=True)
        write(args, results, targets, final=False)
        _release()
    try:
        out["append_in_graph"] = r = _append_in_graph(g, args.quick)
        print(f"append in a CUDA graph, b1 h32/32 L384 at position 255, 24 layers, the mask read -> the keys "
              f"bounded by the position (causal): {r['mask_us_per_call']:.2f} -> {r['causal_us_per_call']:.2f} us "
              f"per call ({r['speedup']:.2f}x [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]), max |diff| {r['max_abs_diff']:.2g}",
              flush=True)
    except Exception as exc:  # noqa: BLE001 - recorded; the summary still prints
        traceback.print_exc()
        out["append_in_graph"] = {"error": f"{type(exc).__name__}: {exc}"}
    _release()
    write(args, results, targets, final=False)
    rows = [r for r in out["shapes"].values() if "error" not in r]
    faster = sum(1 for r in rows if r["speedup"] > 1.0)
    out["gpuopt_faster"] = [faster, len(rows)]
    print(f"attention: gpuopt's kernel faster than SDPA on {faster} of {len(rows)} shapes", flush=True)


class _AttentionStub(torch.nn.Module):
    """What transformers' attention functions read of the attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _attention_in_graph(b, h, hkv, cache, keys, g, quick, layers=24) -> dict:
    """The attention of a whole decode step as it runs in gpuopt's fast path: ``layers`` calls, each on
    a KV cache of its own (together larger than the L2, as a model's are), captured in one CUDA graph
    (gpuopt's graph mode); SDPA's against gpuopt's, interleaved; time per call."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ops = torch.ops.gpuopt
    q = torch.randn(b, 1, h, 64, device="cuda", generator=g).half().transpose(1, 2)
    caches = [(torch.randn(b, hkv, cache, 64, device="cuda", generator=g).half(),
               torch.randn(b, hkv, cache, 64, device="cuda", generator=g).half()) for _ in range(layers)]
    mask = (torch.arange(cache, device="cuda") < keys)[None, None, None, :].expand(b, 1, 1, cache)
    module = _AttentionStub(h // hkv)

    def sdpa():
        for k, v in caches:
            sdpa_attention_forward(module, q, k, v, mask, scaling=None)

    def ours():
        for k, v in caches:
            ops.decode_attention(q, k, v, mask)

    cmp = gpuopt.compare(sdpa, ours, labels=("sdpa", "gpuopt"), mode="graph", calls_per_sample=1,
                         max_time_s=0.5 if quick else 1.5)
    return {"layers": layers, "sdpa_us_per_call": cmp.baseline_ms * 1e3 / layers,
            "gpuopt_us_per_call": cmp.candidate_ms * 1e3 / layers, "speedup": cmp.speedup, "ci": list(cmp.ci),
            "verdict": cmp.verdict}


def _append_in_graph(g, quick, layers=24, cache=384, position=255) -> dict:
    """decode_attention_append as a decode step of gpuopt's fast path runs it (OPT-1.3B's 32 heads of 64,
    fp16, batch 1, ``layers`` caches of their own, captured in one CUDA graph): with the step's mask read
    (before) against the keys bounded by the position (causal), interleaved."""
    ops = torch.ops.gpuopt
    h, d = 32, 64
    q = torch.randn(1, 1, h, d, device="cuda", generator=g).half().transpose(1, 2)
    kv = torch.randn(1, 1, 2 * h * d, device="cuda", generator=g).half()
    k_new = kv[..., :h * d].view(1, 1, h, d).transpose(1, 2)
    v_new = kv[..., h * d:].view(1, 1, h, d).transpose(1, 2)
    caches = [(torch.randn(1, h, cache, d, device="cuda", generator=g).half(),
               torch.randn(1, h, cache, d, device="cuda", generator=g).half()) for _ in range(layers)]
    pos = torch.tensor([position], device="cuda")
    mask = (torch.arange(cache, device="cuda") <= position)[None, None, None, :]

    def masked():
        for k, v in caches:
            ops.decode_attention_append(q, k, v, k_new, v_new, pos, mask)

    def causal():
        for k, v in caches:
            ops.decode_attention_append(q, k, v, k_new, v_new, pos, None, None, True)

    k, v = caches[0]
    err = float((ops.decode_attention_append(q, k, v, k_new, v_new, pos, mask).float()
                 - ops.decode_attention_append(q, k, v, k_new, v_new, pos, None, None, True).float()).abs().max())
    cmp = gpuopt.compare(masked, causal, labels=("mask", "causal"), mode="graph", calls_per_sample=1,
                         max_time_s=0.5 if quick else 1.5)
    return {"layers": layers, "cache": cache, "position": position,
            "mask_us_per_call": cmp.baseline_ms * 1e3 / layers, "causal_us_per_call": cmp.candidate_ms * 1e3 / layers,
            "speedup": cmp.speedup, "ci": list(cmp.ci), "verdict": cmp.verdict, "max_abs_diff": err}


def _kind(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ("gemm", "gemv", "xmma", "cutlass", "nvjet", "splitk", "kernels::int8_linear",
                                       "kernels::decode_linear", "cublas")):
        return "gemm"
    if any(k in low for k in ("attention", "fmha", "flash", "softmax")):
        return "attention"
    return "other"


def _step_breakdown(args, models, b, p, n, results, targets) -> None:
    """Where a decode step's time goes, for each fast path in fp16: the kernels of its captured graph
    (torch.profiler around graph replays), their count and summed time by kind (GEMM/GEMV, attention,
    other), against the step's TPOT; the rest is the GPU's time between kernels. Under programmatic
    dependent launch a kernel starts while the one before it finishes, so kernels overlap: their summed
    time can exceed the TPOT (``between_kernels_us`` is then negative, the overlap)."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    best = results["opt"].get("fast_path")
    for precision, path in (("fp16", "static-graph"), ("fp16", "static-graph-compile"), ("fp16", "static-megakernel"),
                            ("int8wo", best)):
        cell = results["opt"]["cells"].get(f"{precision}+{path}", {})
        if "error" in cell or not cell:
            continue
        dec = _decoder(models, path, b, p, n, precision)
        try:
            prefill, graph = dec._graphs
            reps = max(1, min(20, n - 4))  # decode steps after one prefill, all within the cache
            prefill.replay()
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    graph.replay()
                torch.cuda.synchronize()
        finally:
            dec.close()
            _release()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_kind: dict = {}
        by_name: dict = {}
        for e in kernels:
            us = e.time_range.elapsed_us()
            k = by_kind.setdefault(_kind(e.name), {"kernels": 0, "us": 0.0})
            k["kernels"] += 1 / reps
            k["us"] += us / reps
            c = by_name.setdefault(e.name[:90], [0, 0.0])
            c[0] += 1 / reps
            c[1] += us / reps
        total = sum(k["us"] for k in by_kind.values())
        tpot_us = cell["tpot_ms"]["mean"] * 1e3
        key = path if precision == "fp16" else f"{precision}+{path}"
        out[key] = {"kernels_per_step": sum(k["kernels"] for k in by_kind.values()), "kernel_us_per_step": total,
                     "tpot_us": tpot_us, "between_kernels_us": tpot_us - total, "by_kind": by_kind,
                     "top": sorted(([k, c[0], c[1]] for k, c in by_name.items()), key=lambda t: -t[2])[:15]}
        print(f"{key}: {out[key]['kernels_per_step']:.0f} kernels per step, {total:.0f} us of kernels of "
              f"{tpot_us:.0f} us TPOT; by kind " + ", ".join(f"{k} {v['kernels']:.0f} kernels {v['us']:.0f} us"
                                                           for k, v in by_kind.items()), flush=True)
    results["opt"]["step_breakdown"] = out


def _decoder(models, path, b, p, n, precision="fp16"):
    # as measure_decode runs each path by default: fused projections, gpuopt's attention where they apply
    model = models.candidate(precision, fused=default_fuse(path))
    return Decoder(model, path, models.prompt(b, p), n, gpuopt._C.StepClock(0, n), torch.float16,
                   attention=default_attention(models, path))


def _token_identity(args, models, b, p, n, results, targets) -> None:
    """The fast path's greedy tokens of a whole request against fp16 generate's on the same prompt; at
    the first difference, how far below its own choice generate rates the fast path's token (a near-tie
    explains a flip)."""
    hf = _decoder(models, "hf-generate", b, p, n)
    try:
        ref_tokens, ref_logits = hf.free_logits(n)
    finally:
        hf.close()
    fast = results["opt"]["fast_path"]
    graph = _decoder(models, fast, b, p, n)
    try:  # closed whatever happens: it sets the shared model's attention for its life
        graph.loop.run()
        torch.cuda.synchronize()
        tokens = graph.tokens()
    finally:
        graph.close()
    same = tokens.eq(ref_tokens.to(tokens.device))
    first = int((~same.all(0)).nonzero()[0]) if not bool(same.all()) else None
    info = {"equal": int(same.sum()), "compared": same.numel(), "first_difference": first}
    tie = False
    ulp = 0.0
    if first is not None:
        row = int((~same[:, first]).nonzero()[0])  # the sequence that differs there
        top2 = ref_logits[first, row].float().topk(2)
        info["row"] = row
        info["generate_top2_margin_at_difference"] = float(top2.values[0] - top2.values[1])
        info["generate_top1_logit_at_difference"] = float(top2.values[0].abs())
        info["fast_token_is_generates_second_choice"] = int(tokens[row, first]) == int(top2.indices[1])
        # generate's own logit for the token the fast path took, below its top one by this much (several
        # tokens can share the top fp16 value: then the fast token may be a tied third one).
        info["generate_margin_of_fast_token"] = float(top2.values[0] - ref_logits[first, row, int(tokens[row, first])])
        # Two fp16 paths sum in different orders, so a token generate rates within a rounding step of its
        # choice is as right as that choice; from there the two free-running requests diverge.
        ulp = 2.0 ** (math.floor(math.log2(max(info["generate_top1_logit_at_difference"], 2.0 ** -14))) - 10)
        tie = info["generate_margin_of_fast_token"] <= 2 * ulp
        info["difference_is_a_tie_within_2_fp16_ulps"] = tie
    results["opt"]["fast_vs_generate_tokens"] = info
    _release()
    why = f"fp16 hf-generate, same prompt: {int(same.sum())}/{same.numel()} tokens equal"
    if first is not None:
        why += (f"; first difference at token {first}, where generate rates the fast path's token "
                f"{info['generate_margin_of_fast_token']:.3g} below its own (fp16 ULP there {ulp:.3g}; its top-2 "
                f"margin {info['generate_top2_margin_at_difference']:.3g})")
    targets.append(Target(f"{args.model} fp16 bs1: {fast} tokens equal to hf-generate's up to the first difference, "
                          "which must be a tie within 2 fp16 ULPs", float(first is None or tie), ">=", 1.0, "", why))


def _timer_check(args, models, b, p, n, results, targets) -> None:
    """The engine's TPOT of a decoder's token loop against a plain CUDA-event loop around the same
    decoder's graph replays, measured before and after it."""
    reps = 5 if args.quick else 20
    dec = _decoder(models, "static-graph", b, p, n)
    try:
        before = _event_loop_tpot(dec, reps)
        dec.clock.clear()
        m = gpuopt.measure(dec.loop, mode="latency", warmup=1, min_iters=5, max_time_s=3.0 if args.quick else 10.0)
        got = token_times(dec.clock.requests(), m.n, n)
        after = _event_loop_tpot(dec, reps)
    finally:
        dec.close()
    engine = sorted(got["tpot"])[len(got["tpot"]) // 2]
    plain = (before + after) / 2
    results["opt"]["timer_check"] = {"engine_tpot_ms": engine, "event_loop_tpot_ms": plain,
                                     "event_loop_runs_ms": [before, after], "engine_requests": m.n}
    _release()
    targets.append(Target("timer: |engine TPOT / plain CUDA-event loop TPOT - 1|", abs(engine / plain - 1.0), "<=",
                          0.03, "", "CUDA events around the same graphs' replays, before and after"))


def part_paths(args, ceilings, results: dict, targets: list[Target]) -> None:
    b, p, n = 1, args.prompt, (32 if args.quick else args.new_tokens)
    models = Models(args.model, "cuda")
    results["paths"] = {"model": args.model, "batch_size": b, "prompt_len": p, "new_tokens": n, "cells": {}}
    run = _runner(args, ceilings, results, "paths", models, b, p, n, targets)
    for path in filter(None, args.extra_paths.split(",")):
        run(path, "fp16")


def part_batch(args, ceilings, results: dict, targets: list[Target]) -> None:
    p, n = args.prompt, (32 if args.quick else args.new_tokens)
    models = Models(args.model, "cuda")
    out = {}
    for b in (1, 8, 32, 64):
        try:
            r = measure_decode(models, path="static-graph", precision="fp16", batch_size=b, prompt_len=p,
                               new_tokens=n, ceilings=ceilings, parity=(b == 32), max_time_s=3.0 if args.quick else 8.0)
            print(r.summary(), flush=True)
            out[b] = _cell(r)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            out[b] = {"error": f"{type(exc).__name__}: {exc}"}
        results["batch"] = {"model": args.model, "prompt_len": p, "new_tokens": n, "cells": out}
        _release()
        write(args, results, targets, final=False)
    if "decode_tokens_per_s" in out.get(1, {}) and "decode_tokens_per_s" in out.get(32, {}):
        targets.append(Target(f"{args.model} fp16 static-graph: decode tokens/s at batch 32 / batch 1",
                              out[32]["decode_tokens_per_s"] / out[1]["decode_tokens_per_s"], ">=", 10.0, "x",
                              "batch 1, same run"))


def part_sweep(args, ceilings, results: dict, targets: list[Target]) -> None:
    quick = args.quick
    out_dir = RESULTS / f"llm-sweep-{slug(torch.cuda.get_device_name(0))}"
    res = gpuopt.decode_sweep(
        ["opt-125m", "gpt2", "llama-1b", args.model] if not quick else ["opt-125m"],
        paths=["static-graph"], precisions=["fp16"], batch_sizes=[1, 8, 32, 64] if not quick else [1, 8],
        prompt_lens=[128, 512] if not quick else [128], new_tokens=[128] if not quick else [32],
        ceilings=ceilings, parity_tokens=16, max_time_s=3.0 if quick else 5.0)
    try:
        res.save(out_dir)
    except Exception as exc:  # noqa: BLE001 - the rows are in the JSON below anyway
        print(f"saving the sweep's report failed: {exc}")
    results["sweep"] = {"dir": str(out_dir), "rows": [r.to_dict() for r in res.rows]}
    failed = [r for r in res.rows if not r.ok]
    targets.append(Target("sweep: cells that failed (each recorded with its reason)", float(len(failed)), "<=", 0.0,
                          "", "; ".join(f"{r.model} {r.config} bs{r.batch_size} {r.mode}: {r.error}"
                                        for r in failed)[:300]))


def main() -> int:
    args = parse_args("llm_decode", _extra)
    require_gpu(args.name)
    import transformers

    results: dict = {"errors": {}, "transformers": transformers.__version__}
    targets: list[Target] = []
    try:
        ceilings = gpuopt.ceilings(0, quick=args.quick)
    except Exception as exc:  # noqa: BLE001 - the datasheet figure is used then, and said so
        results["errors"]["ceilings"] = f"{type(exc).__name__}: {exc}"
        ceilings = None
    results["hbm_read_gbps"] = (ceilings or {}).get("measured", {}).get("hbm_read_gbps")
    parts = {"opt": part_opt, "gemv": part_gemv, "linear": part_linear, "chain": part_chain,
             "attention": part_attention, "paths": part_paths, "batch": part_batch, "sweep": part_sweep}
    unknown = sorted(set(args.parts.split(",")) - set(parts))
    if unknown:
        raise SystemExit(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(parts)}")
    if args.out is None and args.parts != "opt,paths,batch,sweep":
        # a run of some parts must not overwrite the file of another run's parts
        args.out = RESULTS / f"{args.name}-{slug(args.parts)}-{slug(torch.cuda.get_device_name(0))}.json"
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            parts[name](args, ceilings, results, targets)
        except Exception as exc:  # noqa: BLE001 - recorded; the other parts still run
            traceback.print_exc()
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
            targets.append(Target(f"{name}: ran without error", 0.0, ">=", 1.0, "", str(exc)[:200]))
        results.setdefault("part_s", {})[name] = time.perf_counter() - t0
        _release()
        write(args, results, targets, final=False)
    return write(args, results, targets)


if __name__ == "__main__":
    raise SystemExit(main())
