"""Inductor's programmatic dependent launch (``triton.enable_pdl``: its Triton kernels launched early,
waiting on the previous kernel in the device) in gpuopt's compiled decode step: OPT-1.3B
static-graph-compile, batch 1, prompt 128, 256 new tokens, each cell with (``pdl``) and without it
(``base``) in turn. gpuopt's own kernels launch programmatically in both; ``gpuopt.llm.passes.compile_options``
turns inductor's on by default where they do (compute capability 9.0+), so ``base`` takes it out.

    python benchmarks/llm_decode_pdl.py fp16:base,fp16:pdl,int8wo:base,int8wo:pdl,fp16:base,fp16:pdl

Prints VARIANT lines (no JSON). The runs the README cites, on the H100 (torch 2.11.0+cu130, transformers
5.17): ``results/llm_decode-pdl-73aa1ea-nvidia-h100-80gb-hbm3.log`` (slower, while gpuopt's own kernels
launched plainly) and ``results/llm_decode-pdl-59df1f2-nvidia-h100-80gb-hbm3.log`` (1.031x, with them
launched programmatically too).
"""
import sys
import time

import torch

from gpuopt.llm import Models, measure_decode, passes

base_options = passes.compile_options
models = Models("opt-1.3b", "cuda")
plan = sys.argv[1].split(",")  # e.g. fp16:base,fp16:pdl,...
res = {s: [] for s in plan}
for s in plan:
    precision, variant = s.split(":")
    passes.compile_options = (
        (lambda device=None: {**base_options(device), "triton.enable_pdl": True}) if variant == "pdl"
        else (lambda device=None: {k: v for k, v in base_options(device).items() if k != "triton.enable_pdl"}))
    t0 = time.time()
    try:
        r = measure_decode(models, path="static-graph-compile", precision=precision, batch_size=1, prompt_len=128,
                           new_tokens=256, parity=variant == "pdl", max_time_s=3.0)
        res[s].append(r.tpot_ms["mean"])
        par = f"; {r.parity.summary()}" if r.parity is not None else ""
        print(f"VARIANT {s}: TPOT {r.tpot_ms['mean']:.4f} ms [{time.time() - t0:.0f}s]{par}", flush=True)
    except Exception as exc:
        print(f"VARIANT {s}: ERROR {type(exc).__name__}: {exc}", flush=True)
    torch.cuda.empty_cache()
passes.compile_options = base_options
