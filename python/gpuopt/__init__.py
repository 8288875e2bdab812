"""gpuopt: how fast a PyTorch model really runs on a GPU, why, and how to make it faster.

The package is layered; each subpackage imports only the ones listed before it:

- ``_ext``: the one module that imports the compiled core ``gpuopt._C`` (after torch, version-checked)
- ``timing``: the timing engine, comparisons, the inputs convention, NVML facts (energy of every GPU
  measurement included), the environment record
- ``memory``: pinned/device pools and the input pipeline
- ``quant``: quantized linear layers (fp8, int8, int8 weight-only) on gpuopt's quantize operators
- ``prepare``: optimization configs and the parity gate
- ``analysis``: FLOP/byte counting, device ceilings, datasheets, roofline, profiler summaries
- ``report``: the Results table and its files, Markdown, plots, cross-hardware reports
- ``run``: workloads and the model zoo, the runner, ``benchmark()``, ``sweep()``
- ``testing``, ``pytest`` (the plugin), ``cli``: the surfaces on top

Above ``run``, each a subpackage of the same shape: ``serving`` (dynamic batcher, load generator),
``llm`` (prefill/decode), ``dist`` (torch.distributed) and ``optimizer`` (config search: :func:`gpuopt.optimize`,
successive halving over configs x batch sizes under latency and memory budgets). Energy is no subpackage: every
GPU measurement of ``timing`` records it
(NVML's counter read by the C++ loop), and the rows, reports and plots carry it.
"""

import torch  # noqa: F401  (first: the extension links against the libtorch it loads)

from . import dist  # noqa: F401  (registers benchmark(devices=...))
from ._ext import build_info  # noqa: I001  (after torch)
from .analysis import ProfileSummary, ceilings, datasheet, profile, roofline
from .llm import decode_sweep, measure_decode
from .memory import DevicePool, InputPipeline, PinnedPool
from .optimizer import OptimizeResult, optimize
from .prepare import (
    Config,
    Parity,
    Prepared,
    SignalFix,
    autocast,
    parity,
    precision,
    preset,
    presets,
    with_signal,
)
from .report import Results, Row
from .report import plots as plot
from .run import benchmark, sweep, zoo
from .serving import (
    LoadSpec,
    NaiveBatcher,
    QueueFullError,
    RequestFailed,
    Server,
    ServeResult,
    latency_curve,
    max_rate,
    serve,
)
from .timing import Comparison, Measurement, RunToRun, calibrate, compare, env, measure

__version__ = build_info()["gpuopt_version"]

__all__ = [
    "Comparison", "Config", "DevicePool", "InputPipeline", "Measurement", "Parity", "PinnedPool", "Prepared",
    "ProfileSummary", "Results", "Row", "SignalFix", "__version__", "autocast", "benchmark", "build_info", "ceilings", "compare",
    "datasheet", "env", "measure", "parity", "plot", "precision", "preset", "presets", "profile", "roofline",
    "sweep", "with_signal", "zoo",
]
__all__ += ["RunToRun", "calibrate"]  # cross-run comparisons
__all__ += ["LoadSpec", "NaiveBatcher", "QueueFullError", "RequestFailed", "ServeResult", "Server", "latency_curve",
            "max_rate", "serve"]  # serving
__all__ += ["decode_sweep", "measure_decode"]  # LLM prefill/decode
__all__ += ["OptimizeResult", "optimize"]  # the optimizer (gpuopt.optimizer)
__all__ += ["dist"]  # several GPUs: benchmark(devices=...), gpuopt.dist.RankFailedError
