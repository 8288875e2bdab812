"""Runs the cells of one workload: for a batch size, the FP32 reference, then every config (prepared,
parity-gated) in every mode, each cell measured by gpuopt's engine and handed on as a row."""

from __future__ import annotations

import copy
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .._ext import _C
from ..analysis import device_ceilings, roofline
from ..analysis.profiler import profile
from ..memory import InputPipeline, PinnedPool
from ..prepare.config import INFERENCE_ONLY_BACKENDS, INFERENCE_ONLY_PRECISIONS, Config, Prepared
from ..prepare.gate import parity as check_parity
from ..prepare.signal import with_signal
from ..report.results import Key, Row
from ..timing import nvml
from ..timing.inputs import device_index, split_inputs, tensors_in
from ..timing.measurement import measure
from .workload import TRAIN_MODE, Workload, batch_of


def _call_inputs(args: tuple, kwargs: dict) -> Any:
    return kwargs if kwargs and not args else args


_NO_COUNTS: dict[str, float | None] = {"flops_per_item": None, "bytes_per_item_min": None, "bytes_per_item_max": None}


def _count(model: torch.nn.Module, inputs: Any, batch: int) -> dict[str, float | None]:
    """FLOPs and bytes moved per item of one forward call (None where they cannot be counted)."""
    out = dict(_NO_COUNTS)
    try:
        out["flops_per_item"] = roofline.count_flops(model, inputs) / batch
        b = roofline.count_bytes(model, inputs)
        out["bytes_per_item_min"] = b["min_bytes"] / batch
        out["bytes_per_item_max"] = b["max_bytes"] / batch
    except Exception:  # noqa: BLE001 - counting is best effort; the row says None
        pass
    return out


def _place(row: Row, ceilings: dict | None) -> dict | None:
    if ceilings is None or row.throughput_items_per_s is None:
        return None
    flops = row.flops_per_item
    if flops is not None and row.mode == TRAIN_MODE:
        flops = 3 * flops  # forward + backward (about twice the forward)
    try:
        return roofline.place(flops_per_item=flops, bytes_per_item=row.bytes_per_item_min,
                              items_per_s=row.throughput_items_per_s, precision=row.precision,
                              ceilings=ceilings, diagnosis=row.diagnosis)
    except Exception as exc:  # noqa: BLE001
        return {"bound": "unknown", "reason": f"placement failed: {exc}"}


def _reason(exc: BaseException, where: str = "") -> str:
    """Why a cell failed (out of memory in one line: torch's message goes on about the allocator)."""
    if isinstance(exc, torch.OutOfMemoryError):
        first = str(exc).splitlines()[0] if str(exc) else "torch.OutOfMemoryError"
        return f"out of memory{where}: {first}"
    return f"{type(exc).__name__}{where}: {exc}"


def device_ceilings_for(device: torch.device) -> dict | None:
    """Measured ceilings if cached (never measures here: that takes tens of seconds), else the
    datasheet entry of the device, else None."""
    if device.type != "cuda":
        return None
    cached = device_ceilings.ceilings(device, cached_only=True)
    if cached is not None:
        return cached
    sheet = roofline.datasheet_ceilings(torch.cuda.get_device_name(device))
    return sheet if sheet["datasheet"] is not None else None


def _loss(out: Any) -> torch.Tensor:
    """A scalar to backpropagate through whatever the model returns."""
    if hasattr(out, "logits"):
        out = out.logits
    elif hasattr(out, "last_hidden_state"):
        out = out.last_hidden_state
    elif isinstance(out, dict):
        out = next(iter(out.values()))
    elif isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().square().mean()


def train_step(config: Config, model: torch.nn.Module, inputs: Any, device: torch.device) -> Callable[[], None]:
    """One forward + backward + optimizer step (SGD with momentum) under ``config``: autocast with a
    GradScaler for fp16-amp, none for bf16-amp; channels-last; torch.compile. TorchScript and CUDA-graph
    configs are inference-only."""
    if config.backend in INFERENCE_ONLY_BACKENDS:
        raise ValueError(f"backend {config.backend!r} is inference-only; train=True supports eager and compile")
    if config.precision in INFERENCE_ONLY_PRECISIONS:
        raise ValueError(f"precision {config.precision!r} is inference-only (quantized layers have no backward)")
    m = copy.deepcopy(model).train()
    with torch.no_grad():
        for t in [*m.parameters(), *m.buffers()]:
            t.data, _ = _C.convert_nested(t.data, device, config.cast_dtype, config.memory_format == "channels_last")
    (args, kwargs), _ = _C.convert_nested(split_inputs(inputs), device, config.cast_dtype,
                                          config.memory_format == "channels_last")
    step_model = m
    if config.backend == "compile":
        step_model = torch.compile(m, mode=config.compile_mode)
    opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16-amp" else None
    guard = config.guard(device.type, inference_mode=False)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with guard:
            loss = _loss(step_model(*args, **kwargs))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return step


