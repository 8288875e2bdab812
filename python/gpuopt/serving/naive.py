"""The seeds' naive Python batcher, kept as a named baseline (``batcher="naive"``): a ``queue.Queue``
of requests and one worker thread that takes the first request, gathers whatever else arrives within
``max_wait_ms`` (up to ``max_batch_size``), stacks the samples, moves the batch to the device, calls
the eager model and answers each request. Measured by the same C++ load generator as the server.

The worker thread lives as long as the batcher (as a real server's would), and the warm-up runs on it:
PyTorch keeps cuDNN's autotuning results per thread (``cudnn.benchmark``), so a warm-up on another
thread, or a new thread per run, would leave every batch size to be autotuned again inside the
measurement."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch

from .._checks import check_int
from .._ext import _C
from ..prepare.config import Prepared
from ..report.results import NAIVE_PATH
from .load import LoadSpec, ServeResult, load_spec
from .server import SampleLayout, output_tensor

_STOP = object()
_WARM_UP_TIMEOUT_S = 1800.0  # cuDNN autotunes every batch size once: minutes at most


def _serve_jobs(jobs: queue.Queue) -> None:
    """The worker thread: runs the jobs it is given until a None (it holds no reference to the batcher,
    so a batcher that is dropped is collected and its __del__ ends the thread)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job()


