"""The static-megakernel path on a GPU (compute capability 9.0+): its persistent step gives the eager static
step's logits and tokens, keeps parity with the fp32 reference in fp16, bf16 and int8wo, replays from a captured graph,
and gpuopt._C.DecodeProgram refuses what its kernel does not take, naming the argument."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import gpuopt  # noqa: E402
from gpuopt import _C  # noqa: E402
from gpuopt.llm import Models  # noqa: E402
from gpuopt.llm.measure import measure_decode  # noqa: E402
from gpuopt.llm.paths import Decoder  # noqa: E402

pytestmark = pytest.mark.gpuopt_gpu


@pytest.fixture(scope="module")
def opt125():
    try:
        _C.DecodeProgram(0, torch.float16)
    except ValueError as e:  # below compute capability 9.0, or a build without code for it
        pytest.skip(str(e))
    return Models("opt-125m", "cuda", seed=0)


@pytest.mark.parametrize(("precision", "tol"), [("fp16", 8e-3), ("bf16", 3e-2), ("int8wo", 8e-3)])
def test_the_persistent_step_gives_the_eager_steps_logits_and_tokens(opt125, precision, tol):
    """The same model's eager static step against the persistent one; int8wo: the same int8 weights and scales
    in both (gpuopt's int8 weight-only kernel in the eager step), so the fp16 tolerance."""
    prompt = opt125.prompt(1, 40)
    n = 24
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    model = opt125.candidate(precision, fused=False, fold=False)
    eager = Decoder(model, "static", prompt, n, gpuopt._C.StepClock(0, n), dtype)
    mega = Decoder(model, "static-megakernel", prompt, n, gpuopt._C.StepClock(0, n), dtype)
    try:
        assert mega.loop is not None and mega._program is not None
        assert mega._program.int8_weights == (precision == "int8wo")
        ref_tokens, ref_logits = eager.forced_logits(None, n)
        tokens, logits = mega.forced_logits(ref_tokens, n)
        # Every step fed the eager step's token: logits within half precision's rounding of the same math.
        scale = ref_logits.abs().amax(-1, keepdim=True)
        err = ((logits - ref_logits).abs() / scale).amax().item()
        assert err < tol, err
        agree = (tokens == ref_tokens).float().mean().item()
        assert agree >= 0.9, (tokens, ref_tokens)
        mega.loop.run()  # the C++ loop over the captured graphs, twice: the same tokens
        torch.cuda.synchronize()
        first = mega.tokens()
        mega.loop.run()
        torch.cuda.synchronize()
        assert torch.equal(mega.tokens(), first)
    finally:
        eager.close()
        mega.close()


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8wo"])
def test_the_path_keeps_parity_with_the_fp32_reference(opt125, precision):
    r = measure_decode(opt125, path="static-megakernel", precision=precision, prompt_len=32, new_tokens=24,
                       parity_tokens=16, max_time_s=0.3)
    assert r.parity is not None and r.parity.passed, r.parity.summary()
    assert r.tpot_ms["p50"] > 0 and r.fused_projections == 0 and r.attention == "model"


def test_the_path_refuses_fuse_and_a_batch(opt125):
    with pytest.raises(ValueError, match="fuse=True does not apply"):
        measure_decode(opt125, path="static-megakernel", fuse=True, prompt_len=8, new_tokens=4)
    with pytest.raises(ValueError, match="batch_size must be 1, got 2"):
        measure_decode(opt125, path="static-megakernel", batch_size=2, prompt_len=8, new_tokens=4)


def test_the_program_refuses_what_the_kernel_does_not_take(opt125):
    h = torch.float16
    p = _C.DecodeProgram(0, h)
    table = torch.zeros(64, 128, dtype=h, device="cuda")
    x = p.embed(table, torch.zeros(40, 128, dtype=h, device="cuda"), 2)
    with pytest.raises(TypeError, match="weight must be float16"):
        p.linear(x, [torch.zeros(16, 128, device="cuda")], [None])
    with pytest.raises(ValueError, match=r"weight 0 must be \[N, 128\]"):
        p.linear(x, [torch.zeros(20, 128, dtype=h, device="cuda")], [None])
    with pytest.raises(ValueError, match="activation id"):
        p.linear(7, [torch.zeros(16, 128, dtype=h, device="cuda")], [None])
    qkv = p.linear(x, [torch.zeros(96, 128, dtype=h, device="cuda")], [None])
    with pytest.raises(ValueError, match="head size must be 64 or 128, got 32"):
        cache = torch.zeros(1, 1, 8, 32, dtype=h, device="cuda")
        p.attention(qkv, cache, cache, 0.1)
    with pytest.raises(ValueError, match="3 \\* H \\* D"):
        cache = torch.zeros(1, 2, 8, 64, dtype=h, device="cuda")
        p.attention(qkv, cache, cache, 0.1)
    ids = torch.zeros(1, dtype=torch.long, device="cuda")
    with pytest.raises(RuntimeError, match="call finish"):
        p.run(ids, ids)
    p.linear(x, [torch.zeros(64, 128, dtype=h, device="cuda")], [None], output=False,
             plain=torch.zeros(64, dtype=h, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert p.blocks == sms
    for bad in (sms + 1, -1):
        with pytest.raises(ValueError, match=rf"blocks: must be 0 \(one block an SM, {sms}\) or 1 to {sms}, "
                                             rf"got {bad}"):
            p.blocks = bad
    p.blocks = 3
    assert p.blocks == 3
    p.blocks = 0
    assert p.blocks == sms
    p.finish()
    with pytest.raises(RuntimeError, match="finished"):
        p.embed(table)
    with pytest.raises(RuntimeError, match="DecodeProgram.blocks: the program is finished"):
        p.blocks = 2
    with pytest.raises(TypeError, match="ids must be int64"):
        p.run(ids.int(), ids)
    with pytest.raises(ValueError, match="position must hold one value"):
        p.run(ids, torch.zeros(2, dtype=torch.long, device="cuda"))
    with pytest.raises(ValueError, match=r"trace must be \["):
        p.run(ids, ids, torch.zeros(3, dtype=torch.long, device="cuda"))
    tokens, column = torch.zeros(1, 4, dtype=torch.long, device="cuda"), torch.zeros(1, dtype=torch.long, device="cuda")
    with pytest.raises(ValueError, match="tokens and column come together .*got tokens alone"):
        p.run(ids, ids, None, tokens)
    with pytest.raises(ValueError, match="got column alone"):
        p.run(ids, ids, None, None, column)
    with pytest.raises(TypeError, match="tokens must be an int64 tensor on cuda:0, got int32"):
        p.run(ids, ids, None, tokens.int(), column)
    with pytest.raises(TypeError, match="column must be an int64 tensor on cuda:0, got int64 on cpu"):
        p.run(ids, ids, None, tokens, column.cpu())
    with pytest.raises(ValueError, match=r"tokens must be contiguous, got strides \[8, 2\]"):
        p.run(ids, ids, None, torch.zeros(1, 8, dtype=torch.long, device="cuda")[:, ::2], column)
    with pytest.raises(ValueError, match=r"tokens must be \[T\] or \[1, T\] .*got \[2, 2\]"):
        p.run(ids, ids, None, tokens.view(2, 2), column)
    with pytest.raises(ValueError, match="column must hold one value, got 2"):
        p.run(ids, ids, None, tokens, torch.zeros(2, dtype=torch.long, device="cuda"))
    q = _C.DecodeProgram(0, h)  # its last operation writes an activation only: no logits to take the argmax of
    q.linear(q.embed(table, torch.zeros(40, 128, dtype=h, device="cuda"), 2),
             [torch.zeros(16, 128, dtype=h, device="cuda")], [None])
    q.finish()
    with pytest.raises(ValueError, match="last operation's plain output .*has none"):
        q.run(ids, ids, None, tokens, column)
    q = _C.DecodeProgram(0, h)  # 80 logits, but a table of 64 tokens: the next step could not embed the argmax
    q.linear(q.embed(table, torch.zeros(40, 128, dtype=h, device="cuda"), 2),
             [torch.zeros(80, 128, dtype=h, device="cuda")], [None], output=False,
             plain=torch.zeros(80, dtype=h, device="cuda"))
    q.finish()
    with pytest.raises(ValueError, match=r"its 80 rows must be at most the embedding's vocab \(64\)"):
        q.run(ids, ids, None, tokens, column)
    with pytest.raises(TypeError, match="dtype must be float16 or bfloat16"):
        _C.DecodeProgram(0, torch.float32)


@pytest.mark.parametrize("offset", [0.0, 8.0])
@pytest.mark.parametrize("h", [torch.float16, torch.bfloat16])
def test_a_small_program_computes_its_linear_layer(opt125, h, offset):
    """embed -> linear with a layer norm, a bias, a ReLU and a residual -> linear into a plain output, against
    the same in float32 rounded where the model rounds. The norm is folded (its scale on the input, its mean
    taken off in the epilogue): with offset 8 the input's mean is about 6 times its deviation, and the result
    must hold as well. The tolerances are about 5x (fp16) and 2x (bf16) the worst error of the fold's float32
    emulation over 20 seeds at offset 8 (the fold's rounding error grows with the mean)."""
    torch.manual_seed(0)
    tol = 2e-2 if h == torch.float16 else 8e-2
    hidden, n = 192, 320
    table = (torch.randn(10, hidden, device="cuda") + offset).to(h)
    pos = torch.randn(12, hidden, dtype=h, device="cuda")
    g, b = torch.rand(hidden, dtype=h, device="cuda") + 0.5, torch.randn(hidden, dtype=h, device="cuda")
    w1, b1 = torch.randn(hidden, hidden, dtype=h, device="cuda") / 16, torch.randn(hidden, dtype=h, device="cuda")
    w2 = torch.randn(n, hidden, dtype=h, device="cuda") / 16
    out = torch.zeros(1, n, dtype=h, device="cuda")
    p = _C.DecodeProgram(0, h)
    x = p.embed(table, pos, 2)
    y = p.linear(x, [w1[:64].contiguous(), w1[64:].contiguous()], [b1[:64].contiguous(), b1[64:].contiguous()],
                 norm_weight=g, norm_bias=b, eps=1e-5, residual=x, relu=True)
    p.linear(y, [w2], [None], output=False, plain=out)
    assert p.stages == 0 and p.max_stages == 0
    with pytest.raises(RuntimeError, match="call finish"):
        p.stages = 2
    p.finish()
    default = p.stages
    assert 2 <= default <= 5
    most = p.max_stages
    assert most >= default
    for stages in (most, 2, 3):  # the ring's depth changes when tiles arrive, not what they sum to
        p.stages = stages
        assert p.stages == stages
        for token, at in ((3, 0), (7, 5), (3, 9)):
            p.run(torch.tensor([token], device="cuda"), torch.tensor([at], device="cuda"))
            e = (table[token].float() + pos[at + 2].float()).to(h).float()
            ln = torch.nn.functional.layer_norm(e, (hidden,), g.float(), b.float(), 1e-5).to(h).float()
            y_ref = (torch.relu((ln @ w1.float().t() + b1.float()).to(h).float()) + e).to(h).float()
            ref = y_ref @ w2.float().t()
            torch.testing.assert_close(out.float().view(-1), ref, rtol=tol, atol=tol)
    for bad in (1, most + 1, -1):
        with pytest.raises(ValueError, match=f"stages: must be 0 \\(the default, {default}\\) or 2 to {most} "
                                             f".*got {bad}"):
            p.stages = bad
    p.stages = 0
    assert p.stages == default


def test_a_normed_operation_with_more_tiles_than_blocks_and_a_partial_segment(opt125):
    """A linear operation with a (folded) layer norm over K = 1344 (a segment of 1024 and one of 320), two
    parts, biases and a residual, with 3 more tiles than blocks: some blocks take two tiles (the norm's
    statistics reduced once, at the first; the second tile's shift, norm sum and residual asked for during the
    first), against float32 rounded where the model rounds; the input's mean is about twice its deviation."""
    torch.manual_seed(3)
    h, k = torch.float16, 1344
    p = _C.DecodeProgram(0, h)
    n = 16 * (p.blocks + 3)
    table = (torch.randn(10, k, device="cuda") + 3).to(h)
    pos = torch.randn(12, k, dtype=h, device="cuda")
    w0 = (torch.randn(n, k, device="cuda") / k ** 0.5).to(h)
    wa = (torch.randn(n - 48, k, device="cuda") / k ** 0.5).to(h)
    wb = (torch.randn(48, k, device="cuda") / k ** 0.5).to(h)
    ba, bb = torch.randn(n - 48, dtype=h, device="cuda"), torch.randn(48, dtype=h, device="cuda")
    g, b = torch.rand(k, dtype=h, device="cuda") + 0.5, torch.randn(k, dtype=h, device="cuda")
    out = torch.zeros(n, dtype=h, device="cuda")
    x = p.embed(table, pos, 2)
    r = p.linear(x, [w0], [None])
    p.linear(x, [wa, wb], [ba, bb], norm_weight=g, norm_bias=b, eps=1e-5, residual=r, output=False, plain=out)
    p.finish()
    w, bias = torch.cat([wa, wb]).float(), torch.cat([ba, bb]).float()
    for token, at in ((3, 0), (7, 5)):
        p.run(torch.tensor([token], device="cuda"), torch.tensor([at], device="cuda"))
        e = (table[token].float() + pos[at + 2].float()).half().float()
        r_ref = (e @ w0.float().t()).half().float()
        ln = torch.nn.functional.layer_norm(e, (k,), g.float(), b.float(), 1e-5).half().float()
        ref = ((ln @ w.t() + bias).half().float() + r_ref).half().float()
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def _greedy_steps(p, out, ids, at, tokens, column, steps, reference):
    """Runs `steps` greedy steps of program p from ids/at/column; each against a plain run of the same step (the
    same output) and reference(token, position) (the output in float32); returns the argmaxes."""
    slots = tokens.shape[-1]
    picked = []
    for _ in range(steps):
        token, where, col = int(ids), int(at), int(column)
        p.run(ids.clone(), at.clone())  # without greedy decoding
        plain = out.clone()
        p.run(ids, at, None, tokens, column)
        torch.cuda.synchronize()
        assert torch.equal(out, plain)
        torch.testing.assert_close(out.float().view(-1), reference(token, where), rtol=2e-2, atol=2e-2)
        best = int(out.float().argmax())
        assert int(ids) == best
        assert int(tokens.view(-1)[min(col, slots - 1)]) == best
        assert int(at) == where + 1 and int(column) == col + 1
        picked.append(best)
    return picked


@pytest.mark.parametrize("int8", [False, True])
def test_greedy_decoding_in_the_step_writes_the_first_largest_logits_index_and_advances(opt125, int8):
    """DecodeProgram.run with tokens and column: the argmax of the last operation's plain output goes into ids
    and tokens[column] (the last slot once column passes it), position and column advance by one, and the next
    step embeds that token; the plain output is the same as without greedy decoding. The last operation (with a
    layer norm folded, a bias, and int8 weights with their scales or fp16 ones) has 33 tiles a block and 5 more:
    the tiles past the 32 whose epilogue rows (shift, norm sum, scale) a block holds ask theirs a tile ahead.
    Two of those rows are equal and the largest: the first is taken, as torch.argmax takes it."""
    torch.manual_seed(5)
    h, k, slots = torch.float16, 128, 3
    p = _C.DecodeProgram(0, h)
    n = 16 * (33 * p.blocks + 5)
    table = torch.randn(n, k, dtype=h, device="cuda")
    pos = torch.randn(12, k, dtype=h, device="cuda")
    g, b = torch.rand(k, dtype=h, device="cuda") + 0.5, torch.randn(k, dtype=h, device="cuda")
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(h)
    bias = torch.randn(n, dtype=h, device="cuda")
    first, second = 16 * (32 * p.blocks + 7) + 3, n - 2  # both in tiles a block does not hold the rows of
    w[second] = w[first]
    bias[first] = bias[second] = 40.0
    if int8:
        q, scales = _int8(w)
        weight, extra, w_ref = q, {"scales": [scales]}, q.float() * scales[:, None]
    else:
        weight, extra, w_ref = w, {}, w.float()
    out = torch.zeros(n, dtype=h, device="cuda")
    p.linear(p.embed(table, pos, 2), [weight], [bias], norm_weight=g, norm_bias=b, eps=1e-5, output=False,
             plain=out, **extra)
    p.finish()

    def reference(token, at):
        e = (table[token].float() + pos[at + 2].float()).half().float()
        ln = torch.nn.functional.layer_norm(e, (k,), g.float(), b.float(), 1e-5).half().float()
        return (ln @ w_ref.t() + bias.float()).half().float()

    ids, at = torch.tensor([[3]], device="cuda"), torch.tensor([0], device="cuda")
    tokens = torch.full((1, slots), -1, dtype=torch.long, device="cuda")
    column = torch.zeros(1, dtype=torch.long, device="cuda")
    picked = _greedy_steps(p, out, ids, at, tokens, column, slots + 2, reference)  # columns 3, 4: the last slot
    assert out[first] == out[second] == out.max()
    assert picked == [first] * (slots + 2)
    assert tokens.tolist() == [[first] * slots]


def test_greedy_decoding_where_most_blocks_have_no_row_and_every_logit_is_negative(opt125):
    """64 rows (4 tiles: most blocks have no tile of the last operation but still take part in the step's
    argmax) whose largest value, negative, is in two equal rows: the first is taken; tokens [T] (one dimension)."""
    torch.manual_seed(6)
    h, k = torch.float16, 128
    p = _C.DecodeProgram(0, h)
    n = 64
    table = torch.randn(n, k, dtype=h, device="cuda")
    w = (torch.randn(n, k, device="cuda") / k ** 0.5 / 8).to(h)
    bias = torch.full((n,), -40.0, dtype=h, device="cuda")
    w[50] = w[21]
    bias[21] = bias[50] = -3.0
    out = torch.zeros(1, n, dtype=h, device="cuda")
    p.linear(p.embed(table, torch.zeros(8, k, dtype=h, device="cuda"), 0), [w], [bias], output=False, plain=out)
    p.finish()

    def reference(token, at):
        return (table[token].float() @ w.float().t() + bias.float()).half().float()

    ids, at = torch.tensor([7], device="cuda"), torch.tensor([0], device="cuda")
    tokens = torch.full((4,), -1, dtype=torch.long, device="cuda")
    column = torch.zeros((), dtype=torch.long, device="cuda")
    picked = _greedy_steps(p, out, ids, at, tokens, column, 3, reference)
    assert float(out.max()) < 0 and out[0, 21] == out[0, 50] == out.max()
    assert picked == [21, 21, 21]
    assert tokens.tolist() == [21, 21, 21, -1]


def test_the_path_runs_half_precisions_and_int8_only(opt125):
    with pytest.raises(ValueError, match="runs fp16, bf16 and int8wo, got precision 'fp32'"):
        measure_decode(opt125, path="static-megakernel", precision="fp32", prompt_len=8, new_tokens=4)


def _int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w's int8 rows and per-row scales (as gpuopt.quant's weight-only layers take them)."""
    scales = (w.float().abs().amax(1) / 127).clamp_min(1e-12)
    return torch.round(w.float() / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


@pytest.mark.parametrize("k", [1344, 3392])
@pytest.mark.parametrize("h", [torch.float16, torch.bfloat16])
def test_a_small_program_with_int8_weights_computes_its_linear_layers(opt125, h, k):
    """embed -> an int8 linear of two parts with a layer norm, biases, a ReLU and a residual over K (int8
    segments are 2048 values: 1344 is one short segment, 3392 a whole one and a short one of 1344, whose warps
    0-4 take a second chunk) -> an int8 linear with 3 more tiles than blocks into a plain output, at the
    default stages, the most and 2, against the dequantized weights in float32 rounded where the model rounds;
    the input's mean about twice its deviation. And the program's refusals of int8 weights."""
    torch.manual_seed(4)
    tol = 2e-2 if h == torch.float16 else 8e-2
    p = _C.DecodeProgram(0, h)
    n = 16 * (p.blocks + 3)
    table = (torch.randn(10, k, device="cuda") + 3).to(h)
    pos = torch.randn(12, k, dtype=h, device="cuda")
    g, b = torch.rand(k, dtype=h, device="cuda") + 0.5, torch.randn(k, dtype=h, device="cuda")
    qa, sa = _int8(torch.randn(k - 48, k, device="cuda") / k ** 0.5)
    qb, sb = _int8(torch.randn(48, k, device="cuda") / k ** 0.5)
    ba, bb = torch.randn(k - 48, dtype=h, device="cuda"), torch.randn(48, dtype=h, device="cuda")
    q2, s2 = _int8(torch.randn(n, k, device="cuda") / k ** 0.5)
    out = torch.zeros(n, dtype=h, device="cuda")
    x = p.embed(table, pos, 2)
    with pytest.raises(ValueError, match=r"int8 weights need scales, one float tensor .* \(1\), got None"):
        p.linear(x, [q2], [None])
    with pytest.raises(ValueError, match="scales 0 must have 16 values"):
        p.linear(x, [q2[:16]], [None], scales=[s2])
    with pytest.raises(ValueError, match="scales apply to int8 weights only"):
        p.linear(x, [torch.zeros(16, k, dtype=h, device="cuda")], [None], scales=[s2[:16]])
    with pytest.raises(TypeError, match="weight 1 must be int8"):
        p.linear(x, [qa, torch.zeros(48, k, dtype=h, device="cuda")], [None, None], scales=[sa, sb])
    y = p.linear(x, [qa, qb], [ba, bb], norm_weight=g, norm_bias=b, eps=1e-5, residual=x, relu=True,
                 scales=[sa.to(h), sb])  # scales of any floating type
    with pytest.raises(ValueError, match="weights must all be int8 or all"):
        p.linear(y, [torch.zeros(16, k, dtype=h, device="cuda")], [None])
    p.linear(y, [q2], [None], output=False, plain=out, scales=[s2])
    p.finish()
    assert p.int8_weights and p.weight_bytes == (k + n) * k
    default, most = p.stages, p.max_stages
    assert default == min(5, most)
    w1 = torch.cat([qa.float() * sa.to(h).float()[:, None], qb.float() * sb[:, None]])
    w2 = q2.float() * s2[:, None]
    bias = torch.cat([ba, bb]).float()
    for stages in (default, most, 2):
        p.stages = stages
        for token, at in ((3, 0), (7, 5)):
            p.run(torch.tensor([token], device="cuda"), torch.tensor([at], device="cuda"))
            e = (table[token].float() + pos[at + 2].float()).to(h).float()
            ln = torch.nn.functional.layer_norm(e, (k,), g.float(), b.float(), 1e-5).to(h).float()
            y_ref = (torch.relu((ln @ w1.t() + bias).to(h).float()) + e).to(h).float()
            ref = y_ref @ w2.t()
            torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("h", [torch.float16, torch.bfloat16])
def test_int8_linears_of_several_tiles_a_block_with_a_norm_a_relu_and_a_residual(opt125, h):
    """int8 weights with K in one stage, several tiles a block: the block's first tile takes the norm's
    statistics to the epilogue warp (each consumer warp's sums; the epilogue warp takes the mean and deviation),
    its later tiles do not. Two linears on the embedding, each of 2 tiles a block and 3 tiles in 3 blocks: the
    first with a bias only; the second with a layer norm, a bias and a ReLU, adding the first's output as its
    residual into a plain output. The second's first tile in a block is the block's third tile (sums and
    statistics in the handoff's buffer 0) or, where the first had 3 tiles, its fourth (buffer 1). The tokens'
    inputs have different statistics (a mean of 3 and a deviation of 1.4, a mean of -6 and a deviation of 4.1),
    run in turn, so that statistics of the wrong token, buffer or launch would be far off. The norm's eps (0.5,
    against the first token's variance of 2) moves that token's outputs by up to a tenth, so the epilogue must
    take the operation's eps. At the default stages and 2, against the dequantized weights in float32 rounded
    where the model rounds."""
    torch.manual_seed(8)
    tol = 2e-2 if h == torch.float16 else 8e-2
    p = _C.DecodeProgram(0, h)
    k, n = 1536, 16 * (2 * p.blocks + 3)
    table = torch.randn(10, k, device="cuda")
    table[3] += 3
    table[7] = 4 * table[7] - 6
    table = table.to(h)
    pos = torch.randn(12, k, dtype=h, device="cuda")
    g, b = torch.rand(k, dtype=h, device="cuda") + 0.5, torch.randn(k, dtype=h, device="cuda")
    q1, s1 = _int8(torch.randn(n, k, device="cuda") / k ** 0.5)
    q2, s2 = _int8(torch.randn(n, k, device="cuda") / k ** 0.5)
    b1, b2 = torch.randn(n, dtype=h, device="cuda"), torch.randn(n, dtype=h, device="cuda")
    out = torch.zeros(n, dtype=h, device="cuda")
    x = p.embed(table, pos, 2)
    a = p.linear(x, [q1], [b1], scales=[s1])
    p.linear(x, [q2], [b2], norm_weight=g, norm_bias=b, eps=0.5, relu=True, residual=a, output=False, plain=out,
             scales=[s2])
    p.finish()
    w1, w2 = q1.float() * s1[:, None], q2.float() * s2[:, None]
    for stages in (p.stages, 2):
        p.stages = stages
        for token, at in ((3, 0), (7, 5), (3, 1)):
            p.run(torch.tensor([token], device="cuda"), torch.tensor([at], device="cuda"))
            e = (table[token].float() + pos[at + 2].float()).to(h).float()
            a_ref = (e @ w1.t() + b1.float()).to(h).float()
            ln = torch.nn.functional.layer_norm(e, (k,), g.float(), b.float(), 0.5).to(h).float()
            y = torch.relu((ln @ w2.t() + b2.float()).to(h).float()).to(h).float()
            ref = (y + a_ref).to(h).float()
            torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


def _finish_attention_program(p, heads: int, head_dim: int, length: int):
    """embed -> q/k/v -> attention -> an identity linear into a plain output, added to p and finished, on fp16
    tensors drawn in this order: table [4, H * D], q/k/v weight, key cache, value cache [1, H, length, D].
    Returns them and the plain output."""
    h = torch.float16
    hidden = heads * head_dim
    table = torch.randn(4, hidden, dtype=h, device="cuda")
    w = torch.randn(3 * hidden, hidden, dtype=h, device="cuda") / hidden ** 0.5
    k_cache = torch.randn(1, heads, length, head_dim, dtype=h, device="cuda")
    v_cache = torch.randn(1, heads, length, head_dim, dtype=h, device="cuda")
    out = torch.zeros(hidden, dtype=h, device="cuda")
    a = p.attention(p.linear(p.embed(table), [w], [None]), k_cache, v_cache, head_dim ** -0.5)
    p.linear(a, [torch.eye(hidden, dtype=h, device="cuda")], [None], output=False, plain=out)
    p.finish()
    return table, w, k_cache, v_cache, out


def _attention_reference(k_cache, v_cache, q, at, scale):
    """Attention of the queries q [H, D] over cache rows 0 .. at, in float32, the heads' outputs in one vector."""
    keys = k_cache[0, :, :at + 1].float()
    att = torch.softmax((keys @ q.unsqueeze(-1)).squeeze(-1) * scale, -1)
    return (att.unsqueeze(1) @ v_cache[0, :, :at + 1].float()).reshape(-1)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_small_programs_attention_matches_torch_at_the_cache_ends(opt125, head_dim):
    """embed -> q/k/v -> attention over a cache of 1100 rows (positions 0, 5, either side of a pass of cached
    rows read into registers, and the last) -> an identity linear into a plain output, against the same in
    float32; and a linear whose K is a full segment and a part."""
    torch.manual_seed(1)
    h, heads, length = torch.float16, 2, 1100
    rows_a_pass = 16384 // head_dim  # the kernel's pass: 256 rows (head size 64) or 128 (128)
    hidden = heads * head_dim
    scale = head_dim ** -0.5
    p = _C.DecodeProgram(0, h)
    table, w, k_cache, v_cache, out = _finish_attention_program(p, heads, head_dim, length)
    assert p.max_position == length
    for token, at in ((1, 0), (2, 5), (3, rows_a_pass - 1), (1, rows_a_pass), (2, rows_a_pass + 1),
                      (3, length - 1)):
        q, k, v = (table[token].float() @ w.float().t()).half().float().view(3, heads, head_dim)
        # The rows either side of a pass's end, where cached, weigh a third or more each (a score of 6 against
        # about N(0, 1) for the others) with values of +3 and -2: a row dropped or counted twice there moves the
        # output by about 0.4 or more.
        for row, value in ((rows_a_pass - 1, 3.0), (rows_a_pass, -2.0)):
            if row < at:
                k_cache[0, :, row] = (q * (6.0 / (scale * (q * q).sum(-1, keepdim=True)))).half()
                v_cache[0, :, row] = value
        keys_before = k_cache.clone()
        p.run(torch.tensor([token], device="cuda"), torch.tensor([at], device="cuda"))
        torch.testing.assert_close(k_cache[0, :, at].float(), k, rtol=2e-3, atol=2e-3)  # written at the position
        torch.testing.assert_close(v_cache[0, :, at].float(), v, rtol=2e-3, atol=2e-3)
        assert torch.equal(k_cache[0, :, :at], keys_before[0, :, :at])  # rows before the position untouched
        ref = _attention_reference(k_cache, v_cache, q, at, scale)
        torch.testing.assert_close(out.float(), ref, rtol=3e-3, atol=3e-3)

    # Where the work went: each operation's tiles (heads) dealt on from the block where the one before stopped.
    trace = torch.full((p.blocks, p.n_ops, 2), -1, dtype=torch.int64, device="cuda")
    p.run(torch.tensor([1], device="cuda"), torch.tensor([5], device="cuda"), trace)
    ran = (trace[:, :, 1] != -1).cpu()
    starts, ends = trace[:, :, 0].cpu()[ran], trace[:, :, 1].cpu()[ran]
    assert (starts != -1).all() and (starts <= ends).all()  # where an operation ran: its input in, then its end
    first = 0
    for op, n in ((1, 3 * hidden // 16), (2, heads), (3, hidden // 16)):  # q/k/v tiles, heads, the identity's tiles
        assert set(ran[:, op].nonzero().flatten().tolist()) == {(first + t) % p.blocks for t in range(n)}, op
        first = (first + n) % p.blocks

    k = 1344  # a segment of 1024 values and one of 320
    big = torch.randn(3, k, dtype=h, device="cuda")
    wk = torch.randn(48, k, dtype=h, device="cuda") / k ** 0.5
    res = torch.zeros(48, dtype=h, device="cuda")
    p = _C.DecodeProgram(0, h)
    p.linear(p.embed(big, torch.zeros(8, k, dtype=h, device="cuda")), [wk], [None], output=False, plain=res)
    p.finish()
    p.run(torch.tensor([2], device="cuda"), torch.tensor([0], device="cuda"))
    torch.testing.assert_close(res.float(), big[2].float() @ wk.float().t(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("int8", [False, True])
def test_an_input_of_8192_values_with_and_without_a_layer_norm(opt125, int8):
    """K = 8192 (the most): every thread's four 16-byte words of the input, asked for at once, then waited for a
    segment at a time (8 segments of fp16 weights, 4 of int8), with and without a (folded) norm."""
    torch.manual_seed(2)
    h, k = torch.float16, 8192
    big = torch.randn(2, k, dtype=h, device="cuda")
    w = torch.randn(32, k, dtype=h, device="cuda") / k ** 0.5
    g, b = torch.rand(k, dtype=h, device="cuda") + 0.5, torch.randn(k, dtype=h, device="cuda")
    plain, normed = torch.zeros(32, dtype=h, device="cuda"), torch.zeros(32, dtype=h, device="cuda")
    p = _C.DecodeProgram(0, h)
    x = p.embed(big, torch.zeros(4, k, dtype=h, device="cuda"))
    if int8:
        q, s = _int8(w)
        w = q.float() * s[:, None]  # the reference: the weights as the kernel's sums see them
        p.linear(x, [q], [None], output=False, plain=plain, scales=[s])
        p.linear(x, [q], [None], norm_weight=g, norm_bias=b, output=False, plain=normed, scales=[s])
    else:
        p.linear(x, [w], [None], output=False, plain=plain)
        p.linear(x, [w], [None], norm_weight=g, norm_bias=b, output=False, plain=normed)
    p.finish()
    p.run(torch.tensor([1], device="cuda"), torch.tensor([0], device="cuda"))
    e = big[1].float()
    torch.testing.assert_close(plain.float(), e @ w.float().t(), rtol=1e-2, atol=1e-2)
    ln = torch.nn.functional.layer_norm(e, (k,), g.float(), b.float(), 1e-5).half().float()
    torch.testing.assert_close(normed.float(), ln @ w.float().t(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_block_with_two_heads_computes_each_heads_attention(opt125, head_dim):
    """A grid of 4 blocks and 6 heads: the q/k/v linear's 72 or 144 tiles are a multiple of 4, so the attention's
    heads are dealt from block 0 again and blocks 0 and 1 take two heads each (heads 0 and 4, 1 and 5), over up
    to 599 cached rows and the new one (three passes of 256 rows, or five of 128). Every head's output, read
    through an identity linear into a plain output, against the same in float32: a head a block takes second must
    not read or overwrite what its first left. The 4 blocks also take 18 or 36 tiles each of the q/k/v linear."""
    torch.manual_seed(4)
    heads, length = 6, 600
    assert (3 * heads * head_dim // 16) % 4 == 0  # the attention's heads dealt from block 0
    scale = head_dim ** -0.5
    p = _C.DecodeProgram(0, torch.float16)
    p.blocks = 4
    table, w, k_cache, v_cache, out = _finish_attention_program(p, heads, head_dim, length)
    assert p.blocks == 4
    for token, at in ((1, 0), (2, 300), (3, length - 1)):
        out.zero_()
        q, k, v = (table[token].float() @ w.float().t()).half().float().view(3, heads, head_dim)
        p.run(torch.tensor([token], device="cuda"), torch.tensor([at], device="cuda"))
        torch.testing.assert_close(k_cache[0, :, at].float(), k, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(v_cache[0, :, at].float(), v, rtol=2e-3, atol=2e-3)
        ref = _attention_reference(k_cache, v_cache, q, at, scale)
        torch.testing.assert_close(out.float(), ref, rtol=3e-3, atol=3e-3)
    trace = torch.full((4, p.n_ops, 2), -1, dtype=torch.int64, device="cuda")
    p.run(torch.tensor([1], device="cuda"), torch.tensor([5], device="cuda"), trace)
    assert (trace[:, 2, 1] != -1).all()  # every block ran an attention


def test_a_block_takes_several_heads_where_there_are_more_heads_than_blocks(opt125):
    """Heads beyond the grid are taken in turn: with 8 heads more than blocks, over 530 cached rows (three passes),
    the step ends (no wait runs out) and every head's key and value are in the cache at the position. (Their
    attention's output, more than a linear's 8192 input values, is not read here; the test above reads two heads'
    a block on a grid of 4.)"""
    torch.manual_seed(3)
    h, d, length, at = torch.float16, 64, 600, 530
    heads = _C.DecodeProgram(0, h).blocks + 8
    table = torch.randn(3, 64, dtype=h, device="cuda")
    w = torch.randn(3 * heads * d, 64, dtype=h, device="cuda") / 8
    k_cache = torch.randn(1, heads, length, d, dtype=h, device="cuda")
    v_cache = torch.randn(1, heads, length, d, dtype=h, device="cuda")
    p = _C.DecodeProgram(0, h)
    p.attention(p.linear(p.embed(table), [w], [None]), k_cache, v_cache, d ** -0.5)
    p.finish()
    p.run(torch.tensor([1], device="cuda"), torch.tensor([at], device="cuda"))
    torch.cuda.synchronize()
    q, k, v = (table[1].float() @ w.float().t()).half().float().view(3, heads, d)
    torch.testing.assert_close(k_cache[0, :, at].float(), k, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(v_cache[0, :, at].float(), v, rtol=2e-3, atol=2e-3)
