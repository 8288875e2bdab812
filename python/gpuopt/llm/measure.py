"""Measuring LLM inference: time to first token, time per output token, inter-token latency, tokens/s,
KV-cache bytes, peak memory and the share of the memory bandwidth a decode step achieves, with parity
against the fp32 reference. Definitions are vLLM's (benchmarks/benchmark_serving.py):

- TTFT: from a request's start to its first generated token (the prefill, and its argmax).
- TPOT: per request, (end-to-end - TTFT) / (output tokens - 1).
- ITL: every gap between two consecutive tokens of a request, all requests pooled.

A request is timed whole by gpuopt's C++ engine (``gpuopt.measure``, latency mode on a GPU: events on
the device, a spin kernel queued ahead); each token's completion is an event on the same stream
(``gpuopt._C.StepClock``), so TTFT and the gaps are device times too, host stalls included where the
host sets the pace (as with ``hf-generate``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .._checks import check_int
from .._ext import _C
from ..analysis.roofline import place
from ..report.results import Row
from ..timing.inputs import device_index
from ..timing.measurement import Measurement, format_ms, measure
from . import attention as _attention
from . import linear as _linear
from . import parity as _parity
from . import stream as _stream
from .fuse import fold_norms, fuse_projections
from .models import (
    LLM_MODELS,
    Shape,
    build_model,
    check_causal_lm,
    check_lengths,
    decode_weight_bytes,
    human_bytes,
    linear_params,
    model_config,
    model_name,
    prefill_flops,
    prepare_for_decoding,
)
from .paths import GRAPH_PATHS, PATHS, Decoder, check_attention, check_path

# Precisions of the weights and the compute: int8wo is int8 weight-only linear layers with fp16
# activations (gpuopt's kernel, torch.ops.gpuopt.int8_weight_only_linear).
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8wo")
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8wo": torch.float16}
# Precisions whose fused copies fold norms into linear layers: those whose linear layers become gpuopt's
# kernels, which normalize x from the loads of their matmul (fp32 would run the norm as a step of its own).
FOLDED_PRECISIONS = ("fp16", "bf16", "int8wo")
_ROOFLINE_PRECISION = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int8wo": "fp16"}

# measure()'s defaults for whole requests (a request of 256 tokens can take seconds on the baseline).
MEASURE_DEFAULTS: dict[str, Any] = {"warmup": 1, "warmup_s": 0.0, "min_iters": 5, "max_time_s": 10.0}

# Above this share of the time a request takes, the host issuing work sets the pace.
HOST_BOUND = 0.8


def check_precision(precision: Any) -> str:
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


class Models:
    """One causal LM in fp32 (the parity reference) and its copies in each precision asked for, built
    once and shared by the cells of a sweep; the fp32 references of each prompt shape are kept too."""

    def __init__(self, model: str | torch.nn.Module, device: torch.device | str | None = None, seed: int = 0):
        index = device_index(device)
        self.device = torch.device("cuda", index) if index is not None else torch.device("cpu")
        self.seed = seed
        self.name = model_name(model)
        if isinstance(model, str):
            self.reference = build_model(model, device=self.device, seed=seed)
        else:
            check_causal_lm(model)
            self.reference = model.to(self.device).float().eval()
            prepare_for_decoding(self.reference)
        self.config = self.reference.config
        self.shape = Shape.of(self.config)
        self._by_precision: dict[tuple[str, bool, bool], torch.nn.Module] = {("fp32", False, False): self.reference}
        self.fused_groups: dict[str, int] = {}  # precision -> projection groups fused in its fused copy
        self.decode_linears: dict[str, int] = {}  # precision -> its fused copy's gpuopt decode linear layers
        self.folded_norms: dict[str, int] = {}  # precision -> norms its fused copy folds into linear layers
        self._references: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def candidate(self, precision: str, fused: bool = False, fold: bool = True) -> torch.nn.Module:
        """The model in ``precision``; ``fused``: a copy of its own with sibling projections fused
        (:func:`gpuopt.llm.fuse.fuse_projections`, before quantization, so int8 fuses too) and, where
        gpuopt's kernels take the linear layers (fp16, bf16, int8wo), the norms before them folded in
        (:func:`gpuopt.llm.fuse.fold_norms`; ``fold=False``: not)."""
        check_precision(precision)
        fold = bool(fused and fold and precision in FOLDED_PRECISIONS)
        key = (precision, bool(fused), fold)
        if key not in self._by_precision:
            m = copy.deepcopy(self.reference)
            if fused:
                self.fused_groups[precision] = fuse_projections(m)
                if fold:
                    self.folded_norms[precision] = fold_norms(m)
            if precision == "int8wo":
                from ..quant import quantize_int8_weight_only

                m = quantize_int8_weight_only(m, torch.float16)
                if fused:
                    _linear.fuse_relu(m)  # into the int8 kernel's epilogue
            else:
                m = m.to(_DTYPES[precision])
                if fused and _DTYPES[precision] in _linear.DTYPES:
                    self.decode_linears[precision] = _linear.use_decode_linear(m)
            self._by_precision[key] = m.eval()
        return self._by_precision[key]

    def prompt(self, batch_size: int, prompt_len: int) -> torch.Tensor:
        """Random token ids [batch, prompt_len], the same for a given shape and seed."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + batch_size * 10_007 + prompt_len)
        return torch.randint(0, self.shape.vocab, (batch_size, prompt_len), generator=g).to(self.device)

    def reference_run(self, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 reference's greedy tokens [batch, n] and logits [n, batch, vocab] on ``prompt``
        (``generate`` with the dynamic cache)."""
        key = (tuple(prompt.shape), n)
        if key not in self._references:
            clock = _C.StepClock(-1, n)
            d = Decoder(self.reference, "hf-generate", prompt, n, clock, torch.float32)
            self._references[key] = d.free_logits(n)
        return self._references[key]

    def free(self, precision: str | None = None) -> None:
        """Drops a precision's copy (all but the reference when None)."""
        for key in list(self._by_precision):
            if key != ("fp32", False, False) and (precision is None or key[0] == precision):
                self._by_precision.pop(key)


@dataclass
class DecodeResult:
    """One decode cell: model, path, precision and shape, its timings and what they mean."""

    model: str
    path: str
    precision: str
    batch_size: int
    prompt_len: int
    new_tokens: int
    device: str
    measurement: Measurement  # whole requests, ms per request
    requests: int
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float] | None  # None with one output token
    itl_ms: dict[str, float] | None
    e2e_ms: dict[str, float]
    output_tokens_per_s: float  # batch x new tokens / mean end-to-end
    decode_tokens_per_s: float | None  # batch / mean TPOT
    kv_cache_bytes: int | None  # allocated by the static cache (None: generate's dynamic cache)
    kv_bytes_per_token: int
    weight_bytes_per_step: int
    bytes_per_step: float  # weights + the KV cache so far (mean over the decode steps): what must be read
    achieved_gbps: float | None
    hbm_read_gbps: float | None
    hbm_read_source: str | None  # "measured" (gpuopt.ceilings) or "datasheet"
    pct_of_hbm_read: float | None
    floor_tpot_ms: float | None  # bytes_per_step at the read ceiling
    prefill_flops: float
    prefill_roofline: dict[str, Any] | None
    decode_roofline: dict[str, Any] | None
    peak_memory_bytes: int | None
    host_ms_per_request: float
    diagnosis: str
    parity: _parity.DecodeParity | None = None
    parity_error: str | None = None
    fused_projections: int = 0  # groups of sibling projections run as one linear layer (gpuopt.llm.fuse)
    decode_linears: int = 0  # linear layers swapped to gpuopt's decode kernel (gpuopt.llm.linear; 1-8 rows run it)
    folded_norms: int = 0  # norms folded into the linear layer after them (gpuopt.llm.fuse.fold_norms)
    attention: str = "model"  # the decode step's attention: the model's own or gpuopt's (gpuopt.llm.attention)
    kv_writes_in_attention: int = 0  # attention modules whose kernel writes the step's key and value (llm.cache)
    causal_in_kernel: int = 0  # of those, how many bound the keys by the position instead of reading a mask
    build_s: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def config(self) -> str:
        return f"{self.precision}+{self.path}"

    def llm_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("measurement", "model", "batch_size", "device", "warnings"):
            d.pop(k)
        d["parity"] = self.parity.to_dict() if self.parity is not None else None
        return d

    def to_row(self) -> Row:
        par = self.parity.to_dict() if self.parity is not None else (
            {"passed": False, "error": self.parity_error} if self.parity_error else None)
        row = Row.decoded(self.measurement, self.llm_dict(), model=self.model, config=self.config,
                          batch_size=self.batch_size, precision=self.precision, device=self.device, parity=par,
                          prepare_s=self.build_s, roofline=self.decode_roofline)
        return dataclasses.replace(row, diagnosis=self.diagnosis, warnings=list(self.warnings))

    def summary(self) -> str:
        tpot = f"TPOT p50 {format_ms(self.tpot_ms['p50'])}" if self.tpot_ms else "TPOT n/a (one token)"
        bw = (f", {self.achieved_gbps:.0f} GB/s = {self.pct_of_hbm_read:.0f}% of HBM read"
              if self.pct_of_hbm_read is not None else "")
        par = f"; {self.parity.summary()}" if self.parity is not None else ""
        return (f"{self.model} {self.config} bs{self.batch_size} p{self.prompt_len}+n{self.new_tokens}: "
                f"TTFT p50 {format_ms(self.ttft_ms['p50'])}, {tpot}, {self.output_tokens_per_s:,.0f} tok/s{bw}"
                f" ({self.requests} requests){par}")

    def __repr__(self) -> str:
        return f"DecodeResult({self.summary()})"


