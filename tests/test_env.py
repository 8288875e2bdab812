from __future__ import annotations

import json
import subprocess

import pytest
import torch

import gpuopt


def test_env_is_a_json_record_of_this_machine():
    e = gpuopt.env()
    json.dumps(e)  # must serialise as is
    assert e["torch"] == torch.__version__
    assert e["torch_cuda"] == torch.version.cuda
    assert e["gpuopt"] == gpuopt.__version__
    assert e["python"].count(".") == 2
    assert e["cpu"] and e["cpu_count"] >= 1
    assert len(e["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if gpuopt.build_info()["cuda"]:
        assert e["cuda_runtime"] is not None


@pytest.mark.gpuopt_gpu
def test_env_describes_each_gpu():
    e = gpuopt.env()
    props = torch.cuda.get_device_properties(0)
    g = e["gpus"][0]
    assert g["name"] == props.name
    assert g["compute_capability"] == f"{props.major}.{props.minor}"
    assert g["memory_bytes"] == props.total_memory
    assert g["sm_count"] == props.multi_processor_count
    assert e["driver"], "the driver version should be readable from NVML or /proc"
    assert e["cuda_driver_api"] is not None
    if e["nvml"]:
        assert g["max_clock_sm_mhz"] > 0
        assert g["power_limit_w"] > 0


def test_git_commit_names_the_checkout_and_says_dirty(tmp_path, monkeypatch):
    from gpuopt.timing.environment import git_commit

    monkeypatch.delenv("GPUOPT_GIT_COMMIT", raising=False)
    assert git_commit(tmp_path) is None  # not a repository
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "f.txt").write_text("a")
    subprocess.run([*git, "add", "f.txt"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=tmp_path, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert len(sha) == 40 and git_commit(tmp_path) == sha
    (tmp_path / "untracked.txt").write_text("new")  # untracked files do not make a checkout dirty
    assert git_commit(tmp_path) == sha
    (tmp_path / "f.txt").write_text("b")
    assert git_commit(tmp_path) == f"{sha}-dirty"
    monkeypatch.setenv("GPUOPT_GIT_COMMIT", "abc123")  # a copied tree without .git
    assert git_commit(tmp_path) == "abc123"
