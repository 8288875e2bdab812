"""The step before a quantized linear layer folded into its quantization, on the CPU: quantize_rowwise's
prologue (norm, affine, activation) against torch's own modules, its argument errors and opcheck; the
fold found by one traced run (which producers fold, which stay and why, the model's output unchanged up
to the quantization), layers reading one tensor sharing its quantization, and the no-fold token."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpuopt import Config
from gpuopt.quant import Int8Linear
from gpuopt.quant.prologue import QuantizingNorm, SharedQuantization, fold_prologues

torchvision = pytest.importorskip("torchvision")
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def _dequantized(x, dtype, **kw):
    q, s = torch.ops.gpuopt.quantize_rowwise(x, dtype, **kw)
    return q.float() * s


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("name, kw, module", [
    ("layer", dict(norm="layer", eps=1e-6), lambda w, b: nn.LayerNorm(96, eps=1e-6)),
    ("layer affine", dict(norm="layer"), lambda w, b: _affine(nn.LayerNorm(96), w, b)),
    ("rms", dict(norm="rms", eps=1e-6), lambda w, b: _affine(nn.RMSNorm(96, eps=1e-6), w, None)),
    ("gelu", dict(activation="gelu"), lambda w, b: nn.GELU()),
    ("gelu tanh", dict(activation="gelu_tanh"), lambda w, b: nn.GELU(approximate="tanh")),
    ("relu", dict(activation="relu"), lambda w, b: nn.ReLU()),
    ("silu", dict(activation="silu"), lambda w, b: nn.SiLU()),
    ("layer then gelu", dict(norm="layer", activation="gelu"), lambda w, b: nn.Sequential(_affine(nn.LayerNorm(96), w, b), nn.GELU())),
])
def test_the_prologue_is_the_module_it_replaces(dtype, name, kw, module):
    torch.manual_seed(0)
    x = torch.randn(6, 96) * 3 + 1
    w, b = torch.randn(96), torch.randn(96)
    m = module(w, b)
    if "affine" in name or name in ("rms", "layer then gelu"):
        kw = {**kw, "weight": w}
        if name != "rms":
            kw["bias"] = b
    want = m(x).detach()
    got = _dequantized(x, dtype, **kw)
    # Within the quantization: half an int8 step of the row's absmax, or e4m3's 1/16 relative.
    amax = want.abs().amax(-1, keepdim=True)
    bound = amax / 254 if dtype == torch.int8 else torch.maximum(want.abs() / 16, amax / 448 * 2**-9)
    assert bool(((got - want).abs() <= bound * 1.001 + 1e-5).all()), name
    # and the scale is the absmax of the prologue's output, not of x
    _, s = torch.ops.gpuopt.quantize_rowwise(x, dtype, **kw)
    torch.testing.assert_close(s, amax / QMAX[dtype], rtol=1e-5, atol=0)


def _affine(m, w, b):
    with torch.no_grad():
        m.weight.copy_(w)
        if b is not None:
            m.bias.copy_(b)
    return m


@pytest.mark.parametrize("xtype", [torch.float32, torch.bfloat16])
def test_apply_quantize_rowwise_returns_the_prologue_output_and_its_quantization(xtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 3, 64).to(xtype), torch.randn(64), torch.randn(64)
    y, q, s = torch.ops.gpuopt.apply_quantize_rowwise(x, torch.int8, "layer", w, b, 1e-5)
    want = nn.functional.layer_norm(x.float(), (64,), w, b, 1e-5)
    assert y.dtype == xtype and y.shape == x.shape and q.shape == x.shape and s.shape == (5, 3, 1)
    torch.testing.assert_close(y, want.to(xtype), rtol=1e-5 if xtype == torch.float32 else 1e-2, atol=1e-5)
    q2, s2 = torch.ops.gpuopt.quantize_rowwise(x, torch.int8, "layer", w, b, 1e-5)
    assert torch.equal(q, q2) and torch.equal(s, s2)  # the same quantization, from float32
    torch.library.opcheck(torch.ops.gpuopt.apply_quantize_rowwise, (x, torch.float8_e4m3fn, "rms", w, None, 1e-6))
    with pytest.raises(ValueError, match="an RMS norm has no bias"):
        torch.ops.gpuopt.apply_quantize_rowwise(x, torch.int8, "rms", w, b)


def test_the_prologue_arguments_are_checked_and_the_operator_is_well_behaved():
    x, w = torch.randn(4, 32), torch.randn(32)
    torch.library.opcheck(torch.ops.gpuopt.quantize_rowwise, (x, torch.int8, "layer", w, torch.randn(32), 1e-5, "gelu"))
    torch.library.opcheck(torch.ops.gpuopt.quantize_rowwise, (x.bfloat16(), torch.float8_e4m3fn, "rms", w, None, 1e-6, "none"))
    q = torch.ops.gpuopt.quantize_rowwise
    with pytest.raises(ValueError, match="norm must be 'none', 'layer' or 'rms', got 'batch'"):
        q(x, torch.int8, norm="batch")
    with pytest.raises(ValueError, match="activation must be 'none', 'gelu', 'gelu_tanh', 'relu' or 'silu', got 'tanh'"):
        q(x, torch.int8, activation="tanh")
    with pytest.raises(ValueError, match="weight and bias are the norm's elementwise affine"):
        q(x, torch.int8, weight=w)
    with pytest.raises(ValueError, match="an RMS norm has no bias"):
        q(x, torch.int8, norm="rms", bias=w)
    with pytest.raises(TypeError, match="weight must be float32, got BFloat16"):
        q(x, torch.int8, norm="layer", weight=w.bfloat16())
    with pytest.raises(ValueError, match=r"bias must have shape \[K\] \(K = x's last dimension, 32\), got sizes \[31\]"):
        q(x, torch.int8, norm="layer", bias=w[:31])
    with pytest.raises(ValueError, match="eps must be finite and >= 0, got -1"):
        q(x, torch.int8, norm="layer", eps=-1.0)


class _Calls(TorchDispatchMode):
    """Counts the quantize operators run: ``n`` quantize_rowwise, ``applied`` apply_quantize_rowwise."""

    def __init__(self):
        super().__init__()
        self.n = self.applied = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.gpuopt.quantize_rowwise.default:
            self.n += 1
        if func is torch.ops.gpuopt.apply_quantize_rowwise.default:
            self.applied += 1
        return func(*args, **(kwargs or {}))


def _vit():
    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64,
                                               mlp_dim=128, num_classes=16).eval()
    nn.init.normal_(vit.heads.head.weight, std=0.2)  # torchvision starts the head at zero
    return vit


@pytest.mark.parametrize("precision", ["int8", pytest.param("fp8", marks=pytest.mark.skipif(
    __import__("gpuopt").quant.fp8_refusal(torch.device("cpu")) is not None, reason="no fp8 on this torch's CPU"))])
def test_a_vit_folds_its_norms_and_gelus_and_keeps_its_output(precision):
    vit, x = _vit(), torch.randn(4, 3, 32, 32)
    folded = Config(precision).apply(vit, x, device="cpu")
    plain = Config.parse(f"{precision}+no-fold").apply(vit, x, device="cpu")
    ref = Config("fp32").apply(vit, x, device="cpu")(x).float()
    note = folded.notes[-1]
    assert "2 gelu, 4 layer norm" in note and "encoder.ln: its output is read by __getitem__" in note, note
    block = folded.eager_module.encoder.layers[0]
    assert isinstance(block.ln_1, nn.Identity) and isinstance(block.ln_2, nn.Identity)
    assert isinstance(block.mlp[1], nn.Identity)
    assert block.self_attention.in_proj.prologue_norm == "layer" and block.mlp[3].prologue_activation == "gelu"
    assert not isinstance(folded.eager_module.encoder.ln, nn.Identity)  # read by x[:, 0]: kept
    assert not isinstance(plain.eager_module.encoder.layers[0].ln_1, nn.Identity)
    assert str(plain.config) == f"{precision}+no-fold"
    err = {name: float((p(x).float() - ref).norm() / ref.norm()) for name, p in (("fold", folded), ("plain", plain))}
    # The same quantization error with and without the fold (it only skips a 16-bit rounding).
    assert err["fold"] < 1.3 * err["plain"] + 0.005 and err["fold"] < (0.03 if precision == "int8" else 0.1), err
    with _Calls() as calls_fold:
        folded(x)
    with _Calls() as calls_plain:
        plain(x)
    assert calls_fold.n == calls_plain.n == 9  # 4 a block and the head: the fold changes what each does, not their number


class _Tangled(nn.Module):
    """A GELU whose output is also added, a layer norm feeding one quantized layer, and a ReLU in place."""

    def __init__(self):
        super().__init__()
        self.norm, self.a, self.act, self.b, self.relu, self.c = (nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU(),
                                                                  nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))

    def forward(self, x):
        h = self.act(self.a(self.norm(x)))
        y = self.b(h) + h
        return self.c(self.relu(y))


def test_a_producer_read_elsewhere_stays_and_says_why():
    torch.manual_seed(0)
    m, x = _Tangled().eval(), torch.randn(8, 32)
    p = Config("int8").apply(m, x, device="cpu")
    note = p.notes[-1]
    assert "1 layer norm, 1 relu" in note and "act: its output is read by add outside a quantized linear layer" in note
    em = p.eager_module
    assert isinstance(em.norm, nn.Identity) and isinstance(em.relu, nn.Identity) and isinstance(em.act, nn.GELU)
    assert isinstance(em.b, Int8Linear) and not em.b.prologue_active
    with torch.no_grad():
        ref = m(x)
    assert float((p(x).float() - ref).norm() / ref.norm()) < 0.03


def test_a_producer_whose_output_the_model_returns_stays():
    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.act, self.lin = nn.GELU(), nn.Linear(16, 16)

        def forward(self, x):
            h = self.act(x)
            return self.lin(h), h

    p = Config("int8").apply(Out().eval(), torch.randn(4, 16), device="cpu")
    assert "act: its output is returned by the model" in p.notes[-1], p.notes


def test_layers_reading_one_tensor_share_its_quantization():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                  vocab_size=100)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 16))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    shared = Config("int8").apply(bert, inputs, device="cpu")
    plain = Config.parse("int8+no-fold").apply(bert, inputs, device="cpu")
    note = shared.notes[-1]
    assert "2 groups of 3 layers reading one tensor quantize it once" in note and "2 gelu" in note, note
    # every norm but the last (read by the pooler through a slice, and returned) quantizes as it writes
    assert "4 norms read elsewhere too (a residual) quantize their output for their layers" in note, note
    em = shared.eager_module
    attn = em.encoder.layer[0].attention.self
    assert attn.query.shared_input is attn.key.shared_input is attn.value.shared_input is not None
    assert isinstance(em.embeddings.LayerNorm, QuantizingNorm) and em.embeddings.LayerNorm.shared is attn.query.shared_input
    assert isinstance(em.encoder.layer[0].attention.output.LayerNorm, QuantizingNorm)
    assert isinstance(em.encoder.layer[1].output.LayerNorm, nn.LayerNorm)
    with _Calls() as a:
        out_shared = shared(inputs)[0]
    with _Calls() as b:
        out_plain = plain(inputs)[0]
    # per layer: the attention output and fc2 (GELU folded in) quantize themselves, q/k/v and fc1 take what
    # the norms before them made (4 norms); unfolded: six a layer; and the pooler's one
    assert (a.n, a.applied, b.n, b.applied) == (2 * 2 + 1, 4, 2 * 6 + 1, 0)
    with torch.no_grad():
        ref = bert(**inputs)[0]
    for out in (out_shared, out_plain):
        assert float((out.float() - ref).norm() / ref.norm()) < 0.02


def test_a_shared_quantization_is_reused_only_for_the_same_unchanged_tensor():
    made = []

    def make(x):
        made.append(1)
        return torch.ops.gpuopt.quantize_rowwise(x, torch.int8)

    s = SharedQuantization(3)
    x = torch.randn(4, 8)
    first = s.take(x, lambda: make(x))
    assert s.take(x, lambda: make(x)) is first and len(made) == 1
    x.add_(1)  # changed in place: quantized again
    assert s.take(x, lambda: make(x)) is not first and len(made) == 2
    y = x.clone()
    s.take(y, lambda: make(y))  # another tensor: quantized
    assert len(made) == 3
    s.take(y, lambda: make(y))
    s.take(y, lambda: make(y))  # its three readers done: the next call quantizes again
    s.take(y, lambda: make(y))
    assert len(made) == 4


def test_fold_is_a_token_of_the_quantizing_precisions_only():
    assert str(Config.parse("fp8+no-fold+compile")) == "fp8+compile+no-fold"
    assert Config.parse("int8+no-fold").fold is False and Config("int8").fold is True
    with pytest.raises(ValueError, match="fold=False \\('no-fold'\\) applies to the precisions that quantize "
                                         "activations \\(fp8, int8\\); got precision 'bf16'"):
        Config.parse("bf16+no-fold")
    with pytest.raises(TypeError, match="fold must be True or False, got 'no'"):
        Config("int8", fold="no")


def test_fold_prologues_leaves_a_model_without_quantized_layers_alone():
    m = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8)).eval()
    report = fold_prologues(m, (torch.randn(2, 8),), {})
    assert not report.folded and isinstance(m[0], nn.LayerNorm)
    assert report.describe() == "no norm or activation folded into the quantization"


def test_a_quantizing_norm_holds_the_norm_it_replaced_and_runs_it_inside_compile(monkeypatch):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                                  vocab_size=100)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 16))
    p = Config("int8").apply(bert, {"input_ids": ids}, device="cpu")
    qn = p.eager_module.embeddings.LayerNorm
    assert isinstance(qn, QuantizingNorm) and type(qn.norm) is nn.LayerNorm  # not itself (it once was)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)  # the quantized precisions run the rest in bf16
    with torch.no_grad():
        eager = qn(x)
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # what torch.compile's trace sees
        with _Calls() as calls:
            compiled_path = qn(x)
    assert calls.applied == 0 and torch.equal(compiled_path, qn.norm(x))
    torch.testing.assert_close(eager, compiled_path, rtol=1e-2, atol=1e-2)


def _int8(model, x):
    torch.manual_seed(0)
    folded = Config("int8").apply(model, x, device="cpu")
    plain = Config.parse("int8+no-fold").apply(model, x, device="cpu")
    a, b = folded(x), plain(x)
    a, b = (a.float(), b.float()) if isinstance(a, torch.Tensor) else (a.hidden.float(), b.hidden.float())
    return folded, float((a - b).norm() / b.norm())


class _Siblings(nn.Module):
    """Two layers reading h, h written in place between them."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        h = x * 2
        y = self.a(h)
        h.mul_(3)
        return y + self.b(h) + self.c(x)


