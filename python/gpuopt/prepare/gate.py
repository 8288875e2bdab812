"""The parity gate: a config's outputs against the FP32 reference, per output tensor."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..timing.inputs import split_inputs
from .config import PRECISIONS, Prepared
from .signal import is_degenerate, output_tensors

# Default relative L2 tolerance by precision (overridable with rtol=).
TOLERANCES = {"fp32": 1e-5, "tf32": 5e-3, "fp16-amp": 2e-2, "bf16-amp": 2e-2, "fp16": 2e-2, "bf16": 2e-2,
              # quantized linear layers (the rest bf16): int8 weights alone lose ~0.5% per layer; int8
              # activations about as much again; fp8 e4m3 (3 mantissa bits) a few percent per layer
              "int8-wo": 3e-2, "int8": 5e-2, "fp8": 1e-1}
# The narrower dtype a precision computes in: its range is checked against the reference's magnitudes.
_NARROW = {"fp16": torch.float16, "fp16-amp": torch.float16, "bf16": torch.bfloat16, "bf16-amp": torch.bfloat16,
           "int8-wo": torch.bfloat16, "int8": torch.bfloat16, "fp8": torch.bfloat16}
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass
class OutputParity:
    path: str  # where the tensor sits in the output structure, e.g. "logits" or "[0]"
    rel_l2: float | None  # ||cand - ref|| / ||ref||; None when the reference carries no signal
    max_abs: float
    ref_norm: float
    ref_max_abs: float  # the reference's largest magnitude: what the range diagnosis looks at
    finite: bool
    degenerate: bool  # reference all zeros or constant: no signal, compared by max abs error
    # For a classifier's output ([batch, classes], classes >= 2; the model's only output or one named
    # logits): the share of rows whose top-1 class matches the reference's. None for other outputs.
    top1_agreement: float | None = None


@dataclass
class Parity:
    """Per-output errors of a candidate against a reference, the tolerance, and the verdict; ``note``
    says why it failed (and names underflow or overflow of the candidate's precision)."""

    passed: bool
    tolerance: float
    outputs: list[OutputParity]
    note: str = ""

    @property
    def top1_agreement(self) -> float | None:
        """The top-1 agreement of the first classifier-shaped output (see :class:`OutputParity`)."""
        return next((o.top1_agreement for o in self.outputs if o.top1_agreement is not None), None)

    @property
    def worst_rel_l2(self) -> float | None:
        errs = [o.rel_l2 for o in self.outputs if o.rel_l2 is not None]
        return max(errs) if errs else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["worst_rel_l2"] = self.worst_rel_l2
        d["top1_agreement"] = self.top1_agreement
        return d

    def __str__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        worst = self.worst_rel_l2
        err = "n/a" if worst is None else f"{worst:.2e}"
        top1 = self.top1_agreement
        top1_text = "" if top1 is None else f", top-1 agreement {top1:.1%}"
        return (f"parity {verdict}: worst relative L2 error {err} (tolerance {self.tolerance:g}){top1_text}"
                f"{'; ' + self.note if self.note else ''}")


def _compare(path: str, cand: torch.Tensor, ref: torch.Tensor) -> OutputParity:
    c = cand.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if c.shape != r.shape:
        raise ValueError(f"output {path}: candidate shape {tuple(c.shape)} differs from reference {tuple(r.shape)}")
    finite = bool(torch.isfinite(c).all())
    diff = (c - r).nan_to_num(nan=math.inf)
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    ref_max_abs = float(r.abs().max()) if r.numel() else 0.0
    ref_norm = float(torch.linalg.vector_norm(r))
    degenerate = is_degenerate(ref)
    rel = None if degenerate else float(torch.linalg.vector_norm(diff)) / ref_norm
    return OutputParity(path, rel, max_abs, ref_norm, ref_max_abs, finite, degenerate)


def _top1(cand: torch.Tensor, ref: torch.Tensor) -> float | None:
    """Top-1 agreement of a [batch, classes] output (classes >= 2), else None."""
    if cand.dim() != 2 or cand.shape[0] < 1 or cand.shape[1] < 2 or not cand.is_floating_point():
        return None
    if not bool(torch.isfinite(cand).all()):
        return None
    return float((cand.argmax(dim=1).cpu() == ref.argmax(dim=1).cpu()).double().mean())


def _precision(candidate: Any, precision: str | None) -> str:
    if precision is None and isinstance(candidate, Prepared):
        precision = candidate.config.precision
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    return precision


def _tolerance(precision: str, rtol: float | None) -> float:
    if rtol is None:
        return TOLERANCES[precision]
    if not (isinstance(rtol, (int, float)) and rtol > 0):
        raise ValueError(f"rtol must be a positive number, got {rtol!r}")
    return float(rtol)


def _range(o: OutputParity, precision: str) -> str | None:
    """Underflow or overflow of the candidate's precision, judged by the reference's largest magnitude."""
    dtype = _NARROW.get(precision)
    if dtype is None or not o.ref_max_abs > 0:
        return None
    info, name = torch.finfo(dtype), _DTYPE_NAMES[dtype]
    if o.ref_max_abs < info.tiny:
        return (f"underflow: reference output '{o.path}' magnitudes (max {o.ref_max_abs:.2g}) lie below {name}'s "
                f"smallest normal number {info.tiny:.2g}")
    if o.ref_max_abs > info.max:
        return (f"overflow: reference output '{o.path}' magnitudes (max {o.ref_max_abs:.2g}) lie above {name}'s "
                f"largest number {info.max:.2g}")
    return None


def _call(fn: Any, inputs: Any) -> Any:
    if isinstance(fn, Prepared):
        return fn(inputs)
    args, kwargs = split_inputs(inputs)
    return fn(*args, **kwargs)


def parity(candidate: Any, reference: Any, inputs: Any, *, rtol: float | None = None,
           precision: str | None = None) -> Parity:
    """Compare ``candidate``'s outputs with ``reference``'s on ``inputs``: what each of them returns,
    so a prepared candidate is checked on the backend that is timed (TorchScript, compile, CUDA graph).

    Both are :class:`Prepared` objects, modules or callables (inputs as in :meth:`Config.apply`).
    Per output tensor, in float64: relative L2 error and max abs error. The tolerance is ``rtol`` or
    the default for the candidate's precision (fp32 1e-5, tf32 5e-3, fp16/bf16 2e-2); ``precision``
    overrides the candidate's own. An output whose reference carries signal passes when its relative
    L2 error is within the tolerance; one whose reference is all zeros or constant, when its max abs
    error is. NaN or Inf in the candidate always fails, and so does a reference none of whose outputs
    carries signal (a zero-initialised head gives that for every input): then nothing the candidate
    computes could be checked; :func:`gpuopt.prepare.with_signal` re-initialises such a layer. For
    fp16 and bf16 precisions, a reference whose magnitudes lie below the smallest normal number or
    above the largest number of that type is named in the note as underflow or overflow.

    >>> import torch, gpuopt
    >>> m = torch.nn.Linear(8, 4)
    >>> fp32 = gpuopt.Config("fp32").apply(m, torch.randn(2, 8), device="cpu")
    >>> gpuopt.parity(fp32, m, torch.randn(2, 8)).passed
    True
    """
    prec = _precision(candidate, precision)
    tol = _tolerance(prec, rtol)
    cand_out = output_tensors(_call(candidate, inputs))
    ref_out = output_tensors(_call(reference, inputs))
    if [p for p, _ in cand_out] != [p for p, _ in ref_out]:
        return Parity(False, tol, [], note=f"output structures differ: candidate {[p for p, _ in cand_out]}, "
                                           f"reference {[p for p, _ in ref_out]}")
    if not ref_out:
        return Parity(False, tol, [], note="the reference returned no tensors")
    outputs = [_compare(p, c, r) for (p, c), (_, r) in zip(cand_out, ref_out)]
    # A classifier's output: the model's only tensor, or one named logits (Hugging Face).
    for o, (p, c), (_, r) in zip(outputs, cand_out, ref_out):
        if len(outputs) == 1 or "logits" in p.lower():
            o.top1_agreement = _top1(c, r)
    notes = [f"non-finite values in {o.path}" for o in outputs if not o.finite]
    flat = [o for o in outputs if o.degenerate]
    if len(flat) == len(outputs):
        notes.append(f"the reference carries no signal: its output {', '.join(repr(o.path) for o in flat)} is all "
                     "zeros or constant for these inputs, so the candidate's outputs cannot be checked; re-initialise "
                     "the zero-initialised layers with gpuopt.prepare.with_signal(model, inputs) (gpuopt.benchmark "
                     "does it) or give inputs for which the output varies")
        passed = False
    else:
        passed = (all(o.finite for o in outputs) and all(o.rel_l2 <= tol for o in outputs if not o.degenerate)
                  and all(o.max_abs <= tol for o in flat))
        notes += [f"reference output '{o.path}' carries no signal (all zeros or constant): compared by max abs "
                  f"error {o.max_abs:.2e}" for o in flat]
    notes += [r for r in (_range(o, prec) for o in outputs) if r]
    return Parity(passed, tol, outputs, "; ".join(notes))
