"""gpuopt's torch operators (torch.ops.gpuopt.*): values against an independent numpy implementation of
the hash, torch.library.opcheck, torch.compile, typed errors; CUDA against CPU on a device."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuopt  # noqa: F401  (loading gpuopt._C registers the operators)

ops = torch.ops.gpuopt
SEEDS = st.integers(0, 2**32 - 1)


def _lowbias32(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


def expected_pattern(n: int, seed: int) -> np.ndarray:
    """pattern(i, seed) = lowbias32(lo32(i) ^ lowbias32(seed ^ hi32(i))), as int32 bit patterns."""
    i = np.arange(n, dtype=np.uint64)
    hi = (i >> np.uint64(32)).astype(np.uint32)
    return _lowbias32(i.astype(np.uint32) ^ _lowbias32(np.uint32(seed) ^ hi)).view(np.int32)


def _random_shape(g: torch.Generator) -> tuple[int, ...]:
    dims = int(torch.randint(1, 4, (1,), generator=g))
    return tuple(int(s) for s in torch.randint(1, 40, (dims,), generator=g))


def _random_seed(g: torch.Generator) -> int:
    return int(torch.randint(0, 2**32, (1,), generator=g, dtype=torch.int64))


def _random_int32(shape: tuple[int, ...], g: torch.Generator, device: str = "cpu") -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, shape, generator=g, dtype=torch.int32).to(device)


def test_numpy_reference_agrees_with_plain_python_integers():
    # The numpy reference (uint32 wrap-around) against arbitrary-precision ints masked by hand, so
    # that it cannot share an overflow bug with the C++ it checks.
    def lowbias32_int(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    for x in (1, 0xDEADBEEF, 0x12345678):
        assert int(_lowbias32(np.array([x], dtype=np.uint32))[0]) == lowbias32_int(x)
    seed, i = 0xCAFEF00D, 7
    want = lowbias32_int(i ^ lowbias32_int(seed))
    assert int(expected_pattern(8, seed).view(np.uint32)[i]) == want


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=SEEDS)
def test_pattern_on_cpu_matches_numpy(n, seed):
    got = ops.pattern(n, seed, torch.device("cpu"))
    assert got.dtype == torch.int32 and got.shape == (n,) and got.device.type == "cpu"
    np.testing.assert_array_equal(got.numpy(), expected_pattern(n, seed))


def test_pattern_on_cpu_across_parallel_chunks(rng):
    n = (1 << 20) + 3  # several parallel_for chunks of 65536
    seed = _random_seed(rng)
    np.testing.assert_array_equal(
        ops.pattern(n, seed, torch.device("cpu")).numpy(), expected_pattern(n, seed)
    )


def test_fill_pattern_writes_exactly_the_tensor_it_is_given(rng):
    shape = _random_shape(rng)
    seed = _random_seed(rng)
    base = _random_int32((shape[0] + 2, *shape[1:]), rng)
    before = base.clone()
    out = base[1 : 1 + shape[0]]  # contiguous, at a storage offset: the pattern indexes from out[0]
    assert ops.fill_pattern_(out, seed) is None
    np.testing.assert_array_equal(out.reshape(-1).numpy(), expected_pattern(out.numel(), seed))
    assert torch.equal(base[0], before[0]) and torch.equal(base[-1], before[-1])


def test_seeds_give_different_patterns(rng):
    seed = _random_seed(rng)
    a = ops.pattern(1000, seed, torch.device("cpu"))
    b = ops.pattern(1000, seed ^ 1, torch.device("cpu"))
    assert (a != b).float().mean() > 0.99


def _assert_opcheck_passes(op, args):
    result = torch.library.opcheck(op, args)
    assert result and set(result.values()) == {"SUCCESS"}, result


def test_opcheck_on_cpu(rng):
    _assert_opcheck_passes(
        ops.fill_pattern_.default, (_random_int32(_random_shape(rng), rng), _random_seed(rng))
    )
    _assert_opcheck_passes(
        ops.pattern.default,
        (int(torch.randint(0, 5000, (1,), generator=rng)), _random_seed(rng), torch.device("cpu")),
    )


def test_torch_compile_fullgraph_on_cpu(rng):
    def fn(x: torch.Tensor, seed: int) -> torch.Tensor:
        fresh = ops.pattern(x.numel(), seed, x.device).view_as(x)
        filled = torch.empty_like(x)
        ops.fill_pattern_(filled, seed ^ 0x5A5A5A5A)
        return x + fresh - 3 * filled

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    for _ in range(2):
        x = _random_int32(_random_shape(rng), rng)
        seed = _random_seed(rng)
        want = (
            x.reshape(-1).numpy()
            + expected_pattern(x.numel(), seed)
            - 3 * expected_pattern(x.numel(), seed ^ 0x5A5A5A5A)
        ).reshape(x.shape)
        np.testing.assert_array_equal(compiled(x, seed).numpy(), want)


# Meta runs the same checks as CPU and CUDA, so tracing (FakeTensor, torch.compile) raises what running would.
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_inputs_are_typed_errors_naming_the_argument(device):
    with pytest.raises(TypeError, match=r"fill_pattern_: out must be int32, got Float"):
        ops.fill_pattern_(torch.empty(4, device=device), 1)
    with pytest.raises(
        ValueError,
        match=r"fill_pattern_: out must be contiguous, got sizes \[5, 3\] with strides \[1, 5\]",
    ):
        ops.fill_pattern_(torch.empty(3, 5, dtype=torch.int32, device=device).t(), 1)
    for seed in (-1, 2**32):
        with pytest.raises(
            ValueError, match=rf"fill_pattern_: seed must be in \[0, 2\^32\), got {seed}"
        ):
            ops.fill_pattern_(torch.empty(4, dtype=torch.int32, device=device), seed)
        with pytest.raises(ValueError, match=rf"pattern: seed must be in \[0, 2\^32\), got {seed}"):
            ops.pattern(4, seed, torch.device(device))
    with pytest.raises(ValueError, match=r"pattern: numel must be >= 0, got -3"):
        ops.pattern(-3, 0, torch.device(device))


def test_the_operators_load_with_import_gpuopt():
    # A fresh interpreter: the static registration must survive linking into _C.
    code = (
        "import torch, gpuopt; t = torch.ops.gpuopt.pattern(3, 1, torch.device('cpu')); "
        "print(torch.ops.gpuopt.fill_pattern_.default._schema, t.tolist())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "gpuopt::fill_pattern_(Tensor(a!) out, int seed) -> ()" in proc.stdout
    assert str(expected_pattern(3, 1).tolist()) in proc.stdout


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("n,offset", [(1, 0), (7, 1), (1 << 20, 0), ((1 << 20) + 3, 3)])
def test_cuda_equals_cpu(n, offset, rng):
    seed = _random_seed(rng)
    base = _random_int32((n + offset,), rng, "cuda")
    out = base[offset:]  # offsets exercise the kernel's unaligned head and tail
    ops.fill_pattern_(out, seed)
    want = ops.pattern(n, seed, torch.device("cpu"))
    assert torch.equal(out.cpu(), want)
    fresh = ops.pattern(n, seed, torch.device("cuda"))
    assert fresh.device.type == "cuda" and torch.equal(fresh.cpu(), want)


@pytest.mark.gpuopt_gpu
def test_opcheck_on_cuda(rng):
    _assert_opcheck_passes(
        ops.fill_pattern_.default,
        (_random_int32(_random_shape(rng), rng, "cuda"), _random_seed(rng)),
    )
    _assert_opcheck_passes(ops.pattern.default, (4099, _random_seed(rng), torch.device("cuda")))


@pytest.mark.gpuopt_gpu
def test_bad_inputs_on_cuda_are_typed_errors():
    with pytest.raises(TypeError, match="fill_pattern_: out must be int32, got Float"):
        ops.fill_pattern_(torch.empty(4, device="cuda"), 1)
    with pytest.raises(ValueError, match="fill_pattern_: out must be contiguous"):
        ops.fill_pattern_(torch.empty(3, 5, dtype=torch.int32, device="cuda").t(), 1)
    with pytest.raises(ValueError, match=r"fill_pattern_: seed must be in \[0, 2\^32\), got -1"):
        ops.fill_pattern_(torch.empty(4, dtype=torch.int32, device="cuda"), -1)