class _OutWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.act, self.lin = nn.ReLU(), nn.Linear(32, 32)

    def forward(self, x):
        h = self.act(x)
        torch.add(h, x, out=h)
        return self.lin(h)


@dataclasses.dataclass
class _Out:
    hidden: torch.Tensor
    logits: torch.Tensor


class _DataclassOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.lin = nn.LayerNorm(32), nn.Linear(32, 32)

    def forward(self, x):
        h = self.norm(x)
        return _Out(h, self.lin(h))


class _InputWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.act, self.lin = nn.GELU(), nn.Linear(32, 32)

    def forward(self, x):
        x = x + 0
        h = self.act(x)
        x.mul_(3)
        return self.lin(h) + x


@pytest.mark.parametrize("model, why", [
    (_OutWrite, "act: its output is read by add outside a quantized linear layer"),  # out=h: not "unchanged"
    (_InputWrite, "act: its input is written in place before a layer reads its output"),
])
def test_writes_in_place_and_outputs_kept_in_any_container_keep_the_producer(model, why):
    p, diff = _int8(model().eval(), torch.randn(8, 32))
    assert why in p.notes[-1], p.notes
    assert diff < 1e-6  # nothing folded: the same model as no-fold


def test_a_norm_whose_output_is_returned_in_a_dataclass_is_not_folded():
    p, diff = _int8(_DataclassOut().eval(), torch.randn(8, 32))
    norm = p.eager_module.norm
    assert isinstance(norm, QuantizingNorm), p.notes  # still writes its output, and quantizes it for lin
    assert "1 norms read elsewhere too" in p.notes[-1] and diff < 0.03


