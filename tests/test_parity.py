"""The parity gate checks what is timed: the real outputs of every backend, never the model's input.
A reference without signal fails with the reason; with_signal gives a zero-initialised head signal
(seeded, on a copy); fp16/bf16 range problems are named; zoo models carry signal in every precision."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from gpuopt import Config, parity
from gpuopt.prepare import with_signal
from gpuopt.run import zoo

FP16 = torch.finfo(torch.float16)


class ZeroHead(torch.nn.Module):
    """Like torchvision's ViT-B/16 with random weights: the classifier head starts at zero, so the
    output is all zeros for every input."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
        self.head = torch.nn.Linear(32, 10)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.body(x))


class Zeros(torch.nn.Module):
    """No inner modules, no parameters, an output without signal."""

    def forward(self, x):
        return x * 0


def test_with_signal_reinitialises_the_zero_head_of_a_copy_seeded(seed, rng):
    torch.manual_seed(seed)
    model = ZeroHead()
    x = torch.randn(4, 16, generator=rng)
    fix = with_signal(model, x, device="cpu", seed=seed)
    assert fix.reinitialised == ["head.weight"]
    assert len(fix.notes) == 1 and "re-initialised the all-zero head.weight" in fix.notes[0]
    assert f"seed {seed}" in fix.notes[0]
    assert fix.model is not model and not model.head.weight.any()  # the caller's model is untouched
    body, fixed_body = model.body.state_dict(), fix.model.body.state_dict()
    assert all(torch.equal(body[k], fixed_body[k]) for k in body)
    w = fix.model.head.weight.detach()
    assert torch.equal(w, with_signal(model, x, device="cpu", seed=seed).model.head.weight)
    assert not torch.equal(w, with_signal(model, x, device="cpu", seed=seed + 1).model.head.weight)
    # std 1/sqrt(fan_in): 320 samples estimate it within a few percent
    assert 0.8 < float(w.std()) * math.sqrt(32) < 1.2, f"seed {seed}"
    with torch.no_grad():
        out = fix.model(torch.randn(8, 16, generator=rng))
    assert 0.3 < float(out.std()) < 3, f"seed {seed}: layer-normed features through the new head"


def test_with_signal_returns_a_model_with_signal_as_the_same_object(rng):
    class ZeroGammaResidual(torch.nn.Module):  # a zero-initialised residual scale still leaves signal
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(8)
            torch.nn.init.zeros_(self.norm.weight)

        def forward(self, x):
            return x + self.norm(self.lin(x))

    for model in (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)),
                  ZeroGammaResidual()):
        fix = with_signal(model, torch.randn(3, 8, generator=rng), device="cpu")
        assert fix.model is model and fix.notes == [] and fix.reinitialised == []


def test_with_signal_says_when_nothing_can_be_fixed(rng):
    x = torch.randn(3, 8, generator=rng)
    fix = with_signal(Zeros(), x, device="cpu")
    assert fix.reinitialised == [] and isinstance(fix.model, Zeros)
    assert fix.notes == ["fp32 output 'output' carries no signal (all zeros or constant) and no layer has "
                         "all-zero weights to re-initialise; parity cannot compare it"]

    class Detached(torch.nn.Module):  # a zero layer whose output is discarded: re-initialising it cannot help
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            torch.nn.init.zeros_(self.lin.weight)

        def forward(self, x):
            return self.lin(x) * 0

    stuck = with_signal(Detached(), x, device="cpu")
    assert stuck.reinitialised == ["lin.weight"] and len(stuck.notes) == 2
    assert "still carries no signal after the re-initialisation" in stuck.notes[1]
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        with_signal(lambda t: t, x)
    with pytest.raises(TypeError, match="seed must be an int, got 1.5"):
        with_signal(Zeros(), x, seed=1.5)


