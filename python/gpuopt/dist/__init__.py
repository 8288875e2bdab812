"""Dist: benchmarks on several GPUs through torch.distributed -- one process per GPU, started by torchrun
(gpuopt's launcher or your own), each rank measuring its replica with gpuopt's engine; rank 0 gathers
the rows and raw samples and writes one Results with per-rank rows, the aggregate (pooled latency
percentiles, summed throughput) and the scaling efficiency against one GPU measured in the same job.
``strategy="split"`` instead scatters one global batch from rank 0 over the ranks and gathers the
outputs back (:mod:`gpuopt.dist.split`): one row per cell, timed on rank 0, with the scatter and
gather times. ``sweep(..., devices=...)`` / ``gpuopt sweep SPEC --gpus N`` spreads a sweep's cells over
the ranks (:mod:`gpuopt.dist.sweep`).
On the CPU (gloo) the same code runs with CPU ranks. Entry points: ``gpuopt.benchmark(..., devices=...)``,
``gpuopt bench --gpus N``, ``torchrun ... -m gpuopt.dist SPEC.json``. Several processes on one GPU (with MPS
where available) against one process: :func:`shared_gpu`.

Layer: above run (it registers ``devices=`` there when imported); nothing above it is imported.
"""

from ..run import sweeps
from ..run.bench import register_distributed
from . import sweep
from .aggregate import aggregate_row, common_interval, pooled, scaling_efficiency
from .launch import resolve, torchrun
from .split import SplitStep
from .shared import MpsDaemon, shared_gpu
from .worker import RankFailedError, run_rank

register_distributed(resolve)
sweeps.register_distributed(sweep.resolve)

__all__ = ["MpsDaemon", "RankFailedError", "SplitStep", "aggregate_row", "common_interval", "pooled", "run_rank",
           "scaling_efficiency", "shared_gpu", "torchrun"]