def _stats(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return None
    s = _C.summarize(values, 0.95, 0.01)
    return {"p50": s["p50"], "p90": s["p90"], "p95": s["p95"], "p99": s["p99"], "mean": s["mean"], "min": s["min"], "max": s["max"],
            "n": s["n"]}


def _hbm_read(index: int | None, ceilings: dict | None) -> tuple[float | None, str | None]:
    if index is None:
        return None, None
    if ceilings is None:
        from ..analysis.device_ceilings import ceilings as measured_ceilings

        ceilings = measured_ceilings(index, cached_only=True)
    if ceilings is not None:
        v = (ceilings.get("measured") or {}).get("hbm_read_gbps")
        if v:
            return float(v), "measured"
        sheet = ceilings.get("datasheet") or {}
    else:
        from ..analysis.datasheet import lookup_dict

        sheet = lookup_dict(torch.cuda.get_device_name(index)) or {}
    v = sheet.get("memory_bandwidth_gbps")
    return (float(v), "datasheet") if v else (None, None)


def _diagnose(r: DecodeResult) -> str:
    """Why the decode runs at the speed it does, in one sentence."""
    if r.tpot_ms is None:
        return "one output token: no decode step to judge"
    tpot = r.tpot_ms["mean"]
    e2e = r.e2e_ms["mean"]
    floor = (f"TPOT {format_ms(tpot)} is {tpot / r.floor_tpot_ms:.1f}x the bandwidth floor "
             f"{format_ms(r.floor_tpot_ms)} ({human_bytes(r.bytes_per_step)} per step at "
             f"{r.hbm_read_gbps:.0f} GB/s)" if r.floor_tpot_ms else f"TPOT {format_ms(tpot)}")
    if r.device == "cpu":
        return f"{floor}; measured on the CPU (host clock)"
    if r.path not in GRAPH_PATHS:
        # generate() synchronizes every step (its stopping check) and the static path launches each
        # kernel from Python: the host's time per request is the request's time whoever is slower.
        return (f"{floor}: Python drives every token ({r.path}: a forward's kernels launched from Python per step"
                f"{', and a host synchronization per step in generate()' if r.path.startswith('hf-') else ''}); "
                "where this is far above the floor the host sets the pace -- compare with static-graph, which "
                "replays each step as one CUDA graph from C++")
    if r.host_ms_per_request >= HOST_BOUND * e2e:
        return (f"{floor}: host-bound -- issuing a request's kernels takes {format_ms(r.host_ms_per_request)} of "
                f"host time for {format_ms(e2e)} on the device, so Python and launches set the pace "
                "(the static-graph path replays the step as one CUDA graph from C++)")
    if r.pct_of_hbm_read is not None and r.pct_of_hbm_read >= 60:
        return f"{floor}: memory-bound near the floor ({r.pct_of_hbm_read:.0f}% of the HBM read bandwidth)"
    if r.pct_of_hbm_read is not None:
        return (f"{floor}: the GPU is busy but reads at {r.pct_of_hbm_read:.0f}% of the HBM bandwidth -- kernel "
                "efficiency (small GEMV-shaped matmuls, attention over the cache, many small kernels per "
                "step) rather than the host")
    return floor


def measure_decode(model: str | torch.nn.Module | Models, *, path: str = "static-graph", precision: str = "fp16",
                   batch_size: int = 1, prompt_len: int = 128, new_tokens: int = 128,
                   device: torch.device | str | int | None = None, seed: int = 0, parity: bool = True,
                   parity_tokens: int = 32, ceilings: dict | None = None, fuse: bool | None = None,
                   attention: str | None = None, fold: bool | None = None, **measure_options: Any) -> DecodeResult:
    """Measures one decode cell: ``batch_size`` random prompts of ``prompt_len`` tokens, ``new_tokens``
    generated greedily by ``path`` (see :data:`gpuopt.llm.PATHS`) in ``precision``.

    ``model`` is a built-in name (:data:`gpuopt.llm.LLM_MODELS`, random weights), a Hugging Face causal
    LM module (its fp32 copy is the reference), or a :class:`Models` shared across cells. ``parity``
    compares the first ``parity_tokens`` tokens and logits with the fp32 reference
    (:mod:`gpuopt.llm.parity`). ``fuse``: run sibling projections (q/k/v, gate/up) as one linear layer
    (:mod:`gpuopt.llm.fuse`); by default on for gpuopt's static paths, and never for the ``hf-*``
    baselines, which run the model as transformers ships it. ``attention``: ``"gpuopt"`` runs the decode
    step's attention through gpuopt's operator (:mod:`gpuopt.llm.attention`), ``"model"`` keeps the
    model's own; by default ``"gpuopt"`` for the static paths on CUDA where it applies
    (:func:`default_attention`), else ``"model"``. ``fold``: fold the norms before linear layers into them
    and move the residual adds into their epilogues (:func:`gpuopt.llm.fuse.fold_norms`,
    :class:`gpuopt.llm.passes.FuseResidual`, compiled steps); by default wherever ``fuse`` is on. ``ceilings`` (``gpuopt.ceilings()``) gives the HBM read bandwidth;
    without it the cached measurement, else the datasheet, is used. Other keywords are
    :func:`gpuopt.measure` options (defaults :data:`MEASURE_DEFAULTS`).

    A KV cache that cannot fit raises ``torch.OutOfMemoryError`` before anything is allocated.

    >>> r = measure_decode("tiny-llama", path="static", precision="fp32", device="cpu",
    ...                    prompt_len=8, new_tokens=4, max_time_s=0.2)          # doctest: +SKIP
    >>> r.tpot_ms["p50"] > 0                                                      # doctest: +SKIP
    True
    """
    check_precision(precision)
    check_int("batch_size", batch_size)
    check_int("parity_tokens", parity_tokens)
    if isinstance(model, str):  # everything checked before a model is built
        config = model_config(model)
        check_path(path, device_index(device) is not None)
        check_lengths(config, prompt_len, new_tokens, model)
    models = model if isinstance(model, Models) else Models(model, device, seed)
    on_gpu = models.device.type == "cuda"
    check_path(path, on_gpu)
    check_lengths(models.config, prompt_len, new_tokens, models.name)
    if path != "hf-generate" and not supports_static_cache(models.reference):
        raise ValueError(f"path {path!r} needs a static KV cache, which {models.name} "
                         f"({type(models.reference).__name__}) does not support; use 'hf-generate'")
    if path == "static-megakernel" and precision not in ("fp16", "bf16", "int8wo"):
        raise ValueError(f"path 'static-megakernel' runs fp16, bf16 and int8wo, got precision {precision!r}")
    if path == "static-megakernel":
        why = _stream.unsupported(models.reference, batch_size, _DTYPES[precision], prompt_len + new_tokens)
        if why is not None:
            raise ValueError(f"path 'static-megakernel' cannot run {models.name}: {why}")
    if fuse is None:
        fuse = default_fuse(path)
    elif not isinstance(fuse, bool):
        raise TypeError(f"fuse must be True, False or None, got {fuse!r}")
    elif fuse and path.startswith("hf-"):
        raise ValueError(f"fuse=True applies to gpuopt's static paths; path {path!r} is a baseline that runs the "
                         "model as transformers ships it")
    elif fuse and path == "static-megakernel":
        raise ValueError("fuse=True does not apply to path 'static-megakernel': its kernel reads the model's own "
                         "projections (q, k and v as one operation without a copy)")
    if fold is None:
        fold = fuse
    elif not isinstance(fold, bool):
        raise TypeError(f"fold must be True, False or None, got {fold!r}")
    elif fold and not fuse:
        raise ValueError("fold=True needs fuse: the norms fold into the fused projections (gpuopt's static paths)")
    if attention is None:
        attention = default_attention(models, path)
    check_attention(attention, path)
    if attention == "gpuopt" and not _attention.can_use(models.reference):
        raise ValueError(f"attention='gpuopt' needs a model that dispatches through transformers' attention "
                         f"interface; {models.name} ({type(models.reference).__name__}) does not")
    index = models.device.index if on_gpu else None
    dtype = _DTYPES[precision]
    element = torch.finfo(dtype).bits // 8
    kv_per_token = models.shape.kv_bytes_per_token(element)
    _check_fits(kv_per_token * batch_size * (prompt_len + new_tokens), index, models.name, batch_size)

    prompt = models.prompt(batch_size, prompt_len)
    reference_error = None
    if parity and attention != "model":
        # The fp32 reference first: the candidate may be the reference model itself (fp32, unfused),
        # whose attention the Decoder switches for its life. A failure is the parity check's, recorded
        # with the cell as any other.
        try:
            models.reference_run(prompt, min(parity_tokens, new_tokens))
        except Exception as exc:
            reference_error = f"{type(exc).__name__}: {exc}"
    t0 = time.perf_counter()
    candidate = models.candidate(precision, fused=fuse, fold=fold)
    clock = _C.StepClock(-1 if index is None else index, new_tokens)
    decoder = Decoder(candidate, path, prompt, new_tokens, clock, dtype, attention=attention, fuse_residual=fold)
    build_s = time.perf_counter() - t0
    try:
        clock.clear()
        # The C++ token loop is timed in latency mode (device time; the host only launches graphs). A
        # path that Python drives is timed in host mode: latency mode's spin kernel, queued ahead,
        # would let the host run ahead and hide the very cost that sets its pace. Its tokens are still
        # device events, so TTFT and the gaps include the GPU waiting for the host.
        mode = "latency" if decoder.loop is not None else "host"
        options = {**MEASURE_DEFAULTS, "mode": mode, "device": index, **measure_options}
        m = measure(decoder.timed_fn(), **options)
        reqs = clock.requests()
        got = token_times(reqs, m.n, new_tokens)
        result = _result(models, decoder, m, got, path=path, precision=precision, index=index, element=element,
                         kv_per_token=kv_per_token, ceilings=ceilings, build_s=build_s)
        result.fused_projections = models.fused_groups.get(precision, 0) if fuse else 0
        result.folded_norms = models.folded_norms.get(precision, 0) if fold else 0
        # layers swapped to gpuopt's decode linear kernel, 0 where the setting forced cuBLAS at capture
        result.decode_linears = (models.decode_linears.get(precision, 0)
                                 if fuse and _C.decode_linear_kernel() == "auto" else 0)
        result.attention = decoder.attention
        result.kv_writes_in_attention = decoder.deferred_writes
        result.causal_in_kernel = decoder.causal_in_kernel
        if decoder.attention_note:
            result.warnings.append(decoder.attention_note)
        if parity:
            try:
                if reference_error is not None:
                    raise RuntimeError(f"the fp32 reference run failed: {reference_error}")
                result.parity = _check_parity(models, decoder, prompt, min(parity_tokens, new_tokens), precision)
            except Exception as exc:  # recorded with the cell: the timings stand
                result.parity_error = f"{type(exc).__name__}: {exc}"
                result.warnings.append(f"parity could not be checked: {result.parity_error}")
            if result.parity is not None and not result.parity.passed:
                result.warnings.append(result.parity.summary())
        return result
    finally:
        decoder.close()


def default_fuse(path: str) -> bool:
    """Whether measure_decode fuses the sibling projections (and folds the norms) by default: on gpuopt's
    static paths, except ``static-megakernel``, whose kernel reads the model's own projections."""
    return not path.startswith("hf-") and path != "static-megakernel"


def default_attention(models: Models, path: str) -> str:
    """The attention measure_decode runs by default: gpuopt's (:mod:`gpuopt.llm.attention`) for the
    static paths on CUDA where the model dispatches through transformers' attention interface with a
    head size the kernel takes, else the model's own."""
    shape = models.shape
    use = (models.device.type == "cuda" and not path.startswith("hf-") and path != "static-megakernel"
           and shape.head_dim in _attention.DIMS
           and _attention.can_use(models.reference))
    return "gpuopt" if use else "model"


def _check_fits(kv_bytes: int, index: int | None, name: str, batch_size: int) -> None:
    if index is None:
        return
    free, _ = torch.cuda.mem_get_info(index)
    free += torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    if kv_bytes > free:
        raise torch.OutOfMemoryError(
            f"out of memory: the KV cache of {name} at batch_size={batch_size} needs {human_bytes(kv_bytes)}, "
            f"{human_bytes(free)} of GPU memory is free")


def supports_static_cache(model: torch.nn.Module) -> bool:
    """Whether transformers lets this model decode on a static cache (the attribute was
    ``_supports_static_cache`` before about 4.50, ``_can_compile_fullgraph`` after)."""
    for attr in ("_can_compile_fullgraph", "_supports_static_cache"):
        v = getattr(model, attr, None)
        if v is not None:
            return bool(v)
    return True


def token_times(reqs: dict, n: int, new_tokens: int) -> dict[str, list[float]]:
    """The last ``n`` requests' (the measured samples') TTFT, end-to-end, TPOT and pooled gaps, in ms,
    from a :class:`gpuopt._C.StepClock`'s ``requests()``."""
    total = len(reqs["ttft_ms"])
    if total < n:
        raise RuntimeError(f"the token clock recorded {total} requests for {n} timed samples")
    keep = range(total - n, total)
    tokens = [reqs["tokens"][i] for i in keep]
    if any(t != new_tokens for t in tokens):
        raise RuntimeError(f"a request produced {min(tokens)}..{max(tokens)} token marks, expected {new_tokens}")
    ttft = [reqs["ttft_ms"][i] for i in keep]
    e2e = [reqs["e2e_ms"][i] for i in keep]
    gaps_per = new_tokens - 1
    itl = reqs["itl_ms"][len(reqs["itl_ms"]) - n * gaps_per:] if gaps_per else []
    tpot = [(e - t) / gaps_per for e, t in zip(e2e, ttft)] if gaps_per else []
    return {"ttft": ttft, "e2e": e2e, "tpot": tpot, "itl": itl}


def _result(models: Models, decoder: Decoder, m: Measurement, got: dict, *, path: str, precision: str,
            index: int | None, element: int, kv_per_token: int, ceilings: dict | None, build_s: float) -> DecodeResult:
    b, p, n = decoder.batch_size, decoder.prompt_len, decoder.new_tokens
    ttft, tpot, itl, e2e = _stats(got["ttft"]), _stats(got["tpot"]), _stats(got["itl"]), _stats(got["e2e"])
    weights = decode_weight_bytes(decoder.model, b)
    # Decode step j (1..n-1) attends to p + j cached tokens: the mean context is p + n / 2.
    per_step = weights + b * kv_per_token * (p + n / 2)
    hbm, source = _hbm_read(index, ceilings)
    achieved = per_step / (tpot["mean"] * 1e-3) / 1e9 if tpot else None
    pct = 100.0 * achieved / hbm if achieved and hbm else None
    floor = per_step / (hbm * 1e9) * 1e3 if hbm else None
    flops = prefill_flops(decoder.model, models.shape, b, p)
    rp = _ROOFLINE_PRECISION[precision]
    device_doc = ceilings if ceilings is not None else (
        {"device": torch.cuda.get_device_name(index)} if index is not None else None)
    prefill_roof = decode_roof = None
    if index is not None:
        prefill_bytes = decode_weight_bytes(decoder.model, b * p) + b * p * kv_per_token
        prefill_roof = place(flops_per_item=flops, bytes_per_item=prefill_bytes, items_per_s=1e3 / ttft["mean"],
                             precision=rp, ceilings=device_doc)
        if tpot:
            shape = models.shape
            step_flops = 2.0 * linear_params(decoder.model) * b + 4.0 * shape.layers * shape.heads * shape.head_dim * b * (p + n / 2)
            decode_roof = place(flops_per_item=step_flops, bytes_per_item=per_step, items_per_s=1e3 / tpot["mean"],
                                precision=rp, ceilings=device_doc)
    peak = (m.memory or {}).get("max_allocated_bytes")
    r = DecodeResult(
        model=models.name, path=path, precision=precision, batch_size=b, prompt_len=p, new_tokens=n,
        device=torch.cuda.get_device_name(index) if index is not None else "cpu", measurement=m, requests=m.n,
        ttft_ms=ttft, tpot_ms=tpot, itl_ms=itl, e2e_ms=e2e,
        output_tokens_per_s=b * n * 1e3 / e2e["mean"],
        decode_tokens_per_s=b * 1e3 / tpot["mean"] if tpot else None,
        kv_cache_bytes=decoder.kv_cache_bytes(), kv_bytes_per_token=kv_per_token, weight_bytes_per_step=weights,
        bytes_per_step=per_step, achieved_gbps=achieved, hbm_read_gbps=hbm, hbm_read_source=source,
        pct_of_hbm_read=pct, floor_tpot_ms=floor, prefill_flops=flops, prefill_roofline=prefill_roof,
        decode_roofline=decode_roof, peak_memory_bytes=peak, host_ms_per_request=m.enqueue["p50"], diagnosis="",
        build_s=build_s, warnings=[w for w in m.warnings if not w.startswith("launch-bound")])
    r.diagnosis = _diagnose(r)
    return r


def _check_parity(models: Models, decoder: Decoder, prompt: torch.Tensor, n: int, precision: str) -> _parity.DecodeParity:
    ref_tokens, ref_logits = models.reference_run(prompt, n)
    if decoder.path.startswith("hf-"):
        tokens, logits = decoder.free_logits(n)
        return _parity.compare(ref_tokens, ref_logits, tokens, logits, precision=precision, teacher_forced=False)
    tokens, logits = decoder.forced_logits(ref_tokens, n)
    return _parity.compare(ref_tokens, ref_logits, tokens, logits, precision=precision, teacher_forced=True)


__all__ = ["LLM_MODELS", "MEASURE_DEFAULTS", "PATHS", "PRECISIONS", "DecodeResult", "Models", "measure_decode"]
