"""The step before a quantized linear layer folded into its quantization (:func:`fold_prologues`).

An fp8 or dynamic-int8 linear layer quantizes its input per row at every call (``quantize_rowwise``:
one read of the 16-bit input, one write of a byte per value). The layer norm or activation that produced
that input wrote it in 16 bits and the quantization reads it back: for ViT-B/16's MLP the GELU alone
moves 4 bytes a value and the quantization 3. Folded, the quantization reads the norm's or activation's
*input* and applies it in float32 on the way (``quantize_rowwise(x, dtype, norm=..., weight=, bias=,
eps=, activation=...)``), and the module becomes ``nn.Identity``: one pass over the activations instead
of two, and no 16-bit rounding in between.

Which producers fold is found by running the model once on the example inputs: every call of the
producer module must hand its output to quantized linear layers only (any other use, a view, an add, a
return from the model, keeps it), and every call of each of those layers must take the producer's
output. Folded: layer norms over the last dimension and the RMS norms of :data:`RMS_NORMS` (a norm
feeding several layers -- a query, key and value -- folds into each), and the activations of
:func:`activation_of` (torch's GELU, ReLU, SiLU; transformers' GELU variants). Layer-level wiring is not
assumed: a model whose producer and layer are connected differently on another input is outside what a
one-input trace can see (models whose control flow depends on the input are rare at inference).

Layer: ``quant`` (below ``prepare``, which calls it for the ``fp8`` and ``int8`` precisions).
"""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..timing.inputs import tensors_in

# RMS norms by class name: x * rsqrt(mean(x^2) + eps) * weight (not Gemma's, which scales by 1 + weight).
RMS_NORMS: tuple[str, ...] = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")

# transformers.activations classes by name -> the quantize kernel's activation (GELUActivation: erf, also
# with use_gelu_python; the others the tanh approximation, FastGELU written differently).
_HF_ACTIVATIONS = {"GELUActivation": "gelu", "NewGELUActivation": "gelu_tanh", "GELUTanh": "gelu_tanh",
                   "PytorchGELUTanh": "gelu_tanh", "FastGELUActivation": "gelu_tanh", "SiLUActivation": "silu"}

# Reads of a tensor's metadata, not its values: they do not keep a producer from folding.
_METADATA_PROPERTIES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad",
                                  "is_leaf", "names", "is_sparse", "is_quantized", "is_meta", "is_nested"})
_METADATA_METHODS = frozenset({"dim", "size", "stride", "numel", "is_contiguous", "__len__", "element_size",
                               "get_device", "is_floating_point", "is_complex", "nelement", "ndimension"})


def norm_of(module: nn.Module, width: int, dtype: torch.dtype | None = None
            ) -> tuple[str, float, torch.Tensor | None, torch.Tensor | None] | None:
    """(kind, eps, scale, shift) of a norm over the last ``width`` values: ``nn.LayerNorm`` ("layer", its
    affine optional), ``nn.RMSNorm`` or a class of :data:`RMS_NORMS` ("rms"; ``weight``, ``variance_epsilon``
    or ``eps``; ``nn.RMSNorm``'s eps=None is the machine epsilon of the type torch computes the input
    ``dtype`` in: float32 for 16-bit inputs);
    else None."""
    if type(module) is nn.LayerNorm:
        if tuple(module.normalized_shape) != (width,):
            return None
        return "layer", float(module.eps), module.weight, module.bias
    if type(module) is getattr(nn, "RMSNorm", None):
        if tuple(module.normalized_shape) != (width,):
            return None
        eps = module.eps
        if eps is None:  # torch takes the machine epsilon of the type it computes in (float32 for 16-bit)
            if dtype is None or not dtype.is_floating_point:
                return None
            eps = torch.finfo(torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype).eps
        return "rms", float(eps), module.weight, None
    if type(module).__name__ in RMS_NORMS:
        weight = getattr(module, "weight", None)
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if (isinstance(weight, torch.Tensor) and weight.shape == (width,) and isinstance(eps, float)
                and not list(module.children())):
            return "rms", eps, weight, None
    return None


