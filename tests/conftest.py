"""Shared fixtures and the `gpu` marker's automatic skip.

Set GPUOPT_REQUIRE_GPU=1 (the GPU runner does) to turn "no usable GPU" into an error instead of a
skip, so that a GPU run can never pass by skipping.
"""

from __future__ import annotations

import os

import pytest
import torch

import gpuopt

pytest_plugins = ["pytester"]  # the pytest plugin's own tests run inner sessions


def _gpu_unavailable_reason() -> str | None:
    info = gpuopt.build_info()
    if not info["cuda"]:
        return f"gpuopt was built without CUDA ({info['no_cuda_reason']})"
    if not torch.cuda.is_available():
        return "no CUDA device visible"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("GPUOPT_REQUIRE_GPU") == "1" and any("gpu" in i.keywords for i in items):
        raise pytest.UsageError(f"GPUOPT_REQUIRE_GPU=1 but {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng() -> torch.Generator:
    """A fresh, seeded generator per test: random inputs, reproducible failures."""
    g = torch.Generator()
    g.manual_seed(int.from_bytes(os.urandom(4), "little"))
    return g