def test_a_wrong_backend_fails_once_the_head_carries_signal(seed, rng):
    """The timed module is wrong, the eager module right (a miscompiled graph). The old hook-based
    check compared the eager module's features and passed this; now the backend's output is compared."""
    torch.manual_seed(seed)
    model = ZeroHead()
    x, fresh = torch.randn(4, 16, generator=rng), torch.randn(4, 16, generator=rng)

    def miscompiled(m: torch.nn.Module) -> object:
        broken = copy.deepcopy(m)
        broken.body[0].weight.data.mul_(-1)
        cand = Config.parse("fp32+torchscript").apply(m, x, device="cpu")
        cand.module = Config.parse("fp32+torchscript").apply(broken, x, device="cpu").module
        with torch.no_grad():
            assert torch.equal(cand.eager_module(fresh), m(fresh))  # its eager module is right
        return cand

    # Without signal nothing can be checked: a failure that says why, not a pass.
    unfixed = parity(miscompiled(model), Config("fp32").apply(model, x, device="cpu"), fresh)
    assert not unfixed.passed and unfixed.worst_rel_l2 is None
    assert "the reference carries no signal: its output 'output' is all zeros" in unfixed.note
    assert "gpuopt.prepare.with_signal(model, inputs)" in unfixed.note

    fixed = with_signal(model, x, device="cpu", seed=seed).model
    ref = Config("fp32").apply(fixed, x, device="cpu")
    bad = parity(miscompiled(fixed), ref, fresh)
    assert not bad.passed and bad.worst_rel_l2 > 0.1, f"seed {seed}: {bad}"
    good = parity(Config.parse("fp32+torchscript").apply(fixed, x, device="cpu"), ref, fresh)
    assert good.passed and not good.outputs[0].degenerate and good.note == "", f"seed {seed}: {good}"
    amp = parity(Config("bf16-amp").apply(fixed, x, device="cpu"), ref, fresh)
    assert amp.passed and 1e-4 < amp.worst_rel_l2 < 2e-2, f"seed {seed}: {amp}"


def test_a_model_without_inner_modules_and_signal_fails_never_comparing_its_input(rng):
    x = torch.randn(4, 8, generator=rng)
    res = parity(Config("fp32").apply(Zeros(), x, device="cpu"), Zeros(), x)
    assert not res.passed and res.worst_rel_l2 is None
    assert res.note.startswith("the reference carries no signal: its output 'output' is all zeros or constant")
    assert res.to_dict()["passed"] is False and "signal" not in res.to_dict()


def test_an_output_without_signal_beside_one_with_it_is_compared_by_max_abs_error(rng):
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(4, 8, generator=rng)

    def ref(t):
        return {"logits": lin(t), "mask": torch.zeros(4)}

    res = parity(lambda t: {"logits": lin(t), "mask": torch.full((4,), 1e-6)}, ref, x)
    assert res.passed and res.outputs[1].degenerate and res.outputs[1].rel_l2 is None
    assert "reference output 'mask' carries no signal (all zeros or constant): compared by max abs error 1.00e-06" \
        in res.note
    off = parity(lambda t: {"logits": lin(t), "mask": torch.full((4,), 0.5)}, ref, x)
    assert not off.passed and off.outputs[1].max_abs == 0.5 and off.worst_rel_l2 == 0.0


@pytest.mark.parametrize("config", ["fp16", "fp16-amp"])
def test_underflow_of_fp16_is_named_with_the_largest_magnitude(config, seed, rng):
    model = torch.nn.Linear(16, 8)
    with torch.no_grad():
        model.weight.copy_(torch.randn(8, 16, generator=rng) * 1e-7)
        model.bias.zero_()
    x = torch.randn(4, 16, generator=rng)
    largest = float(model(x).detach().abs().max())
    assert 0 < largest < FP16.tiny, f"seed {seed}"
    res = parity(Config(config).apply(model, x, device="cpu"), model, x)
    assert not res.passed, f"seed {seed}: {res}"
    assert (f"underflow: reference output 'output' magnitudes (max {largest:.2g}) lie below fp16's smallest normal "
            "number 6.1e-05") in res.note
    # bf16 has fp32's range: the same outputs are no range problem there
    wide = parity(Config("bf16").apply(model, x, device="cpu"), model, x)
    assert wide.passed and "underflow" not in wide.note, f"seed {seed}: {wide}"


@pytest.mark.parametrize("config", ["fp16", "fp16-amp"])
def test_overflow_of_fp16_is_named_with_the_largest_magnitude(config, seed, rng):
    model = torch.nn.Linear(16, 8)
    with torch.no_grad():
        model.weight.copy_(torch.randn(8, 16, generator=rng) * 2e4)
    x = torch.randn(4, 16, generator=rng)
    largest = float(model(x).detach().abs().max())
    assert largest > FP16.max, f"seed {seed}"
    res = parity(Config(config).apply(model, x, device="cpu"), model, x)
    assert not res.passed, f"seed {seed}: {res}"
    assert (f"overflow: reference output 'output' magnitudes (max {largest:.2g}) lie above fp16's largest number "
            "6.6e+04") in res.note
    ordinary = torch.nn.Linear(16, 8)
    fine = parity(Config(config).apply(ordinary, x, device="cpu"), ordinary, x)
    assert fine.passed and "flow" not in fine.note, f"seed {seed}: {fine}"


