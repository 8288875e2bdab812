"""The parity gate: a config's outputs against the FP32 reference, per output tensor."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..timing.inputs import split_inputs
from .config import Prepared

# Default relative L2 tolerance by precision (overridable with rtol=).
TOLERANCES = {"fp32": 1e-5, "tf32": 5e-3, "fp16-amp": 2e-2, "bf16-amp": 2e-2, "fp16": 2e-2, "bf16": 2e-2}


@dataclass
class OutputParity:
    path: str  # where the tensor sits in the output structure, e.g. "logits" or "[0]"
    rel_l2: float | None  # ||cand - ref|| / ||ref||; None when the reference carries no signal
    max_abs: float
    ref_norm: float
    finite: bool
    degenerate: bool  # reference all zeros or constant: no signal to compare against


@dataclass
class Parity:
    """Per-output errors of a candidate against a reference, the tolerance, and the verdict."""

    passed: bool
    tolerance: float
    outputs: list[OutputParity]
    note: str = ""
    signal: str | None = None  # the tensor compared instead of a degenerate output, if any
    signal_rel_l2: float | None = None

    @property
    def worst_rel_l2(self) -> float | None:
        errs = [o.rel_l2 for o in self.outputs if o.rel_l2 is not None]
        if self.signal_rel_l2 is not None:
            errs.append(self.signal_rel_l2)
        return max(errs) if errs else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["worst_rel_l2"] = self.worst_rel_l2
        return d

    def __str__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        worst = self.worst_rel_l2
        err = "n/a" if worst is None else f"{worst:.2e}"
        return f"parity {verdict}: worst relative L2 error {err} (tolerance {self.tolerance:g}){'; ' + self.note if self.note else ''}"


def _flatten(obj: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """Tensors of an output structure: tensors, tuples/lists, dicts and Hugging Face ModelOutput."""
    if isinstance(obj, torch.Tensor):
        return [(path or "output", obj)]
    if hasattr(obj, "to_tuple") and hasattr(obj, "keys"):  # transformers ModelOutput
        obj = dict(obj.items())
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            out += _flatten(v, f"{path}.{k}" if path else str(k))
        return out
    if isinstance(obj, (list, tuple)):
        out = []
        for i, v in enumerate(obj):
            out += _flatten(v, f"{path}[{i}]")
        return out
    return []


def _degenerate(ref: torch.Tensor) -> bool:
    if ref.numel() == 0:
        return True
    r = ref.detach().float()
    return bool(torch.all(r == 0)) or (ref.numel() > 1 and bool(r.max() == r.min()))


def _compare(path: str, cand: torch.Tensor, ref: torch.Tensor) -> OutputParity:
    c = cand.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if c.shape != r.shape:
        raise ValueError(f"output {path}: candidate shape {tuple(c.shape)} differs from reference {tuple(r.shape)}")
    finite = bool(torch.isfinite(c).all())
    diff = (c - r).nan_to_num(nan=math.inf)
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    ref_norm = float(torch.linalg.vector_norm(r))
    degenerate = _degenerate(ref)
    rel = None if degenerate else float(torch.linalg.vector_norm(diff)) / ref_norm
    return OutputParity(path, rel, max_abs, ref_norm, finite, degenerate)


def _tolerance(candidate: Any, precision: str | None, rtol: float | None) -> float:
    if rtol is not None:
        if not (isinstance(rtol, (int, float)) and rtol > 0):
            raise ValueError(f"rtol must be a positive number, got {rtol!r}")
        return float(rtol)
    if precision is None and isinstance(candidate, Prepared):
        precision = candidate.config.precision
    precision = precision or "fp32"
    if precision not in TOLERANCES:
        raise ValueError(f"precision must be one of {', '.join(TOLERANCES)}; got {precision!r}")
    return TOLERANCES[precision]


def _call(fn: Any, inputs: Any) -> Any:
    if isinstance(fn, Prepared):
        return fn(inputs)
    args, kwargs = split_inputs(inputs)
    return fn(*args, **kwargs)


def _eager(fn: Any) -> tuple[torch.nn.Module | None, Callable[[Any], Any] | None]:
    """The hookable module behind a candidate/reference and how to run it."""
    if isinstance(fn, Prepared) and fn.eager_module is not None:
        return fn.eager_module, fn.eager_call
    if isinstance(fn, torch.nn.Module) and not isinstance(fn, torch.jit.ScriptModule):
        return fn, lambda inputs: _call(fn, inputs)
    return None, None


def _leaf_io(module: torch.nn.Module, run: Callable[[Any], Any], inputs: Any) -> list[tuple[str, Any, Any]]:
    """(name, first input, output) of every leaf module, in execution order."""
    records: list[tuple[str, Any, Any]] = []
    hooks = []
    for name, sub in module.named_modules():
        if next(sub.children(), None) is None:
            hooks.append(sub.register_forward_hook(
                lambda m, i, o, name=name: records.append((name, i[0] if i else None, o))))
    try:
        with torch.no_grad():
            run(inputs)
    finally:
        for h in hooks:
            h.remove()
    return records


def _signal(reference: Any, candidate: Any, inputs: Any) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """The last tensor, in execution order, that carries signal in the reference: a leaf module's
    output, or else its input (the features before a zero-initialised head)."""
    ref_mod, ref_run = _eager(reference)
    cand_mod, cand_run = _eager(candidate)
    if ref_mod is None or cand_mod is None:
        return None
    ref_io = _leaf_io(ref_mod, ref_run, inputs)
    cand_io = {name: (i, o) for name, i, o in _leaf_io(cand_mod, cand_run, inputs)}
    for name, inp, out in reversed(ref_io):
        if name not in cand_io:
            continue
        for kind, ref_t, cand_t in (("output", out, cand_io[name][1]), ("input", inp, cand_io[name][0])):
            if isinstance(ref_t, torch.Tensor) and isinstance(cand_t, torch.Tensor) and not _degenerate(ref_t):
                return f"{kind} of module '{name}'", cand_t, ref_t
    return None


def parity(candidate: Any, reference: Any, inputs: Any, *, rtol: float | None = None,
           precision: str | None = None) -> Parity:
    """Compare ``candidate``'s outputs with ``reference``'s on ``inputs``.

    Both are :class:`Prepared` objects, modules or callables (inputs as in :meth:`Config.apply`).
    Per output tensor: relative L2 error and max abs error (in float64). The tolerance is ``rtol``
    or the default for the candidate's precision (fp32 1e-5, tf32 5e-3, fp16/bf16 2e-2). NaN or Inf
    in the candidate always fails. A reference output that is all zeros or constant (a zero-initialised
    classifier head gives that for every input) carries no signal: the check then compares the last
    tensor that does -- found with forward hooks, e.g. the features entering the head -- and says so.

    >>> import torch, gpuopt
    >>> m = torch.nn.Linear(8, 4)
    >>> fp32 = gpuopt.Config("fp32").apply(m, torch.randn(2, 8), device="cpu")
    >>> gpuopt.parity(fp32, m, torch.randn(2, 8)).passed
    True
    """
    tol = _tolerance(candidate, precision, rtol)
    cand_out = _flatten(_call(candidate, inputs))
    ref_out = _flatten(_call(reference, inputs))
    if [p for p, _ in cand_out] != [p for p, _ in ref_out]:
        return Parity(False, tol, [], note=f"output structures differ: candidate {[p for p, _ in cand_out]}, "
                                           f"reference {[p for p, _ in ref_out]}")
    if not ref_out:
        return Parity(False, tol, [], note="the reference returned no tensors")
    outputs = [_compare(p, c, r) for (p, c), (_, r) in zip(cand_out, ref_out)]
    passed = all(o.finite for o in outputs) and all(o.rel_l2 <= tol for o in outputs if o.rel_l2 is not None)
    notes = [f"non-finite values in {o.path}" for o in outputs if not o.finite]
    result = Parity(passed, tol, outputs)
    degenerate = [o.path for o in outputs if o.degenerate]
    if degenerate:
        found = _signal(reference, candidate, inputs)
        what = ", ".join(degenerate)
        if found is None:
            notes.append(f"reference output {what} carries no signal (all zeros or constant) and no module "
                         "was hookable to compare inner tensors; only exact agreement was checked")
            result.passed = passed and all(o.max_abs <= tol for o in outputs if o.degenerate)
        else:
            where, cand_t, ref_t = found
            sig = _compare(where, cand_t, ref_t)
            result.signal, result.signal_rel_l2 = where, sig.rel_l2
            result.passed = passed and sig.finite and sig.rel_l2 is not None and sig.rel_l2 <= tol
            notes.append(f"reference output {what} carries no signal (all zeros or constant for this input); "
                         f"compared the {where} instead: relative L2 error {sig.rel_l2:.2e}")
    result.note = "; ".join(notes)
    return result