def activation_of(module: nn.Module) -> str | None:
    """The quantize kernel's name for an activation module ("gelu", "gelu_tanh", "relu", "silu"), or None."""
    t = type(module)
    if t is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if t is nn.ReLU:
        return "relu"
    if t is nn.SiLU:
        return "silu"
    if t.__module__.startswith("transformers.") and t.__name__ in _HF_ACTIVATIONS and not list(module.children()):
        return _HF_ACTIVATIONS[t.__name__]
    return None


class SharedQuantization:
    """One quantization of a tensor for the ``n`` layers that read it in turn (a query, key and value
    projection): the first to run quantizes and keeps the result for the others; the last one lets it go.
    The result is reused only for the same tensor object on the same thread, unchanged where its version
    counter says so (inference tensors have none: :func:`fold_prologues` shares only where the traced run
    wrote the tensor nowhere), and not inside ``torch.compile`` (each layer quantizes: the compiled graph
    has no Python-side state)."""

    def __init__(self, n: int):
        self.n = n
        self._state = threading.local()  # per thread: a server runs one model on several threads

    def __reduce__(self) -> tuple:  # copies and pickles start empty (the state is per thread and per call)
        return (SharedQuantization, (self.n,))

    def put(self, x: torch.Tensor, value: Any) -> None:
        """``value`` is x's quantization, made by the step that wrote x (:class:`QuantizingNorm`)."""
        if torch.compiler.is_compiling():
            return
        st = self._state
        st.ref, st.value, st.left = weakref.ref(x), value, self.n
        st.version = None if x.is_inference() else x._version

    def take(self, x: torch.Tensor, make: Any) -> Any:
        if torch.compiler.is_compiling():
            return make()
        st = self._state
        version = None if x.is_inference() else x._version
        ref = getattr(st, "ref", None)
        if getattr(st, "left", 0) > 0 and ref is not None and ref() is x and st.version == version:
            st.left -= 1
            value = st.value
            if st.left == 0:
                st.ref = st.value = None
            return value
        value = make()
        st.ref, st.version, st.value, st.left = weakref.ref(x), version, value, self.n - 1
        return value


