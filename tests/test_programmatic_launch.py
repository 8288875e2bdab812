"""Programmatic dependent launch of gpuopt's decode kernels (csrc/cuda/pdl.cuh): the process-wide setting; on
a GPU, a chain of the kernels in a CUDA graph -- each reading what the one before it wrote, one of them a
weight written right before it -- gives, replay after replay with new inputs, exactly what the same calls
give launched plainly. A kernel that read its input (or a weight) before waiting for the kernel before it
would read the previous replay's values there -- when the timing exposes it: a race can go unseen, so these
tests catch a missing wait often, not always. They need compute capability 9.0+ (below, nothing launches
programmatically and there is nothing to test)."""

from __future__ import annotations

import pytest
import torch

import gpuopt  # (loading gpuopt._C registers the operators)
from gpuopt import _C

ops = torch.ops.gpuopt


@pytest.fixture
def launch_setting():
    """Restores the process-wide setting after the test."""
    before = _C.programmatic_launch()
    yield
    _C.programmatic_launch(before)


def test_the_setting_is_process_wide_and_on_by_default(launch_setting):
    assert _C.programmatic_launch() is True
    assert _C.programmatic_launch(False) is True and _C.programmatic_launch() is False
    assert _C.programmatic_launch(True) is False and _C.programmatic_launch() is True


def test_whether_it_runs_on_a_device_follows_the_device_the_build_and_the_setting(launch_setting):
    """programmatic_launch_runs(device): 9.0+ with this build's code for it (the GPU suite builds for its
    device) and the setting on; False in a build without CUDA; the device checks of every binding."""
    if not gpuopt.build_info()["cuda"]:
        assert _C.programmatic_launch_runs(0) is False  # nothing launches at all
        return
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="programmatic_launch_runs needs a CUDA device, and none is visible"):
            _C.programmatic_launch_runs(0)
        return
    assert _C.programmatic_launch_runs(0) is (torch.cuda.get_device_capability(0)[0] >= 9)
    _C.programmatic_launch(False)
    assert _C.programmatic_launch_runs(0) is False
    count = torch.cuda.device_count()
    for bad in (-1, count):
        with pytest.raises(IndexError, match=rf"programmatic_launch_runs: device must be in \[0, {count}\), got {bad}"):
            _C.programmatic_launch_runs(bad)


# ---- GPU -------------------------------------------------------------------------------------------------


def _needs_programmatic_launch():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0+ (it is off below)")


def _chain(x, w1, b1, q2, s2, w3_base, w3_scale, w4, k_cache, v_cache, position, heads, d):
    """decode_linear -> int8 linear with ReLU -> a weight computed by the kernel right before -> decode_linear
    on it -> the q/k/v projection's output appended to a KV cache and attended (decode_attention_append) ->
    decode_linear again."""
    h1 = ops.decode_linear(x, w1, b1, "none")
    h2 = ops.int8_weight_only_linear(h1, q2, s2, None, "relu")
    w3 = w3_base * w3_scale  # written by the kernel right before the one that reads it
    qkv = ops.decode_linear(h2, w3, None, "none")  # [1, 3 * heads * d]
    q, k, v = qkv.view(1, 1, 3, heads, d).unbind(2)
    att = ops.decode_attention_append(q.transpose(1, 2), k_cache, v_cache, k.transpose(1, 2), v.transpose(1, 2),
                                      position, None, None, True)  # [1, heads, 1, d]
    return ops.decode_linear(att.reshape(1, heads * d), w4, None, "none")


@pytest.fixture
def int8_kernel(request):
    """The int8 operator's kernel for the test (the process-wide setting, restored after)."""
    before = _C.int8_linear_kernel(request.param)
    yield request.param
    _C.int8_linear_kernel(before)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("keys, first", [(256, 6), (4096, 3000)], ids=["one-block", "split-kv"])
@pytest.mark.parametrize("int8_kernel", ["auto", "simt"], indirect=True)
def test_a_chain_of_decode_kernels_in_a_graph_reads_each_others_outputs(dtype, keys, first, int8_kernel,
                                                                        launch_setting, kernels_run):
    """The attention is one block per head (256 keys) or split over blocks and combined by a second kernel
    (4096 keys); the int8 linear layer runs the tensor-core kernel (auto, one row of N = 2048) or the SIMT one."""
    _needs_programmatic_launch()
    g = torch.Generator(device="cuda").manual_seed(0)
    heads, d, k = 8, 64, 2048

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)

    x = rand(1, k)
    w1, b1 = rand(k, k, scale=k ** -0.5), rand(k)
    q2 = torch.randint(-127, 128, (k, k), device="cuda", dtype=torch.int8, generator=g)
    s2 = (torch.rand(k, device="cuda", generator=g) * 0.01).to(dtype)
    w3_base, w3_scale = rand(3 * heads * d, k, scale=k ** -0.5), rand(1, k)
    w4 = rand(k, heads * d, scale=(heads * d) ** -0.5)
    caches = [rand(1, heads, keys, d), rand(1, heads, keys, d)]
    position = torch.tensor([5], device="cuda")
    args = (x, w1, b1, q2, s2, w3_base, w3_scale, w4, *caches, position, heads, d)

    _C.programmatic_launch(True)  # read at capture: the graph keeps programmatic edges (on 9.0+)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _chain(*args)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            out = _chain(*args)
    torch.cuda.current_stream().wait_stream(stream)
    names = kernels_run(graph.replay)
    assert any("decode_attention_combine" in n for n in names) == (keys > 1024), names
    assert any("int8_linear<" in n for n in names) == (int8_kernel == "simt"), names
    _C.programmatic_launch(False)
    for step in range(6):
        x.copy_(rand(1, k))
        w3_scale.copy_(rand(1, k))
        position.fill_(first + step)
        saved = [c.clone() for c in caches]
        graph.replay()
        after = [c.clone() for c in caches]
        for c, s in zip(caches, saved):
            c.copy_(s)
        want = _chain(*args)  # launched plainly
        torch.cuda.synchronize()
        assert torch.isfinite(want).all()
        assert torch.equal(out, want), f"replay {step}: the graph's chain differs from the plain launches"
        assert all(torch.equal(a, c) for a, c in zip(after, caches)), f"replay {step}: the cache rows differ"


@pytest.mark.gpuopt_gpu
def test_eager_calls_with_the_launch_on_and_off_agree(launch_setting):
    """Back-to-back eager calls (the next kernel queued while the one before runs): identical values."""
    _needs_programmatic_launch()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(4, 2048, device="cuda", generator=g).half()
    ws = [(torch.randn(2048, 2048, device="cuda", generator=g) / 45).half() for _ in range(6)]
    got = {}
    for on in (True, False):
        _C.programmatic_launch(on)
        h = x
        for w in ws:
            h = ops.decode_linear(h, w, None, "relu")
        got[on] = h.clone()
    torch.cuda.synchronize()
    assert torch.isfinite(got[True]).all() and got[True].abs().sum() > 0
    assert torch.equal(got[True], got[False])
