"""gpuopt::int8_weight_only_linear: values against a float64 reference, typed errors naming the argument,
torch.library.opcheck, torch.compile; on a GPU the CUDA kernel (decode rows) and its dequantized cuBLAS
path against the reference and the CPU operator, also captured in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

import gpuopt  # noqa: F401  (loading gpuopt._C registers the operators)

ops = torch.ops.gpuopt


def _inputs(
    lead: tuple[int, ...],
    n: int,
    k: int,
    dtype: torch.dtype,
    g: torch.Generator,
    *,
    bias: bool = True,
    scales_fp32: bool = True,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random x [*lead, k], int8 weight [n, k], per-channel scales [n] (like absmax / 127), bias [n]."""
    x = torch.randn(*lead, k, generator=g).to(dtype)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, generator=g) * 0.02 + 0.001).to(torch.float32 if scales_fp32 else dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x.to(device), w.to(device), s.to(device), None if b is None else b.to(device)


def _reference(x, w, s, b) -> torch.Tensor:
    y = (x.double().cpu() @ w.double().cpu().t()) * s.double().cpu()
    return y if b is None else y + b.double().cpu()


def _allowed_error(x, w, s, b, want: torch.Tensor) -> float:
    """The largest error allowed against the float64 reference, kept in one place: float32 a small
    multiple of its rounding; float16/bfloat16 twice PyTorch's own error computing the same product
    in that dtype (dequantized weight, F.linear), plus one epsilon of the output's magnitude."""
    scale = float(want.abs().max()) if want.numel() else 0.0
    if x.dtype == torch.float32:
        return 1e-5 * scale
    wd = w.to(x.dtype) * s.to(x.dtype)[:, None]
    torch_err = float((torch.nn.functional.linear(x, wd, b).double().cpu() - want).abs().max())
    return 2 * torch_err + torch.finfo(x.dtype).eps * scale


def _check(got: torch.Tensor, x, w, s, b) -> None:
    assert got.dtype == x.dtype and got.device == x.device
    assert got.shape == (*x.shape[:-1], w.shape[0]) and got.is_contiguous()
    want = _reference(x, w, s, b)
    if want.numel() == 0:
        return
    err = float((got.double().cpu() - want).abs().max())
    allowed = _allowed_error(x, w, s, b, want)
    assert err <= allowed, f"max error {err:.3g} > allowed {allowed:.3g} (|ref| max {float(want.abs().max()):.3g})"


SHAPES = [  # (leading dims of x, N, K)
    ((), 7, 64),
    ((1,), 3, 64),
    ((5,), 17, 33),  # odd K
    ((2, 3), 11, 2056),  # 3-D x, K not a multiple of 16
    ((4, 1, 2), 5, 48),
    ((0,), 4, 16),  # no rows
]


@pytest.mark.parametrize("lead,n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("scales_fp32", [True, False])
def test_values_on_cpu(lead, n, k, dtype, bias, scales_fp32, rng):
    x, w, s, b = _inputs(lead, n, k, dtype, rng, bias=bias, scales_fp32=scales_fp32)
    _check(ops.int8_weight_only_linear(x, w, s, b), x, w, s, b)


def test_bias_defaults_to_none(rng):
    x, w, s, _ = _inputs((3,), 5, 32, torch.float32, rng, bias=False)
    assert torch.equal(ops.int8_weight_only_linear(x, w, s), ops.int8_weight_only_linear(x, w, s, None))


def test_non_contiguous_x_is_accepted(rng):
    x, w, s, b = _inputs((6, 4), 9, 32, torch.float32, rng)
    xt = x.transpose(0, 1)  # [4, 6, 32], not contiguous
    _check(ops.int8_weight_only_linear(xt, w, s, b), xt, w, s, b)


# Meta runs the same checks as CPU and CUDA, so tracing (FakeTensor, torch.compile) raises what running would.
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_inputs_are_typed_errors_naming_the_argument(device, rng):
    x, w, s, b = _inputs((2,), 4, 32, torch.bfloat16, rng, device=device)
    op = ops.int8_weight_only_linear
    with pytest.raises(TypeError, match="x must be float16, bfloat16 or float32, got int32"):
        op(torch.ones(2, 32, dtype=torch.int32, device=device), w, s, None)
    with pytest.raises(TypeError, match="x must be float16, bfloat16 or float32, got float64"):
        op(x.double(), w, s, None)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., K\], got a 0-dim tensor"):
        op(x[0, 0], w, s, b)
    with pytest.raises(TypeError, match="weight must be int8, got float32"):
        op(x, w.float(), s, b)
    with pytest.raises(ValueError, match=r"weight must be 2-D \[N, K\], got sizes \[128\]"):
        op(x, w.reshape(-1), s, b)
    with pytest.raises(ValueError, match=r"weight must be contiguous, got sizes \[4, 32\] with strides \[1, 4\]"):
        op(x, w.t().contiguous().t(), s, b)
    with pytest.raises(ValueError, match=r"x's last dimension must equal weight's K .* got x sizes \[2, 31\]"):
        op(x[:, :31], w, s, b)
    with pytest.raises(TypeError, match=r"scales must be float32 or x's dtype \(bfloat16\), got float16"):
        op(x, w, s.half(), b)
    with pytest.raises(ValueError, match=r"scales must have shape \[N\] with N = weight.size\(0\) = 4, got sizes \[3\]"):
        op(x, w, s[:3], b)
    with pytest.raises(TypeError, match=r"bias must have x's dtype \(bfloat16\), got float32"):
        op(x, w, s, b.float())
    with pytest.raises(ValueError, match=r"bias must have shape \[N\] with N = weight.size\(0\) = 4, got sizes \[1, 4\]"):
        op(x, w, s, b[None])


def test_tensors_on_different_devices_are_a_value_error(rng):
    x, w, s, b = _inputs((2,), 4, 32, torch.float32, rng)
    with pytest.raises(ValueError, match=r"weight must be on x's device \(cpu\), got meta"):
        ops.int8_weight_only_linear(x, w.to("meta"), s, b)
    with pytest.raises(ValueError, match=r"bias must be on x's device \(meta\), got cpu"):
        ops.int8_weight_only_linear(x.to("meta"), w.to("meta"), s.to("meta"), b)


def test_meta_gives_the_output_shape(rng):
    x, w, s, b = _inputs((2, 5), 7, 48, torch.float16, rng, device="meta")
    out = ops.int8_weight_only_linear(x, w, s, b)
    assert out.device.type == "meta" and out.dtype == torch.float16 and out.shape == (2, 5, 7)


def _assert_opcheck_passes(args):
    result = torch.library.opcheck(ops.int8_weight_only_linear.default, args)
    assert result and set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_opcheck_on_cpu(dtype, bias, rng):
    _assert_opcheck_passes(_inputs((2, 3), 5, 32, dtype, rng, bias=bias))
    _assert_opcheck_passes(_inputs((4,), 6, 33, dtype, rng, bias=bias, scales_fp32=False))


def test_torch_compile_fullgraph_on_cpu(rng):
    _, w, s, b = _inputs((3, 2), 6, 64, torch.float32, rng)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return ops.int8_weight_only_linear(x, w, s, b).relu() * 2

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3, 2, 64, generator=rng)
        torch.testing.assert_close(compiled(x), fn(x))


