"""Offload at any world size (verl's ``param_offload`` / ``optimizer_offload``): with one worker on
CUDA a role is wrapped with FSDP2 over a group of one so that ``CPUOffloadPolicy`` applies; on the
CPU the keys mean nothing (the start-up notes say so, tests/config/test_config_schema.py).

FSDP2's CPU offload itself needs an accelerator, so here the group-of-one path is checked on the
CPU without the policy: a model sharded over one rank computes what the plain model does.
"""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from hybridrl.workers.sharding import needs_fsdp


def _fsdp(param_offload: bool, offload_policy: bool = False) -> SimpleNamespace:
    return SimpleNamespace(param_offload=param_offload, offload_policy=offload_policy)


@pytest.mark.parametrize(
    ("world_size", "device", "offload", "expected"),
    [
        (1, "cpu", False, False),
        (1, "cpu", True, False),  # one CPU worker: a plain module
        (1, "cuda", False, False),
        (1, "cuda", True, True),  # one GPU: FSDP2 only to offload
        (2, "cpu", False, True),
        (2, "cuda", True, True),  # several workers: always sharded
    ],
)
def test_which_roles_are_wrapped_with_fsdp2(world_size, device, offload, expected):
    assert needs_fsdp(world_size, device, _fsdp(offload)) is expected
    assert needs_fsdp(world_size, device, _fsdp(False, offload_policy=offload)) is expected  # verl's FSDP2 key


def test_offload_policy_turns_on_fsdp2s_cpu_offload(monkeypatch):
    from hybridrl.workers import sharding

    seen = {}
    monkeypatch.setattr(sharding, "apply_fsdp2", lambda module, device, **kw: seen.update(kw))
    fsdp = SimpleNamespace(
        fsdp_size=-1, reshard_after_forward=True, param_offload=False, offload_policy=True,
        mixed_precision=SimpleNamespace(param_dtype="fp32"),
    )  # fmt: skip
    sharding.shard_module(object(), fsdp, "cuda")
    assert seen["param_offload"] is True


GROUP_OF_ONE = """
import functools, torch, torch.distributed as dist
from types import SimpleNamespace
from hybridrl.models import load_causal_lm
from hybridrl.workers.sharding import shard_module
from hybridrl.workers.sharding import is_sharded
fsdp = SimpleNamespace(fsdp_size=-1, reshard_after_forward=True, param_offload=True,
                       mixed_precision=SimpleNamespace(param_dtype="fp32"))
plain = load_causal_lm(sys.argv[1])
assert not dist.is_initialized()
sharded = load_causal_lm(sys.argv[1], shard=functools.partial(shard_module, fsdp_config=fsdp, device="cpu"))
assert dist.is_initialized() and dist.get_world_size() == 1 and is_sharded(sharded)
ids = torch.tensor([[5, 17, 300, 2, 9]])
with torch.no_grad():
    diff = (plain(input_ids=ids).logits - sharded(input_ids=ids).logits).abs().max().item()
print("maxdiff", diff)
assert diff == 0.0, diff
"""


@pytest.mark.slow
def test_one_worker_shards_over_a_group_of_one(tiny_model_dir):
    # a subprocess: the group of one would otherwise stay initialised in the test process
    code = "import sys\n" + GROUP_OF_ONE
    result = subprocess.run([sys.executable, "-c", code, tiny_model_dir], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "maxdiff 0.0" in result.stdout
