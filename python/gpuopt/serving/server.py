"""The dynamic batcher as an in-process server: requests one at a time from any thread, batches formed
in C++ (``max_batch_size``, ``max_queue_delay_us``, ``preferred_batch_sizes``, sequence ``buckets``),
``instances`` executors on their own CUDA streams, inputs staged through gpuopt's pinned pool.

How a batch runs (``Server.path``):

- ``cuda-graph``: for a ``cudagraph`` config, or a ``compile`` config whose mode does not use CUDA
  graphs itself, one CUDA graph per instance, bucket and graph batch size is captured here and replayed
  from C++ without the GIL (a batch is padded up to the smallest captured size that holds it);
- ``python``: anything else (eager, TorchScript, ``compile:reduce-overhead``, any callable): the model is
  called from the executor's thread with the GIL.

Several GPUs (``devices=``): a replica of the model per GPU, prepared with the same config, and
``instances`` executors per GPU, each with its graphs captured and its streams on its GPU. All pull
from one queue: the first free executor takes the next batch (least-loaded dispatch), and the stats
give each GPU's busy time and batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import check_int, cuda_indices
from .._ext import _C
from ..memory.pools import PinnedPool
from ..prepare.config import Config, Prepared
from ..timing import graphs
from .load import LoadSpec, ServeResult, checksum_weights, verify_checksums
from .load import load_spec as _load_spec

TIMEOUT_ACTIONS = ("reject", "delay")


class QueueFullError(RuntimeError):
    """The server's queue held ``max_queue_size`` requests: this one was rejected (and counted)."""


class RequestFailed(RuntimeError):
    """The batch this request rode in failed (the model's error), or the server shut down first."""