def test_layers_reading_a_tensor_written_between_them_do_not_share_under_inference_mode():
    p, diff = _int8(_Siblings().eval(), torch.randn(8, 32))
    assert "groups of" not in p.notes[-1] and p.eager_module.a.shared_input is None, p.notes
    assert diff < 1e-6


class _QKV(nn.Module):
    """An affine layer norm feeding three separate projections (pre-norm attention), and no producer at
    all before two layers reading the input."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        nn.init.normal_(self.norm.weight)
        nn.init.normal_(self.norm.bias)
        self.q, self.k, self.v, self.u, self.w = (nn.Linear(32, 32) for _ in range(5))

    def forward(self, x):
        h = self.norm(x)
        return self.q(h) * self.k(h) + self.v(h) + self.u(x) - self.w(x)


def test_an_affine_norm_folds_into_every_projection_and_they_share_one_quantization():
    p, diff = _int8(_QKV().eval(), torch.randn(8, 32))
    em = p.eager_module
    note = p.notes[-1]
    assert "1 layer norm" in note and "2 groups of 2/3 layers reading one tensor quantize it once" in note, note
    assert em.q.shared_input is em.k.shared_input is em.v.shared_input is not None
    assert em.u.shared_input is em.w.shared_input is not None and em.u.shared_input is not em.q.shared_input
    assert em.q.prologue_norm == "layer" and diff < 0.03
    with _Calls() as calls, torch.no_grad():
        p(torch.randn(8, 32))
    assert calls.n == 2


def test_rms_norm_without_eps_takes_float32s_machine_epsilon_for_16_bit_inputs():
    from gpuopt.quant.prologue import norm_of
    norm = nn.RMSNorm(32)
    assert norm_of(norm, 32, torch.bfloat16)[1] == torch.finfo(torch.float32).eps
    assert norm_of(norm, 32, torch.float64)[1] == torch.finfo(torch.float64).eps
    m = nn.Sequential(nn.RMSNorm(32), nn.Linear(32, 32)).eval()
    p, diff = _int8(m, torch.randn(8, 32) * 0.01)  # small activations: a wrong eps would swamp them
    assert "1 rms norm" in p.notes[-1] and diff < 0.03, (p.notes, diff)


def test_a_shared_quantization_is_per_thread():
    s = SharedQuantization(2)
    x = torch.randn(4, 8)
    first = s.take(x, lambda: torch.ops.gpuopt.quantize_rowwise(x, torch.int8))
    seen = []
    t = threading.Thread(target=lambda: seen.append(s.take(x, lambda: "made on the other thread")))
    t.start()
    t.join()
    assert seen == ["made on the other thread"] and s.take(x, lambda: None) is first


def test_a_traced_run_that_fails_leaves_the_model_unfolded_and_says_why():
    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.act, self.lin = nn.GELU(), nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(self.act(x))

    m = Config.parse("int8+no-fold").apply(Fails().eval(), torch.randn(2, 8), device="cpu").eager_module
    report = fold_prologues(m, (torch.randn(2, 9),), {})  # the wrong width: the run raises
    assert report.error is not None and "RuntimeError" in report.error and not report.folded
    assert report.describe().startswith("nothing folded into the quantization: the traced run failed (RuntimeError")


class _AliasWrite(nn.Module):
    """A GELU feeding a layer, its input written through an alias before the layer reads (``how``)."""

    def __init__(self, how):
        super().__init__()
        self.how, self.act, self.lin = how, nn.GELU(), nn.Linear(32, 32)

    def forward(self, x):
        x = x + 0
        h = self.act(x)
        if self.how == "view":
            x[:, :16].mul_(5)
        elif self.how == "data":
            x.data.mul_(5)
        elif self.how == "aten":
            torch.ops.aten.mul_.Scalar(x, 5.0)
        elif self.how == "set data":
            x.data = x * 5
        elif self.how == "after":  # after the layer has read: harmless, still folds
            y = self.lin(h)
            x.mul_(5)
            return y + x
        return self.lin(h) + x


@pytest.mark.parametrize("how", ["view", "data", "aten", "set data"])
def test_a_write_to_the_producers_input_through_any_alias_keeps_it(how):
    p, diff = _int8(_AliasWrite(how).eval(), torch.randn(8, 32))
    assert "act: its input is written in place before a layer reads its output" in p.notes[-1], p.notes
    assert diff < 1e-6


def test_a_write_to_the_producers_input_after_the_layer_read_it_still_folds():
    p, diff = _int8(_AliasWrite("after").eval(), torch.randn(8, 32))
    assert "1 gelu" in p.notes[-1] and isinstance(p.eager_module.act, nn.Identity), p.notes
    assert diff < 0.03


class _ViewWrites(nn.Module):
    """A tensor two layers read, written through a view between them; a norm's output (also read by an
    add) written through a view before its layer; a ReLU's output written by an aten in-place op."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(32, 32) for _ in range(4))
        self.norm, self.act = nn.LayerNorm(32), nn.GELU()

    def forward(self, x):
        h = x * 2
        y = self.a(h)
        h.view(-1).mul_(3)
        y = y + self.b(h)
        n = self.norm(x)
        r = n + 1
        n[:, :].mul_(3)
        y = y + self.c(n) + r
        g = self.act(x)
        torch.ops.aten.relu_.default(g)
        return y + self.d(g)


def test_writes_through_views_and_aten_ops_stop_sharing_quantizing_norms_and_folds():
    p, diff = _int8(_ViewWrites().eval(), torch.randn(8, 32))
    em = p.eager_module
    assert em.a.shared_input is None and em.b.shared_input is None, p.notes
    assert isinstance(em.norm, nn.LayerNorm) and isinstance(em.act, nn.GELU), p.notes
    assert diff < 1e-6


def test_a_prepared_model_with_shared_quantizations_copies_and_pickles():
    import copy
    import pickle
    p, _ = _int8(_QKV().eval(), torch.randn(8, 32))
    em = copy.deepcopy(p.eager_module)
    assert em.q.shared_input is em.k.shared_input is em.v.shared_input
    assert em.q.shared_input is not p.eager_module.q.shared_input and em.q.shared_input.n == 3
    again = pickle.loads(pickle.dumps(p.eager_module))
    assert again.q.shared_input is again.v.shared_input
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(em(x), p.eager_module(x))