class NaiveBatcher:
    """The baseline. ``prepared`` runs eagerly (a ``cudagraph`` config's eager module) under its
    config's guard; samples are stacked on the host and copied with ``.to(device)``."""

    path = NAIVE_PATH

    def __init__(self, prepared: Prepared, layout: SampleLayout, *, max_batch_size: int = 32, max_wait_ms: float = 1.0,
                 specs: list[tuple] | None = None):
        if not prepared.ok:
            raise RuntimeError(f"config {prepared.label} could not be prepared: {prepared.error}")
        check_int("max_batch_size", max_batch_size)
        if not (isinstance(max_wait_ms, (int, float)) and max_wait_ms >= 0):
            raise ValueError(f"max_wait_ms must be a number >= 0, got {max_wait_ms!r}")
        self.prepared, self.layout = prepared, layout
        self.max_batch_size, self.max_wait_ms = max_batch_size, float(max_wait_ms)
        self.module = prepared.eager_module if prepared.config.backend == "cudagraph" else prepared.module
        self.device = prepared.device
        self._dtypes = [s[0] for s in specs] if specs else None
        self._samples: list[list[torch.Tensor]] = []
        self.warmed_up = False
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def _submit(self, fn: Any) -> tuple[threading.Event, dict[str, BaseException]]:
        """Runs ``fn`` on the batcher's worker thread (started on first use); returns (done, errors)."""
        if self._thread is None or not self._thread.is_alive():
            # A queue of its own per thread: a None that close() left for no live thread must not end
            # the next one.
            self._jobs = queue.Queue()
            self._thread = threading.Thread(target=_serve_jobs, args=(self._jobs,), name="gpuopt-naive-batcher",
                                            daemon=True)
            self._thread.start()
        done, errors = threading.Event(), {}

        def job() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors["error"] = exc
            finally:
                done.set()

        self._jobs.put(job)
        return done, errors

    def close(self, timeout_s: float = 30.0) -> None:
        """Ends the worker thread (after the job it is running, waiting at most ``timeout_s``)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout=timeout_s)

    def __del__(self) -> None:
        jobs = self.__dict__.get("_jobs")
        if jobs is not None:
            jobs.put(None)

    def warm_up(self) -> None:
        """Runs the model once at every batch size from 1 to ``max_batch_size``, so that no measured
        batch pays a shape's first run (cuDNN's autotuning under ``cudnn.benchmark``, CUDA's lazy kernel
        loading): the C++ server captures its graphs before it is measured, and the baseline gets the
        same start. :meth:`run_load` calls it once. It runs on the worker thread, where cuDNN keeps what
        it learned."""
        if not self._samples:
            raise ValueError("add samples first (add_samples)")
        cfg, dev = self.prepared.config, self.device

        def every_size() -> None:
            for b in range(1, self.max_batch_size + 1):  # as the worker runs a batch
                batch = [torch.stack([t] * b).to(dev) for t in self._samples[0]]
                with cfg.guard(dev.type):
                    output_tensor(self.layout.call(self.module, batch)).cpu()

        done, errors = self._submit(every_size)
        if not done.wait(_WARM_UP_TIMEOUT_S):
            raise TimeoutError(f"the naive batcher's warm-up did not finish within {_WARM_UP_TIMEOUT_S:.0f} s")
        if "error" in errors:
            raise errors["error"]
        self.warmed_up = True

    def add_samples(self, samples: list[Any]) -> int:
        for s in samples:
            ts = self.layout.tensors(s)
            if self._dtypes:
                ts = [t.to(d) for t, d in zip(ts, self._dtypes)]
            self._samples.append(ts)
        return len(self._samples)

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "instances": 1, "max_batch_size": self.max_batch_size,
                "max_wait_ms": self.max_wait_ms, "device": str(self.device), "config": self.prepared.label,
                "warmed_up": self.warmed_up}

    def _worker(self, q: queue.Queue, generator: Any, stats: dict[str, Any]) -> None:
        cfg, dev = self.prepared.config, self.device
        while True:
            first = q.get()
            if first is _STOP:
                return
            items = [first]
            deadline = time.perf_counter() + self.max_wait_ms / 1e3
            stop = False
            while len(items) < self.max_batch_size:
                left = deadline - time.perf_counter()
                try:
                    item = q.get(timeout=left) if left > 0 else q.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                items.append(item)
            start = time.perf_counter()
            try:
                columns = list(zip(*(self._samples[s] for _, s, _ in items)))
                batch = [torch.stack(col).to(dev) for col in columns]
                with cfg.guard(dev.type):
                    output_tensor(self.layout.call(self.module, batch)).cpu()  # answers back on the host
                error = ""
            except Exception as exc:  # noqa: BLE001 - the batch's requests fail with the reason
                error = f"{type(exc).__name__}: {exc}"
            done = time.perf_counter()
            stats["batches"] += 1
            stats["busy_s"] += done - start
            for id_, _, t_in in items:
                generator.complete(id_, "ok" if not error else "failed", (start - t_in) * 1e6, (done - start) * 1e6,
                                   len(items), error)
            if stop:
                return

    def run_load(self, spec: LoadSpec | None = None, *, records: bool = False, model_name: str = "model",
                 **load: Any) -> ServeResult:
        """The baseline under the C++ load generator (same scenarios and rules as :class:`Server`)."""
        spec = load_spec(spec, load)
        if not self._samples:
            raise ValueError("add samples first (add_samples)")
        if not self.warmed_up:
            self.warm_up()
        options = spec.options()
        options.sample_count = len(self._samples)
        q: queue.Queue = queue.Queue()

        def issue(ids: list[int], samples: list[int], priorities: list[int]) -> None:
            now = time.perf_counter()
            for i, s in zip(ids, samples):
                q.put((i, s, now))

        generator = _C.LoadGenerator(options, issue)
        stats = {"batches": 0, "busy_s": 0.0}
        served, errors = self._submit(lambda: self._worker(q, generator, stats))
        t0 = time.perf_counter()
        try:
            run = generator.run(records)
        finally:
            while True:  # what the run left unanswered must not be served into the next run
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
            q.put(_STOP)
            finished = served.wait(timeout=spec.drain_timeout_s)
        if not finished:
            raise TimeoutError(f"the naive batcher's worker did not stop within drain_timeout_s="
                               f"{spec.drain_timeout_s:g} s after the load ended (a batch still running)")
        if "error" in errors:
            raise errors["error"]
        run["wall_s"] = time.perf_counter() - t0
        run["busy_s"] = stats["busy_s"]
        recs = run.pop("records")
        return ServeResult(model=model_name, config=self.prepared.label, load=spec, settings=self.describe(),
                           result=run, server={"batches": stats["batches"], "path": self.path},
                           records=recs if records else None)
