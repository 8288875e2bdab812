"""``optimize()``: successive halving over (config, batch size) candidates.

How the search runs (the rest of the design is in the package docstring):

1. Rung 0: the cheap candidates (eager, TorchScript, CUDA graphs) are prepared (the runner's
   ``prepare_cell``: conversion, parity against fp32) and measured briefly, each at the batch sizes its
   :class:`~gpuopt.optimizer.ladder.Ladder` hands out: up from the smallest with a budget (jumping as far
   as the budget allows), down from the largest without one, then down from the largest that meets the
   budgets while smaller ones could still win. What is known to lose is not run: larger batch sizes after
   a p99 over the SLO, a peak memory over the budget or out of memory (they grow with the batch), and
   smaller ones once the objective stopped improving; each with its reason in the log. The ladders go
   in rounds, each round's batch sizes ascending (one batch size's fp32 reference alive at a time).
2. Compiled configs cost a compilation per batch size (the search's dominant cost), so they enter at
   rung 1, behind their eager twin (same precision and memory format), on a ladder of their own:

   - with a p99 budget (objectives throughput and energy): at the largest batch size where the twin's
     device median, halved (``COMPILE_SPEEDUP_BOUND``), meets the SLO. The twin's ladder measures on
     past a miss that is the host's (its device median within the SLO: issuing the eager calls takes
     longer than running them) to where its device time breaks the SLO, without pruning larger batch
     sizes there (``Ladder.record_probe``: such a miss guides the climb and is not feasible). From the
     start the compiled ladder climbs, stepping down instead if the start is over the SLO unless stalls
     alone broke it (``space.stalls_only``: smaller batch sizes share them); a batch size is not compiled
     when the twin's device median there (or a lower bound for it from the saturation of items/s) times
     the smallest compiled / eager ratio measured so far is ``PREDICTION_MARGIN`` over the SLO;
   - otherwise: at the twin's best ``compile_batches`` (default 1) batch sizes surviving rung 0, plus the
     batch where the twin first broke the SLO (compiling may bring it under: the host's launch overhead
     is gone), and, when it does, upward from there.

   They are measured once, at the confirmation length (under a p99 budget, 300 calls): a later
   compilation resets torch.compile's caches (``Prepared.recompiles``), so measuring again would compile
   again; the answer's interval between two such candidates comes from their measurements as taken (the
   C++ bootstrap, widened by the drift between runs), not an interleaved run.
3. Rungs 1, 2, ...: the best ``1/eta`` of the candidates that meet the constraints are kept (at least
   two), each measured again with longer options; the rest are dropped and their memory freed. When at
   most ``eta`` remain, they are measured at the confirmation length -- under a p99 budget (300 calls)
   only the best, then the new best while the one confirmed lost its place or broke the budget -- and the
   best and the runner-up are measured again, interleaved (``gpuopt.compare``: the C++ bootstrap over
   pairs), for the interval. Where that run finds the runner-up better, it becomes the answer
   (``_turn``: not for the latency objective, nor where a device time held the host's gaps; under a p99
   budget only from 300 of its calls there that meet the SLO).

What is known to lose is not run, with the reason in the log: besides the ladders' rules, under a p99
budget a batch size whose device median (a lower bound for it, from the saturation of items/s over the
smaller ones; for a compiled config its twin's times the compiled / eager ratio measured) is
``PREDICTION_MARGIN`` over the SLO, and a compiled batch size whose items/s, so bounded, cannot beat the
best candidate within the budgets.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._ext import _C
from ..analysis.roofline import LOW_UTILIZATION_PCT
from ..prepare.config import Config, Prepared
from ..report.results import Results, Row
from ..run.runner import Cell, Runner
from ..run.workload import (
    batch_of,
    check_measure_options,
    resolve_batch_sizes,
    resolve_configs,
    resolve_device,
    workload,
)
from ..timing.calibration import RunToRun
from ..timing.comparison import compare
from . import space
from .ladder import Ladder
from .result import Choice, LogEntry, OptimizeResult, figures, pareto_front

# Measure options of the rungs (the last repeats) and of the confirmation; the benchmark's sweep uses CONFIRM.
RUNGS = ({"max_time_s": 0.25, "min_time_s": 0.05, "target_rel_ci": 0.02},
         {"max_time_s": 0.75, "min_time_s": 0.2, "target_rel_ci": 0.01})
CONFIRM = {"max_time_s": 2.0, "min_time_s": 0.5, "target_rel_ci": 0.005}
# A compiled config is compiled at this many batch sizes by default (its eager twin's best surviving rung 0),
# plus the batch where the twin first broke the SLO.
COMPILE_BATCHES = 1
SATURATION_GAIN = 0.03  # a batch size this much worse than the best (or two not better by it) ends a walk
# Under a p99 budget a compiled config starts where its eager twin's device median divided by this meets
# the SLO: torch.compile shortened the device time by 1.3-1.8x for ResNet-50 and ViT-B/16 on the H100. A
# larger speedup costs a climb, a smaller one a step down (which stalls alone at the start end).
COMPILE_SPEEDUP_BOUND = 2.0
PREDICTION_MARGIN = 0.1  # a batch size is skipped only when predicted this much over the SLO (or under the best)
# A rung drops a candidate more than this far below the rung's best, whatever its rank: further than the drift
# between two measurements of one cell (3% on a GPU, RunToRun.default) and a short measurement's interval.
LOSING_MARGIN = 0.1
# Beyond the batch sizes a config measured, items/s are taken to gain at most this much more per doubling of
# the batch than they gained over its last measured step (the GPU saturates: the gain shrinks; the allowance
# covers the noise of a short measurement).
GAIN_ALLOWANCE = 0.1


@dataclass
class _Candidate:
    config: Config
    batch: int
    cell: Cell | None = None
    row: Row | None = None  # the latest measurement
    rung: int = -1
    gb: float | None = None
    gb_source: str = ""
    status: str = "waiting"  # waiting, alive, pending (see _measure), infeasible, failed, pruned, dropped
    reason: str | None = None
    misses: dict[str, float] = field(default_factory=dict)
    measure_once: bool = False
    final: bool = False  # measured as the answer would stand on it (under a p99 budget: TAIL_SAMPLES calls)
    static_bytes: int = 0  # on CUDA: what its preparation left allocated (converted weights, inputs, graphs)
    host_bound_ms: float | None = None  # infeasible by the host alone: the device median (a twin's navigation)
    tail: str | None = None  # pending: why its p99 over the SLO does not decide yet (space.tail_undecided)
    beaten_by: _Candidate | None = None  # pruned as unable to beat this candidate (see _revisit)
    turned_p99: tuple[float, int] | None = None  # made the answer by the interleaved run: its p99 and calls there

    @property
    def label(self) -> str:
        return self.config.label


def _split_inputs(inputs_or_shape: Any) -> dict[str, Any]:
    """The workload's input argument: None (a zoo model), an item shape (ints), a callable (batch -> inputs),
    or fixed inputs (a tensor, tuple or dict)."""
    if inputs_or_shape is None:
        return {}
    if isinstance(inputs_or_shape, (tuple, list)) and inputs_or_shape and all(
            isinstance(d, int) and not isinstance(d, bool) for d in inputs_or_shape):
        return {"input_shape": tuple(inputs_or_shape)}
    if callable(inputs_or_shape) and not isinstance(inputs_or_shape, torch.nn.Module):
        return {"input_fn": inputs_or_shape}
    return {"inputs": inputs_or_shape}


def _check(objective: Any, eta: Any) -> None:
    if not isinstance(objective, str) or objective not in space.OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(map(repr, space.OBJECTIVES))}, got {objective!r}")
    if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
        raise ValueError(f"eta must be an integer >= 2 (the share 1/eta of candidates each rung keeps), got {eta!r}")


def _check_energy(objective: str, device: torch.device) -> None:
    """objective='energy' needs NVML's readings: refused where the device has none (the one check to adapt)."""
    if objective != "energy":
        return
    if device.type != "cuda":
        raise ValueError(f"objective='energy' ranks by joules per item, and energy is not measured on this device "
                         f"({device}): NVML measures GPUs; use objective='throughput' or 'latency'")
    from ..timing import nvml

    meter = nvml.energy_meter(device.index if device.index is not None else torch.cuda.current_device())
    if not meter.active:
        raise ValueError(f"objective='energy' ranks by joules per item, and energy is not measured on this "
                         f"device / build: {meter.reason}")


