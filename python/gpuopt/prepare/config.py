"""Optimization configs: precision, memory format and backend as one named, composable object that
applies to any ``nn.Module`` without modifying it, restoring all global state it touches."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._ext import _C
from ..quant.linear import QUANTIZED_PRECISIONS, fp8_refusal, quantize_linears
from ..quant.prologue import fold_prologues
from ..timing import graphs
from ..timing.inputs import split_inputs
from . import exported
from .exported import EXPORTED_BACKENDS

PRECISIONS = ("fp32", "tf32", "fp16-amp", "bf16-amp", "fp16", "bf16", *QUANTIZED_PRECISIONS)
MEMORY_FORMATS = ("contiguous", "channels_last")
BACKENDS = ("eager", "torchscript", "compile", "cudagraph", *EXPORTED_BACKENDS)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Bumped by every reset of torch.compile's caches (reset_compile_caches: a ``compile`` preparation, the LLM
# paths' compiled decoders); see Prepared.recompiles.
_compile_epoch = 0


def reset_compile_caches() -> int:
    """Resets torch.compile's caches (``torch._dynamo.reset()``: its recompile limit then counts from zero) and
    returns the new compile epoch: every compiled Prepared from an earlier one compiles again on its next call
    (:attr:`Prepared.recompiles`). gpuopt's one call of the reset."""
    global _compile_epoch
    torch._dynamo.reset()
    _compile_epoch += 1
    return _compile_epoch


_AMP = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}
# The precisions whose layers quantize their inputs at each call: the norm or activation feeding them folds
# into that quantization unless fold=False (gpuopt.quant.prologue).
_FOLDING = ("fp8", "int8")
# Quantized precisions run everything but their linear layers in bf16.
_CAST = {"fp16": torch.float16, "bf16": torch.bfloat16, **{p: torch.bfloat16 for p in QUANTIZED_PRECISIONS}}


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")


