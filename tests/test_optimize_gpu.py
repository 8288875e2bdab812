"""gpuopt.optimize on a GPU: latency mode, the allocator's peak as memory, compiled configs entering behind
their eager twin, the interleaved comparison, and the energy objective."""

from __future__ import annotations

import pytest
import torch

import gpuopt

pytestmark = pytest.mark.gpuopt_gpu

FAST = {"rung_options": [{"max_time_s": 0.1, "min_time_s": 0.02}],
        "confirm_options": {"max_time_s": 0.4, "min_time_s": 0.1}}
CONFIGS = ["fp32", "fp16-amp", "fp16-amp+channels_last", "fp16-amp+channels_last+compile"]


def test_optimize_on_the_gpu_with_a_compiled_config_behind_its_eager_twin():
    r = gpuopt.optimize("tiny-cnn", configs=CONFIGS, batch_sizes=[1, 8, 64, 256], slo_p99_ms=50.0, memory_gb=20.0,
                        **FAST)
    assert r.found and r.mode == "latency"
    assert r.best.figures["memory_source"].startswith("allocator peak") and r.best.figures["memory_gb"] > 0
    compiled = [e for e in r.log if e.config == "fp16-amp+channels_last+compile"]
    assert compiled and all(e.rung != 0 for e in compiled)  # never in rung 0
    # Under the p99 budget it starts where its eager twin's device time (halved) meets the SLO: at a batch
    # size the twin measured; the ones below it and the ones predicted over are not compiled.
    runs = [e for e in compiled if e.action in ("measured", "infeasible", "failed")]
    twin = {e.batch_size for e in r.log if e.config == "fp16-amp+channels_last" and e.action in ("measured",
                                                                                                  "infeasible")}
    assert runs and runs[0].batch_size in twin and len(runs) <= 3
    pruned = [e for e in compiled if e.action == "pruned"]
    assert all(any(k in e.reason for k in ("where this config's search began", "on the way down", "predicted over",
                                           "already over the budgets")) for e in pruned)
    assert r.ratio is not None and r.ratio["ci"][0] <= r.ratio["value"] <= r.ratio["ci"][1]
    x = torch.randn(r.best.batch_size, 3, 32, 32, device="cuda")
    assert r.prepared(x).shape == (r.best.batch_size, 10)


def test_energy_objective_ranks_by_joules_per_item_or_says_why_not():
    try:
        r = gpuopt.optimize("tiny-cnn", objective="energy", configs=["fp32", "fp16-amp"], batch_sizes=[8, 64], **FAST)
    except ValueError as exc:
        assert "objective='energy'" in str(exc) and "energy is not measured" in str(exc)
        return
    assert r.best.figures["joules_per_item"] > 0
    assert r.best.objective_value == pytest.approx(r.best.figures["joules_per_item"])


def test_a_second_compilation_leaves_the_first_to_compile_again_and_says_so():
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    x = torch.randn(8, 64)
    a = gpuopt.Config.parse("fp16-amp+compile").apply(m, x, device="cuda", strict=True)
    assert not a.recompiles
    b = gpuopt.Config.parse("fp32+compile").apply(m, x, device="cuda", strict=True)
    assert a.recompiles and not b.recompiles  # b's preparation reset torch.compile's caches
    assert torch.allclose(a(x).float(), m.cuda()(x.cuda()), atol=2e-2)  # compiles again, then runs