def optimize(
    model: torch.nn.Module | str,
    inputs_or_shape: Any = None,
    objective: str = "throughput",
    slo_p99_ms: float | None = None,
    memory_gb: float | None = None,
    configs: str | Config | Sequence[str | Config] | None = None,
    batch_sizes: Sequence[int] | int | None = None,
    budget_s: float | None = None,
    *,
    device: str | torch.device | None = None,
    mode: str | None = None,
    eta: int = 3,
    parity: bool = True,
    rung_options: Sequence[dict[str, Any]] | None = None,
    confirm_options: dict[str, Any] | None = None,
    compile_batches: int = COMPILE_BATCHES,
    progress: Callable[[str], None] | bool = False,
) -> OptimizeResult:
    """The fastest config and batch size of ``model`` that keeps parity and meets the budgets, found by
    successive halving (short measurements rank many candidates, longer ones confirm the few best); the
    best and the runner-up are then measured interleaved for the interval between them, and where that
    run finds the runner-up better it becomes the answer (see the module's docstring).

    - ``inputs_or_shape``: None for a zoo name, one item's shape (``(3, 224, 224)``), a callable
      ``batch_size -> inputs``, or fixed inputs (then their batch size is the only one).
    - ``objective``: ``"throughput"`` (items/s), ``"latency"`` (p99 per call; batch sizes default to 1)
      or ``"energy"`` (joules per item; a GPU with NVML's counter).
    - ``slo_p99_ms``: p99 latency per call at most this, as a request sees it (per call the later of the
      device time and the host's time issuing it: a launch-bound config is judged by its host);
      ``memory_gb``: peak allocated memory at most this.
    - ``configs``: as for :func:`gpuopt.benchmark`; default the device's candidate set
      (:func:`gpuopt.optimize.candidate_configs`). ``batch_sizes``: default 1 .. 256 by doubling.
    - ``budget_s``: stop after this many seconds with the best answer so far (``result.stopped`` says so).
    - ``mode``: how each call is timed (default ``latency`` on CUDA: p99 is a served request's latency;
      ``host`` on the CPU). ``rung_options`` / ``confirm_options``: measure options of the rungs and of the
      confirmation (defaults ``RUNGS`` and ``CONFIRM``). ``compile_batches``: without a p99 budget (or with
      ``objective="latency"``), a compiled config is compiled at its eager twin's best this many batch sizes
      (and where the twin first broke the SLO); with one it starts where its twin's device time met the SLO.

    Never raises for what the model does: a candidate that fails parity, runs out of memory or breaks a
    budget is logged with its reason; when none meets the budgets, ``best`` is None and ``closest`` says
    by how much the nearest ones miss. Bad arguments raise ValueError / TypeError naming them.

    >>> r = gpuopt.optimize("tiny-cnn", objective="throughput", slo_p99_ms=5, device="cpu",
    ...                     batch_sizes=[1, 8, 32])                                 # doctest: +SKIP
    >>> print(r.summary()); r.prepared(torch.randn(32, 3, 32, 32))                   # doctest: +SKIP
    """
    t_start = time.perf_counter()
    _check(objective, eta)
    if isinstance(compile_batches, bool) or not isinstance(compile_batches, int) or compile_batches < 1:
        raise ValueError(f"compile_batches must be an integer >= 1 (batch sizes a compiled config is compiled at), "
                         f"got {compile_batches!r}")
    slo = space.check_positive("slo_p99_ms", slo_p99_ms)
    mem = space.check_positive("memory_gb", memory_gb)
    budget = space.check_positive("budget_s", budget_s)
    if not isinstance(parity, bool):
        raise TypeError(f"parity must be True or False, got {parity!r}")
    work = workload(model, **_split_inputs(inputs_or_shape))
    dev = resolve_device(device)
    _check_energy(objective, dev)
    cfgs = space.candidate_configs(dev) if configs is None else resolve_configs(configs, device=dev)
    if work.make_inputs is None:
        if batch_sizes is not None:
            raise ValueError(f"batch_sizes={batch_sizes!r} needs inputs made per batch size (a zoo model, an item "
                             f"shape or a callable); fixed inputs have one batch size")
        batches = [batch_of(work.fixed_inputs)]
    elif batch_sizes is None:
        batches = list(space.LATENCY_BATCH_SIZES if objective == "latency" else space.DEFAULT_BATCH_SIZES)
    else:
        batches = sorted(resolve_batch_sizes(batch_sizes))
    allowed_modes = ("latency", "host") if dev.type == "cuda" else ("host",)
    timed_mode = mode or ("latency" if dev.type == "cuda" else "host")
    if timed_mode not in allowed_modes:
        raise ValueError(f"mode must be one of {', '.join(map(repr, allowed_modes))} on {dev.type} (a mode that "
                         f"times each call, so p99 is a call's latency), got {mode!r}")
    rungs = [dict(o) for o in (RUNGS if rung_options is None else rung_options)]
    if not rungs or not all(isinstance(o, dict) for o in rungs):
        raise ValueError(f"rung_options must be a non-empty list of measure-option dicts, got {rung_options!r}")
    confirm = dict(CONFIRM if confirm_options is None else confirm_options)
    for o in (*rungs, confirm):
        check_measure_options(o, [timed_mode], dev)
    say = progress if callable(progress) else ((lambda line: print(line, flush=True)) if progress else None)

    search = _Search(work, cfgs, batches, dev, timed_mode, objective, slo, mem, budget, eta, parity, rungs, confirm,
                     say, t_start)
    search.compile_batches = compile_batches
    return search.run()


