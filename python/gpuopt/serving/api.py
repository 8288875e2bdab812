"""``gpuopt.serve``: one call from a model to a served load run, plus the searches users ask for --
the highest Poisson rate whose p99 stays under an SLO, and the latency-throughput curve."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._checks import check_int
from ..prepare.config import Config
from .load import LoadSpec, ServeResult, load_spec
from .naive import NaiveBatcher
from .server import Server

BATCHERS = ("gpuopt", "naive")
_LOAD_FIELDS = set(LoadSpec.__dataclass_fields__)


def _model_and_samples(model: Any, sample_fn: Any) -> tuple[torch.nn.Module, Callable[[int], Any], str]:
    """A zoo name or a module, and ``sample_fn(i) -> one request's inputs`` (no batch axis)."""
    name = "model"
    if isinstance(model, str):
        from ..run import zoo

        name = model
        module, make_inputs = zoo.get(model)
        if sample_fn is None:
            def sample_fn(i: int, _make=make_inputs) -> Any:  # one row of a batch of one
                torch.manual_seed(i)
                batch = _make(1)
                if isinstance(batch, dict):
                    return {k: v[0] for k, v in batch.items()}
                if isinstance(batch, (tuple, list)):
                    return tuple(v[0] for v in batch)
                return batch[0]
        model = module
    elif isinstance(model, torch.nn.Module):
        name = type(model).__name__
    else:
        raise TypeError(f"model must be a torch.nn.Module or a zoo name (gpuopt.zoo names), got {type(model).__name__}")
    if sample_fn is None:
        raise ValueError("sample_fn is required for a module: sample_fn(i) returns request i's inputs (no batch axis)")
    if isinstance(sample_fn, (torch.Tensor, tuple, dict)):
        fixed = sample_fn
        sample_fn = lambda i: fixed  # noqa: E731 - one sample for every request
    if not callable(sample_fn):
        raise TypeError(f"sample_fn must be a callable i -> sample, or one sample, got {type(sample_fn).__name__}")
    return model, sample_fn, name


def build(model: Any, config: str | Config = "fp32", sample_fn: Any = None, *, batcher: str = "gpuopt",
          samples: int = 64, device: Any = None, max_batch_size: int = 32, max_queue_delay_us: int = 0,
          naive_max_wait_ms: float = 1.0, **server_kw: Any) -> tuple[Server | NaiveBatcher, str]:
    """A server (``batcher="gpuopt"``) or the naive baseline (``"naive"``) for ``model`` with ``samples``
    samples loaded; returns it and the model's name."""
    if batcher not in BATCHERS:
        raise ValueError(f"batcher must be one of {', '.join(map(repr, BATCHERS))}, got {batcher!r}")
    check_int("samples", samples)
    if batcher == "naive" and server_kw.get("devices") is not None:
        raise ValueError(f"devices={server_kw['devices']!r} applies to batcher='gpuopt'; the naive baseline serves on "
                         "one device")
    module, sample_fn, name = _model_and_samples(model, sample_fn)
    data = [sample_fn(i) for i in range(samples)]
    server = Server(module, config, data[0], device=device, max_batch_size=max_batch_size,
                    max_queue_delay_us=max_queue_delay_us, **server_kw)
    if batcher == "naive":
        naive = NaiveBatcher(server.prepared, server.layout, max_batch_size=max_batch_size,
                             max_wait_ms=naive_max_wait_ms, specs=server.input_specs)
        server.close(drain=False)
        naive.add_samples(data)
        return naive, name
    server.add_samples(data)
    return server, name


def serve(model: Any, config: str | Config = "fp32", sample_fn: Any = None, *, scenario: str = "server",
          rate: float | None = None, slo_ms: float | None = None, batcher: str = "gpuopt", samples: int = 64,
          device: Any = None, records: bool = False, verify: bool = False, **kw: Any) -> ServeResult:
    """Serve ``model`` under ``config`` with gpuopt's C++ dynamic batcher (or ``batcher="naive"``, the
    seeds' Python baseline) and drive it with the C++ load generator.

    ``sample_fn(i)`` returns request i's inputs without a batch axis (a zoo name brings its own);
    ``samples`` of them are loaded and queries draw from them. Batcher settings (``max_batch_size``,
    ``max_queue_delay_us``, ``preferred_batch_sizes``, ``buckets``, ``instances``, ``max_queue_size``,
    ``priority_levels``, ``timeout_ms``, ``timeout_action``, ``executor``, ``devices`` for a replica on
    each of several GPUs with ``instances`` executors per GPU) and load settings (any
    :class:`LoadSpec` field: ``arrival``, ``concurrency``, ``min_queries``, ``duration_s``, ...) are
    keywords.

    >>> import torch, gpuopt
    >>> r = gpuopt.serve(torch.nn.Linear(16, 4), "fp32", lambda i: torch.randn(16), device="cpu",
    ...                  scenario="closed-loop", concurrency=4, min_queries=200, duration_s=0.0)
    >>> r.result["ok"] >= 200, r.settings["path"]
    (True, 'python')
    """
    load_kw = {k: kw.pop(k) for k in list(kw) if k in _LOAD_FIELDS}
    spec = load_spec(None, {"scenario": scenario, "rate": rate, "slo_ms": slo_ms, **load_kw})
    spec.options()  # bad load settings fail before the model is prepared
    if verify:
        kw["checksums"] = True
    target, name = build(model, config, sample_fn, batcher=batcher, samples=samples, device=device, **kw)
    try:
        if isinstance(target, NaiveBatcher):
            if verify:
                raise ValueError("verify applies to batcher='gpuopt'")
            return target.run_load(spec, records=records, model_name=name)
        return target.run_load(spec, records=records, verify=verify, model_name=name)
    finally:
        target.close(**({"drain": False} if isinstance(target, Server) else {}))


