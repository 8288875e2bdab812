"""Shared fixtures. The `gpuopt_gpu` marker's skip (and GPUOPT_REQUIRE_GPU=1, which makes "no usable GPU" an
error so that a GPU run can never pass by skipping) comes from gpuopt's own pytest plugin: one hook,
the one users get."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest_plugins = ["pytester"]  # the pytest plugin's own tests run inner sessions


if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under `pytest -n`, one intra-op thread per worker: the workers already use every CPU, and threads
    # beyond them would make the host-timed tests noisier.
    torch.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown (and unused) where it is not installed
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``pytest -n auto`` (pytest-xdist; the README's test command): one worker per CPU this process may run
    on, but a single worker where a CUDA device is visible -- the GPU tests time kernels, and two sessions
    sharing one GPU would time each other. PYTEST_XDIST_AUTO_NUM_WORKERS, where set, still decides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if torch.cuda.is_available():
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.fixture
def seed() -> int:
    """A fresh random seed per test, printed so that a failure shows it (pytest prints a failing
    test's captured output): rerun with GPUOPT_TEST_SEED=<seed> to reproduce."""
    value = int(os.environ.get("GPUOPT_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"random seed: {value} (GPUOPT_TEST_SEED={value} reproduces it)")
    return value


@pytest.fixture
def rng(seed: int) -> torch.Generator:
    """A torch generator seeded with the test's printed seed: random inputs, reproducible failures."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def np_rng(seed: int) -> np.random.Generator:
    """A numpy generator seeded with the test's printed seed."""
    return np.random.default_rng(seed)


def _cuda_kernels_run(fn, contains: str | None = None) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and (contains is None or contains in e.name)]


@pytest.fixture
def kernels_run():
    """``kernels_run(fn, contains=None)``: the names of the CUDA kernels ``fn()`` ran, in order (those whose
    name contains ``contains``), from the profiler: which kernel an operator picked."""
    return _cuda_kernels_run
