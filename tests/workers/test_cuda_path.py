"""The CUDA path's device logic, shown on CPU (issue 31, item 1)."""

import warnings

import torch

from hybridrl.workers.model_forward import autocast


def test_autocast_follows_the_given_device_not_the_parameters():
    offloaded = torch.nn.Linear(2, 2)  # param_offload: the parameters wait on the CPU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU-only torch warns that CUDA autocast is unavailable
        ctx = autocast(offloaded, torch.bfloat16, "cuda")
    assert ctx.device == "cuda"
    assert autocast(offloaded, torch.bfloat16, torch.device("cpu")).device == "cpu"
    assert autocast(offloaded, torch.bfloat16).device == "cpu"  # no device: the parameters'

    on_meta = torch.nn.Linear(2, 2, device="meta")
    with autocast(on_meta, torch.bfloat16, "cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(on_meta, torch.float32, "cpu"):
        assert not torch.is_autocast_enabled("cpu")