def end_to_end(prepared: Prepared, host_batches: list[torch.Tensor]) -> Callable[[], None]:
    """One call per batch: host tensor in (through gpuopt.InputPipeline on CUDA), model, result copied
    back to the host (into a pinned pool). Rotates through ``host_batches``."""
    if prepared.device.type != "cuda":
        cycle = itertools.cycle(host_batches)
        return lambda: prepared(next(cycle))
    pipe = InputPipeline(depth=2, device=prepared.device)
    out_pool = PinnedPool(name="end-to-end outputs")
    cycle = itertools.cycle(host_batches)
    for _ in range(pipe.depth):
        pipe.submit(next(cycle))

    def call() -> None:
        y = prepared(pipe.next())
        pipe.submit(next(cycle))
        for t in tensors_in(y):
            out_pool.empty(tuple(t.shape), t.dtype).copy_(t, non_blocking=True)

    call.pipeline = pipe  # keep the pipeline alive with the callable
    return call


@dataclass
class BatchContext:
    """What every cell of one batch size shares: the inputs, the fp32 reference (with parity) and the
    FLOP/byte counts per item."""

    batch: int
    inputs: Any
    ref: Prepared | None
    counts: dict[str, float | None]


@dataclass
class Cell:
    """A config prepared at a batch size and parity-checked, ready to be measured (again)."""

    config: Config
    batch: int
    inputs: Any
    prepared: Prepared | None  # None: a training-only cell (prepared per measurement)
    facts: dict[str, Any]

    @property
    def failure(self) -> str | None:
        """Why the cell cannot be measured (preparation or parity failed), else None."""
        if self.prepared is not None and not self.prepared.ok:
            return self.prepared.error
        gate = self.facts.get("parity")
        if gate is not None and not gate["passed"]:
            return gate["error"]
        return None


