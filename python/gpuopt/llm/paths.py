"""Decode paths: how one request (prefill, then one token at a time, greedy) is run.

- ``hf-generate``: transformers' ``generate`` with its dynamic cache, greedy -- the baseline users run.
- ``hf-static-compile``: ``generate`` on a transformers ``StaticCache`` with generate's own compile of the
  decode step (``CompileConfig(fullgraph=True, mode="reduce-overhead")``), the cache made once and reset
  per request.
- ``static``: gpuopt's decode step on a preallocated static KV cache, driven token by token from Python
  (eager): the same work as the graph paths, with the host's launch cost in full view.
- ``static-graph``: that step and the prefill captured as CUDA graphs; the token loop (graph replay,
  greedy argmax on the device, the next input and position written in place) runs in C++
  (``gpuopt._C.TokenLoop``), so no Python runs per token.
- ``static-graph-compile``: as ``static-graph``, with the step compiled by ``torch.compile`` first
  (gpt-fast's recipe; the CUDA graph is gpuopt's own).
- ``static-megakernel``: as ``static-graph``, with the decode step one persistent kernel of gpuopt's that
  streams the weights through shared memory ahead of need (:mod:`gpuopt.llm.stream`: OPT models at batch 1 in
  fp16/bf16, or int8wo, on compute capability 9.0+) and takes the argmax and the loop's bookkeeping itself,
  so the decode graph is that one kernel; the prefill is the model's own.

Every path marks each token's completion on a :class:`gpuopt._C.StepClock` (CUDA events on the GPU, the
host clock on CPU), from which TTFT, TPOT and inter-token latencies follow.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from typing import Any

import torch

from .._ext import _C
from ..prepare.config import reset_compile_caches
from ..timing.graphs import capture as capture_graph
from . import attention as _attention
from . import cache as _cache
from . import stream as _stream

PATHS: tuple[str, ...] = ("hf-generate", "hf-static-compile", "static", "static-graph", "static-graph-compile",
                          "static-megakernel")
GRAPH_PATHS = ("static-graph", "static-graph-compile", "static-megakernel")
COMPILE_PATHS = ("hf-static-compile", "static-graph-compile")


def check_path(path: Any, on_gpu: bool) -> str:
    if not isinstance(path, str) or path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    if path in GRAPH_PATHS and not on_gpu:
        raise ValueError(f"path {path!r} replays CUDA graphs and needs a CUDA device; on CPU use 'static' or "
                         "'hf-generate'")
    return path


ATTENTIONS: tuple[str, ...] = ("model", "gpuopt")


def check_attention(attention: Any, path: str) -> str:
    if not isinstance(attention, str) or attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    if attention == "gpuopt" and path.startswith("hf-"):
        raise ValueError(f"attention='gpuopt' applies to gpuopt's static paths; path {path!r} is a baseline that "
                         "runs the model as transformers ships it")
    if attention == "gpuopt" and path == "static-megakernel":
        raise ValueError("attention='gpuopt' does not apply to path 'static-megakernel': its decode step attends "
                         "in its own kernel (the prefill runs the model's attention); use attention='model'")
    return attention


def static_cache(model: torch.nn.Module, batch_size: int, max_cache_len: int, device: torch.device,
                 dtype: torch.dtype) -> Any:
    """transformers' StaticCache for this model, across the signatures of transformers 4.4x and 5.x."""
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs: dict[str, Any] = {"config": model.config, "max_cache_len": max_cache_len}
    if "max_batch_size" in params:
        kwargs["max_batch_size"] = batch_size
    elif "batch_size" in params:
        kwargs["batch_size"] = batch_size
    if "device" in params:
        kwargs["device"] = device
    if "dtype" in params:
        kwargs["dtype"] = dtype
    return StaticCache(**kwargs)


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The key and value tensors a cache holds (allocated ones only)."""
    layers = getattr(cache, "layers", None)
    if layers:  # transformers >= 4.54 (some versions also show the same tensors as key_cache/value_cache)
        pairs = [(getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in layers]
        return [t for pair in pairs for t in pair if isinstance(t, torch.Tensor)]
    return [t for name in ("key_cache", "value_cache") for t in getattr(cache, name, None) or []
            if isinstance(t, torch.Tensor)]


def _accepts(model: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


class _Marker:
    """A transformers LogitsProcessor that marks the clock each time a token's logits are ready."""

    def __init__(self, clock: Any):
        self.clock = clock

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.clock.mark()
        return scores