@dataclass(frozen=True)
class Config:
    """One optimization config.

    - ``precision``: ``fp32`` (TF32 off), ``tf32``, ``fp16-amp`` / ``bf16-amp`` (autocast), ``fp16`` /
      ``bf16`` (weights and inputs cast); quantized linear layers with the rest in bf16: ``fp8`` (FP8
      e4m3 matmuls, compute capability 8.9+), ``int8`` (dynamic int8), ``int8-wo`` (int8 weights,
      16-bit activations) -- see :mod:`gpuopt.quant`; the notes say which layers were quantized.
    - ``fold`` (``fp8``, ``int8``): the norms and activations that feed quantized layers are folded into
      their quantization, found by one traced run (:mod:`gpuopt.quant.prologue`; the notes say what); token
      ``no-fold`` (``fold=False``) keeps them as they are.
    - ``memory_format``: ``contiguous`` or ``channels_last``.
    - ``backend``: ``eager``; ``torchscript`` (trace, freeze, optimize_for_inference); ``compile``
      (``compile_mode`` one of default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs);
      ``cudagraph`` (the eager model captured with static inputs, replayed); exported: ``onnxruntime``
      (``torch.onnx.export``, ONNX Runtime), ``tensorrt`` (torch-tensorrt) -- see :mod:`.exported`.

    ``str(config)`` and :meth:`parse` round-trip: ``Config.parse("fp16-amp+channels_last+compile:max-autotune")``.

    >>> c = Config.parse("fp16-amp+channels_last+compile")
    >>> (c.precision, c.memory_format, c.backend, c.compile_mode)
    ('fp16-amp', 'channels_last', 'compile', 'default')
    >>> str(c)
    'fp16-amp+channels_last+compile'
    """

    precision: str = "fp32"
    memory_format: str = "contiguous"
    backend: str = "eager"
    compile_mode: str | None = None
    cudnn_benchmark: bool = True
    fold: bool = True
    name: str | None = None

    def __post_init__(self):
        _one_of("precision", self.precision, PRECISIONS)
        _one_of("memory_format", self.memory_format, MEMORY_FORMATS)
        _one_of("backend", self.backend, BACKENDS)
        if self.backend == "compile":
            if self.compile_mode is None:
                object.__setattr__(self, "compile_mode", "default")
            _one_of("compile_mode", self.compile_mode, COMPILE_MODES)
        elif self.compile_mode is not None:
            raise ValueError(f"compile_mode applies to backend='compile' only; got compile_mode="
                             f"{self.compile_mode!r} with backend={self.backend!r}")
        if self.backend in EXPORTED_BACKENDS and (self.precision in _AMP or self.precision in QUANTIZED_PRECISIONS):
            raise ValueError(f"precision {self.precision!r} does not survive the export of backend "
                             f"{self.backend!r} (autocast and gpuopt's quantized layers are not exported); use "
                             "fp32, tf32, fp16 or bf16 with it")
        if self.backend == "onnxruntime" and self.precision == "bf16":
            raise ValueError("precision 'bf16' with backend 'onnxruntime': ONNX Runtime's providers lack bfloat16 "
                             "kernels (convolutions, most matmuls) and numpy has no bfloat16; use fp32 or fp16")
        if not isinstance(self.cudnn_benchmark, bool):
            raise TypeError(f"cudnn_benchmark must be True or False, got {self.cudnn_benchmark!r}")
        if not isinstance(self.fold, bool):
            raise TypeError(f"fold must be True or False, got {self.fold!r}")
        if not self.fold and self.precision not in _FOLDING:
            raise ValueError(f"fold=False ('no-fold') applies to the precisions that quantize activations "
                             f"({', '.join(_FOLDING)}); got precision {self.precision!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"name must be a string, got {self.name!r}")

    def __str__(self) -> str:
        parts = [self.precision]
        if self.memory_format != "contiguous":
            parts.append(self.memory_format)
        if self.backend == "compile":
            parts.append("compile" if self.compile_mode == "default" else f"compile:{self.compile_mode}")
        elif self.backend != "eager":
            parts.append(self.backend)
        if not self.cudnn_benchmark:
            parts.append("no-cudnn-benchmark")
        if not self.fold:
            parts.append("no-fold")
        return "+".join(parts)

    @property
    def label(self) -> str:
        """The name if one was given, else the canonical string."""
        return self.name or str(self)

    @classmethod
    def parse(cls, text: str | Config, name: str | None = None) -> Config:
        """Build a config from ``precision[+memory_format][+backend[:compile_mode]][+no-cudnn-benchmark][+no-fold]``
        (tokens in any order, each at most once; omitted parts take their defaults)."""
        if isinstance(text, Config):
            return text
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"config must be a non-empty string like 'fp16-amp+channels_last', got {text!r}")
        kw: dict[str, Any] = {}

        def put(key, value, token):
            if key in kw:
                raise ValueError(f"config {text!r} sets {key} twice (at {token!r})")
            kw[key] = value

        for token in (t.strip() for t in text.split("+")):
            if token in PRECISIONS:
                put("precision", token, token)
            elif token in MEMORY_FORMATS:
                put("memory_format", token, token)
            elif token in BACKENDS:
                put("backend", token, token)
            elif token.startswith("compile:"):
                put("backend", "compile", token)
                put("compile_mode", token.split(":", 1)[1], token)
            elif token == "no-cudnn-benchmark":
                put("cudnn_benchmark", False, token)
            elif token == "no-fold":
                put("fold", False, token)
            else:
                allowed = [*PRECISIONS, *MEMORY_FORMATS, *BACKENDS, "compile:<mode>", "no-cudnn-benchmark", "no-fold"]
                raise ValueError(f"unknown config token {token!r} in {text!r}; allowed: {', '.join(allowed)}")
        return cls(name=name, **kw)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return _AMP.get(self.precision)

    @property
    def cast_dtype(self) -> torch.dtype | None:
        return _CAST.get(self.precision)

    def guard(self, device_type: str = "cuda", *, capture: bool = False, inference_mode: bool = True) -> Any:
        """The C++ guard this config runs under: autocast (or explicitly off), TF32 on only for
        ``tf32``, its cudnn.benchmark, and inference mode. ``capture``: autocast cache off, as CUDA
        graph capture requires."""
        amp = self.autocast_dtype
        return _C.StateGuard(
            autocast=amp is not None, autocast_dtype=amp or torch.float16, device_type=device_type,
            autocast_cache=not capture, tf32=self.precision == "tf32",
            cudnn_benchmark=self.cudnn_benchmark if device_type == "cuda" else None,
            inference_mode=inference_mode,
        )

    def apply(self, model: torch.nn.Module, example_inputs: Any, *, device: str | torch.device | None = None,
              strict: bool = False) -> Prepared:
        """Prepare ``model`` under this config and return a :class:`Prepared` runnable.

        The caller's model is not modified (a deep copy is converted), and global state is restored.
        ``example_inputs`` is a tensor (one positional argument), a tuple/list (positional), or a
        dict (keyword); any nesting of tensors inside is converted. A config that cannot apply
        (tracing fails on control flow, a compile error, a capture failure, bf16 on a device without
        it) gives a Prepared with ``ok=False`` and the reason, unless ``strict=True``, which raises.

        >>> import torch
        >>> p = Config("fp32").apply(torch.nn.Linear(4, 2), torch.randn(3, 4), device="cpu")
        >>> p.ok, tuple(p(torch.randn(3, 4)).shape)
        (True, (3, 2))
        """
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        dev = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        prepared = Prepared(self, dev)
        try:
            prepared._prepare(model, example_inputs)
        except Exception as exc:  # noqa: BLE001 - recorded as a failed config, re-raised if strict
            prepared._fail(exc)
            if strict:
                raise
        return prepared


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Prepared:
    """A model prepared under a :class:`Config`: call it with inputs (``prepared(inputs)`` or
    ``prepared.run(inputs)``), inputs given as for :meth:`Config.apply`.

    ``prepare_s`` is the wall time of conversion, tracing or compilation (for ``compile`` it includes
    the compiling first call); ``first_call_ms`` the first call after that. ``ok`` is False when the
    config could not apply; ``error`` then says why.
    """

    config: Config
    device: torch.device
    ok: bool = False
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)  # what made it fail
    prepare_s: float | None = None
    first_call_ms: float | None = None
    notes: list[str] = field(default_factory=list)
    module: Any = field(default=None, repr=False)  # what runs: eager, traced, compiled
    eager_module: torch.nn.Module | None = field(default=None, repr=False)  # converted, before backend
    _graph: Any = field(default=None, repr=False)
    _static_in: Any = field(default=None, repr=False)
    _static_out: Any = field(default=None, repr=False)
    _epoch: int | None = field(default=None, repr=False)  # the compile epoch it was compiled in

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def recompiles(self) -> bool:
        """True for a compiled Prepared whose compiled code is gone: preparing another ``compile`` config
        resets torch.compile's caches (so that compilations do not count against each other's limits), and
        the next call of this one compiles again (seconds to minutes), then runs as before."""
        return self._epoch is not None and self._epoch != _compile_epoch

    def _guard(self, capture: bool = False):
        return self.config.guard(self.device.type, capture=capture)

    def convert_inputs(self, inputs: Any) -> tuple[tuple, dict]:
        """Inputs moved to the device, cast for fp16/bf16 configs and made channels-last for
        channels-last configs (in C++), as (args, kwargs)."""
        args, kwargs = split_inputs(inputs)
        converted, _ = _C.convert_nested((args, kwargs), self.device, self.config.cast_dtype,
                                         self.config.memory_format == "channels_last")
        return converted[0], converted[1]

    def _prepare(self, model: torch.nn.Module, example_inputs: Any) -> None:
        c = self.config
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device is CUDA but no CUDA device is visible")
        if c.backend == "cudagraph" and self.device.type != "cuda":
            raise RuntimeError("backend 'cudagraph' needs a CUDA device")
        if ((c.cast_dtype == torch.bfloat16 or "bf16" in c.precision) and self.device.type == "cuda"
                and not torch.cuda.is_bf16_supported()):
            raise RuntimeError(f"{torch.cuda.get_device_name(self.device)} does not support bfloat16"
                               + (f" (what {c.precision} runs the layers it does not quantize in)"
                                  if c.precision in QUANTIZED_PRECISIONS else ""))
        if c.precision == "fp8" and (why := fp8_refusal(self.device)):
            raise RuntimeError(why)
        if c.precision == "tf32" and self.device.type != "cuda":
            self.notes.append("tf32 has no effect on CPU: this runs as fp32")
        t0 = time.perf_counter()
        m = copy.deepcopy(model).eval()
        changed = 0
        with torch.no_grad():
            for t in [*m.parameters(), *m.buffers()]:
                new, n = _C.convert_nested(t.data, self.device, c.cast_dtype, c.memory_format == "channels_last")
                t.data = new
                changed += n
        if c.memory_format == "channels_last" and changed == 0:
            self.notes.append("channels_last: the model has no 4-D or 5-D parameters; the config is a no-op")
        if c.precision in QUANTIZED_PRECISIONS:
            with torch.no_grad():
                report = quantize_linears(m, c.precision)
            if not report.quantized:
                raise RuntimeError(f"{c.precision} quantizes linear layers and this model has none it can take "
                                   f"({report.describe()}); use fp16 or bf16 for it")
            self.notes.append(report.describe())
        self.eager_module = m
        args, kwargs = self.convert_inputs(example_inputs)
        if c.precision in _FOLDING and c.fold:
            with self._guard():
                folded = fold_prologues(m, args, kwargs)
            self.notes.append(f"{c.precision}: {folded.describe()}")
        if c.backend == "eager":
            self.module = m
        elif c.backend == "torchscript":
            self.module = self._torchscript(m, args, kwargs)
        elif c.backend in EXPORTED_BACKENDS:
            built = exported.build(c.backend, m, args, kwargs, self.device)
            self.module = built
            self.notes += built.notes
        elif c.backend == "compile":
            self._epoch = reset_compile_caches()  # other configs' compiles must not count against this one
            self.module = torch.compile(m, mode=c.compile_mode)
            self._call(args, kwargs)  # compiles
        else:
            self._capture(m, args, kwargs)
        _sync(self.device)
        self.prepare_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        self._call(args, kwargs)
        _sync(self.device)
        self.first_call_ms = (time.perf_counter() - t1) * 1e3
        self.ok = True

    def _torchscript(self, m: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        # Traced without inference mode (inference tensors would become constants of the graph).
        guard = self.config.guard(self.device.type, inference_mode=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit is deprecated in recent torch; it still works
            with guard, torch.no_grad():
                traced = torch.jit.trace(m, None if kwargs else args, example_kwarg_inputs=kwargs or None,
                                         strict=False, check_trace=False)
                frozen = torch.jit.freeze(traced.eval())
                return torch.jit.optimize_for_inference(frozen)

    def _capture(self, m: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        # On the model's GPU as the current device, and on a capture stream of that GPU: without a
        # stream, torch.cuda.graph() used one default capture stream made on the device current at
        # its first use, so a model on cuda:1 captured after one on cuda:0 ran on cuda:0's stream and
        # the capture failed ("operation failed due to a previous error during capture").
        with torch.cuda.device(self.device):
            self._capture_here(m, args, kwargs)

    def _capture_here(self, m: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        # Static buffers the graph reads; warm-up on a side stream (lazy init, cuDNN autotuning).
        self._static_in = (
            tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args),
            {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()},
        )
        s_args, s_kwargs = self._static_in
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), self._guard(capture=True):
            for _ in range(3):
                m(*s_args, **s_kwargs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        capture_stream = torch.cuda.Stream(self.device)
        with self._guard(capture=True), graphs.capture(graph, stream=capture_stream):
            self._static_out = m(*s_args, **s_kwargs)
        self._graph = graph
        self.module = m

    def _call(self, args: tuple, kwargs: dict) -> Any:
        if self._graph is not None:
            self._graph.replay()  # torch replays on its capture device's current stream
            return self._static_out
        with self._guard():
            return self.module(*args, **kwargs)

    def _fail(self, exc: BaseException) -> None:
        self.ok = False
        self.error = f"{self.config.label}: {type(exc).__name__}: {exc}".strip()
        self.exception = exc
        self.module = None
        self._graph = None

    def _check_ok(self) -> None:
        if not self.ok:
            raise RuntimeError(f"config {self.config.label} could not be prepared: {self.error}")

    def __call__(self, inputs: Any) -> Any:
        """Run on ``inputs`` (converted first). A cudagraph config copies them into its static
        buffers (shapes must match the example) and returns a copy of the outputs."""
        self._check_ok()
        args, kwargs = self.convert_inputs(inputs)
        try:
            if self._graph is not None:
                s_args, s_kwargs = self._static_in
                for dst, src in [*zip(s_args, args), *((s_kwargs[k], kwargs[k]) for k in s_kwargs)]:
                    if isinstance(dst, torch.Tensor):
                        if dst.shape != src.shape:
                            raise ValueError(f"a cudagraph config replays fixed shapes: expected input shape "
                                             f"{tuple(dst.shape)}, got {tuple(src.shape)}")
                        dst.copy_(src)
                return _clone_tree(self._call(s_args, s_kwargs))
            return self._call(args, kwargs)
        except Exception as exc:
            raise _wrapped(exc, self.config.label) from exc

    run = __call__

    def runner(self, inputs: Any) -> Callable[[], Any]:
        """A zero-argument callable running the prepared model on ``inputs`` converted once, for
        timing: nothing but the guard and the call (or the graph replay) happens per call."""
        self._check_ok()
        if self._graph is not None:
            self(inputs)  # loads the static buffers
            return self._graph.replay
        return self.bound(inputs)[0]

    def bound(self, inputs: Any) -> tuple[Callable[[], Any], tuple[tuple, dict]]:
        """:meth:`runner` that returns the outputs, and the ``(args, kwargs)`` it reads on every call:
        writing new values into those tensors in place (a collective receiving the next batch) changes
        what the next call computes. For a cudagraph config they are the graph's static inputs, and the
        outputs its static outputs (overwritten by the next call)."""
        self._check_ok()
        if self._graph is not None:
            self(inputs)  # loads the static buffers
            replay, out = self._graph.replay, self._static_out

            def replayed():
                replay()
                return out

            return replayed, self._static_in
        args, kwargs = self.convert_inputs(inputs)
        module, guard = self.module, self._guard()  # one guard object, entered per call

        def run():
            with guard:
                return module(*args, **kwargs)

        return run, (args, kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {"config": str(self.config), "label": self.label, "ok": self.ok, "error": self.error,
                "prepare_s": self.prepare_s, "first_call_ms": self.first_call_ms, "notes": list(self.notes),
                "device": str(self.device)}


def _clone_tree(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return type(obj)((k, _clone_tree(v)) for k, v in obj.items()) if type(obj) is dict else {
            k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_clone_tree(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def _wrapped(exc: Exception, label: str) -> Exception:
    """The model's own error type, its message prefixed with the config's name."""
    try:
        return type(exc)(f"[config {label}] {exc}")
    except Exception:  # noqa: BLE001 - exception types with unusual constructors
        return RuntimeError(f"[config {label}] {type(exc).__name__}: {exc}")


def autocast(dtype: torch.dtype = torch.float16, *, device_type: str = "cuda", enabled: bool = True,
             cache_enabled: bool = True) -> Any:
    """``torch.autocast`` through gpuopt's C++ guard: restores enable flag, dtype and cache state.

    >>> import torch, gpuopt
    >>> with gpuopt.autocast(torch.bfloat16, device_type="cpu"):
    ...     torch.is_autocast_enabled("cpu")
    True
    """
    return _C.StateGuard(autocast=enabled, autocast_dtype=dtype, device_type=device_type,
                         autocast_cache=cache_enabled)


def precision(mode: str = "fp32", *, cudnn_benchmark: bool | None = None) -> Any:
    """Sets fp32 math for the block: ``"fp32"`` (TF32 off for cuBLAS and cuDNN) or ``"tf32"`` (on);
    optionally cudnn.benchmark. Restores what it found.

    >>> import torch, gpuopt
    >>> with gpuopt.precision("tf32"):
    ...     torch.get_float32_matmul_precision()
    'high'
    """
    _one_of("mode", mode, ("fp32", "tf32"))
    return _C.StateGuard(tf32=mode == "tf32", cudnn_benchmark=cudnn_benchmark)


# Backends that cannot time a training step (a traced, frozen graph; a replayed capture; an exported model),
# and precisions that cannot (quantized layers have no backward).
INFERENCE_ONLY_BACKENDS = ("torchscript", "cudagraph", *EXPORTED_BACKENDS)
INFERENCE_ONLY_PRECISIONS = QUANTIZED_PRECISIONS

_PRESETS: dict[str, tuple[str, ...]] = {
    # The seeds' comparisons.
    "fp16-torchscript": ("fp32", "fp16-amp", "fp32+torchscript"),
    "amp-channels-last-compile": ("fp32", "fp16-amp+channels_last+compile"),
    # gpuopt bench's and benchmark()'s defaults (see default_preset).
    "bench": ("fp32", "fp16-amp", "fp16-amp+channels_last", "fp32+torchscript", "fp16-amp+channels_last+compile"),
    "bench-cpu": ("fp32", "bf16-amp", "fp32+torchscript"),
    "bench-train": ("fp32", "fp16-amp", "fp16-amp+channels_last", "fp16-amp+channels_last+compile"),
    "bench-cpu-train": ("fp32", "bf16-amp"),
    "precisions": PRECISIONS,
    "backends": ("fp16+channels_last", "fp16+channels_last+torchscript", "fp16+channels_last+cudagraph",
                 "fp16+channels_last+compile", "fp16+onnxruntime"),
}


def presets() -> dict[str, list[Config]]:
    """Named sets of configs: ``fp16-torchscript`` (fp32 / fp16-amp / TorchScript fp32) and
    ``amp-channels-last-compile`` (fp32 / fp16-amp + channels_last + compile) from the seeds;
    ``bench``, ``bench-cpu`` and their training variants ``bench-train``, ``bench-cpu-train`` (no
    inference-only backend; see :func:`default_preset`), ``precisions``, ``backends``."""
    return {name: [Config.parse(c) for c in cfgs] for name, cfgs in _PRESETS.items()}


def preset(name: str) -> list[Config]:
    """The configs of one preset; ValueError listing the names for an unknown one."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(_PRESETS)}")
    return [Config.parse(c) for c in _PRESETS[name]]


def default_preset(device_type: str, train: bool = False) -> str:
    """The preset a benchmark runs when no configs are given -- the one place that decides it, for
    ``gpuopt bench`` and :func:`gpuopt.benchmark` alike: ``bench`` on CUDA, ``bench-cpu`` elsewhere;
    with ``train`` their ``-train`` variants, which leave out the inference-only backends.

    >>> default_preset("cpu"), default_preset("cuda", train=True)
    ('bench-cpu', 'bench-train')
    """
    name = "bench" if device_type == "cuda" else "bench-cpu"
    return f"{name}-train" if train else name