# bf16 rounds 8 times coarser than fp16; on these two random-weight networks, whose calibrated
# BatchNorm layers keep every activation at unit scale, its error (about 5e-2, on an H100 too) exceeds
# the 2e-2 tolerance while fp16's is about 7e-3. strict: passing means the tolerance policy changed.
_BF16_OVER_TOLERANCE = pytest.mark.xfail(strict=True, reason="bf16 error of a random-weight efficientnet_b0 / "
                                         "mobilenet_v3_large (~5e-2) exceeds the 2e-2 tolerance")
ZOO_ON_CPU = [
    ("tiny-cnn", "fp16-amp"), ("tiny-cnn", "bf16-amp"), ("resnet18", "fp16-amp"), ("resnet18", "bf16-amp"),
    ("efficientnet_b0", "fp16-amp"), pytest.param("efficientnet_b0", "bf16-amp", marks=_BF16_OVER_TOLERANCE),
    ("mobilenet_v3_large", "fp16-amp"), pytest.param("mobilenet_v3_large", "bf16-amp", marks=_BF16_OVER_TOLERANCE),
    pytest.param("vit_b_16", "fp16-amp", marks=pytest.mark.slow), pytest.param("vit_b_16", "bf16-amp", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, config", ZOO_ON_CPU)
def test_zoo_models_carry_signal_in_every_precision(name, config, seed):
    if zoo.spec(name).needs:
        pytest.importorskip(zoo.spec(name).needs)
    model, make_inputs = zoo.get(name)
    torch.manual_seed(seed)
    x = make_inputs(1)
    ref = Config("fp32").apply(model, x, device="cpu")
    y = ref(x)
    # Ordinary magnitudes, far inside fp16's range: not efficientnet_b0's 1e-14 with default BatchNorm statistics
    assert 1e-3 < float(y.std()) < 1e3, f"{name}, seed {seed}: output std {float(y.std()):.3g}"
    res = parity(Config(config).apply(model, x, device="cpu"), ref, x)
    assert res.worst_rel_l2 > 0 and "flow" not in res.note, f"{name} {config}, seed {seed}: {res}"
    assert res.passed, f"{name} {config}, seed {seed}: {res}"


def test_the_zoo_calibrates_the_models_whose_outputs_vanish():
    assert [n for n, s in zoo.MODELS.items() if s.calibrate] == ["efficientnet_b0", "mobilenet_v3_large"]


@pytest.mark.slow
def test_the_zoo_gives_vit_b_16_a_seeded_head():
    pytest.importorskip("torchvision")
    torch.manual_seed(0)
    vit, _ = zoo.get("vit_b_16")
    head = vit.heads.head.weight.detach()
    assert head.any() and abs(float(head.std()) * math.sqrt(head.shape[1]) - 1) < 0.05
    torch.manual_seed(1)
    assert torch.equal(zoo.get("vit_b_16")[0].heads.head.weight, head)  # seeded, whatever the global RNG


def test_batchnorm_calibration_is_seeded_and_leaves_the_global_rng_alone(seed):
    torch.manual_seed(seed)
    model = zoo.TinyCNN()
    state = torch.random.get_rng_state()
    make_inputs = zoo.spec("tiny-cnn").make_inputs
    assert zoo.calibrate_batchnorm(model, make_inputs, batches=3, batch_size=4, seed=seed) == 2
    assert torch.equal(torch.random.get_rng_state(), state)
    norm = model.features[1]
    assert not model.training and norm.momentum == 0.1 and int(norm.num_batches_tracked) == 3
    # the running statistics are those of the calibration batches' activations, averaged
    torch.manual_seed(seed)
    batches = [make_inputs(4) for _ in range(3)]
    with torch.no_grad():
        acts = [model.features[0](b) for b in batches]
    mean = torch.stack([a.mean(dim=(0, 2, 3)) for a in acts]).mean(0)
    var = torch.stack([a.var(dim=(0, 2, 3)) for a in acts]).mean(0)
    torch.testing.assert_close(norm.running_mean, mean, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(norm.running_var, var, rtol=1e-4, atol=1e-6)
