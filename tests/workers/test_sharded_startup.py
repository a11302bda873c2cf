"""Sharded from the first byte: on two FSDP2 Ray workers, no rank's peak resident memory before
the first step exceeds its shard of every role, the rollout engine's own copy, one checkpoint
tensor (the largest: the embedding) and the process baseline.

The baseline is measured, not guessed: the same worker and config on a model with the same
tokenizer but a tiny body, whose weights are negligible. The model under test (~113M parameters,
453 MB in fp32; budget 684 MB, measured 646-661 MB on an AMD EPYC) sits far below the old
start-up, which held three whole fp32 copies plus a bf16 one on every rank (~1.6 GB by arithmetic).
"""

import pytest
import torch

from hybridrl.config import load_config
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker
from tests.tiny_models import actor_batch_sizes, build_tiny_model

ray = pytest.importorskip("ray")
from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

MB = 1024**2
SHAPES = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "num_kv_heads": 4, "intermediate_size": 2048}


def _peak_after_init(model_dir: str) -> list[float]:
    """Each rank's peak RSS (MB) after ``init_model`` of the actor + rollout + reference role on two workers."""
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.actor.use_kl_loss=true",
        ]
    )
    section = cfg.actor_rollout_ref
    group = RayWorkerGroup(
        RayResourcePool([1, 1]),
        RayClassWithInitArgs(
            ActorRolloutRefWorker, section, actor_batch_sizes(section, 2), role="actor_rollout_ref", device="cpu"
        ),
    )
    try:
        group.init_model()
        return [m["perf/max_memory_allocated_gb"] * 1024 for m in group.get_memory_metrics()]
    finally:
        group.shutdown()


def _budget_mb(model_dir: str) -> float:
    """This rank's share of every role plus the engine's copy and one checkpoint tensor, in MB:
    actor fp32 / 2, reference bf16 / 2, rollout copy bf16 whole, the largest tensor in fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    n = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    return (4 * n / 2 + 2 * n / 2 + 2 * n + 4 * largest) / MB


@pytest.mark.slow
def test_no_rank_holds_a_whole_copy_at_start_up(ray_cluster, tokenizer_dir, tmp_path, monkeypatch):
    # glibc's default policy (another test's trainer.cpu_malloc_reuse may have set it for the workers)
    monkeypatch.setenv("HYBRIDRL_CPU_MALLOC_REUSE", "0")
    big = build_tiny_model(tokenizer_dir, str(tmp_path / "big"), **SHAPES)
    small = build_tiny_model(
        tokenizer_dir,
        str(tmp_path / "small"),
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
    )
    baseline = max(_peak_after_init(small))
    peaks = _peak_after_init(big)
    budget = _budget_mb(big)
    for rank, peak in enumerate(peaks):
        assert peak - baseline <= budget, (
            f"rank {rank}: {peak - baseline:.0f} MB over the baseline > budget {budget:.0f} MB"
        )