class QuantizingNorm(nn.Module):
    """A norm whose output other operations read as well (a residual add), and whose quantized readers take
    nothing else: it writes its output and their row-wise quantization in one pass
    (``gpuopt::apply_quantize_rowwise``) and hands the quantization to them (``shared``), so that they do
    not read the output back. ``norm`` is the module it replaces (what runs inside ``torch.compile``)."""

    def __init__(self, norm: nn.Module, kind: str, eps: float, weight: torch.Tensor | None,
                 bias: torch.Tensor | None, dtype: torch.dtype, shared: SharedQuantization):
        super().__init__()
        self.norm, self.kind, self.eps, self.dtype, self.shared = norm, kind, eps, dtype, shared

        def kept(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().to(torch.float32).clone()

        self.register_buffer("norm_weight", kept(weight))
        self.register_buffer("norm_bias", kept(bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self.norm(x)
        y, q, s = torch.ops.gpuopt.apply_quantize_rowwise(x, self.dtype, self.kind, self.norm_weight, self.norm_bias,
                                                          self.eps)
        self.shared.put(y, (q.reshape(-1, q.shape[-1]), s.reshape(-1, 1)))
        return y

    def extra_repr(self) -> str:
        return f"kind={self.kind}, eps={self.eps}, quantized={str(self.dtype).replace('torch.', '')}"


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """``old`` replaced by ``new`` wherever the model holds it (found first: ``new`` may hold ``old``)."""
    places = [(parent, name) for parent in model.modules() for name, child in parent.named_children() if child is old]
    for parent, name in places:
        setattr(parent, name, new)


def _candidate(module: nn.Module) -> bool:
    return (activation_of(module) is not None or type(module) in (nn.LayerNorm, getattr(nn, "RMSNorm", None))
            or type(module).__name__ in RMS_NORMS)


@dataclass
class _Call:
    """One call of a producer module: its output (a weak reference: the run holds no activations) and why it
    cannot fold (None while it can)."""

    producer: nn.Module
    ref: Any
    shape: tuple
    dtype: torch.dtype
    why_not: str | None = None
    read_by: int = 0  # calls of quantized layers that took it
    written: bool = False  # its output written in place
    reshapes: bool = False  # its output differs from its input in shape or dtype
    last_read: int = 0  # the trace's clock at the last layer call that took the output
    input_written_at: int | None = None  # the clock at the first in-place write of its input after it ran

    def holds(self, t: torch.Tensor) -> bool:
        return self.ref is not None and self.ref() is t


@dataclass
class _Readers:
    """The quantized layers that took one tensor, in call order."""

    ref: Any
    layers: list[nn.Module]
    written: bool = False  # written in place during the run


@dataclass
class FoldReport:
    """What :func:`fold_prologues` folded (producer name -> the layers it went into), what it kept, with why,
    and the groups of layers that share one quantization of their common input."""

    folded: dict[str, list[str]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # producer name -> "layer norm", "gelu", ...
    kept: dict[str, str] = field(default_factory=dict)
    shared: list[list[str]] = field(default_factory=list)
    quantizing: dict[str, list[str]] = field(default_factory=dict)  # norm -> the layers it quantizes for
    error: str | None = None  # the traced run failed: nothing was changed

    def describe(self) -> str:
        if self.error is not None:
            return f"nothing folded into the quantization: the traced run failed ({self.error})"
        if not self.folded:
            text = "no norm or activation folded into the quantization"
        else:
            counts: dict[str, int] = {}
            for name in self.folded:
                counts[self.kinds[name]] = counts.get(self.kinds[name], 0) + 1
            what = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            text = (f"folded into the quantization of the layers they feed (their 16-bit outputs no longer "
                    f"written): {what}")
        if self.kept:
            text += f"; {len(self.kept)} not folded (e.g. {next(iter(self.kept))}: {next(iter(self.kept.values()))})"
        if self.quantizing:
            text += (f"; {len(self.quantizing)} norms read elsewhere too (a residual) quantize their output for their "
                     f"layers as they write it")
        if self.shared:
            sizes = sorted({len(g) for g in self.shared})
            text += (f"; {len(self.shared)} groups of {'/'.join(map(str, sizes))} layers reading one tensor quantize "
                     f"it once (e.g. {', '.join(self.shared[0])})")
        return text


@dataclass
class _Trace:
    """What the traced run has seen so far (ids are checked against weak references, storages by address:
    no activation is kept)."""

    live: dict[int, _Call] = field(default_factory=dict)  # producer outputs
    readers: dict[int, _Readers] = field(default_factory=dict)  # tensors quantized layers took
    active: list[int] = field(default_factory=list)  # the inputs of the quantized layers running
    clock: int = 0
    # storage address -> what lives there: producer outputs and inputs, tensors layers took
    outputs_at: dict[int, list[_Call]] = field(default_factory=dict)
    inputs_at: dict[int, list[_Call]] = field(default_factory=dict)
    readers_at: dict[int, list[_Readers]] = field(default_factory=dict)
    last_write: dict[int, int] = field(default_factory=dict)  # storage address -> clock

    def wrote(self, address: int) -> None:
        self.clock += 1
        self.last_write[address] = self.clock
        for call in self.outputs_at.get(address, []):
            call.written = True
        for call in self.inputs_at.get(address, []):
            if call.input_written_at is None:
                call.input_written_at = self.clock
        for r in self.readers_at.get(address, []):
            r.written = True


def _storage(t: torch.Tensor) -> int | None:
    """The address of t's storage (asked with torch function modes off: not a read the trace should see)."""
    try:
        with torch._C.DisableTorchFunction():
            return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - no storage (nested, sparse): not tracked
        return None


class _Uses(TorchFunctionMode):
    """Marks every read of a tracked producer output that is not its consumer's: the innermost quantized
    layer running took it as input, the call returned it unchanged without writing its storage (dropout in
    eval, a no-op cast), or it read metadata. Setting ``.data`` counts as a write."""

    def __init__(self, trace: _Trace):
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tr = self.trace
        before = tr.clock
        setting_data = (getattr(func, "__name__", "") == "__set__" and args and isinstance(args[0], torch.Tensor)
                        and getattr(getattr(func, "__self__", None), "__name__", "") == "data")
        if setting_data and (address := _storage(args[0])) is not None:
            tr.wrote(address)  # x.data = ...: x's values change under the same object
        out = func(*args, **kwargs)
        for t in tensors_in((args, kwargs)):
            call = tr.live.get(id(t))
            if call is None or not call.holds(t) or call.why_not is not None:
                continue
            if (tr.active and tr.active[-1] == id(t)) or _metadata(func):
                continue
            if out is t and tr.last_write.get(_storage(t), -1) <= before:  # returned unchanged, not written
                continue
            call.why_not = f"its output is read by {_name(func)} outside a quantized linear layer"
        return out


class _Writes(TorchDispatchMode):
    """Every write an operator's schema declares (in-place, ``out=``, through any view or ``.data`` alias):
    the storage it writes, for :meth:`_Trace.wrote`."""

    def __init__(self, trace: _Trace):
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        if schema is not None:
            for i, arg in enumerate(schema.arguments):
                alias = arg.alias_info
                if alias is None or not alias.is_write:
                    continue
                value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
                for t in tensors_in(value):
                    if (address := _storage(t)) is not None:
                        self.trace.wrote(address)
        return func(*args, **kwargs)


def _metadata(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", "") in _METADATA_PROPERTIES
    return name in _METADATA_METHODS


def _name(func: Any) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    if name == "__get__":
        return f"Tensor.{getattr(getattr(func, '__self__', None), '__name__', '?')}"
    return name


def fold_prologues(model: nn.Module, args: tuple, kwargs: dict) -> FoldReport:
    """Fold the norms and activations that feed only gpuopt's fp8 / dynamic-int8 linear layers into those
    layers' quantization (module docstring), found by one run of ``model(*args, **kwargs)`` (no grad).
    ``model`` is changed in place: the layers get the prologue (``set_prologue``), the folded modules
    become ``nn.Identity``. Returns what was folded and what was kept, with why."""
    from .linear import Fp8Linear, Int8Linear  # noqa: PLC0415 - linear imports this module

    report = FoldReport()
    names: dict[int, str] = {}
    for name, m in model.named_modules():
        names.setdefault(id(m), name)
    consumers = [m for m in model.modules() if isinstance(m, (Fp8Linear, Int8Linear))]
    producers = [m for m in model.modules() if _candidate(m)]
    if not consumers or (not producers and len(consumers) < 2):
        return report
    tr = _Trace()
    calls: list[_Call] = []
    taken: dict[int, list[_Call | None]] = {id(c): [] for c in consumers}
    groups: list[_Readers] = []

    def produced(mod, inp, out):
        x = inp[0] if inp else None
        if isinstance(out, torch.Tensor) and isinstance(x, torch.Tensor):
            call = _Call(mod, weakref.ref(out), tuple(out.shape), x.dtype)
            if x.shape != out.shape or x.dtype != out.dtype:
                call.reshapes = True
                call.why_not = "its output differs from its input in shape or dtype"
            tr.live[id(out)] = call
            out_at, in_at = _storage(out), _storage(x)
            if out_at is None or in_at is None:
                call.why_not = "its input or output has no storage to watch"
            else:
                tr.outputs_at.setdefault(out_at, []).append(call)
                tr.inputs_at.setdefault(in_at, []).append(call)
        else:
            call = _Call(mod, None, (), torch.float32, why_not="not called on one tensor")
        calls.append(call)

    def entered(mod, inp, kw):
        x = inp[0] if inp else next(iter(kw.values()), None)
        tr.clock += 1
        call = tr.live.get(id(x)) if isinstance(x, torch.Tensor) else None
        call = call if call is not None and call.holds(x) else None
        taken[id(mod)].append(call)
        if call is not None:
            call.read_by += 1
            call.last_read = tr.clock
        if isinstance(x, torch.Tensor):
            r = tr.readers.get(id(x))
            if r is not None and r.ref() is x:
                r.layers.append(mod)
            else:
                tr.readers[id(x)] = r = _Readers(weakref.ref(x), [mod])
                groups.append(r)
                address = _storage(x)
                if address is None:
                    r.written = True  # unwatchable: never shared
                else:
                    tr.readers_at.setdefault(address, []).append(r)
        tr.active.append(id(x))

    def left(mod, inp, out):
        tr.active.pop()

    handles = []
    try:
        for p in producers:
            handles.append(p.register_forward_hook(produced))
        for c in consumers:
            handles.append(c.register_forward_pre_hook(entered, with_kwargs=True))
            handles.append(c.register_forward_hook(left))
        with torch.no_grad(), _Uses(tr), _Writes(tr):
            out = model(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the model runs unfolded; the notes say why
        report.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        return report
    finally:
        for h in handles:
            h.remove()
    # An output still alive once the run is over was returned or kept (in whatever container): it escapes.
    gc.collect()  # not one held only by a reference cycle
    for c in calls:
        if c.why_not is None and c.ref is not None and c.ref() is not None:
            c.why_not = "its output is returned by the model or kept after the run"
    del out
    for c in calls:
        if c.why_not is None and c.written:
            c.why_not = "its output is written in place"
        if c.why_not is None and c.input_written_at is not None and c.input_written_at < c.last_read:
            c.why_not = "its input is written in place before a layer reads its output"

    by_producer: dict[int, list[_Call]] = {}
    for call in calls:
        by_producer.setdefault(id(call.producer), []).append(call)

    def fed(p: nn.Module) -> tuple[list[nn.Module], bool]:
        """The layers that took p's output, and whether every call of each took p's output only."""
        mine = [c for c in consumers if any(t is not None and t.producer is p for t in taken[id(c)])]
        return mine, all(all(t is not None and t.producer is p for t in taken[id(c)]) for c in mine)

    def norm_spec(p: nn.Module, pcalls: list[_Call]):
        widths, dtypes = {c.shape[-1] for c in pcalls}, {c.dtype for c in pcalls}
        return norm_of(p, widths.pop(), dtypes.pop()) if len(widths) == 1 and len(dtypes) == 1 else None

    # Per producer: all its calls foldable, read only by layers that take nothing else.
    plan: list[tuple[nn.Module, dict[str, Any], list[nn.Module]]] = []
    claimed: set[int] = set()
    for p in producers:
        pname = names.get(id(p), type(p).__name__)
        pcalls = by_producer.get(id(p), [])
        if not pcalls:
            continue  # not called on this input: left as it is, nothing to say
        why = next((c.why_not for c in pcalls if c.why_not), None)
        if why is None and any(c.read_by == 0 for c in pcalls):
            why = "its output is not read by a quantized linear layer"
        mine, only = fed(p)
        if why is None and not only:
            why = "a layer it feeds also takes other inputs"
        if why is None and any(id(c) in claimed or c.prologue_active for c in mine):
            why = "a layer it feeds already has a prologue"
        spec: dict[str, Any] = {}
        if why is None:
            act = activation_of(p)
            if act is not None:
                spec = {"activation": act}
                kind = act.replace("_", " ")
            else:
                norm = norm_spec(p, pcalls)
                if norm is None:
                    why = "a norm this fold does not take (not over the last dimension alone)"
                else:
                    spec = {"norm": norm[0], "eps": norm[1], "weight": norm[2], "bias": norm[3]}
                    kind = f"{norm[0]} norm"
        if why is not None:
            report.kept[pname] = why
            continue
        claimed.update(id(c) for c in mine)
        plan.append((p, spec, mine))
        report.folded[pname] = [names.get(id(c), "?") for c in mine]
        report.kinds[pname] = kind
    source: dict[int, int] = {}  # layer -> the producer folded into it
    for p, spec, mine in plan:
        for c in mine:
            c.set_prologue(**spec)
            source[id(c)] = id(p)
        _replace(model, p, nn.Identity())
    # Layers that always take the same tensor together (a query, key and value): one quantization, shared.
    together: dict[int, set[tuple[int, ...]]] = {}
    written: set[tuple[int, ...]] = set()  # keys of groups whose tensor was written in place
    for g in groups:
        key = tuple(id(m) for m in g.layers)
        for m in g.layers:
            together.setdefault(id(m), set()).add(key)
        if g.written:
            written.add(key)
    seen: set[tuple[int, ...]] = set()
    by_id = {id(c): c for c in consumers}
    for g in groups:
        key = tuple(id(m) for m in g.layers)
        if len(key) < 2 or key in seen or len(set(key)) != len(key):
            continue
        seen.add(key)
        if any(together[i] != {key} for i in key):
            continue  # one of them also reads other tensors, or with other layers
        if key in written:
            continue  # the tensor was written in place between (or after) their reads
        layers = [by_id[i] for i in key]
        if len({(type(m), source.get(id(m))) for m in layers}) != 1:
            continue  # not the same prologue (the same folded producer, or none)
        shared = SharedQuantization(len(layers))
        for m in layers:
            m.shared_input = shared
        report.shared.append([names.get(i, "?") for i in key])
    # Norms that stay (read elsewhere too) but whose quantized readers take nothing else and share one
    # quantization (a query, key and value) or are one layer: the norm quantizes for them.
    folded_now = {id(p) for p, _, _ in plan}
    for p in producers:
        pcalls = by_producer.get(id(p), [])
        if id(p) in folded_now or not pcalls or activation_of(p) is not None:
            continue
        if any(c.ref is None or c.read_by == 0 or c.written or c.reshapes for c in pcalls):
            continue  # a call on something else, an output no layer read, written in place or reshaped
        mine, only = fed(p)
        if not mine or not only or any(c.prologue_active for c in mine) or len({type(c) for c in mine}) != 1:
            continue
        if any(c.read_by != len(mine) for c in pcalls):
            continue  # each output read by all of them, once
        if len(mine) == 1 and mine[0].shared_input is None:
            shared = SharedQuantization(1)
        else:  # the group that already shares one quantization, exactly
            shared = mine[0].shared_input
            if shared is None or shared.n != len(mine) or any(c.shared_input is not shared for c in mine):
                continue
        norm = norm_spec(p, pcalls)
        if norm is None:
            continue
        mine[0].shared_input = shared
        qdtype = torch.float8_e4m3fn if isinstance(mine[0], Fp8Linear) else torch.int8
        new = QuantizingNorm(p, norm[0], norm[1], norm[2], norm[3], qdtype, shared)
        _replace(model, p, new)
        pname = names.get(id(p), type(p).__name__)
        report.quantizing[pname] = [names.get(id(c), "?") for c in mine]
        report.kept.pop(pname, None)
    return report


__all__ = ["RMS_NORMS", "FoldReport", "QuantizingNorm", "SharedQuantization", "activation_of", "fold_prologues", "norm_of"]