@dataclass
class RateSearch:
    """The result of :func:`max_rate`: the highest rate whose run was valid with its percentile under the
    SLO (``best``), every step in order, and the offline throughput that bounded the search."""

    slo_ms: float
    best: ServeResult | None
    steps: list[ServeResult] = field(default_factory=list)
    offline: ServeResult | None = None

    @property
    def max_rate(self) -> float | None:
        return None if self.best is None else float(self.best.load.rate)

    def closest(self) -> ServeResult | None:
        """With no valid rate: the step whose estimate came nearest the SLO (and by how much it missed)."""
        if not self.steps:
            return None

        def miss(r: ServeResult) -> float:
            est = r.result["early_stop"].get("estimate_ms")
            return math.inf if est is None else est - self.slo_ms

        return min(self.steps, key=miss)

    def summary(self) -> str:
        if self.best is None:
            c = self.closest()
            extra = f"; closest: {c.summary()}" if c is not None else ""
            return f"no rate met p99 <= {self.slo_ms} ms{extra}"
        cap = f" ({self.best.load.rate / self.offline.throughput:.0%} of offline)" if self.offline else ""
        return f"max rate under p99 <= {self.slo_ms} ms: {self.max_rate:,.0f} req/s{cap}, {len(self.steps)} steps"


def _is_target(x: Any) -> bool:
    return isinstance(x, (Server, NaiveBatcher))


def max_rate(target: Server | NaiveBatcher, *, slo_ms: float, model_name: str = "model", rel_tol: float = 0.03,
             max_steps: int = 12, duration_s: float = 2.0, min_queries: int = 2000, low: float | None = None,
             high: float | None = None, **load: Any) -> RateSearch:
    """The highest Poisson rate at which ``target`` serves with the early-stopping p99 (``percentile``)
    under ``slo_ms``: an offline run bounds the rate, then a bisection where each step is a full,
    valid-or-not server run (``duration_s``, at least ``min_queries``); stops when the bracket is
    within ``rel_tol``."""
    if not _is_target(target):
        raise TypeError(f"target must be a gpuopt Server or NaiveBatcher, got {type(target).__name__}")
    if not (isinstance(slo_ms, (int, float)) and slo_ms > 0):
        raise ValueError(f"slo_ms must be a positive number of milliseconds, got {slo_ms!r}")
    if not (0 < rel_tol < 1):
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    offline = None
    if high is None:
        offline = target.run_load(LoadSpec(scenario="offline", min_queries=max(min_queries, 4096), duration_s=0.0),
                                  model_name=model_name)
        if offline.result["ok"] == 0:
            return RateSearch(float(slo_ms), None, [], offline)
        high = offline.throughput * 1.05
    lo = float(low) if low is not None else 0.0
    hi = float(high)
    search = RateSearch(float(slo_ms), None, [], offline)
    rate = hi * 0.7 if low is None else (lo + hi) / 2
    for _ in range(max_steps):
        n = max(min_queries, int(rate * duration_s))
        spec = LoadSpec(scenario="server", rate=rate, slo_ms=float(slo_ms), duration_s=duration_s, min_queries=n,
                        **load)
        r = target.run_load(spec, model_name=model_name)
        search.steps.append(r)
        if r.valid:
            lo = rate
            if search.best is None or rate > search.best.load.rate:
                search.best = r
        else:
            hi = rate
        if lo > 0 and (hi - lo) / hi <= rel_tol:
            break
        rate = (lo + hi) / 2 if lo > 0 else hi / 4 if len(search.steps) == 1 else rate / 2
    return search


def latency_curve(target: Server | NaiveBatcher, *, rates: Sequence[float] | None = None,
                  concurrencies: Sequence[int] | None = None, model_name: str = "model", duration_s: float = 2.0,
                  min_queries: int = 1000, **load: Any) -> list[ServeResult]:
    """Latency against load: one server run per rate, or one closed-loop run per concurrency; a run
    that fails is recorded (its row says why) and the curve goes on."""
    if (rates is None) == (concurrencies is None):
        raise ValueError("give exactly one of rates (server scenario) or concurrencies (closed loop)")
    points = list(rates if rates is not None else concurrencies)
    if not points:
        raise ValueError("rates/concurrencies must not be empty")
    out = []
    for p in points:
        if rates is not None:
            spec = LoadSpec(scenario="server", rate=float(p), duration_s=duration_s,
                            min_queries=max(min_queries, int(p * duration_s)), **load)
        else:
            spec = LoadSpec(scenario="closed-loop", concurrency=int(p), duration_s=duration_s,
                            min_queries=min_queries, **load)
        try:
            out.append(target.run_load(spec, model_name=model_name))
        except Exception as exc:  # noqa: BLE001 - recorded with its reason; the curve goes on
            out.append(ServeResult.failed(f"{type(exc).__name__}: {exc}", model=model_name,
                                          config=target.prepared.label, load=spec, settings=target.describe()))
    return out

