"""Exported backends: ``onnxruntime`` (``torch.onnx.export``, run by ONNX Runtime) and ``tensorrt``
(torch-tensorrt), as config backends behind the same parity gate as the others.

``onnxruntime``: the model (already converted to the config's precision and memory format) is exported
at the example inputs' shapes -- the dynamo exporter first, the classic one where it fails -- and run by
an ``InferenceSession``: with the CUDA execution provider and I/O bound to device tensors where
onnxruntime-gpu is installed and the device is a GPU; with the CPU provider on the CPU. A GPU device
without the CUDA provider is refused (the session would run on the host while the GPU timers measure
nothing of it): measure ONNX Runtime's CPU provider with ``device="cpu"``. The export time is part of
``prepare_s`` (like a compile) and named in the notes with the exporter and the provider.

``tensorrt``: torch-tensorrt's ``compile`` where installed, on a GPU; the build time is in the notes.

A missing package, a failed export or a refused device fails the config with the reason (the pip
command where a package is missing); the sweep goes on.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

EXPORTED_BACKENDS = ("onnxruntime", "tensorrt")

_ORT_INSTALL = "pip install onnxruntime (or onnxruntime-gpu for the CUDA execution provider)"
_ONNX_INSTALL = "pip install onnx onnxscript"
_TRT_INSTALL = "pip install torch-tensorrt"

# numpy has no bfloat16: ONNX Runtime's I/O in these types goes through device buffers only.
_ORT_ELEMENT = {torch.float32: "float32", torch.float16: "float16", torch.int64: "int64", torch.int32: "int32",
                torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.float64: "float64"}


@dataclass
class Exported:
    """A model exported and loaded by a backend: called like the module, it returns the module's output
    structure (tensors on the config's device)."""

    backend: str
    run: Any  # (args, kwargs) -> the output tensors, flat
    spec: Any  # the eager output's pytree spec
    device: torch.device
    notes: list[str] = field(default_factory=list)
    keep: Any = None  # what must stay alive with the session (its temporary folder)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return pytree.tree_unflatten(self.run(args, kwargs), self.spec)


def build(backend: str, module: torch.nn.Module, args: tuple, kwargs: dict, device: torch.device) -> Exported:
    """Export ``module`` (converted, on ``device``) at the shapes of ``args``/``kwargs`` and load it
    with ``backend`` (one of :data:`EXPORTED_BACKENDS`). RuntimeError with the reason where it cannot."""
    if backend not in EXPORTED_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(EXPORTED_BACKENDS)}, got {backend!r}")
    with torch.no_grad():
        eager_out = module(*args, **kwargs)
    leaves, spec = pytree.tree_flatten(eager_out)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise RuntimeError(f"backend {backend!r} needs a model whose outputs are tensors (in tuples, lists or "
                           f"dicts); this one returns {type(eager_out).__name__} with "
                           f"{sorted({type(t).__name__ for t in leaves})}")
    if backend == "onnxruntime":
        return _onnxruntime(module, args, kwargs, device, spec, len(leaves))
    return _tensorrt(module, args, kwargs, device, spec)


# ---- ONNX Runtime ------------------------------------------------------------------------------------------
def _onnxruntime(module: torch.nn.Module, args: tuple, kwargs: dict, device: torch.device, spec: Any,
                 n_out: int) -> Exported:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise RuntimeError(f"onnxruntime is not installed: {_ORT_INSTALL}") from exc
    providers = ort.get_available_providers()
    if device.type == "cuda" and "CUDAExecutionProvider" not in providers:
        raise RuntimeError("onnxruntime has no CUDA execution provider here (onnxruntime-gpu is not installed: "
                           "pip install onnxruntime-gpu); its CPU provider runs on the host, which the GPU timers "
                           f"would not measure: measure it with device='cpu' (providers: {', '.join(providers)})")
    folder = tempfile.TemporaryDirectory(prefix="gpuopt-onnx-")
    path = os.path.join(folder.name, "model.onnx")
    t0 = time.perf_counter()
    exporter = _export_onnx(module, args, kwargs, path)
    export_s = time.perf_counter() - t0
    provider = "CUDAExecutionProvider" if device.type == "cuda" else "CPUExecutionProvider"
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if provider == "CUDAExecutionProvider":
        session = ort.InferenceSession(path, options, providers=[(provider, {"device_id": device.index or 0})])
    else:
        session = ort.InferenceSession(path, options, providers=[provider])
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    if len(outputs) != n_out:
        raise RuntimeError(f"the exported model has {len(outputs)} outputs and the module returns {n_out} tensors")
    notes = [f"onnxruntime: exported by torch.onnx ({exporter} exporter) in {export_s:.1f} s; runs on {provider}"]
    run = _cuda_runner(session, names, outputs, device) if provider == "CUDAExecutionProvider" else \
        _cpu_runner(session, names, outputs)
    return Exported("onnxruntime", run, spec, device, notes, keep=folder)


