from __future__ import annotations

import json

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
