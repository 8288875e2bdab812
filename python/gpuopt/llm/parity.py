"""Parity of a decode path against the fp32 reference: greedy tokens and logits, step by step.

Static paths are teacher-forced: every step is fed the reference's previous token, so each of the
first ``n`` steps is compared on the same history and one early difference cannot cascade. ``generate``
picks its own tokens, so the hf paths are compared free-running, up to their first different token.
A different token is excused when the reference itself was undecided there: its top two logits lie
within twice the precision's logits tolerance of each other (``2 * rtol * max |logits|``), so an error
the precision is allowed can swap them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

# Worst |candidate - reference| / max |reference| over the compared steps' logits.
LOGITS_RTOL = {"fp32": 1e-3, "fp16": 3e-2, "bf16": 1e-1, "int8wo": 2.5e-1}


@dataclass
class DecodeParity:
    """Tokens and logits of a decode path against the fp32 reference."""

    reference: str
    teacher_forced: bool
    steps: int  # generated tokens compared per sequence
    sequences: int
    tokens_equal: int  # (sequence, step) pairs whose greedy token equals the reference's
    tokens_compared: int
    matched_prefix: int  # leading steps at which every sequence's token equals the reference's
    first_mismatch: int | None  # the first step with a different token (None: none)
    excused: int  # different tokens where the reference's top two logits were within the error
    unexcused: int
    worst_logits_rel_err: float
    rtol: float
    passed: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = "llm"
        return d

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        mode = "teacher-forced" if self.teacher_forced else "free-running"
        return (f"parity {verdict} vs {self.reference} ({mode}, {self.steps} tokens x {self.sequences} sequences): "
                f"{self.tokens_equal}/{self.tokens_compared} tokens equal ({self.excused} excused near-ties, "
                f"{self.unexcused} not), logits error {self.worst_logits_rel_err:.2e} (tolerance {self.rtol:.0e})")


def logits_rtol(precision: str) -> float:
    return LOGITS_RTOL.get(precision, 1e-1)


def compare(ref_tokens: torch.Tensor, ref_logits: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor, *,
            precision: str, teacher_forced: bool, reference: str = "fp32 hf-generate") -> DecodeParity:
    """Compares ``tokens`` [batch, n] and ``logits`` [n, batch, vocab] with the reference's. Free-running
    (``teacher_forced=False``), steps after the first different token are not compared."""
    n = min(ref_tokens.shape[1], tokens.shape[1], ref_logits.shape[0], logits.shape[0])
    ref_logits, logits = ref_logits[:n].float().to(logits.device), logits[:n].float()
    ref_tokens, tokens = ref_tokens[:, :n].to(tokens.device), tokens[:, :n]
    err = (logits - ref_logits).abs().amax(-1)  # [n, batch]
    scale = ref_logits.abs().amax(-1).clamp_min(1e-30)
    top2 = ref_logits.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]  # [n, batch]
    same = (tokens == ref_tokens).t()  # [n, batch]
    step_same = same.all(dim=1)
    first = int((~step_same).nonzero()[0]) if not bool(step_same.all()) else None
    upto = n if teacher_forced or first is None else first + 1  # free-running: histories differ after it
    same, err, scale, margin = same[:upto], err[:upto], scale[:upto], margin[:upto]
    rtol = logits_rtol(precision)
    excused_mask = ~same & (margin <= 2 * rtol * scale)
    # Logits are comparable where the histories agree: every step teacher-forced, up to and including
    # the first difference free-running.
    rel = float((err / scale).max()) if err.numel() else 0.0
    unexcused = int((~same & ~excused_mask).sum())
    return DecodeParity(
        reference=reference, teacher_forced=teacher_forced, steps=upto, sequences=int(tokens.shape[0]),
        tokens_equal=int(same.sum()), tokens_compared=int(same.numel()), matched_prefix=n if first is None else first,
        first_mismatch=first, excused=int(excused_mask.sum()), unexcused=unexcused, worst_logits_rel_err=rel,
        rtol=rtol, passed=bool(unexcused == 0 and rel <= rtol))