def test_the_kernel_setting_takes_the_three_names_and_refuses_others():
    from gpuopt import _C

    assert _C.int8_linear_kernel() == "auto"
    try:
        assert _C.int8_linear_kernel("simt") == "auto" and _C.int8_linear_kernel() == "simt"
        assert _C.int8_linear_kernel("tensor-core") == "simt"
        with pytest.raises(ValueError, match="kernel must be one of 'auto', 'simt', 'tensor-core', got 'mma'"):
            _C.int8_linear_kernel("mma")
        assert _C.int8_linear_kernel() == "tensor-core"  # a refused name changes nothing
    finally:
        _C.int8_linear_kernel("auto")


def test_the_warps_setting_takes_the_kernels_block_sizes_and_refuses_others():
    from gpuopt import _C

    assert _C.int8_linear_warps() == 0
    try:
        for warps in (4, 8, 16, 32):
            _C.int8_linear_warps(warps)
            assert _C.int8_linear_warps() == warps
        assert _C.int8_linear_warps(0) == 32
        for bad in (1, 12, 64, -4):
            with pytest.raises(ValueError, match=f"warps must be 0 \\(chosen from N and K\\), 4, 8, 16 or 32, got {bad}"):
                _C.int8_linear_warps(bad)
        assert _C.int8_linear_warps() == 0  # a refused value changes nothing
    finally:
        _C.int8_linear_warps(0)


# ---- CUDA ------------------------------------------------------------------------------------------------


