"""The optimizer: the fastest config and batch size of a model that keeps parity, under a p99 latency
and a memory budget, found by successive halving in a fraction of an exhaustive sweep's time
(:func:`gpuopt.optimize`, ``gpuopt optimize MODEL``).

Design:

- Candidates are (config, batch size) pairs: the device's configs (:func:`candidate_configs`, built from
  Config's parts; or the caller's) x batch sizes (1 .. 256 by doubling; 1 for ``objective="latency"``).
- Each candidate is prepared once (the runner's ``prepare_cell``: conversion, compilation, parity against
  fp32) and kept only while it is in the running: rungs measure it again with longer options (the
  runner's ``measure_cell``: gpuopt's one timing engine), dropped candidates free their memory.
- Objectives: ``throughput`` = items/s (batch / median time per call); ``latency`` = p99 time per call,
  lower is better; ``energy`` = joules per item from ``Row.energy`` (NVML; refused where not measured).
  Constraints: p99 per call <= ``slo_p99_ms``, peak allocated memory <= ``memory_gb``.
- Pruned with a reason, never run: larger batch sizes of a config after a p99 over the SLO, memory over
  the budget or out of memory (all grow with the batch), smaller ones once the objective stopped improving
  (:mod:`gpuopt.optimizer.ladder` picks the batch sizes a config measures), compiled configs at batch
  sizes where their eager twin lost or, under a p99 budget, away from where the twin's device time met it,
  where they are predicted over it or cannot beat the best so far; under a p99 budget also any batch size
  whose device time is bounded over the SLO (see :mod:`gpuopt.optimizer.search`). Failed with a reason:
  preparation errors, parity failures, out of memory.
- The answer (:class:`OptimizeResult`): best and runner-up with their figures, their interleaved
  comparison (``gpuopt.compare``: the C++ bootstrap) as a ratio with an interval, Pareto fronts
  (throughput vs p99, vs memory), the log, every measurement as Results, the winner's Prepared; with no
  feasible candidate ``best`` is None and ``closest`` says by how much the nearest miss.

Layer: above ``run`` (imports run and everything below it).
"""

from .result import Choice, LogEntry, OptimizeResult, pareto_front
from .search import CONFIRM, RUNGS, optimize
from .space import DEFAULT_BATCH_SIZES, OBJECTIVES, candidate_configs

__all__ = ["CONFIRM", "DEFAULT_BATCH_SIZES", "OBJECTIVES", "RUNGS", "Choice", "LogEntry", "OptimizeResult",
           "candidate_configs", "optimize", "pareto_front"]