class Runner:
    """Runs cells of one workload: for a batch size, every config, every mode. Rows go to
    ``on_row`` as each finishes, so a sweep can persist them one by one. Every failure becomes rows
    with the reason -- of one cell (its config, parity or measurement failed) or of every cell of
    a batch size (its inputs or the fp32 reference failed, e.g. out of memory) -- and the run goes on."""

    def __init__(self, work: Workload, configs: list[Config], modes: list[str], *, parity: bool, device: torch.device,
                 measure_options: dict[str, Any], on_row: Callable[[Row], None],
                 skip: Callable[[Key], bool] | None = None, profile_dir: str | None = None,
                 progress: Callable[[str, str], None] | None = None,
                 before_mode: Callable[[], None] | None = None):
        self.work, self.configs, self.modes = work, configs, modes
        self.parity, self.device, self.options = parity, device, measure_options
        self.on_row, self.skip = on_row, skip or (lambda key: False)
        self.profile_dir = profile_dir
        self.progress = progress or (lambda event, cell: None)  # ("start" | "done", cell description)
        # Called once per cell and mode, on every path (also a failed cell's), right before its timed part:
        # after preparation, parity and the first call, before the measurement's warm-up and sampling. The
        # ranks of a distributed benchmark align there, so that their sampling windows overlap.
        self.before_mode = before_mode or (lambda: None)
        # The device's idle power (0.5 s of readings, once per device and process, cached) is read now, before
        # anything of this run and before the first before_mode: read by the first measurement, after the
        # hook, it started ranks 1..N-1 half a second after rank 0 (which read it while it measured alone).
        if device.type == "cuda" and measure_options.get("energy", True):
            nvml.idle_power_w(device_index(device))
        self.ceilings = device_ceilings_for(device)
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.profiles: dict[str, dict] = {}
        # The model every cell prepares: the workload's, or (with parity) a copy whose zero-initialised
        # layers were re-initialised so the reference carries signal, found once on the first batch.
        self.model: torch.nn.Module = work.model
        self.signal_notes: list[str] = []
        self._signal_checked = not parity

    def _cell(self, config: Config, batch: int, mode: str) -> dict[str, Any]:
        return {"model": self.work.name, "config": config.label, "batch_size": batch, "mode": mode}

    def _facts(self, config: Config, batch: int) -> dict[str, Any]:
        return {"precision": config.precision, "items_per_call": batch, "item_unit": self.work.item_unit,
                "device": self.device_name}

    def run_batch(self, batch: int, configs: list[Config] | None = None) -> None:
        """Every cell of batch size ``batch`` not skipped, of ``configs`` (default: all of this runner's)."""
        configs = self.configs if configs is None else configs
        wanted = {c.label: [m for m in self.modes if not self.skip((self.work.name, c.label, batch, m))]
                  for c in configs}
        if not any(wanted.values()):
            return
        ctx = self.batch_context(batch)
        if isinstance(ctx, str):
            self._fail_batch(batch, configs, wanted, ctx)
            return
        for config in configs:
            if wanted[config.label]:
                self._run_config(config, ctx, wanted[config.label])
        del ctx
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def batch_context(self, batch: int) -> BatchContext | str:
        """The inputs of batch size ``batch`` and (with parity) the fp32 reference every config of that batch
        is checked against; or why the whole batch size fails (its inputs or the reference: e.g. out of memory).
        :meth:`run_batch` and the optimizer (which prepares cells one at a time) start here."""
        ref, counts, failure = None, _NO_COUNTS, None
        try:
            inputs = self.work.inputs(batch)
            actual = batch_of(inputs)
            if self.work.make_inputs is not None and actual != batch:
                raise ValueError(f"input_fn({batch}) returned a batch of {actual}")
            if not self._signal_checked:
                try:  # runs the fp32 model once: fails the way the reference would
                    fix = with_signal(self.work.model, inputs, device=self.device)
                except Exception as exc:  # noqa: BLE001
                    failure = self._reference_failure(exc, f"fp32: {type(exc).__name__}: {exc}", inputs, batch)
                else:
                    self.model, self.signal_notes, self._signal_checked = fix.model, fix.notes, True
            if self.parity and failure is None:
                ref = Config("fp32").apply(self.model, inputs, device=self.device)
                if ref.ok:
                    args, kwargs = ref.convert_inputs(inputs)
                    counts = _count(ref.eager_module, _call_inputs(args, kwargs), actual)
                else:
                    failure = self._reference_failure(ref.exception, ref.error, inputs, batch)
        except Exception as exc:  # noqa: BLE001 - the batch's cells are recorded as failed; the run goes on
            failure = _reason(exc, f" at batch {batch}")
        if failure is not None:
            ref = inputs = None  # with the exception and its frames, so that the memory can be released
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return failure
        return BatchContext(actual, inputs, ref, counts)

    def _reference_failure(self, exc: BaseException | None, error: str | None, inputs: Any, batch: int) -> str:
        if isinstance(exc, torch.OutOfMemoryError):
            return _reason(exc, f" in the fp32 reference at batch {batch}")
        shapes = [tuple(t.shape) for t in tensors_in(inputs)]
        return (f"{self.work.name}: the fp32 reference failed on inputs of shape {', '.join(map(str, shapes))} "
                f"(batch {batch}): {error}")

    def _fail_batch(self, batch: int, configs: list[Config], wanted: dict[str, list[str]], reason: str) -> None:
        for config in configs:
            if not wanted[config.label]:
                continue
            for mode in wanted[config.label]:
                self.before_mode()
                self.on_row(Row.failed(reason, **self._cell(config, batch, mode), **self._facts(config, batch)))
            self.progress("done", f"{self.work.name} b{batch} {config.label} (failed)")

    def _run_config(self, config: Config, ctx: BatchContext, modes: list[str]) -> None:
        t_cell = time.perf_counter()
        cell_name = f"{self.work.name} b{ctx.batch} {config.label}"
        self.progress("start", cell_name)
        cell = self.prepare_cell(config, ctx, inference=any(m != TRAIN_MODE for m in modes))
        for mode in modes:
            self.before_mode()
            self.on_row(self.measure_cell(cell, mode))
        if self.profile_dir is not None and cell.prepared is not None and cell.prepared.ok:
            self._profile(config, cell.prepared, ctx.inputs, ctx.batch)
        del cell
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.progress("done", f"{cell_name} ({time.perf_counter() - t_cell:.1f} s)")

    def prepare_cell(self, config: Config, ctx: BatchContext, *, inference: bool = True) -> Cell:
        """``config`` prepared at ``ctx``'s batch size and (with parity) checked against its reference; the
        cell can then be measured any number of times (:meth:`measure_cell`). Failures are kept in the cell."""
        facts = {**self._facts(config, ctx.batch), **ctx.counts}
        prepared = config.apply(self.model, ctx.inputs, device=self.device) if inference else None
        if prepared is not None:
            facts.update(prepare_s=prepared.prepare_s, first_call_ms=prepared.first_call_ms,
                         notes=[*self.signal_notes, *prepared.notes])
        gate = None
        if prepared is not None and prepared.ok and self.parity and ctx.ref is not None:
            t0 = time.perf_counter()
            try:
                p = check_parity(prepared, ctx.ref, self.work.inputs(ctx.batch))
                gate = p.to_dict()
                if not p.passed:
                    gate["error"] = f"parity failed: {p}"
            except Exception as exc:  # noqa: BLE001
                gate = {"passed": False, "error": f"parity check raised {type(exc).__name__}: {exc}"}
            facts["parity_s"] = time.perf_counter() - t0
        facts["parity"] = gate
        return Cell(config, ctx.batch, ctx.inputs, prepared, facts)

    def measure_cell(self, cell: Cell, mode: str, measure_options: dict[str, Any] | None = None) -> Row:
        """The row of one measurement of a prepared cell in ``mode`` (the failed row, with its reason, when the
        config could not be prepared or failed parity), with ``measure_options`` (default: this runner's)."""
        where = self._cell(cell.config, cell.batch, mode)
        t_mode = time.perf_counter()
        if mode != TRAIN_MODE and cell.failure is not None:
            row = Row.failed(cell.failure, **where, **cell.facts)
        else:
            row = self._measure(cell.config, cell.prepared, cell.inputs, cell.batch, where, cell.facts,
                                self.options if measure_options is None else measure_options)
        timed = row.timing or {}
        overhead = max(0.0, (time.perf_counter() - t_mode) - timed.get("warmup_s", 0.0)
                       - timed.get("sampling_s", 0.0))
        return replace(row, runner_overhead_s=overhead, roofline=_place(row, self.ceilings) if row.ok else None)

    def _measure(self, config: Config, prepared: Prepared | None, inputs: Any, batch: int, where: dict[str, Any],
                 facts: dict[str, Any], options: dict[str, Any]) -> Row:
        mode = where["mode"]
        try:
            opts = {**options, "device": self.device}  # a CPU run on a machine with GPUs leaves them alone
            label = f"{self.work.name} b{batch} {config.label} {mode}"
            if mode == TRAIN_MODE:
                fn = train_step(config, self.model, inputs, self.device)
                fn()  # compiles / allocates optimizer state outside the timed region
                m = measure(fn, mode="throughput" if self.device.type == "cuda" else "host", label=label, **opts)
            elif mode == "end-to-end":
                if not isinstance(inputs, torch.Tensor):
                    raise ValueError("end-to-end mode needs a model with one tensor input")
                fn = end_to_end(prepared, [self.work.inputs(batch) for _ in range(3)])
                m = measure(fn, mode="throughput" if self.device.type == "cuda" else "host", label=label, **opts)
            else:
                m = measure(prepared.runner(inputs), mode=mode, label=label, **opts)
            return Row.measured(m, **where, **facts)
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded; the run goes on
            failed = Row.failed(_reason(exc), **where, **facts)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # now that the exception and the frames it held are gone
        return failed

    def _profile(self, config: Config, prepared: Prepared, inputs: Any, batch: int) -> None:
        out = Path(self.profile_dir) / f"{self.work.name}-b{batch}-{config.label}".replace("+", "_").replace(":", "_")
        try:
            summary = profile(prepared, inputs, output_dir=str(out))
            self.profiles[f"{self.work.name} b{batch} {config.label}"] = {"summary": summary.to_dict(),
                                                                          "markdown": summary.to_markdown()}
        except Exception as exc:  # noqa: BLE001
            self.profiles[f"{self.work.name} b{batch} {config.label}"] = {"error": f"{type(exc).__name__}: {exc}"}