@pytest.fixture(params=["simt", "tensor-core"])
def kernel(request):
    """Each CUDA kernel of the operator in turn (the process-wide setting, restored after the test)."""
    from gpuopt import _C

    if request.param == "tensor-core" and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core kernel needs compute capability 8.0+")
    before = _C.int8_linear_kernel(request.param)
    yield request.param
    _C.int8_linear_kernel(before)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("m", [1, 2, 7, 12, 16, 33])
@pytest.mark.parametrize("k", [64, 2048, 2056, 8192])
@pytest.mark.parametrize("n", [3, 1000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_matches_the_reference_and_the_cpu_operator(m, k, n, dtype, kernel, rng):
    # Rows 1..16 with K % 16 == 0 take the int8 kernel (each of the two: K = 64, 2048 and 8192 are multiples
    # of 64; 8192 runs the tensor-core kernel's 4-chunk batches, 12 rows its second 8-row tile); 33 rows
    # and K = 2056 the dequantized GEMM. n = 3 and 1000 leave a partial 16-column tile.
    # Bias, fp32 scales and a 3-D x vary with the case, so every path meets each of them.
    lead = (m,) if k != 2048 else (1, m)
    x, w, s, b = _inputs(lead, n, k, dtype, rng, bias=m % 2 == 1, scales_fp32=n == 1000, device="cuda")
    got = ops.int8_weight_only_linear(x, w, s, b)
    _check(got, x, w, s, b)
    cpu = ops.int8_weight_only_linear(x.cpu(), w.cpu(), s.cpu(), None if b is None else b.cpu())
    want = _reference(x, w, s, b)
    diff = float((got.cpu().double() - cpu.double()).abs().max())
    assert diff <= 2 * _allowed_error(x, w, s, b, want)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("m,k", [(1, 528), (4, 528), (2, 12304), (1, 16)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_simt_kernel_takes_k_not_a_multiple_of_64(m, k, dtype, rng, kernels_run):
    # Only the SIMT kernel runs these (the tensor cores take 64-wide chunks): a partial last 512-wide step.
    x, w, s, b = _inputs((m,), 300, k, dtype, rng, bias=m != 2, scales_fp32=k != 528, device="cuda")
    assert "int8_linear<" in kernels_run(lambda: ops.int8_weight_only_linear(x, w, s, b), "kernels::int8_linear")[0]
    _check(ops.int8_weight_only_linear(x, w, s, b), x, w, s, b)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("vector", [1, 2])
@pytest.mark.parametrize("warps", [4, 8, 16, 32])
@pytest.mark.parametrize("m,n,k", [(1, 2048, 8192), (12, 1000, 2048), (3, 40, 64), (1, 3, 4096), (2, 300, 2368)])
def test_the_tensor_core_kernel_with_each_layout_matches_the_reference(warps, vector, m, n, k, rng, kernels_run):
    # The warps split K into chunks of 64 * vector: 4 warps over 128 chunks take 8 batches each, 32 warps over
    # one chunk leave 31 idle; K = 64 and 2368 (37 chunks of 64: whole batches, then single chunks) take one
    # load per row and chunk whatever is asked. A ReLU in the epilogue with 16 warps.
    from gpuopt import _C

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core kernel needs compute capability 8.0+")
    relu = warps == 16
    act = "relu" if relu else "none"
    dtype = torch.bfloat16 if vector == 2 and warps in (8, 16) else torch.float16
    before = (_C.int8_linear_kernel("tensor-core"), _C.int8_linear_warps(warps), _C.int8_linear_vector(vector))
    try:
        x, w, s, b = _inputs((m,), n, k, dtype, rng, bias=m % 2 == 1, device="cuda")
        got = ops.int8_weight_only_linear(x, w, s, b, act)
        names = kernels_run(lambda: ops.int8_weight_only_linear(x, w, s, b, act), "kernels::int8_linear")
        v = vector if k % 128 == 0 else 1
        want_name = f", {warps}, {v}, false>"  # the last: row statistics, for a folded norm only
        assert len(names) == 1 and "int8_linear_mma" in names[0] and want_name in names[0], names
    finally:
        _C.int8_linear_kernel(before[0])
        _C.int8_linear_warps(before[1])
        _C.int8_linear_vector(before[2])
    if relu:
        _check_relu(got, x, w, s, b)
    else:
        _check(got, x, w, s, b)


def _check_relu(got, x, w, s, b) -> None:
    want = _reference(x, w, s, b)
    err = float((got.cpu().double() - want.clamp_min(0)).abs().max())
    assert err <= _allowed_error(x, w, s, b, want), err


@pytest.mark.parametrize("relu", [False, True])
def test_cpu_relu_in_the_operator(relu, rng):
    x, w, s, b = _inputs((3,), 50, 64, torch.float32, rng)
    got = ops.int8_weight_only_linear(x, w, s, b, "relu" if relu else "none")
    want = ops.int8_weight_only_linear(x, w, s, b)
    assert torch.equal(got, want.clamp_min(0) if relu else want)
    for device in ("cpu", "meta"):
        with pytest.raises(ValueError, match="int8_weight_only_linear: activation must be 'none' or 'relu', got 'gelu'"):
            ops.int8_weight_only_linear(*(t.to(device) for t in (x, w, s, b)), "gelu")


def test_int8_linear_vector_setting_is_checked():
    from gpuopt import _C

    assert _C.int8_linear_vector() == 0
    try:
        assert _C.int8_linear_vector(1) == 0 and _C.int8_linear_vector() == 1
        for bad in (3, -1):
            with pytest.raises(ValueError, match=f"vector must be 0 \\(chosen from K\\), 1 or 2, got {bad}"):
                _C.int8_linear_vector(bad)
        assert _C.int8_linear_vector() == 1
    finally:
        _C.int8_linear_vector(0)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("m,k", [(1, 2048), (3, 528), (20, 512)])
def test_cuda_relu_in_each_kernel(m, k, rng):
    # one row of a wide matrix: SIMT; K % 64 != 0: SIMT; 20 rows: the dequantized GEMM
    x, w, s, b = _inputs((m,), 4000, k, torch.float16, rng, device="cuda")
    _check_relu(ops.int8_weight_only_linear(x, w, s, b, "relu"), x, w, s, b)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("lead", [(1,), (5,), (2, 8)])
@pytest.mark.parametrize("scales_fp32", [True, False])
def test_float32_activations_on_cuda(lead, scales_fp32, rng):
    x, w, s, b = _inputs(lead, 77, 128, torch.float32, rng, scales_fp32=scales_fp32, device="cuda")
    _check(ops.int8_weight_only_linear(x, w, s, b), x, w, s, b)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_unaligned_x_takes_the_dequantized_path(dtype, rng, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # float32's tolerance is fp32's
    x, w, s, b = _inputs((3,), 10, 64, dtype, rng, device="cuda")
    base = torch.empty(3 * 64 + 1, dtype=dtype, device="cuda")
    xu = base[1:].view(3, 64).copy_(x)  # contiguous, but one element past a 16-byte boundary
    _check(ops.int8_weight_only_linear(xu, w, s, b), xu, w, s, b)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("m,n,k,dtype,which", [
    (1, 4000, 512, torch.float16, "int8_linear<__half, 1, false>"),
    (1, 2048, 2048, torch.float16, "int8_linear_mma<__half, 1, 16, 2, false>"),
    (1, 2048, 512, torch.bfloat16, "int8_linear_mma<__nv_bfloat16, 1, 4, 2, false>"),
    (1, 2048, 576, torch.bfloat16, "int8_linear_mma<__nv_bfloat16, 1, 8, 1, false>"),
    (1, 6144, 2048, torch.float16, "int8_linear<__half, 1, false>"),
    (2, 6144, 2048, torch.float16, "int8_linear_mma<__half, 1, 8, 2, false>"),
    (2, 50272, 2048, torch.float16, "int8_linear<__half, 2, false>"),
    (4, 50272, 2048, torch.float16, "int8_linear_mma<__half, 1, 8, 2, false>"),
    (1, 2048, 8192, torch.bfloat16, "int8_linear_mma<__nv_bfloat16, 1, 32, 2, false>"),
    (1, 4000, 4096, torch.bfloat16, "int8_linear_mma<__nv_bfloat16, 1, 16, 2, false>"),
    (9, 4000, 4096, torch.float16, "int8_linear_mma<__half, 2, 16, 2, false>"),
    (16, 256, 528, torch.float16, "int8_linear<__half, 16, false>"),
    (1, 256, 528, torch.bfloat16, "int8_linear<__nv_bfloat16, 1, false>"),
    (3, 256, 512, torch.float32, "int8_linear<float, 4, false>"),
    (17, 256, 512, torch.float16, None)])  # the dequantized GEMM
def test_decode_rows_run_the_int8_kernel(m, n, k, dtype, which, rng, kernels_run):
    # "auto" on this GPU (compute capability 8.0+): tensor cores for float16/bfloat16 with K % 64 == 0 from
    # two rows on (four for N > 16384), or K >= 4096, or N <= 2048, with two 16-byte loads per row and chunk
    # where K % 128 == 0 (chunks of 128, one 2-chunk batch per warp: K / 256 warps, 4 to 32; for N <= 2048
    # one chunk per warp, K / 128, up to 32), else one (chunks of 64, 4-chunk batches); one row of a wider,
    # shorter matrix (two of one wider than 16384) streams faster through the SIMT kernel.
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core kernel needs compute capability 8.0+")
    x, w, s, b = _inputs((m,), n, k, dtype, rng, device="cuda")
    names = kernels_run(lambda: ops.int8_weight_only_linear(x, w, s, b), "kernels::int8_linear")
    assert (which is None and not names) or (len(names) == 1 and which in names[0]), names


@pytest.mark.gpuopt_gpu
def test_each_kernel_runs_when_asked_and_tensor_cores_refuse_what_they_cannot_run(rng, kernels_run):
    from gpuopt import _C

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core kernel needs compute capability 8.0+")
    x, w, s, b = _inputs((4,), 256, 512, torch.float16, rng, device="cuda")
    try:
        _C.int8_linear_kernel("simt")
        simt = ops.int8_weight_only_linear(x, w, s, b)
        run = kernels_run(lambda: ops.int8_weight_only_linear(x, w, s, b), "kernels::int8_linear")
        assert "int8_linear<" in run[0]
        _C.int8_linear_kernel("tensor-core")
        run = kernels_run(lambda: ops.int8_weight_only_linear(x, w, s, b), "kernels::int8_linear")
        assert "int8_linear_mma" in run[0]
        # the same sums in another order: within the dtype's rounding of the result
        torch.testing.assert_close(ops.int8_weight_only_linear(x, w, s, b), simt, rtol=2e-3, atol=2e-3)
        with pytest.raises(ValueError, match=r"int8_linear_kernel is 'tensor-core', which needs float16 or "
                                             r"bfloat16 x \(got float32\), K a multiple of 64 \(got 512\)"):
            ops.int8_weight_only_linear(x.float(), w, s.float(), b.float())
        x2, w2, s2, b2 = _inputs((4,), 256, 528, torch.float16, rng, device="cuda")
        with pytest.raises(ValueError, match=r"\(got float16\), K a multiple of 64 \(got 528\)"):
            ops.int8_weight_only_linear(x2, w2, s2, b2)
    finally:
        _C.int8_linear_kernel("auto")


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_opcheck_on_cuda(dtype, rng):
    _assert_opcheck_passes(_inputs((2, 3), 40, 64, dtype, rng, device="cuda"))
    _assert_opcheck_passes(_inputs((33,), 40, 64, dtype, rng, bias=False, scales_fp32=False, device="cuda"))


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("m", [1, 7, 12, 33])
def test_captured_in_a_cuda_graph_replays_the_same_values(m, kernel, rng):
    x, w, s, b = _inputs((m,), 300, 1024, torch.float16, rng, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graph's docs advise
        ops.int8_weight_only_linear(x, w, s, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.int8_weight_only_linear(x, w, s, b)
    for _ in range(2):
        x.copy_(torch.randn(m, 1024, generator=rng).half())
        graph.replay()
        torch.cuda.synchronize()
        if m <= 16:  # the int8 kernel is deterministic; cuBLAS may pick another algorithm when captured
            assert torch.equal(out, ops.int8_weight_only_linear(x, w, s, b))
        _check(out, x, w, s, b)


@pytest.mark.gpuopt_gpu
def test_bad_inputs_on_cuda_are_typed_errors(rng):
    x, w, s, b = _inputs((2,), 4, 32, torch.float16, rng, device="cuda")
    with pytest.raises(ValueError, match=r"weight must be on x's device \(cuda:0\), got cpu"):
        ops.int8_weight_only_linear(x, w.cpu(), s, b)
    with pytest.raises(ValueError, match=r"scales must be on x's device \(cuda:0\), got cpu"):
        ops.int8_weight_only_linear(x, w, s.cpu(), b)
    with pytest.raises(TypeError, match="weight must be int8, got float16"):
        ops.int8_weight_only_linear(x, w.half(), s, b)
