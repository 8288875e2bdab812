"""Linear-kernel settings in the decode step itself: OPT-1.3B static-graph-compile, batch 1, prompt 128, 256
new tokens, every linear layer in one setting, each setting measured once per pass in turn (``passes``,
default 2), so that a drift over the session shows as a difference between passes.

    python benchmarks/llm_decode_layouts.py w0v0,cublas,w8v1,w16v2,w8v2 2

Settings: ``cublas`` (gpuopt._C.decode_linear_kernel("cublas")), ``w<warps>v<vector>`` (fp16,
gpuopt._C.decode_linear_layout(warps, vector); w0v0 is the default choice) and ``i8-<kernel>-v<vector>``
(int8wo; gpuopt._C.int8_linear_kernel and int8_linear_vector, v0 the default). It prints a ``VARIANT`` line
per measurement and one per setting at the end; it writes no JSON. The three runs that chose the decode
linear kernel's layout and the int8 kernel's vector are kept as printed in
``benchmarks/results/llm_decode-layouts-<commit>-nvidia-h100-80gb-hbm3.log`` (H100 80GB HBM3, torch
2.11.0+cu130, transformers 5.17.0, one session, 2026-11-27; the commit is the tree the package was built
from, whose default then was: c7ff738, 16 warps with one load; 24a6cf3 and 005c115, 16 warps with two).
"""
import sys
import time

import torch

from gpuopt import _C
from gpuopt.llm import Models, measure_decode

models = Models("opt-1.3b", "cuda")
settings = sys.argv[1].split(",")
passes = int(sys.argv[2]) if len(sys.argv) > 2 else 2
res = {s: [] for s in settings}
for p in range(passes):
    for s in settings:
        t0 = time.time()
        precision = "fp16"
        if s == "cublas":
            _C.decode_linear_kernel("cublas")
        elif s.startswith("i8-"):
            precision = "int8wo"
            kernel, v = s[3:].rsplit("-", 1)
            _C.int8_linear_kernel(kernel)
            _C.int8_linear_vector(int(v.lstrip("v")))
        else:
            w, v = (int(a) for a in s.lstrip("w").split("v"))
            _C.decode_linear_layout(w, v)
        try:
            r = measure_decode(models, path="static-graph-compile", precision=precision, batch_size=1, prompt_len=128,
                               new_tokens=256, parity=p == 0 and precision == "int8wo", max_time_s=3.0)
            res[s].append(r.tpot_ms["mean"])
            par = f"; {r.parity.summary()}" if r.parity is not None else ""
            print(f"VARIANT pass {p} {s}: TPOT {r.tpot_ms['mean']:.4f} ms [{time.time() - t0:.0f}s]{par}", flush=True)
        except Exception as exc:  # noqa: BLE001 - printed; the other settings still run
            print(f"VARIANT pass {p} {s}: ERROR {type(exc).__name__}: {exc}", flush=True)
        finally:
            _C.decode_linear_kernel("auto")
            _C.decode_linear_layout(0, 0)
            _C.int8_linear_kernel("auto")
            _C.int8_linear_vector(0)
        torch.cuda.empty_cache()
for s, v in res.items():
    print(f"VARIANT {s}: " + " ".join(f"{x:.4f}" for x in v))