def _export_onnx(module: torch.nn.Module, args: tuple, kwargs: dict, path: str) -> str:
    """Export to ``path``; returns which exporter did it. RuntimeError with both exporters' messages."""
    errors = {}
    for exporter, dynamo in (("dynamo", True), ("classic", False)):
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                if dynamo:
                    program = torch.onnx.export(module, args, kwargs=kwargs or None, dynamo=True, verbose=False)
                    program.save(path)
                else:
                    torch.onnx.export(module, (*args, kwargs) if kwargs else args, path, dynamo=False)
            return exporter
        except ImportError as exc:
            errors[exporter] = f"{exc} ({_ONNX_INSTALL})"
        except Exception as exc:  # noqa: BLE001 - the exporter's own message is the reason
            errors[exporter] = _first_line(exc)
    raise RuntimeError("torch.onnx.export failed (" + "; ".join(f"{k}: {v}" for k, v in errors.items()) + ")")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException) -> str:
    """The exporter's message in one line: its cause's where its own is a banner (the dynamo exporter's
    "Failed to convert ... Next steps")."""
    while exc.__cause__ is not None and "Next steps" in str(exc):
        exc = exc.__cause__
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _match(names: list[str], args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The call's tensors in the exported model's input order (positional, then keyword)."""
    flat = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if len(flat) != len(names):
        raise RuntimeError(f"the exported model takes {len(names)} inputs ({', '.join(names)}) and the call gives "
                           f"{len(flat)} tensors (an input the model does not use is left out by the exporter)")
    return flat


def _cpu_runner(session: Any, names: list[str], outputs: list[str]) -> Any:
    def run(args: tuple, kwargs: dict) -> list[torch.Tensor]:
        feeds = {n: t.detach().cpu().contiguous().numpy() for n, t in zip(names, _match(names, args, kwargs))}
        return [torch.from_numpy(a) for a in session.run(outputs, feeds)]

    return run


def _cuda_runner(session: Any, names: list[str], outputs: list[str], device: torch.device) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()

    def run(args: tuple, kwargs: dict) -> list[torch.Tensor]:
        binding = session.io_binding()
        bound = [t.contiguous() for t in _match(names, args, kwargs)]  # alive until the session has read them
        for name, t in zip(names, bound):
            if t.dtype not in _ORT_ELEMENT:
                raise RuntimeError(f"onnxruntime cannot bind an input of {t.dtype}")
            binding.bind_input(name, "cuda", index, _ORT_ELEMENT[t.dtype], list(t.shape), t.data_ptr())
        for name in outputs:
            binding.bind_output(name, "cuda", index)
        torch.cuda.current_stream(device).synchronize()  # ONNX Runtime runs on a stream of its own
        session.run_with_iobinding(binding)
        del bound
        return [torch.from_dlpack(o.to_dlpack()) if hasattr(o, "to_dlpack") else torch.from_numpy(o.numpy()).to(device)
                for o in binding.get_outputs()]

    return run


# ---- TensorRT ----------------------------------------------------------------------------------------------
def _tensorrt(module: torch.nn.Module, args: tuple, kwargs: dict, device: torch.device, spec: Any) -> Exported:
    if device.type != "cuda":
        raise RuntimeError("backend 'tensorrt' needs a CUDA device")
    try:
        import torch_tensorrt
    except ImportError as exc:
        raise RuntimeError(f"TensorRT is not installed: {_TRT_INSTALL} (it needs a CUDA device)") from exc
    dtypes = {t.dtype for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()}
    t0 = time.perf_counter()
    engine = torch_tensorrt.compile(module, ir="dynamo", arg_inputs=list(args), kwarg_inputs=kwargs or None,
                                    enabled_precisions=dtypes or {torch.float32})
    build_s = time.perf_counter() - t0

    def run(a: tuple, k: dict) -> list[torch.Tensor]:
        return pytree.tree_leaves(engine(*a, **k))

    return Exported("tensorrt", run, spec, device,
                    [f"tensorrt: engine built by torch-tensorrt {torch_tensorrt.__version__} in {build_s:.1f} s"])


__all__ = ["EXPORTED_BACKENDS", "Exported", "build"]