def split_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` in two reductions: each chunk's maximum and its first index, then the first chunk
    holding the overall maximum. A compiled step then reduces the vocabulary over many blocks: inductor
    runs an argmax over one row in one block (11.6 us for OPT's 50,272 logits on an H100). The same
    index as argmax, the first maximal one; a row whose last dimension has no divisor between 8 and 64
    takes argmax itself."""
    n = x.shape[-1]
    chunks = next((c for c in range(64, 7, -1) if n % c == 0), 1)
    if chunks == 1:
        return x.argmax(-1)
    values, index = x.unflatten(-1, (chunks, n // chunks)).max(-1)
    best = values.argmax(-1, keepdim=True)
    return (index.gather(-1, best) + best * (n // chunks)).squeeze(-1)


class Decoder:
    """One decode path for one shape (batch, prompt length, new tokens) of one model.

    ``request()`` runs a whole request (for the graph paths, :attr:`loop` is the C++ token loop that
    does the same without Python); ``tokens()`` are the greedy tokens of the last request [batch,
    new_tokens]; ``forced_logits(ref_tokens, n)`` the logits of the first ``n`` steps when each step is
    fed the reference's previous token (static paths) -- the captured graphs themselves are replayed.
    """

    def __init__(self, model: torch.nn.Module, path: str, prompt: torch.Tensor, new_tokens: int, clock: Any,
                 dtype: torch.dtype, attention: str = "model", fuse_residual: bool = True):
        self.model, self.path, self.prompt, self.new_tokens, self.clock = model, path, prompt, new_tokens, clock
        self.fuse_residual = fuse_residual  # a compiled step's FuseResidual pass (gpuopt.llm.passes)
        self.device = prompt.device
        self.batch_size, self.prompt_len = prompt.shape
        self.dtype = dtype
        self.loop: Any = None
        self._last: torch.Tensor | None = None
        self._graphs: list[Any] = []
        # The attention the decode step runs: "model" (the model's own) or "gpuopt"
        # (gpuopt.llm.attention, set on the model for this Decoder's life and restored by close()).
        self.attention = check_attention(attention, path)
        self.attention_note = ""
        self._attention_before: str | None = None
        self.deferred_writes = 0  # attention modules whose kernel writes their new key and value
        if getattr(getattr(model, "config", None), "_attn_implementation", None) == _attention.NAME:
            raise RuntimeError("the model runs gpuopt's decode attention for another Decoder that is still open "
                               "(close it first): a Decoder sets the attention for its own life")
        try:
            if path.startswith("hf-"):
                self._setup_generate()
            else:
                self._setup_static()
        except BaseException:
            self.close()
            raise

    # -- transformers' generate -------------------------------------------------------------------
    def _setup_generate(self) -> None:
        from transformers import LogitsProcessorList

        gen = copy.deepcopy(self.model.generation_config)
        gen.do_sample, gen.num_beams, gen.eos_token_id = False, 1, None
        gen.max_new_tokens = gen.min_new_tokens = self.new_tokens
        gen.pad_token_id = 0 if gen.pad_token_id is None else gen.pad_token_id
        self._cache = None
        if self.path == "hf-static-compile":
            self._setup_static_compile(gen)
        elif hasattr(gen, "disable_compile"):
            gen.disable_compile = True  # hf-generate: eager, with the dynamic cache
        self._gen = gen
        self._processors = LogitsProcessorList([_Marker(self.clock)])
        self._mask = torch.ones_like(self.prompt)
        if self._cache is not None:
            # Compiles, then CUDA-graph trees record (on the second call of a shape): before any timing.
            for _ in range(3):
                self.clock.begin()
                self._generate()
            self.clock.clear()
            if getattr(self.model, "_compiled_call", None) is None:
                raise RuntimeError("hf-static-compile: transformers' generate did not compile the decode step "
                                   "(its auto-compile criteria were not met for this model); use the static-graph "
                                   "paths instead")

    def _setup_static_compile(self, gen: Any) -> None:
        """transformers' own static-cache recipe: a StaticCache and generate's automatic compile of the
        decode step (``CompileConfig(fullgraph=True, mode="reduce-overhead")``; the prefill runs eager).

        The cache is made once and passed to every request (reset in between), as a server keeps one:
        generate would otherwise make a new one per call, whose new addresses recompile the step. Its
        tensors are created by the first, eager prefill, outside any compile, so transformers marks them
        as static addresses and the CUDA-graph trees neither copy nor pool them."""
        from transformers import CompileConfig

        if not hasattr(gen, "disable_compile"):
            raise RuntimeError("hf-static-compile needs transformers' automatic compile of generate "
                               "(transformers >= 4.48)")
        self._cache = static_cache(self.model, self.batch_size, self.prompt_len + self.new_tokens, self.device,
                                   self.dtype)
        gen.cache_implementation = None  # the cache is passed in
        gen.disable_compile = False
        gen.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
        # generate compiles only on accelerators unless told to; on the CPU this path is the compile alone.
        gen.compile_config._compile_all_devices = self.device.type == "cpu" or None
        # Each Decoder compiles afresh: dynamo's recompile limit would end a sweep after a few cells, and
        # generate keeps its compiled call on the model.
        reset_compile_caches()
        if hasattr(self.model, "_compiled_call"):
            del self.model._compiled_call

    def _generate(self, gen: Any = None) -> Any:
        kw = {}
        with torch.inference_mode():
            if self._cache is not None:
                self._cache.reset()  # its tensors are inference tensors: zeroed in inference mode
                kw["past_key_values"] = self._cache
            return self.model.generate(input_ids=self.prompt, attention_mask=self._mask,
                                       generation_config=gen or self._gen, logits_processor=self._processors, **kw)

    # -- gpuopt's static-cache step -----------------------------------------------------------------
    def _setup_static(self) -> None:
        b, p, n, dev = self.batch_size, self.prompt_len, self.new_tokens, self.device
        self.cache = static_cache(self.model, b, p + n, dev, self.dtype)
        # The cache's layers share one fill level where transformers allows it (gpuopt.llm.cache): the
        # step's position, advanced once per step here instead of once per layer by the cache.
        length = _cache.share_fill_level(self.cache, dev)
        self._prefill_pos = torch.arange(p, device=dev)
        self._ids = torch.zeros(b, 1, dtype=torch.long, device=dev)
        self._pos = length.view(1) if length is not None else torch.full((1,), p, dtype=torch.long, device=dev)
        self._col = torch.ones(1, dtype=torch.long, device=dev)
        self._tokens = torch.zeros(b, n, dtype=torch.long, device=dev)
        # Positions and an all-ones padding mask over the whole cache, passed explicitly: a model that
        # derives them from the cache's fill level (OPT sizes a mask by get_seq_length()) would read a
        # device value on the host, which a CUDA graph capture cannot do.
        self._mask = torch.ones(b, p + n, dtype=torch.long, device=dev)
        # The prefill needs the last position's logits only (transformers >= 4.45 can skip the rest).
        keep = next((k for k in ("logits_to_keep", "num_logits_to_keep") if _accepts(self.model, k)), None)
        self._keep = {keep: 1} if keep else {}
        self._fill_levels: list[torch.Tensor] = []
        compiled = self.path == "static-graph-compile"
        self._split_argmax = compiled  # in eager it would be three kernels for ATen's one
        self._program: Any = None  # static-megakernel: the step's persistent kernel
        if self.path == "static-megakernel":
            if dev.type != "cuda":
                raise ValueError(f"path 'static-megakernel' runs on a CUDA device, got {dev}")
            why = _stream.unsupported(self.model, b, self.dtype, p + n)
            if why is not None:
                raise ValueError(f"path 'static-megakernel' cannot run {type(self.model).__name__}: {why}")
        side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        if self.attention == "gpuopt":
            self._attention_before = _attention.use(self.model)
            # gpuopt's kernel writes each step's key and value into the cache (no index_copy_ per layer).
            self.deferred_writes = _cache.defer_writes(self.model, self.cache)
        with torch.inference_mode():
            # First one eager prefill: transformers >= 5 creates the cache's tensors (and each layer's
            # fill level) on their first update. From then on every prefill zeroes the fill levels, so
            # each warm-up request, replay and compiled call starts at position 0.
            with self._on(side):
                self._prefill_step()
                if self.attention == "gpuopt":
                    self._check_attention()
                if self.path == "static-megakernel":  # the cache's tensors exist now
                    self._step_logits = torch.empty(1, self.model.config.vocab_size, dtype=self.dtype, device=dev)
                    self._program = _stream.build(self.model, self.cache, self._step_logits)
            levels = [t for layer in getattr(self.cache, "layers", None) or []
                      if isinstance(t := getattr(layer, "cumulative_length", None), torch.Tensor)]
            self._fill_levels = list({id(t): t for t in levels}.values())  # a shared one once
            prefill, decode = self._prefill_step, self._decode_step
            if compiled:
                # Every Decoder compiles the same bound methods: without a reset, dynamo's recompile
                # limit (fullgraph=True makes hitting it an error) ends a sweep after a few cells.
                reset_compile_caches()
                # (gpuopt.llm.passes: the query's multiplication by one that fuse_projections leaves goes)
                from . import passes as _passes

                options = _passes.compile_options(self.device)
                if not self.fuse_residual:
                    options.pop("post_grad_custom_post_pass")
                prefill = torch.compile(prefill, fullgraph=True, dynamic=False, options=options)
                decode = torch.compile(decode, fullgraph=True, dynamic=False, options=options)
            self._prefill, self._decode = prefill, decode
            # Warm-up: loads kernels (CUDA lazy loading synchronizes on a kernel's first launch) and
            # compiles, all before any capture. One decode step fits even with new_tokens=1 (the cache
            # holds prompt + new tokens, and the step writes at the prompt's length).
            with self._on(side):
                for _ in range(3 if compiled else 1):
                    self._prefill()
                    for _ in range(max(1, min(2, n - 1))):
                        self._decode()
            if self.path in GRAPH_PATHS:
                self._capture()

    def _check_attention(self) -> None:
        """One eager decode step: did the model's attention run gpuopt's operator? (Before any
        compile, which would trace the function once instead of running it.) And was each mask it got
        exactly the causal one (rows up to the position)? Then the kernel bounds the keys by the position
        and no mask is read -- nor, in a compiled step, computed."""
        before = _attention.calls
        layers = [layer for layer in getattr(self.cache, "layers", None) or [] if getattr(layer, "defer", False)]
        for layer in layers:
            layer.check_mask, layer.mask_is_causal = True, None
        try:
            self._decode_step()
        finally:
            for layer in layers:
                layer.check_mask = False
        if _cache.pending_layers(self.cache):  # some layer's attention did not take its write: none defer
            _cache.undefer_writes(self.model, self.cache)
            self.deferred_writes = 0
        elif layers and all(layer.mask_is_causal for layer in layers):
            for layer in layers:
                layer.causal = True
        if _attention.calls == before:
            self.attention = "model"
            self.attention_note = (f"gpuopt's decode attention did not apply to {type(self.model).__name__} "
                                   f"(head sizes {', '.join(map(str, _attention.DIMS))} and a bool mask are taken); "
                                   "its own attention ran")
            _attention.restore(self.model, self._attention_before)
            self._attention_before = None
            _cache.undefer_writes(self.model, self.cache)
            self.deferred_writes = 0

    @property
    def causal_in_kernel(self) -> int:
        """Attention modules whose kernel bounds the keys by the position instead of reading the mask
        (their cache layers' ``causal``, set by the check step; undefer_writes clears it)."""
        return sum(1 for layer in getattr(getattr(self, "cache", None), "layers", None) or []
                   if getattr(layer, "causal", False))

    def _on(self, side: Any) -> Any:
        """A context running work on ``side`` (a CUDA stream ordered after the current one, and the
        current one after it on exit), or nothing on the CPU."""
        if side is None:
            return contextlib.nullcontext()

        @contextlib.contextmanager
        def ctx():
            current = torch.cuda.current_stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                yield
            current.wait_stream(side)
            torch.cuda.synchronize(self.device)

        return ctx()

    def _prefill_step(self) -> torch.Tensor:
        # A request starts at position 0. transformers >= 5 keeps each static layer's fill level in a
        # device tensor of its own (older versions write at cache_position): zeroed here, in the graph.
        # Entries of an earlier request beyond the current position stay, masked until overwritten.
        for t in self._fill_levels:
            t.zero_()
        out = self.model(input_ids=self.prompt, past_key_values=self.cache, cache_position=self._prefill_pos,
                         position_ids=self._prefill_pos.view(1, -1).expand(self.batch_size, -1),
                         attention_mask=self._mask, use_cache=True, **self._keep)
        logits = out.logits[:, -1]
        nxt = logits.argmax(-1)
        self._ids.copy_(nxt[:, None])
        self._tokens[:, 0].copy_(nxt)
        self._pos.fill_(self.prompt_len)
        self._col.fill_(1)
        return logits

    def _decode_step(self) -> torch.Tensor:
        if self._program is not None:
            # The argmax and the bookkeeping below happen in the step's own kernel (DecodeProgram.run's
            # greedy arguments): the decode graph is that one kernel.
            self._program.run(self._ids, self._pos, None, self._tokens, self._col)
            return self._step_logits
        out = self.model(input_ids=self._ids, past_key_values=self.cache, cache_position=self._pos,
                         position_ids=self._pos.view(1, 1).expand(self.batch_size, 1),
                         attention_mask=self._mask, use_cache=True)
        logits = out.logits[:, -1]
        nxt = split_argmax(logits) if self._split_argmax else logits.argmax(-1)
        self._ids.copy_(nxt[:, None])
        self._tokens.index_copy_(1, self._col.clamp(max=self.new_tokens - 1), nxt[:, None])
        self._pos.add_(1)
        self._col.add_(1)
        return logits

    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        graphs, outs = [], []
        for fn in (self._prefill, self._decode):
            g = torch.cuda.CUDAGraph()
            with capture_graph(g, stream=stream, pool=pool):
                outs.append(fn())
            graphs.append(g)
        self._graphs = graphs
        self._prefill_logits, self._decode_logits = outs
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        # The loop holds raw executables: it keeps the graphs and everything they read or write alive
        # itself (the model's weights, a compiled step's own buffers, the cache and the step's tensors).
        owner = (tuple(graphs), tuple(outs), self.model, self._prefill, self._decode, self.cache, self._ids,
                 self._pos, self._col, self._tokens, self._mask, self._prefill_pos, self.prompt,
                 tuple(self._fill_levels), self._program)
        self.loop = _C.TokenLoop(graphs[0].raw_cuda_graph_exec(), graphs[1].raw_cuda_graph_exec(), index,
                                 self.new_tokens, self.clock, owner)

    def _run_prefill(self) -> torch.Tensor:
        if self._graphs:
            self._graphs[0].replay()
            return self._prefill_logits
        return self._prefill()

    def _run_decode(self) -> torch.Tensor:
        if self._graphs:
            self._graphs[1].replay()
            return self._decode_logits
        return self._decode()

    # -- the surface ----------------------------------------------------------------------------------
    def request(self) -> None:
        """One request: prefill and ``new_tokens - 1`` decode steps, each token marked on the clock."""
        if self.loop is not None:
            self.loop.run()
            return
        if self.path.startswith("hf-"):
            self.clock.begin()
            self._last = self._generate()
            return
        with torch.inference_mode():
            self.clock.begin()
            self._prefill()
            self.clock.mark()
            for _ in range(self.new_tokens - 1):
                self._decode()
                self.clock.mark()

    def timed_fn(self) -> Any:
        """What measure() times: the C++ token loop where there is one, else :meth:`request`."""
        return self.loop if self.loop is not None else self.request

    def tokens(self) -> torch.Tensor:
        """The greedy tokens of the last request, [batch, new_tokens] (synchronizes)."""
        if self.path.startswith("hf-"):
            if self._last is None:
                raise RuntimeError("no request has run yet")
            return self._last[:, self.prompt_len:].clone()
        return self._tokens.clone()

    def free_logits(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [batch, n], logits [n, batch, vocab] in float32) of a free-running greedy request."""
        if self.path.startswith("hf-"):
            gen = copy.deepcopy(self._gen)
            gen.max_new_tokens = gen.min_new_tokens = n
            gen.output_logits = gen.return_dict_in_generate = True
            self.clock.begin()
            out = self._generate(gen)
            self.clock.clear()
            tokens = out.sequences[:, self.prompt_len:self.prompt_len + n]
            return tokens, torch.stack([t.float() for t in out.logits[:n]])
        return self.forced_logits(None, n)

    def forced_logits(self, ref_tokens: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [batch, n], logits [n, batch, vocab] float32) of the first ``n`` steps, each step fed
        ``ref_tokens[:, i - 1]`` (teacher forcing) or, without ``ref_tokens``, its own previous token.
        Static paths only; the graphs are replayed one step at a time."""
        if self.path.startswith("hf-"):
            raise ValueError(f"path {self.path!r} cannot be teacher-forced (generate() picks its own tokens)")
        logits = []
        with torch.inference_mode():
            logits.append(self._run_prefill().float().clone())
            for i in range(1, n):
                if ref_tokens is not None:
                    self._ids.copy_(ref_tokens[:, i - 1:i])
                logits.append(self._run_decode().float().clone())
        stacked = torch.stack(logits)
        return stacked.argmax(-1).t().contiguous(), stacked

    def kv_cache_bytes(self) -> int | None:
        """Bytes the static cache allocated (None for generate's dynamic cache, which grows)."""
        cache = getattr(self, "_cache", None) if self.path.startswith("hf-") else self.cache
        return None if cache is None else sum(t.untyped_storage().nbytes() for t in cache_tensors(cache))

    def close(self) -> None:
        """Drops the token loop, the graphs, the cache and the compiled steps (the loop replays the
        graphs' executables: it must not outlive them)."""
        self.loop = None
        self._graphs = []
        try:
            try:
                _attention.restore(self.model, self.__dict__.pop("_attention_before", None))
            finally:
                if self.deferred_writes:
                    _cache.undefer_writes(self.model, getattr(self, "cache", None))
                    self.deferred_writes = 0
        finally:
            for name in ("cache", "_prefill", "_decode", "_prefill_logits", "_decode_logits", "_cache", "_last",
                         "_fill_levels", "_program", "_step_logits"):
                self.__dict__.pop(name, None)
            if self.path == "hf-static-compile":
                self.model.__dict__.pop("_compiled_call", None)  # generate keeps its compiled step on the model
