"""Exported backends on the CPU: ONNX Runtime (CPU provider) through the parity gate and a benchmark,
the exporter's failure, missing packages and refused devices, each a failed config with its reason."""

from __future__ import annotations

import sys

import pytest
import torch

import gpuopt
from gpuopt import Config
from gpuopt.prepare import exported
from gpuopt.run import zoo

pytest.importorskip("onnxruntime", reason="the onnx extra (pip install onnx onnxruntime onnxscript)")


@pytest.mark.parametrize("name, config", [("tiny-cnn", "fp32+onnxruntime"), ("tiny-cnn", "fp16+onnxruntime"),
                                          ("tiny-transformer", "fp32+onnxruntime")])
def test_onnxruntime_configs_pass_parity_and_name_exporter_and_provider(name, config):
    model, make = zoo.get(name)
    x = make(4)
    ref = Config("fp32").apply(model, x, device="cpu")
    p = Config.parse(config).apply(model, x, device="cpu")
    assert p.ok, p.error
    assert any(n.startswith("onnxruntime: exported by torch.onnx (") and n.endswith("runs on CPUExecutionProvider")
               for n in p.notes), p.notes
    result = gpuopt.parity(p, ref, make(4))  # new inputs: the exported graph is not a constant
    assert result.passed, result
    assert p.prepare_s > 0


def test_a_model_the_exporters_cannot_take_fails_with_their_messages():
    class Eigen(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.eigh(x @ x.transpose(-1, -2)).eigenvalues

    p = Config.parse("fp32+onnxruntime").apply(Eigen(), torch.randn(2, 4, 4), device="cpu")
    assert not p.ok and "torch.onnx.export failed (dynamo: " in p.error and "classic: " in p.error
    assert "linalg_eigh" in p.error


def test_missing_onnxruntime_is_a_failed_config_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    p = Config.parse("fp32+onnxruntime").apply(torch.nn.Linear(4, 2), torch.randn(3, 4), device="cpu")
    assert not p.ok and "onnxruntime is not installed: pip install onnxruntime" in p.error


def test_a_gpu_without_the_cuda_provider_is_refused_with_the_reason(monkeypatch):
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(RuntimeError, match="onnxruntime has no CUDA execution provider here .*pip install "
                                           "onnxruntime-gpu.*measure it with device='cpu'"):
        exported.build("onnxruntime", torch.nn.Linear(4, 2), (torch.randn(3, 4),), {}, torch.device("cuda", 0))


def test_tensorrt_needs_a_gpu_and_the_package():
    p = Config("fp32", backend="tensorrt").apply(torch.nn.Linear(4, 2), torch.randn(3, 4), device="cpu")
    assert not p.ok and "backend 'tensorrt' needs a CUDA device" in p.error
    if "torch_tensorrt" not in sys.modules:
        try:
            import torch_tensorrt  # noqa: F401
        except ImportError:
            with pytest.raises(RuntimeError, match="TensorRT is not installed: pip install torch-tensorrt"):
                exported.build("tensorrt", torch.nn.Linear(4, 2), (torch.randn(3, 4),), {}, torch.device("cuda", 0))


def test_precisions_that_do_not_survive_export_are_refused_and_training_too():
    with pytest.raises(ValueError, match="precision 'fp16-amp' does not survive the export of backend 'onnxruntime'"):
        Config.parse("fp16-amp+onnxruntime")
    with pytest.raises(ValueError, match="precision 'fp8' does not survive the export of backend 'tensorrt'"):
        Config.parse("fp8+tensorrt")
    with pytest.raises(ValueError, match="use an inference-only backend"):
        gpuopt.benchmark("tiny-cnn", configs=["fp32+onnxruntime"], train=True, device="cpu", progress=False)
    with pytest.raises(ValueError, match=r"or precision \(int8-wo or int8 or fp8\)"):
        gpuopt.benchmark("tiny-cnn", configs=["int8-wo"], train=True, device="cpu", progress=False)


def test_a_benchmark_measures_onnxruntime_beside_eager(tmp_path):
    res = gpuopt.benchmark("tiny-cnn", configs=["fp32", "fp32+onnxruntime"], batch_sizes=[8], modes=["host"],
                           device="cpu", output_dir=str(tmp_path), max_time_s=0.2, min_time_s=0.0, progress=False)
    rows = {r.config: r for r in res.rows}
    assert rows["fp32+onnxruntime"].ok and rows["fp32+onnxruntime"].parity["passed"], rows["fp32+onnxruntime"].error
    assert rows["fp32+onnxruntime"].throughput_items_per_s > 0 and rows["fp32"].ok
    assert any("CPUExecutionProvider" in n for n in rows["fp32+onnxruntime"].notes)