class ProgressBar:
    """Progress, one step per cell: a tqdm bar with ETA where tqdm is installed and stderr is a
    terminal (or a notebook); otherwise one plain line per finished cell on stderr, so a log gets
    lines, not a flood of carriage returns; nothing when disabled."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done, self.bar = total, enabled, 0, None
        if enabled:
            try:
                # tqdm.auto's notebook bar needs ipywidgets (the notebook extra) and warns without it:
                # then the text bar, which a notebook shows too.
                import ipywidgets  # noqa: F401
                from tqdm.auto import tqdm
            except ImportError:
                try:
                    from tqdm import tqdm
                except ImportError:
                    tqdm = None
            if tqdm is not None:
                # Off where stderr is not a terminal (logs get plain lines); a notebook's widget stays on.
                bar = tqdm(total=total, unit="cell", leave=False, disable=False if "ipykernel" in sys.modules else None)
                self.bar = None if bar.disable else bar

    def __call__(self, event: str, cell: str) -> None:
        if not self.enabled:
            return
        if event == "done":
            self.done += 1
        if self.bar is not None:
            if event == "done":
                self.bar.update(1)
            self.bar.set_description(cell[:60])
        elif event == "done":
            print(f"[{self.done}/{self.total}] {cell}", file=sys.stderr, flush=True)

    def set_done(self, done: int) -> None:
        """Set the count of finished cells (the next ``done`` event adds one): a count kept elsewhere,
        e.g. a job's across its ranks."""
        self.done = done
        if self.bar is not None:
            self.bar.n = done
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