class _Search:
    def __init__(self, work, cfgs, batches, dev, mode, objective, slo, mem, budget, eta, parity, rungs, confirm, say,
                 t_start):
        self.work, self.configs, self.batches, self.device, self.mode = work, cfgs, batches, dev, mode
        self.objective, self.slo, self.mem, self.budget, self.eta = objective, slo, mem, budget, eta
        self.rungs, self.confirm, self.say, self.t0 = rungs, confirm, say, t_start
        self.rows: dict[tuple, Row] = {}  # each cell's latest (longest) measurement
        self.spec = ({"models": [work.name], "configs": [str(c) for c in cfgs],
                                         "config_labels": [c.label for c in cfgs], "batch_sizes": batches,
                                         "modes": [mode], "parity": parity, "optimize": {
                                             "objective": objective, "slo_p99_ms": slo, "memory_gb": mem}})
        self.runner = Runner(work, cfgs, [mode], parity=parity, device=dev, measure_options=confirm,
                             on_row=lambda row: None)
        self.log: list[LogEntry] = []
        self.cands = {(c.label, b): _Candidate(c, b) for c in cfgs for b in batches}
        self.stopped: str | None = None
        self.broke = False  # a confirmation broke the budgets (see _revisit)
        self.contexts: dict[int, Any] = {}
        self.compile_batches = COMPILE_BATCHES
        labels = {c.label for c in cfgs}
        self.deferred = {c.label: t for c in cfgs if (t := space.eager_twin(c)) is not None and t.label in labels}
        # With a p99 budget and an objective that favours large batches, a compiled config starts where its
        # eager twin's device time last met the budget: the twins climb past a miss that is the host's.
        self.twin_climbs = slo is not None and objective != "latency"
        self.navigating = {t.label for t in self.deferred.values()} if self.twin_climbs else set()

    # -- bookkeeping -------------------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _out_of_time(self) -> bool:
        if self.budget is not None and self._elapsed() >= self.budget:
            if self.stopped is None:
                self.stopped = (f"budget_s={self.budget:g} spent after {self._elapsed():.1f} s; the answer is the "
                                f"best candidate measured so far")
            return True
        return False

    def _note(self, c: _Candidate, rung: int | None, action: str, reason: str | None = None) -> None:
        figs = figures(c.row, c.gb, c.gb_source) if (action in ("measured", "infeasible") and c.row) else None
        entry = LogEntry(c.label, c.batch, rung, action, reason, figs, round(self._elapsed(), 3))
        self.log.append(entry)
        if self.say is not None:
            self.say(entry.line())

    def _release(self, c: _Candidate) -> None:
        c.cell = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _drop(self, c: _Candidate, status: str, reason: str, rung: int | None, action: str | None = None) -> None:
        c.status, c.reason = status, reason
        if status == "failed" and (c.row is None or c.row.ok):  # the Results record why the cell failed
            facts = {"precision": c.config.precision, "items_per_call": c.batch, "device": self.runner.device_name}
            row = Row.failed(reason, model=self.work.name, config=c.label, batch_size=c.batch, mode=self.mode,
                             **facts)
            self.rows[row.key] = row
        self._note(c, rung, action or status, reason)
        self._release(c)

    def _prune_larger(self, c: _Candidate, reason: str) -> None:
        for b in self.batches:
            other = self.cands[(c.label, b)]
            if b > c.batch and other.status == "waiting":
                other.status, other.reason = "pruned", reason
                self._note(other, None, "pruned", reason)

    # -- one candidate -----------------------------------------------------------------------------------
    def _context(self, batch: int):
        if batch not in self.contexts:
            self.contexts[batch] = self.runner.batch_context(batch)
        return self.contexts[batch]

    def _forget_context(self, batch: int) -> None:
        if self.contexts.pop(batch, None) is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _enter(self, c: _Candidate, rung: int, options: dict[str, Any]) -> None:
        """Prepare ``c`` (parity included) and measure it the first time."""
        if c.status != "waiting":
            return
        if self._out_of_time():
            c.status, c.reason = "skipped", "budget_s spent before it was run"
            self._note(c, rung, "skipped", c.reason)
            return
        ctx = self._context(c.batch)
        if isinstance(ctx, str):
            self._drop(c, "failed", ctx, rung)
            if space.is_out_of_memory(ctx):
                self._prune_larger(c, f"the fp32 reference ran out of memory at batch {c.batch}")
            return
        before = self._allocated()
        c.cell = self.runner.prepare_cell(c.config, ctx)
        c.static_bytes = max(0, self._allocated() - before)
        if c.cell.failure is not None:
            failure = c.cell.failure
            self._drop(c, "failed", failure, rung)
            if space.is_out_of_memory(failure):
                self._prune_larger(c, f"out of memory at batch {c.batch}")
            return
        noop = [n for n in c.cell.prepared.notes if n.startswith("channels_last:")]
        twin = dataclasses.replace(c.config, memory_format="contiguous", name=None)
        if noop and (twin.label, c.batch) in self.cands and c.config.memory_format == "channels_last":
            self._drop(c, "pruned", f"channels_last changes nothing in this model: the same as {twin.label}", rung)
            self._prune_larger(c, f"channels_last changes nothing in this model: the same as {twin.label}")
            return
        self._measure(c, rung, options, final=c.measure_once)

    def _allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0

    def _measure(self, c: _Candidate, rung: int, options: dict[str, Any], final: bool = False) -> None:
        """Measure ``c`` with ``options``; a p99 over the SLO that a 1% tail explains is measured again with
        ``TAIL_SAMPLES`` calls -- at rung 0 under a p99 budget only after the rung, if it can still win (it
        is ``pending`` meanwhile; :meth:`_decide_pending`). ``final`` (the measurement the answer stands on)
        under a p99 budget: measured with ``TAIL_SAMPLES`` calls at once, so that its p99 is not the
        largest of a few."""
        # The allocator's peak counts every candidate still prepared and the batch's fp32 reference: what
        # was allocated before the measurement, less this candidate's own preparation, is not its memory.
        others = max(0, self._allocated() - c.static_bytes)
        long = final and self.slo is not None
        row = self.runner.measure_cell(c.cell, self.mode, space.tail_options(options) if long else options)
        # A long measurement stands as measured: with fewer than TAIL_SAMPLES calls only when they take over
        # ~17 ms each, and a second look with the same options would hold no more.
        tail = None if long else space.tail_undecided(row, self.slo)
        if tail is not None and rung == 0 and self.twin_climbs:
            self._judge(c, row, rung, others, final, pending=tail)
            return
        if tail is not None and not self._out_of_time():  # a p99 few samples cannot decide
            row = self._second_look(c)
        else:
            tail = None
        # a second look has the final measurement's options: under a budget the answer may stand on it
        self._judge(c, row, rung, others, final or (tail is not None and self.slo is not None), tail=tail)

    def _decide_pending(self, rung: int) -> None:
        """The candidates whose p99 a 1% tail may explain, after the rung: measured again with ``TAIL_SAMPLES``
        calls if their objective clears the second best within the budgets less ``PREDICTION_MARGIN`` and,
        for throughput, the best less ``LOSING_MARGIN`` (what the rung's band keeps); otherwise infeasible as
        measured -- a second look (300 calls, 2-5 s for a launch-bound config) would decide nothing the
        answer needs."""
        feasible = self._ranked([x for x in self.cands.values() if x.status == "alive"])
        # The bar: the second best by PREDICTION_MARGIN, or what the rung's band keeps, whichever is higher.
        refs = [(feasible[1], PREDICTION_MARGIN)] if len(feasible) > 1 else []
        if feasible and self.objective == "throughput":
            refs.append((feasible[0], LOSING_MARGIN))
        for c in self._ranked([x for x in self.cands.values() if x.status == "pending"]):
            tail, c.tail = c.tail, None
            ref = next((r for r, margin in refs if self._beaten_by_margin(c, r, margin)), None)
            if ref is not None:
                what = space.objective_value(ref.row, self.objective)
                self._drop(c, "infeasible", f"{c.reason}; not measured again: it cannot beat {ref.label} "
                                            f"b{ref.batch} ({what:.4g} {space.OBJECTIVE_UNITS[self.objective]}, within "
                                            f"the budgets) by enough to stay in the running", rung)
            elif self._out_of_time():
                self._drop(c, "infeasible", f"{c.reason}; budget_s spent before it was measured again", rung)
            else:
                others = max(0, self._allocated() - c.static_bytes)
                c.status = "waiting"
                self._judge(c, self._second_look(c), rung, others, True, tail=tail, after=True)

    def _second_look(self, c: _Candidate) -> Row:
        """``c`` measured again with the final measurement's options (``space.tail_options``: aiming at
        ``TAIL_SAMPLES`` calls), for a p99 few samples could not decide."""
        return self.runner.measure_cell(c.cell, self.mode, space.tail_options(self.confirm))

    def _judge(self, c: _Candidate, row: Row, rung: int, others: int, final: bool, tail: str | None = None,
               pending: str | None = None, after: bool = False) -> None:
        """``c``'s verdict from ``row``: alive, pending (``pending``: its p99 over the SLO may be a 1% tail's,
        decided after the rung), infeasible or failed; ``tail``: why ``row`` is a second look; ``after``:
        judged after its rung (its ladder is done)."""
        self.rows[row.key] = row
        c.row, c.rung, c.final = row, rung, final
        if not row.ok:
            self._drop(c, "failed", row.error, rung)
            if space.is_out_of_memory(row.error):
                self._prune_larger(c, f"out of memory at batch {c.batch}")
            return
        if self.objective == "energy" and space.energy_per_item(row) is None:
            raise ValueError(f"objective='energy' ranks by joules per item, and energy is not measured on this "
                             f"device / build: {space.energy_missing_reason(row)}")
        c.gb, c.gb_source = space.memory_gb(row, c.cell.prepared, exclude_bytes=others)
        c.misses = space.misses(row, c.gb, slo_p99_ms=self.slo, memory_gb=self.mem)
        if tail is not None:
            self._note(c, rung, "remeasured", f"{tail}; measured again, longer (aiming at {space.TAIL_SAMPLES} "
                                              f"samples): p99 {space.request_p99(row):.4g} ms from "
                                              f"{row.measurement.n} samples, as measured")
        if c.misses:
            parts = []
            if "p99_ms_over" in c.misses:
                parts.append(f"p99 {space.request_p99(row):.4g} ms > slo_p99_ms={self.slo:g}")
            if "memory_gb_over" in c.misses:
                parts.append(f"memory {c.gb:.3g} GB ({c.gb_source}) > memory_gb={self.mem:g}")
            reason = "; ".join(parts)
            if pending is not None and set(c.misses) == {"p99_ms_over"}:
                # Kept prepared; its ladder climbs on by its device time (a probe), as past a host's miss.
                c.status, c.reason, c.tail = "pending", reason, pending
                self._note(c, rung, "undecided", f"{pending}; larger batch sizes are measured on, and it is "
                                                 f"measured again after rung {rung} if it can still win")
                return
            c.host_bound_ms = (space.host_bound_miss(row, c.misses, self.slo) if c.label in self.navigating
                               and c.rung == 0 else None)
            if c.host_bound_ms is not None and after:
                reason += f" (the host's: the device median {c.host_bound_ms:.4g} ms is within it)"
            elif c.host_bound_ms is not None:  # measured on for the compiled twin's start
                reason += (f" (the host's: the device median {c.host_bound_ms:.4g} ms is within it; larger batch "
                           f"sizes are measured on, for where {self._compiled_of(c.label)} starts)")
            self._drop(c, "infeasible", reason, rung)
            if c.host_bound_ms is None:
                self._prune_larger(c, f"{reason} at batch {c.batch} already (it grows with the batch)")
            return
        c.status = "alive"
        self._note(c, rung, "measured")

    # -- the search ---------------------------------------------------------------------------------------
    def _alive(self) -> list[_Candidate]:
        return [c for c in self.cands.values() if c.status == "alive"]

    def _ranked(self, cands: list[_Candidate]) -> list[_Candidate]:
        return sorted(cands, key=lambda c: -space.score(c.row, self.objective))

    def _keep(self, n: int) -> int:
        return max(2, math.ceil(n / self.eta))

    def run(self) -> OptimizeResult:
        deferred = self.deferred
        try:
            # rung 0: the cheap candidates, on their ladders
            first = {c.label: self._ladder() for c in self.configs if c.label not in deferred}
            self._climb(first, 0, self.rungs[0])
            self._decide_pending(0)
            self._halve(0)
            climbs = {}
            for label, twin in deferred.items():
                broke = sorted(c.batch for c in self.cands.values() if c.label == twin.label
                               and c.status == "infeasible" and "p99_ms_over" in c.misses)
                start = self._compiled_start(twin) if self.twin_climbs and twin.label in first else None
                if self.twin_climbs and start is not None:
                    # Under a p99 budget the compiled config starts where its twin's device time, shortened as
                    # much as compiling may, meets it; climbs from there unless predicted over; steps down if
                    # over it at the start.
                    climbs[label] = self._ladder(start=start, descend=False, below_start=True)
                    continue
                # Otherwise it enters where its eager twin survived rung 0, and where the twin first broke the SLO.
                survivors = self._ranked([c for c in self.cands.values() if c.label == twin.label
                                          and c.status == "alive"])
                keep = {c.batch for c in survivors[:self.compile_batches]}
                for b in sorted(keep):
                    self._enter_once(self.cands[(label, b)])
                if broke and broke[0] not in keep:
                    # Compiling removes the host's launch overhead: a twin over the SLO even at its
                    # smallest batch size may come under it compiled. If it does, larger batch sizes may too.
                    climbs[label] = self._ladder(start=broke[0], descend=False)
            self._climb(climbs, 1, self.confirm, once=True)
            for label, twin in deferred.items():
                for b in self.batches:
                    c = self.cands[(label, b)]
                    if c.status == "waiting":
                        self._leave_out(c, f"its eager twin {twin.label} at batch {b} was not among its best "
                                           f"{self.compile_batches} surviving rung 0 (compiling is the search's "
                                           f"dominant cost)")
            self.contexts.clear()  # the fp32 references: parity is done
            rung = 1
            while len(self._alive()) > self.eta and not self._out_of_time():
                opts = self.rungs[min(rung, len(self.rungs) - 1)]
                for c in self._alive():
                    if not c.measure_once and c.rung < rung and not self._out_of_time():
                        self._measure(c, rung, opts)
                self._halve(rung)
                rung += 1
            # confirmation
            if self.slo is None:
                for c in self._alive():
                    if not c.measure_once and not self._out_of_time():
                        self._measure(c, rung, self.confirm, final=True)
            else:
                # The final measurement takes TAIL_SAMPLES calls, and only the answer stands on its p99: the
                # best is confirmed, then the new best if it lost its place or broke the budget, and so on
                # (the runner-up is measured again, interleaved with the best, for the interval).
                self._confirm(rung)
                if self._revisit(rung):
                    self._confirm(rung)
        finally:
            self.contexts.clear()
        return self._answer(rung)

    def _confirm(self, rung: int) -> None:
        """Under a p99 budget: the final measurement takes TAIL_SAMPLES calls, and only the answer stands on
        its p99: the best is confirmed, then the new best if it lost its place or broke the budget, and so on
        (the runner-up is measured again, interleaved with the best, for the interval)."""
        while not self._out_of_time():
            top = next(iter(self._ranked(self._alive())), None)
            if top is None or top.final:
                return
            self._measure(top, rung, self.confirm, final=True)
            self.broke = self.broke or top.status != "alive"

    def _revisit(self, rung: int) -> bool:
        """What the short measurements' verdicts left out, taken back when they did not hold (the candidates
        that beat them broke the budget at their confirmation): first a compiled candidate that could not
        beat a candidate which then broke the budget; then the best (at most ``eta``) of those a rung dropped
        that beat the best left, if any is, when a confirmation broke the budget (scores of different rungs
        cross by noise otherwise). Prepared again and measured as final; True if any was."""
        done = False
        for step in ("pruned", "dropped") if self.broke else ("pruned",):
            if step == "pruned":
                back = [c for c in self.cands.values() if c.status == "pruned" and c.beaten_by is not None
                        and c.beaten_by.status not in ("alive", "dropped")]
            else:
                best = next(iter(self._ranked(self._alive())), None)
                dropped = self._ranked([c for c in self.cands.values() if c.status == "dropped" and not c.misses])
                back = [c for c in dropped if best is None or space.score(c.row, self.objective)
                        > space.score(best.row, self.objective)][:self.eta]
            for c in back:
                if self._out_of_time():
                    return done
                why = (f"{c.beaten_by.label} b{c.beaten_by.batch}, which it could not beat, broke the budget"
                       if c.beaten_by is not None else "the candidates kept ahead of it broke the budgets at their "
                       "confirmation")
                self._note(c, rung, "revisited", why)
                c.status, c.reason, c.beaten_by, c.measure_once = "waiting", None, None, True
                self._enter(c, rung, self.confirm)
                self._forget_context(c.batch)
                done = True
        return done

    def _ladder(self, start: int | None = None, descend: bool = True, below_start: bool = False) -> Ladder:
        return Ladder(self.batches, objective=self.objective, slo_p99_ms=self.slo, memory_gb=self.mem,
                      gain=SATURATION_GAIN, start=start, descend=descend, below_start=below_start)

    def _compiled_of(self, twin_label: str) -> str:
        return ", ".join(label for label, t in self.deferred.items() if t.label == twin_label)

    def _device_ms(self, label: str, batch: int) -> float | None:
        row = self.cands[(label, batch)].row
        return space.device_median_ms(row) if row is not None else None

    def _compiled_start(self, twin: Config) -> int | None:
        """The batch size a compiled config starts at under a p99 budget: the largest its eager twin measured
        whose device median, shortened by ``COMPILE_SPEEDUP_BOUND``, meets the SLO (and its memory the
        budget); None when there is none (the twin failed, or even so its device time is over the SLO at
        every batch size it measured: it then enters where the twin first broke the SLO)."""
        best = None
        for b in self.batches:
            c = self.cands[(twin.label, b)]
            d = self._device_ms(twin.label, b)
            if d is not None and c.status != "failed" and "memory_gb_over" not in c.misses \
                    and d / COMPILE_SPEEDUP_BOUND <= self.slo:
                best = b
        return best

    def _trusted_ms(self, label: str, batch: int) -> float | None:
        """The device median of ``label`` at ``batch`` where it is the device's own time: None unmeasured, or
        where most calls took the host longer to issue than the spin queued ahead of them (a synchronization
        inside the call, as in Hugging Face's eager BERT, waits for the spin every time: then the device time
        holds the host's gaps; a few calls over it are the host's noise)."""
        row = self.cands[(label, batch)].row
        m = row.measurement if row is not None and row.ok else None
        if m is None or space.holds_host_gaps(m):
            return None
        return space.device_median_ms(row)

    def _device_dominated(self, label: str, batch: int) -> bool:
        """Whether ``label``'s device time at ``batch`` is its own (:meth:`_trusted_ms`) and its calls are not
        far launch-bound (a request's median at most twice the device's): the further the host's issuing
        outweighs the work, the more its excursions outrun the spin queued ahead, and the device time then
        holds the host's gaps (ViT-B/16's fp16-amp b4 once measured 4.4 ms on the device against 4.0 at b16,
        its calls issuing for 10.9 ms) -- which would overstate a bound extrapolated from it."""
        row = self.cands[(label, batch)].row
        d = self._trusted_ms(label, batch)
        p50 = space.request_quantile(row, 0.5) if d is not None else None
        return d is not None and p50 is not None and p50 <= 2.0 * d

    def _device_bound(self, label: str, batch: int, who: str) -> tuple[float, str] | None:
        """``label``'s device median at ``batch`` (measured), or a lower bound for it beyond the batch sizes it
        measured: items/s grow ever more slowly with the batch (the GPU saturates), so past the largest
        measured batch size they gain per doubling of the batch at most what they gained over the last
        measured step, plus ``GAIN_ALLOWANCE`` (noise). None where that is not clear: fewer than two device
        times of its own; the last step gained less than 2% per doubling (noise of a short measurement, or a
        batch size that happened to map badly onto the GPU); or the last point is not device-dominated
        (:meth:`_device_dominated`: a device time holding the host's gaps there would overstate the bound --
        at the smaller point it only overstates the gain, so the bound is lower and the prediction rarer).
        ``who`` names it in the reason."""
        d = self._device_ms(label, batch)
        if d is not None:
            return d, f"{who} device median at batch {batch} ({d:.4g} ms)"
        known = [(b, v) for b in self.batches if b < batch and (v := self._device_ms(label, b))]
        if len(known) < 2 or not self._device_dominated(label, known[-1][0]):
            return None
        (b1, d1), (b2, d2) = known[-2:]
        gain = ((b2 / d2) / (b1 / d1)) ** (1 / math.log2(b2 / b1))  # items/s gained per doubling of the batch
        if gain < 1.02:
            return None
        g = gain * (1 + GAIN_ALLOWANCE)
        bound = d2 * (batch / b2) / g ** math.log2(batch / b2)
        return bound, (f"a lower bound of {who} device median at batch {batch} ({bound:.4g} ms: {d2:.4g} ms at "
                       f"batch {b2}, items/s gaining at most {g:.2f}x per doubling of the batch, {gain:.2f}x as "
                       f"from batch {b1} to {b2} plus {GAIN_ALLOWANCE:.0%})")

    def _ratio(self, c: _Candidate, twin: Config, trusted: bool = False) -> tuple[float, int] | None:
        """The smallest compiled / eager ratio of device medians measured so far for ``c``'s config, and where
        (compiling speeds the device up by about as much at every batch size where the work dominates; the
        smallest ratio seen errs towards compiling). ``trusted``: only pairs whose device times are the
        device's own (:meth:`_trusted_ms`)."""
        ms = self._trusted_ms if trusted else self._device_ms
        ratios = [(dx / dy, b) for b in self.batches if (dx := ms(c.label, b)) and (dy := ms(twin.label, b))]
        return min(ratios) if ratios else None

    def _predicted_over(self, c: _Candidate) -> str | None:
        """Why a candidate not measured yet cannot meet the p99 budget, or None (a median over the SLO puts
        the p99 over it):

        - a compiled one: its eager twin's device median at its batch size (or a lower bound for it) times
          the compiled / eager ratio (:meth:`_ratio`) -- judged without compiling it;
        - any other: a lower bound of its own device median there, from the smaller batch sizes it measured
          (not for a compiled config's eager twin: its measured device times place the compiled start).

        Both must be ``PREDICTION_MARGIN`` over the SLO. Only with a p99 budget and an objective that favours
        large batches."""
        if not self.twin_climbs:
            return None
        twin = self.deferred.get(c.label)
        if twin is None:
            if c.label in self.navigating:  # a compiled config's start is read from its twin's measured times
                return None
            bound = self._device_bound(c.label, c.batch, "its")
            if bound is None or bound[0] <= self.slo * (1 + PREDICTION_MARGIN):
                return None
            return (f"predicted over the SLO: {bound[1]}, more than {PREDICTION_MARGIN:.0%} over "
                    f"slo_p99_ms={self.slo:g}")
        ratio = self._ratio(c, twin)
        bound = self._device_bound(twin.label, c.batch, f"its eager twin {twin.label}'s") if ratio else None
        if bound is None or bound[0] * ratio[0] <= self.slo * (1 + PREDICTION_MARGIN):
            return None
        r, b0 = ratio
        return (f"predicted over the SLO without compiling: {bound[1]} x the compiled / eager ratio at batch {b0} "
                f"({r:.2f}) = {bound[0] * r:.4g} ms, more than {PREDICTION_MARGIN:.0%} over slo_p99_ms={self.slo:g}")

    def _cannot_win(self, c: _Candidate) -> str | None:
        """Why a compiled candidate cannot beat the best candidate within the budgets so far (items/s), judged
        without compiling it, or None: at most its batch over its eager twin's device median there times the
        compiled / eager ratio (:meth:`_ratio`), ``PREDICTION_MARGIN`` below that best. Under a p99 budget with
        objective throughput, once the config was compiled somewhere (the ratio is measured, not assumed)."""
        twin = self.deferred.get(c.label)
        if twin is None or not self.twin_climbs or self.objective != "throughput":
            return None
        # A bound that drops a candidate: only from device times that are the device's own.
        ratio, d = self._ratio(c, twin, trusted=True), self._trusted_ms(twin.label, c.batch)
        feasible = [x for x in self.cands.values() if x.row is not None and x.row.ok and not x.misses
                    and x.status in ("alive", "dropped")]
        if ratio is None or not d or not ratio[0] or not feasible:
            return None
        best = max(feasible, key=lambda x: space.score(x.row, "throughput"))
        top = space.score(best.row, "throughput")
        most = c.batch / (d * ratio[0]) * 1e3
        if most * (1 + PREDICTION_MARGIN) >= top:
            return None
        c.beaten_by = best  # its p99 is from a short run: revisited if it breaks the budget later (_revisit)
        return (f"cannot beat {best.label} b{best.batch} ({top:.4g} items/s within the budgets) without compiling: "
                f"at most {most:.4g} items/s, from its eager twin {twin.label}'s device median at batch {c.batch} "
                f"({d:.4g} ms) x the compiled / eager ratio at batch {ratio[1]} ({ratio[0]:.2f})")

    def _enter_once(self, c: _Candidate) -> None:
        c.measure_once = True
        self._enter(c, 1, self.confirm)
        self._forget_context(c.batch)

    def _climb(self, ladders: dict[str, Ladder], rung: int, options: dict[str, Any], once: bool = False) -> None:
        """Runs each config's ladder to its end, in rounds (each round's batch sizes ascending, one fp32
        reference alive at a time); the batch sizes a ladder left out are pruned with its reason."""
        while ladders and not self.stopped:
            wanted: dict[int, list[str]] = {}
            for label, ladder in ladders.items():
                b = ladder.next()
                if b is not None:
                    wanted.setdefault(b, []).append(label)
            if not wanted:
                break
            for b in sorted(wanted):
                for label in wanted[b]:
                    c = self.cands[(label, b)]
                    if c.status == "waiting" and (why := self._predicted_over(c)):
                        c.status, c.reason = "pruned", why
                        self._note(c, None, "pruned", why)
                        ladders[label].record_over(b, predicted=True)
                        continue
                    if c.status == "waiting" and (why := self._cannot_win(c)):
                        # Nor can smaller batch sizes (the twin's items/s fall with the batch); on a climb the
                        # larger ones are left too (rare: a compiled climb starts near the SLO).
                        c.status, c.reason = "pruned", why
                        self._note(c, None, "pruned", why)
                        ladders[label].stop(f"{c.label} at batch {b}: {why}")
                        continue
                    c.measure_once = once
                    self._enter(c, rung, options)
                    self._feed(ladders[label], c)
                self._forget_context(b)
        for label, ladder in ladders.items():
            for b in self.batches:
                c = self.cands[(label, b)]
                if c.status == "waiting":
                    self._leave_out(c, ladder.why_not(b) if ladder.finished else None)

    def _leave_out(self, c: _Candidate, reason: str | None) -> None:
        """A candidate never run: pruned with ``reason``, or skipped once budget_s is spent (reason None: its
        ladder was interrupted)."""
        if self.stopped and reason is None:
            c.status, c.reason = "skipped", "budget_s spent before it was run"
        else:
            c.status, c.reason = "pruned", reason or "not run"
        self._note(c, None, c.status, c.reason)

    def _feed(self, ladder: Ladder, c: _Candidate) -> None:
        if c.status == "alive":
            ladder.record_ok(c.batch, space.score(c.row, self.objective), space.request_p99(c.row), c.gb)
        elif c.status == "pending":  # decided after the rung: meanwhile the climb goes on by its device time
            ladder.record_probe(c.batch, space.device_median_ms(c.row), c.gb)
        elif c.status == "infeasible" and c.host_bound_ms is not None:  # the climb goes on by its device time
            ladder.record_probe(c.batch, c.host_bound_ms, c.gb)
        elif c.status == "infeasible" or (c.status == "failed" and space.is_out_of_memory(c.reason)):
            ladder.record_over(c.batch)
            stalls = (space.stalls_only(c.row, self.slo) if set(c.misses) == {"p99_ms_over"} and c.row is not None
                      and c.row.ok else None)
            if ladder.below_start and ladder.feasible_top is None and stalls is not None:
                # Over at a start that was a guess by stalls alone, which a smaller batch size shares. (Calls
                # at or just over the SLO: the issuing time, which may shrink with the batch, steps down.)
                ladder.stop(f"{c.label} at batch {c.batch} broke the SLO by stalls alone ({stalls}): the host's, "
                            f"which smaller batch sizes share")
        elif c.status != "skipped":  # failed (parity, an error) or pruned (a no-op config); skipped: budget_s
            ladder.stop(f"{c.label} {c.status} at batch {c.batch}: {c.reason}")

    def _halve(self, rung: int) -> None:
        """Keeps the best ``1/eta`` of the candidates alive (at least two), and of those only the ones within
        ``LOSING_MARGIN`` of the best (at least two). At rung 0 an eager twin of a compiled config stands in
        for it: judged by its items/s times ``COMPILE_SPEEDUP_BOUND`` (any objective but throughput: kept)."""
        alive = self._ranked(self._alive())
        if len(alive) <= self.eta:
            return
        keep = self._keep(len(alive))
        twins = {t.label for t in self.deferred.values()}

        def close(c: _Candidate) -> bool:
            if self.objective != "throughput":  # a p99 or J/item of a short run: noisier than a median
                return True
            if rung == 0 and c.label in twins:
                best = space.score(alive[0].row, self.objective)
                return space.score(c.row, self.objective) * COMPILE_SPEEDUP_BOUND >= best * (1 - LOSING_MARGIN)
            return not self._beaten_by_margin(c, alive[0], LOSING_MARGIN)

        kept = [c for c in alive[:keep] if close(c)]
        kept += [c for c in alive[:2] if c not in kept][:max(0, 2 - len(kept))]
        b = space.objective_value(alive[0].row, self.objective)
        for i, c in enumerate(alive):
            if c in kept:
                continue
            if i < keep:
                v = space.objective_value(c.row, self.objective)
                twice = (f" (as its compiled config's stand-in, at {COMPILE_SPEEDUP_BOUND:g}x: still behind)"
                         if rung == 0 and c.label in twins else "")
                why = (f"{abs(v - b) / abs(b):.0%} behind the best at rung {rung} ({alive[0].label} b{alive[0].batch}: "
                       f"{b:.4g} against {v:.4g} {space.OBJECTIVE_UNITS[self.objective]}){twice}: beyond the "
                       f"{LOSING_MARGIN:.0%} margin kept for measurements of one cell drifting apart (~3% on a GPU)")
            else:
                why = f"not among the best {keep} of {len(alive)} at rung {rung}"
            self._drop(c, "dropped", why, rung, "dropped")

    def _beaten_by_margin(self, c: _Candidate, ref: _Candidate, margin: float) -> bool:
        a, b = space.score(c.row, self.objective), space.score(ref.row, self.objective)
        return a + margin * abs(b) < b

    def _choice(self, c: _Candidate) -> Choice:
        flags = []
        roof = c.row.roofline or {}
        pcts = [p for p in (roof.get("pct_of_compute_ceiling"), roof.get("pct_of_memory_ceiling")) if p is not None]
        if pcts and max(pcts) < LOW_UTILIZATION_PCT:
            flags.append(f"far below its roofline ({max(pcts):.0f}% of the nearest ceiling; {roof.get('bound')})")
        if c.turned_p99 is not None:
            flags.append(f"p99 {c.turned_p99[0]:.3f} ms over its {c.turned_p99[1]} calls in the interleaved run "
                         f"that made it the answer (its figures are from its own measurement at rung {c.rung})")
        elif self.slo is not None and not c.final and c.row.measurement is not None:
            flags.append(f"p99 from its {c.row.measurement.n} calls at rung {c.rung}: "
                         + (f"not confirmed with {space.TAIL_SAMPLES} calls (budget_s spent)" if self.stopped else
                            f"only the answer's p99 is confirmed with {space.TAIL_SAMPLES} calls"))
        if c.cell is not None and c.cell.prepared.recompiles:
            flags.append("its Prepared compiles again on its first call (a later compilation reset torch.compile's "
                         "caches), then runs as measured")
        return Choice(c.label, c.batch, space.objective_value(c.row, self.objective),
                      figures(c.row, c.gb, c.gb_source), c.rung, flags, c.row)

    def _answer(self, rung: int) -> OptimizeResult:
        alive = self._ranked(self._alive())
        comparison, ratio, turned = None, None, None
        if len(alive) > 1 and not self._out_of_time():
            comparison, ratio = self._compare(alive[0], alive[1])
            turned = self._turn(alive, comparison, ratio)
            if turned is not None:
                comparison, ratio = comparison.swapped(), turned
        best = self._choice(alive[0]) if alive else None
        runner_up = self._choice(alive[1]) if len(alive) > 1 else None
        if turned is not None:
            best.flags.append(f"chosen over {runner_up.config} b{runner_up.batch_size} by their interleaved run "
                              f"({ratio['value']:.3f}x); measured apart it ranked second")
        prepared: Prepared | None = alive[0].cell.prepared if alive else None
        for c in alive[1:]:
            self._release(c)
        measured = [c for c in self.cands.values() if c.row is not None and c.row.ok]
        points = [{"config": c.label, "batch_size": c.batch, **figures(c.row, c.gb, c.gb_source)} for c in measured]
        pareto = {"measured": points,
                  "throughput_vs_p99": pareto_front(points, "items_per_s", "p99_ms"),
                  "throughput_vs_memory": pareto_front(points, "items_per_s", "memory_gb")}
        closest = []
        if best is None:
            infeasible = [c for c in self.cands.values() if c.status == "infeasible"]

            def relative(c: _Candidate) -> float:
                rel = [c.misses.get("p99_ms_over", 0) / self.slo if self.slo else 0,
                       c.misses.get("memory_gb_over", 0) / self.mem if self.mem else 0]
                return sum(rel)

            closest = [{"config": c.label, "batch_size": c.batch, "misses": dict(c.misses),
                        "figures": figures(c.row, c.gb, c.gb_source)} for c in sorted(infeasible, key=relative)[:5]]
        failures: dict[str, list[str]] = {}
        for c in self.cands.values():
            if c.status == "failed":
                failures.setdefault(c.label, []).append(f"batch {c.batch}: {c.reason}")
        results = Results.new(spec=self.spec)
        for row in self.rows.values():
            results.add(row)
        results.ceilings = self.runner.ceilings
        return OptimizeResult(
            model=self.work.name, device=self.runner.device_name, objective=self.objective,
            constraints={"slo_p99_ms": self.slo, "memory_gb": self.mem}, mode=self.mode, best=best,
            runner_up=runner_up, comparison=comparison, ratio=ratio, pareto=pareto, log=self.log,
            results=results, prepared=prepared, closest=closest, failures=failures, stopped=self.stopped,
            search_s=self._elapsed(), candidates=len(self.cands),
            measured=len({(c.label, c.batch) for c in self.cands.values() if c.row is not None}),
            settings={"eta": self.eta, "rungs": self.rungs, "confirm": self.confirm, "batch_sizes": self.batches,
                      "configs": [c.label for c in self.configs], "last_rung": rung})

    def _turn(self, alive: list[_Candidate], comparison, ratio) -> dict[str, Any] | None:
        """When the interleaved run of the best and the runner-up says the runner-up is better, it is the
        answer: the two ran under the same conditions there, while their separate measurements drift apart
        with the device's clocks (10-15% on the H100 at its power cap). The interval must lie below 1 by the
        comparison's ``min_effect``. Not for ``objective="latency"`` (it ranks by the requests' p99, the
        interleaved run compares device medians), not where either one's device times in that run hold its
        host's gaps (:func:`space.holds_host_gaps`: then the order is the host's, in either run), and under a
        p99 budget only if the runner-up's calls in that run, at least ``TAIL_SAMPLES`` of them, meet the SLO
        as requests. Reorders ``alive`` and returns the ratio turned round (best / runner-up again), or
        None."""
        if (ratio is None or ratio["verdict"] != "runner-up is better" or not comparison.interleaved
                or ratio["ci"][1] * (1.0 + comparison.min_effect) >= 1.0):
            return None
        second = alive[1]
        why = (f"its interleaved run with {alive[0].label} b{alive[0].batch}: best / runner-up "
               f"{ratio['value']:.3f}x [{ratio['ci'][0]:.3f} .. {ratio['ci'][1]:.3f}]")
        if self.objective == "latency":
            self._note(second, None, "kept second", why + "; the latency objective ranks by the requests' p99, "
                       "which the interleaved run's device medians do not measure")
            return None
        gaps = [c for c, m in ((second, comparison.baseline_measurement), (alive[0], comparison.candidate_measurement))
                if m is not None and space.holds_host_gaps(m)]
        if gaps:
            self._note(second, None, "kept second", why + "; " + " and ".join(f"{c.label} b{c.batch}" for c in gaps)
                       + " took the host longer to issue than the spin ahead on most calls there (its device "
                       "times hold the host's gaps), so the host set that order")
            return None
        if self.slo is not None:
            calls = space.calls_ms(comparison.baseline_measurement)
            p99 = float(_C.quantile(calls, 0.99)) if len(calls) >= space.TAIL_SAMPLES else None
            if p99 is None or p99 > self.slo:
                self._note(second, None, "kept second", why + (f"; its p99 there {p99:.3f} ms is over the SLO"
                                                               if p99 is not None else
                                                               f"; fewer than {space.TAIL_SAMPLES} calls there "
                                                               "to judge its p99"))
                return None
            second.turned_p99 = (p99, len(calls))
            why += f"; its p99 there {p99:.3f} ms over {len(calls)} calls"
        self._note(second, None, "chosen", why + "; the interleaved run decides between the two")
        alive[0], alive[1] = second, alive[0]
        lo, hi = ratio["ci"]
        return {**ratio, "value": 1.0 / ratio["value"], "ci": (1.0 / hi, 1.0 / lo), "verdict": "best is better",
                "what": ratio["what"] + "; the interleaved run reversed their order"}

    def _compare(self, best: _Candidate, second: _Candidate):
        """Runner-up (baseline) and best (candidate) measured interleaved; the interval of time per call,
        turned into the objective's ratio (items/s scale by the batch sizes). A compiled one whose code a later
        compilation reset would compile again first (8-15 s for ResNet-50 on the H100's host): then their
        latest measurements are compared as they are, not interleaved (the C++ bootstrap of two runs)."""
        stale = [f"{c.label} b{c.batch}" for c in (second, best) if c.cell.prepared.recompiles]
        labels = (f"{second.label} b{second.batch}", f"{best.label} b{best.batch}")
        try:
            if stale and self.objective == "energy":
                self.log.append(LogEntry(best.label, best.batch, None, "not compared",
                                         f"no interval against the runner-up: energy needs interleaved rounds, and "
                                         f"{' and '.join(stale)} would compile again first", None,
                                         round(self._elapsed(), 3)))
                return None, None
            if stale:  # two runs: the drift between runs widens the interval that judges them
                a, b = second.row.measurement, best.row.measurement
                cmp = compare(a, b, labels=labels, run_to_run=RunToRun.default(a))
                how = (f"measured apart: {' and '.join(stale)} would compile again; the interval widened by "
                       f"{cmp.run_to_run['rel']:.0%} for drift between runs")
            else:
                a = second.cell.prepared.runner(second.cell.inputs)
                b = best.cell.prepared.runner(best.cell.inputs)
                metric = "energy" if self.objective == "energy" else "time"
                cmp = compare(a, b, metric=metric, labels=labels, mode=self.mode, **self.confirm)
                how = "interleaved"
            if self.objective == "energy":
                scale, what = best.batch / second.batch, f"joules per item, runner-up / best ({how})"
            elif self.objective == "throughput":
                scale, what = best.batch / second.batch, f"items/s, best / runner-up (medians, {how})"
            else:
                scale, what = 1.0, f"median latency per call, runner-up / best ({how})"
        except Exception as exc:  # noqa: BLE001 - the answer stands without its interval
            self.log.append(LogEntry(best.label, best.batch, None, "failed",
                                     f"the comparison with the runner-up failed: "
                                     f"{type(exc).__name__}: {exc}", None, round(self._elapsed(), 3)))
            return None, None
        lo, hi = (cmp.judged_ci or cmp.ci)[0] * scale, (cmp.judged_ci or cmp.ci)[1] * scale
        # The comparison's own verdict is per call; at different batch sizes the objective's ratio decides.
        verdict = ("best is better" if lo > 1 else "runner-up is better" if hi < 1 else "no significant difference")
        ratio = {"value": cmp.speedup * scale, "ci": (lo, hi), "confidence": cmp.confidence, "what": what,
                 "verdict": verdict}
        return cmp, ratio
