"""Smoke runs of the benchmark scripts that have a CPU ``--quick`` mode: they run end to end and write
their JSON (the targets are for the GPU run; here they are recorded as not applicable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_cross_run_quick_runs_and_records_its_counts(tmp_path):
    out = tmp_path / "cross_run.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the installed gpuopt, as a user runs the script
    proc = subprocess.run([sys.executable, "cross_run.py", "--quick", "--out", str(out)], cwd=ROOT / "benchmarks",
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUMMARY cross_run on cpu: 0/0 targets met (3 not applicable here)" in proc.stdout
    record = json.loads(out.read_text())
    r = record["results"]
    assert (r["pairs_aa"], r["pairs_slow"], r["rounds"]) == (4, 2, 3)
    assert 0 <= r["aa_calibrated"] <= 4 and 0 <= r["slow_calibrated"] <= 2
    # Widening never turns a "no difference" into a difference: calibrated >= unwidened counts of A/A.
    assert r["aa_calibrated"] >= r["aa_unwidened"] and r["slow_calibrated"] <= r["slow_unwidened"]
    for name, w in r["workloads"].items():
        assert w["calibration"]["source"] == "calibration" and w["calibration"]["rounds"] == 3, name
        assert w["default"] == {"rel": 0.05, "source": "default", "rounds": None, "workloads": None,
                                "confidence": 0.95}
        assert all(p["calibrated"]["run_to_run"] == w["calibration"] for p in w["a_a"] + w["slow_5pct"])
    assert [t["passed"] for t in record["targets"]] == [None, None, None]


def test_exported_quick_measures_onnxruntime_beside_eager_on_the_cpu(tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra")
    pytest.importorskip("torchvision", reason="the models extra")
    out = tmp_path / "exported.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "exported.py", "--quick", "--parts", "resnet50", "--out", str(out)],
                          cwd=ROOT / "benchmarks", env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUMMARY exported on cpu: 1/1 targets met" in proc.stdout
    r = json.loads(out.read_text())["results"]["resnet50"]
    ort = r["configs"]["fp32+onnxruntime"]
    assert r["device"] == "cpu" and ort["parity"] is True and ort["speedup_vs_eager"] > 0
    assert any("runs on CPUExecutionProvider" in n for n in ort["notes"])