def output_tensor(out: Any) -> torch.Tensor:
    """The tensor a served model answers with: the output itself, the first of a tuple/list, or the first
    tensor value of a dict or a Hugging Face ModelOutput (``logits``, ``last_hidden_state``, ...)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        values = list(out.values()) if isinstance(out, dict) else list(out.to_tuple())
    elif isinstance(out, (tuple, list)):
        values = list(out)
    else:
        values = []
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"a served model must return a tensor (or a tuple/dict/ModelOutput holding one), got "
                    f"{type(out).__name__}")


@dataclass(frozen=True)
class SampleLayout:
    """How a sample (one request's inputs, without a batch axis) maps to the model's arguments: a
    tensor (one positional argument), a tuple of tensors (positional), or a dict (keyword)."""

    keys: tuple[str, ...] | None  # dict samples: the keyword of each tensor, in order
    count: int

    @staticmethod
    def of(sample: Any) -> SampleLayout:
        if isinstance(sample, torch.Tensor):
            return SampleLayout(None, 1)
        if isinstance(sample, dict):
            if not sample or not all(isinstance(v, torch.Tensor) for v in sample.values()):
                raise TypeError("a dict sample must map argument names to tensors")
            return SampleLayout(tuple(sample), len(sample))
        if isinstance(sample, (tuple, list)) and sample and all(isinstance(v, torch.Tensor) for v in sample):
            return SampleLayout(None, len(sample))
        raise TypeError(f"a sample must be a tensor, a tuple of tensors or a dict of tensors (one request, no batch "
                        f"axis), got {type(sample).__name__}")

    def tensors(self, sample: Any) -> list[torch.Tensor]:
        if self.keys is not None:
            if not isinstance(sample, dict) or tuple(sample) != self.keys:
                raise ValueError(f"a sample must be a dict with keys {list(self.keys)}, got "
                                 f"{list(sample) if isinstance(sample, dict) else type(sample).__name__}")
            return list(sample.values())
        tensors = [sample] if isinstance(sample, torch.Tensor) else list(sample)
        if len(tensors) != self.count or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ValueError(f"a sample must be {self.count} tensor(s), got {type(sample).__name__}")
        return tensors

    def call(self, module: Callable[..., Any], tensors: Sequence[torch.Tensor]) -> Any:
        if self.keys is not None:
            return module(**dict(zip(self.keys, tensors)))
        return module(*tensors)


def _sizes(name: str, value: Any, limit: int | None = None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of integers, got {value!r}")
    out = [check_int(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"{name} must be strictly increasing, got {list(value)}")
    if limit is not None and out and out[-1] > limit:
        raise ValueError(f"{name} must not exceed max_batch_size={limit}, got {list(value)}")
    return out


# How long an idle executor polls the queue for a request before it sleeps (one executor at a time).
DEFAULT_IDLE_SPIN_US, MAX_IDLE_SPIN_US = 200, 100_000


def batcher_options(*, max_batch_size: int, max_queue_delay_us: int, preferred_batch_sizes: Sequence[int] | None,
                    buckets: Sequence[int] | None, max_queue_size: int, priority_levels: int,
                    timeout_ms: float | None, timeout_action: str, idle_spin_us: int = DEFAULT_IDLE_SPIN_US) -> Any:
    """The C++ batcher's options, each checked and named here."""
    o = _C.BatcherOptions()
    o.max_batch_size = check_int("max_batch_size", max_batch_size)
    o.max_queue_delay_us = check_int("max_queue_delay_us", max_queue_delay_us, 0)
    o.preferred_batch_sizes = _sizes("preferred_batch_sizes", preferred_batch_sizes, max_batch_size)
    o.buckets = _sizes("buckets", buckets)
    o.max_queue_size = check_int("max_queue_size", max_queue_size, 0)  # 0: unbounded
    o.priority_levels = check_int("priority_levels", priority_levels)
    if timeout_ms is not None and not (isinstance(timeout_ms, (int, float)) and not isinstance(timeout_ms, bool)
                                       and timeout_ms > 0 and math.isfinite(timeout_ms)):
        raise ValueError(f"timeout_ms must be a positive number of milliseconds or None, got {timeout_ms!r}")
    o.default_timeout_us = 0 if timeout_ms is None else max(1, round(timeout_ms * 1e3))
    if timeout_action not in TIMEOUT_ACTIONS:
        raise ValueError(f"timeout_action must be one of {', '.join(map(repr, TIMEOUT_ACTIONS))}, got "
                         f"{timeout_action!r}")
    o.timeout_action = timeout_action
    o.idle_spin_us = check_int("idle_spin_us", idle_spin_us, 0)
    if o.idle_spin_us > MAX_IDLE_SPIN_US:
        raise ValueError(f"idle_spin_us must be in [0, {MAX_IDLE_SPIN_US}] (0: never poll), got {idle_spin_us!r}")
    o.validate()
    return o


def graph_batch_sizes(max_batch_size: int, preferred: Sequence[int] = ()) -> list[int]:
    """The batch sizes a graph is captured for: the preferred sizes, the powers of two below
    ``max_batch_size``, and ``max_batch_size`` (a batch runs in the smallest that holds it)."""
    sizes = {max_batch_size, *preferred}
    b = 1
    while b < max_batch_size:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


class Future:
    """One request's answer. :meth:`result` waits (bounded) and returns the output (a CPU tensor, the
    request's row of the batch output, its sequence axis cut back to the request's length)."""

    def __init__(self, native: Any):
        self._native = native

    def done(self) -> bool:
        return self._native.done

    @property
    def status(self) -> str:
        """``pending``, ``ok``, ``failed``, ``rejected``, ``timed-out`` or ``cancelled``."""
        return self._native.status

    def result(self, timeout: float = 60.0) -> torch.Tensor:
        if not self._native.wait(float(timeout)):
            raise TimeoutError(f"no answer within {timeout} s (the request is still {self.status})")
        status = self._native.status
        if status == "ok":
            return self._native.output
        if status == "timed-out":
            raise TimeoutError(self._native.error)
        if status == "rejected":
            raise QueueFullError(self._native.error)
        raise RequestFailed(self._native.error)

    @property
    def timings(self) -> dict[str, float]:
        """Queue and compute time of the request (microseconds) and the size of its batch."""
        n = self._native
        return {"queue_us": n.queue_us, "compute_us": n.compute_us, "batch_size": n.batch_size}


class Server:
    """A dynamic batcher serving ``model`` under ``config`` in this process.

    ``sample`` is one request's inputs (a tensor, tuple or dict of tensors, without a batch axis): it
    fixes the shapes and dtypes every request must have. With ``buckets``, every input's first axis is
    a sequence axis: requests are padded (with zeros; give an attention mask as an input) to the
    smallest bucket that holds them, and outputs whose second axis is the padded length are cut back.

    >>> import torch, gpuopt
    >>> model = torch.nn.Linear(8, 4)
    >>> with gpuopt.Server(model, "fp32", torch.randn(8), device="cpu", max_batch_size=4) as s:
    ...     y = s.infer(torch.randn(8))
    >>> tuple(y.shape), s.path
    ((4,), 'python')

    ``devices`` (``"all"``, a number of GPUs or a list of indices; not with ``device``) serves a replica
    on each GPU with ``instances`` executors per GPU; ``stats()`` then has ``busy_s_per_device`` and
    ``batches_per_device``.

    ``idle_spin_us``: an idle executor polls the queue this long before it sleeps (one executor at a
    time), so that a request arriving just after a batch skips the sleeping thread's wake-up latency;
    0 never polls (for a host whose cores are all busy).
    """

    def __init__(self, model: torch.nn.Module | Prepared, config: str | Config = "fp32", sample: Any = None, *,
                 device: str | torch.device | None = None, max_batch_size: int = 32, max_queue_delay_us: int = 0,
                 preferred_batch_sizes: Sequence[int] | None = None, buckets: Sequence[int] | None = None,
                 instances: int = 2, max_queue_size: int = 0, priority_levels: int = 1,
                 timeout_ms: float | None = None, timeout_action: str = "reject", executor: str = "auto",
                 graph_sizes: Sequence[int] | None = None, checksums: bool = False, name: str = "Server",
                 devices: str | int | Sequence[int] | None = None, idle_spin_us: int = DEFAULT_IDLE_SPIN_US):
        if sample is None:
            raise ValueError("sample is required: one request's inputs (no batch axis), e.g. torch.randn(3, 224, 224)")
        if executor not in ("auto", "graph", "python"):
            raise ValueError(f"executor must be 'auto', 'graph' or 'python', got {executor!r}")
        self.name = name
        self.layout = SampleLayout.of(sample)
        self.options = batcher_options(
            max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
            preferred_batch_sizes=preferred_batch_sizes, buckets=buckets, max_queue_size=max_queue_size,
            priority_levels=priority_levels, timeout_ms=timeout_ms, timeout_action=timeout_action,
            idle_spin_us=idle_spin_us)
        self.instances = check_int("instances", instances)
        if self.instances > 64:
            raise ValueError(f"instances must be <= 64, got {instances}")
        indices = self._devices(devices, device, model)
        if len(indices) == 1:  # one GPU: the single-device server on it
            device, indices = torch.device("cuda", indices[0]), []
        self.buckets = list(self.options.buckets)
        tensors = self.layout.tensors(sample)
        if self.buckets:
            for i, t in enumerate(tensors):
                if t.dim() < 1:
                    raise ValueError(f"with buckets every input's first axis is its sequence axis; input {i} is a "
                                     f"scalar")
        self.prepared = self._prepare(model, config, tensors, torch.device("cuda", indices[0]) if indices else device)
        # One replica per GPU with devices=, prepared alike; the first is `prepared`.
        self.replicas = [self.prepared] + [self._prepare(model, config, tensors, torch.device("cuda", i))
                                           for i in indices[1:]]
        self.device = self.prepared.device
        self.devices = [r.device for r in self.replicas]
        cfg = self.prepared.config
        self.config = cfg
        # (dtype, sample shape, memory format) of each input, as requests are staged.
        self.input_specs = [self._spec(t, cfg) for t in tensors]
        self.notes: list[str] = list(self.prepared.notes)
        self.path = self._choose_path(executor, cfg)
        self._pool = PinnedPool(name=f"{name} pinned")
        # Before _graphs: attributes are released in this order when the server is dropped unclosed, so
        # the C++ server (its deleter stops the executors) goes before the graphs it replays.
        self._native: Any = None
        self._graphs: list[Any] = []  # kept alive while C++ replays them
        dev = self.device.index if self.device.type == "cuda" else -1
        if dev is None:
            dev = torch.cuda.current_device()
        self._samples: list[list[torch.Tensor]] = []
        self._expected: tuple[torch.Tensor, torch.Tensor] | None = None
        self._checksums = bool(checksums)
        kwargs: dict[str, Any] = dict(batcher=self.options, device=dev, inputs=self.input_specs, checksums=checksums,
                                      name=name, pinned_pool=self._pool._native, devices=indices)
        if self.path == "cuda-graph":
            self.graph_sizes = _sizes("graph_sizes", graph_sizes, max_batch_size) or graph_batch_sizes(
                max_batch_size, self.options.preferred_batch_sizes)
            if self.graph_sizes[-1] != max_batch_size:
                raise ValueError(f"graph_sizes must include max_batch_size={max_batch_size}, got {self.graph_sizes}")
            kwargs["graphs"] = self._capture_all(indices)
        else:
            self.graph_sizes = []
            kwargs["fn"] = self._fn_by_device() if indices else self.direct_fn()
            kwargs["instances"] = self.instances
        self._native = _C.Server(**kwargs)

    # ---- preparation ---------------------------------------------------------------------------------------

    @staticmethod
    def _devices(devices: Any, device: Any, model: Any) -> list[int]:
        """The GPU indices of ``devices=`` (empty without it), checked against ``device`` and the model."""
        if devices is None:
            return []
        if device is not None:
            raise ValueError(f"give device= (one device) or devices= (several GPUs), not both; got device={device!r} "
                             f"and devices={devices!r}")
        if not torch.cuda.is_available():
            raise ValueError(f"devices={devices!r} spreads the server over GPUs and none is visible; on the CPU give "
                             "device='cpu' (one server, several instances) instead")
        indices = cuda_indices("devices", devices)
        if isinstance(model, Prepared) and len(indices) > 1:
            raise ValueError("devices= prepares a replica of the model on each GPU: give the torch.nn.Module, not a "
                             "Prepared (which lives on one device)")
        return indices

    def _prepare(self, model: Any, config: Any, tensors: list[torch.Tensor], device: Any) -> Prepared:
        if isinstance(model, Prepared):
            if not model.ok:
                raise RuntimeError(f"config {model.label} could not be prepared: {model.error}")
            return model
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or a gpuopt Prepared, got {type(model).__name__}")
        cfg = Config.parse(config)
        example = self._example_batch(tensors, 1)
        prepared = cfg.apply(model, example, device=device)
        if not prepared.ok:
            raise RuntimeError(f"config {cfg.label} could not be prepared: {prepared.error}")
        return prepared

    def _example_batch(self, tensors: Sequence[torch.Tensor], rows: int) -> Any:
        batch = [t.unsqueeze(0).expand(rows, *t.shape).contiguous() for t in tensors]
        if self.layout.keys is not None:
            return dict(zip(self.layout.keys, batch))
        return tuple(batch)

    @staticmethod
    def _spec(t: torch.Tensor, cfg: Config) -> tuple[torch.dtype, list[int], str]:
        dtype = cfg.cast_dtype if (cfg.cast_dtype is not None and t.is_floating_point()) else t.dtype
        fmt = "channels_last" if cfg.memory_format == "channels_last" and t.dim() == 3 else "contiguous"
        return (dtype, list(t.shape), fmt)

    def _choose_path(self, executor: str, cfg: Config) -> str:
        graphable = self.device.type == "cuda" and (
            cfg.backend == "cudagraph" or (cfg.backend == "compile" and cfg.compile_mode in (
                "default", "max-autotune-no-cudagraphs")))
        if executor == "graph" and not graphable:
            raise ValueError(f"executor='graph' needs a CUDA device and a 'cudagraph' config or a 'compile' config "
                             f"whose mode does not capture graphs itself; got {cfg.label} on {self.device}")
        if executor == "python" or not graphable:
            return "python"
        return "cuda-graph"

    def _module(self, replica: Prepared | None = None) -> Callable[..., Any]:
        p = replica or self.prepared
        return p.eager_module if p.config.backend == "cudagraph" else p.module

    def _fn_by_device(self) -> Callable[..., torch.Tensor]:
        """The Python executors' call over several GPUs: each batch runs on the replica of its GPU."""
        fns = {r.device.index: self.direct_fn(r) for r in self.replicas}

        def run(*batch: torch.Tensor) -> torch.Tensor:
            return fns[batch[0].device.index](*batch)

        return run

    def direct_fn(self, replica: Prepared | None = None) -> Callable[..., torch.Tensor]:
        """The model as one call on a batch already on the device (the config's guard, the eager or
        compiled module of ``replica``, default the first): what the Python executor runs, what graphs
        are captured from, and the direct call answers are verified against."""
        module, layout, cfg, device_type = self._module(replica), self.layout, self.prepared.config, self.device.type

        def run(*batch: torch.Tensor) -> torch.Tensor:
            with cfg.guard(device_type):  # one guard per call: instances run this on several threads
                return output_tensor(layout.call(module, batch))

        return run

    def _capture_all(self, indices: Sequence[int]) -> list[list[tuple]]:
        """Per executor (``instances``, or with several GPUs ``instances`` per GPU in the order of
        ``_C.executor_devices``), per bucket: static inputs for the largest graph batch, and one graph per
        graph batch size on views of them, sharing the executor's memory pool (never replayed
        concurrently), all on the executor's GPU with its replica."""
        layout, cfg = self.layout, self.prepared.config
        buckets = self.buckets or [None]
        replica = {r.device.index: r for r in self.replicas}
        order = _C.executor_devices(list(indices), self.instances) if indices else [self.device.index] * self.instances
        per_instance: list[list[tuple]] = []
        for index in order:
            with torch.cuda.device(index):
                per_instance.append(self._capture_executor(self._module(replica[index]), layout, cfg, buckets,
                                                           torch.device("cuda", index)))
        for d in self.devices:
            torch.cuda.synchronize(d)
        return per_instance

    def _capture_executor(self, module, layout, cfg, buckets, device: torch.device) -> list[tuple]:
        pool = torch.cuda.graph_pool_handle()
        # A capture stream per executor: torch keys cuBLAS workspaces by (handle, stream), so graphs
        # captured on one stream (torch.cuda.graph's shared default) would all write the same
        # workspace -- and replayed concurrently by two executors, race on it (split-K GEMMs then
        # deadlock on the GPU).
        stream = torch.cuda.Stream(device)
        entries: list[tuple] = []
        for b_index, length in enumerate(buckets):
            static = []
            for dtype, shape, fmt in self.input_specs:
                full = [self.graph_sizes[-1], *shape]
                if length is not None:
                    full[1] = length
                mf = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
                static.append(torch.zeros(full, dtype=dtype, device=device).contiguous(memory_format=mf))
            for rows in reversed(self.graph_sizes):
                views = [s[:rows] for s in static]
                graph, out = self._capture(module, layout, cfg, views, pool, stream, device)
                self._graphs.append(graph)
                entries.append((b_index if length is not None else -1, rows, graph.raw_cuda_graph_exec(), views, out))
        return entries

    @staticmethod
    def _capture(module, layout, cfg, views, pool, stream, device: torch.device):
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), cfg.guard(device.type, capture=True):
            for _ in range(2):  # lazy initialisation, cuDNN autotuning: outside the capture
                output_tensor(layout.call(module, views))
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with cfg.guard(device.type, capture=True), graphs.capture(graph, stream=stream, pool=pool):
            out = output_tensor(layout.call(module, views)).contiguous()
        return graph, out

    # ---- requests ------------------------------------------------------------------------------------------

    def submit(self, sample: Any, *, priority: int = 0, timeout_ms: float | None = None) -> Future:
        """Queues one request (copied into pinned memory at once) and returns its :class:`Future`.
        A full queue raises :class:`QueueFullError` (counted in :meth:`stats`); ``priority`` 0 is
        served first; ``timeout_ms`` overrides the server's."""
        if timeout_ms is None:
            timeout_us = -1
        elif isinstance(timeout_ms, (int, float)) and not isinstance(timeout_ms, bool) and timeout_ms > 0:
            timeout_us = max(1, round(timeout_ms * 1e3))
        else:
            raise ValueError(f"timeout_ms must be a positive number of milliseconds or None, got {timeout_ms!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int in [0, {self.options.priority_levels}), got {priority!r}")
        native = self._native.submit(self.layout.tensors(sample), priority, timeout_us)
        if native.status == "rejected":
            raise QueueFullError(native.error)
        if native.status == "cancelled":
            raise RequestFailed(native.error)
        return Future(native)

    def infer(self, sample: Any, *, timeout: float = 60.0, **kwargs: Any) -> torch.Tensor:
        """``submit(sample).result(timeout)``."""
        return self.submit(sample, **kwargs).result(timeout)

    def add_samples(self, samples: Sequence[Any]) -> int:
        """Samples the load generator draws from (converted to pinned rows once); returns the count."""
        for s in samples:
            tensors = self.layout.tensors(s)
            self._native.add_sample(tensors)
            self._samples.append([t.detach().cpu() for t in tensors])
        self._expected = None
        return self._native.sample_count

    @property
    def sample_count(self) -> int:
        return self._native.sample_count

    def run_load(self, spec: LoadSpec | None = None, *, records: bool = False, verify: bool = False,
                 model_name: str = "model", **load: Any) -> ServeResult:
        """Drives this server with the C++ load generator (``spec``, or :class:`LoadSpec` fields as
        keywords) over the samples added with :meth:`add_samples`. ``verify`` (needs ``checksums=True``)
        compares every answer's output checksum with a direct model call on its sample."""
        spec = _load_spec(spec, load)
        weights = spec.priority_weights or []
        if len(weights) > self.options.priority_levels:
            raise ValueError(f"priority_weights has {len(weights)} levels but the server has priority_levels="
                             f"{self.options.priority_levels}")
        if verify and not self._checksums:
            raise ValueError("verify=True needs a server built with checksums=True")
        run = self._native.run_load(spec.options(), records or verify)
        recs = run.pop("records")
        result = ServeResult(model=model_name, config=self.prepared.label, load=spec, settings=self.describe(),
                             result=run, server=self.stats(), records=recs if records else None)
        if verify:
            result.verification = verify_checksums(recs, self.expected_checksums(), self.config.precision)
        return result

    def expected_checksums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per added sample, from a direct model call on it (batch of one, the config's eager module):
        its checksums and their scales, ``[samples, CHECKSUMS]`` float64 each
        (:func:`~gpuopt.serving.load.checksum_weights`), weighted on the output's own device as the
        server weights its answers on its device."""
        if self._expected is None:
            fn = self.direct_fn()
            sums, scales = [], []
            weights = None
            with torch.inference_mode():
                for tensors in self._samples:
                    batch = [t.unsqueeze(0).to(self.device, dtype) for t, (dtype, _, _) in zip(tensors, self.input_specs)]
                    batch = [b.contiguous(memory_format=torch.channels_last) if fmt == "channels_last" else b
                             for b, (_, _, fmt) in zip(batch, self.input_specs)]
                    out = fn(*batch)[0].double().flatten()
                    if weights is None or weights.shape[0] < out.numel() or weights.device != out.device:
                        grown = 0 if weights is None else 2 * weights.shape[0]  # by doubling: rebuilt rarely
                        weights = checksum_weights(max(out.numel(), grown), out.device)
                    w = weights[:out.numel()]
                    sums.append((out @ w).cpu())
                    scales.append((out.square() @ w.square()).sqrt().cpu())
            self._expected = (torch.stack(sums), torch.stack(scales))
        return self._expected

    def stats(self) -> dict[str, Any]:
        """Requests by outcome, batches (per instance and per device), busy time (of the server and per
        device), host time per phase, the queue's counters and batch-size histogram."""
        return dict(self._native.stats())

    def close(self, drain: bool = True, timeout_s: float = 30.0) -> None:
        """Stops accepting requests; with ``drain`` serves what waits (for up to ``timeout_s``) and
        cancels the rest, otherwise cancels at once; returns once every executor has stopped."""
        self._native.close(bool(drain), float(timeout_s))

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close(drain=exc[0] is None)
        return False

    def describe(self) -> dict[str, Any]:
        """The settings a result records."""
        o = self.options
        return {"path": self.path, "instances": self.instances, "max_batch_size": o.max_batch_size,
                "max_queue_delay_us": o.max_queue_delay_us, "preferred_batch_sizes": list(o.preferred_batch_sizes),
                "buckets": list(o.buckets), "max_queue_size": o.max_queue_size,
                "priority_levels": o.priority_levels, "timeout_us": o.default_timeout_us,
                "timeout_action": o.timeout_action, "idle_spin_us": o.idle_spin_us,
                "graph_sizes": list(self.graph_sizes),
                "device": str(self.device), "devices": [str(d) for d in self.devices], "config": self.prepared.label}

    def __repr__(self) -> str:
        where = ", ".join(map(str, self.devices))
        return (f"Server({self.prepared.label} on {where}, path={self.path}, instances={self.instances}, "
                f"max_batch_size={self.options.max_batch_size}, max_queue_delay_us={self.options.max_queue_delay_us})")
