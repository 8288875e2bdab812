from __future__ import annotations

import json
import subprocess
import sys

import torch


def gpuopt_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuopt", *args], capture_output=True, text=True, timeout=300
    )


def test_env_json_is_machine_readable():
    proc = gpuopt_cli("env", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["env"]["torch"] == torch.__version__
    assert data["build"]["torch_version"] == torch.__version__


def test_env_table_is_readable():
    proc = gpuopt_cli("env")
    assert proc.returncode == 0, proc.stderr
    assert torch.__version__ in proc.stdout
    assert "CUDA compiled" in proc.stdout
    assert ("GPU 0" in proc.stdout) == torch.cuda.is_available()


def test_unknown_subcommand_is_a_usage_error():
    proc = gpuopt_cli("frobnicate")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr and "frobnicate" in proc.stderr


def test_unknown_option_is_a_usage_error():
    proc = gpuopt_cli("env", "--colour")
    assert proc.returncode == 2
    assert "--colour" in proc.stderr


def test_no_subcommand_prints_usage_and_exits_2():
    proc = gpuopt_cli()
    assert proc.returncode == 2
    assert "usage: gpuopt" in proc.stderr


def test_env_says_why_nvml_is_unavailable():
    import importlib.util

    proc = gpuopt_cli("env")
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("NVML")]
    if line.split()[1] == "yes":
        return
    if importlib.util.find_spec("pynvml") is None:
        assert "nvidia-ml-py is not installed (pip install nvidia-ml-py" in line
    else:  # installed: the reason is the driver, never "pip install"
        assert "nvidia-ml-py is installed, but" in line and "pip install" not in line
