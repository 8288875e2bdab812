"""Loads gpuopt's compiled extension and checks it matches the torch installed now."""

from __future__ import annotations

import torch  # must precede _C: the extension finds libtorch through the already-loaded torch

REBUILD_HINT = (
    "pip install --no-build-isolation --no-deps --force-reinstall <gpuopt source dir or git URL>"
)


def check_torch_version(built: str, running: str) -> None:
    """Raise ImportError unless the extension was built against the running torch."""
    if built != running:
        raise ImportError(
            f"gpuopt was built against torch {built}, but torch {running} is installed now; "
            f"the compiled extension must be rebuilt: {REBUILD_HINT}"
        )


def _load():
    try:
        from . import _C
    except ImportError as exc:
        raise ImportError(
            f"gpuopt's compiled extension could not be loaded ({exc}). It has to be built "
            f"against the torch installed now ({torch.__version__}); rebuild it: {REBUILD_HINT}"
        ) from exc
    check_torch_version(_C.BUILT_TORCH_VERSION, torch.__version__)
    return _C


_C = _load()


def build_info() -> dict:
    """What the compiled extension was built from and with.

    Keys: ``gpuopt_version``, ``torch_version`` (built against), ``torch_cuda``, ``cuda`` (whether
    CUDA sources were compiled), ``no_cuda_reason``, ``cuda_archs``, ``nvcc_version``, ``compiler``,
    ``cxx_standard``, ``build_type``.

    >>> import gpuopt
    >>> gpuopt.build_info()["torch_version"] == torch.__version__
    True
    """
    return dict(_C.build_info())
