"""FSDP2 over two Ray workers (one per simulated node, Gloo) against one in-process worker:
the same PPO update gives the same losses and weights; the sharded checkpoint resumes on one
worker; ``hybridrl merge`` turns it into an HF folder that transformers loads.

Tolerance (fp32): weights and log-probs agree to 1e-5 absolute (1e-4 relative on the loss).
The sharded run sums gradients in another order (a reduce-scatter over two ranks), so bitwise
equality is not expected; observed differences are ~1e-7.
"""

import pytest
import torch

from hybridrl.config import load_config
from hybridrl.controller.local import LocalWorkerGroup
from hybridrl.protocol import DataProto
from hybridrl.trainer.jobs.merge import load_merged_model
from hybridrl.trainer.jobs.merge import main as merge_main
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker
from tests.tiny_models import actor_batch_sizes

ray = pytest.importorskip("ray")
from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

A = "actor_rollout_ref.actor"
ATOL = 1e-5
PROMPT_LENS = [6, 3, 1, 4, 5, 2, 6, 2]
RESPONSE_LENS = [5, 2, 4, 1, 3, 5, 1, 2]  # uneven: the two ranks hold different token counts


@pytest.fixture(scope="module")
def actor_config(tiny_model_dir):
    # 4 prompts x 2 responses, one mini batch of 8 rows; micro batches of 2 rows per worker;
    # fp32 compute (exact comparisons), whatever auto would pick on this CPU.
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_batch_size=4",
            f"{A}.fsdp_config.mixed_precision.param_dtype=fp32",
            f"{A}.ppo_mini_batch_size=4",
            f"{A}.ppo_micro_batch_size_per_gpu=2",
            f"{A}.optim.lr=1e-2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        ]
    )
    return cfg.actor_rollout_ref


@pytest.fixture(scope="module")
def batch():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import _build_batch

    b = _build_batch(PROMPT_LENS, RESPONSE_LENS, seed=0)
    gen = torch.Generator().manual_seed(1)
    b["old_log_probs"] = -torch.rand(b["responses"].shape, generator=gen) * 3
    b["advantages"] = torch.randn(b["responses"].shape, generator=gen) * b["response_mask"]
    return DataProto.from_dict(tensors=b)


@pytest.fixture(scope="module")
def runs(ray_cluster, actor_config, batch, tmp_path_factory):
    """The same update on one local worker and on two FSDP2 Ray workers; checkpoints of both."""
    out = tmp_path_factory.mktemp("fsdp")
    local = LocalWorkerGroup(
        ActorRolloutRefWorker, actor_config, actor_batch_sizes(actor_config), role="actor_rollout", device="cpu"
    )
    local.init_model()
    result = {
        "local_logp": local.compute_log_prob(batch).batch["old_log_probs"],
        "local_metrics": local.update_actor(batch).meta_info["metrics"],
    }
    local.save_checkpoint(str(out / "local"), 1)
    sharded = RayWorkerGroup(
        RayResourcePool([1, 1]),
        RayClassWithInitArgs(
            ActorRolloutRefWorker, actor_config, actor_batch_sizes(actor_config, 2), role="actor_rollout", device="cpu"
        ),
    )
    try:
        sharded.init_model()
        result["sharded_logp"] = sharded.compute_log_prob(batch).batch["old_log_probs"]
        result["sharded_metrics"] = sharded.update_actor(batch).meta_info["metrics"]
        result["sharded_logp_after"] = sharded.compute_log_prob(batch).batch["old_log_probs"]
        sharded.save_checkpoint(str(out / "sharded"), 1)
    finally:
        sharded.shutdown()
    result["dir"] = out
    return result


def _mean(values):
    return sum(values) / len(values)


def test_two_sharded_workers_update_like_one(runs):
    torch.testing.assert_close(runs["sharded_logp"], runs["local_logp"], atol=ATOL, rtol=0)
    local, sharded = runs["local_metrics"], runs["sharded_metrics"]
    assert len(sharded["actor/pg_loss"]) == 2  # one record per rank, averaged by the driver
    assert _mean(sharded["actor/pg_loss"]) == pytest.approx(local["actor/pg_loss"][0], rel=1e-4)
    assert sharded["actor/grad_norm"][0] == pytest.approx(local["actor/grad_norm"][0], rel=1e-4)
    local_model = load_merged_model(str(runs["dir"] / "local"))
    sharded_model = load_merged_model(str(runs["dir"] / "sharded"))
    moved = 0.0
    for (name, p_local), p_sharded in zip(local_model.named_parameters(), sharded_model.parameters()):
        torch.testing.assert_close(p_sharded, p_local, atol=ATOL, rtol=0, msg=name)
        moved = max(moved, (p_local - p_sharded).abs().max().item())
    assert moved < ATOL


def test_sharded_checkpoint_resumes_on_one_worker(runs, actor_config, batch):
    resumed = LocalWorkerGroup(
        ActorRolloutRefWorker, actor_config, actor_batch_sizes(actor_config), role="actor_rollout", device="cpu"
    )
    resumed.init_model()
    before = resumed.compute_log_prob(batch).batch["old_log_probs"]
    resumed.load_checkpoint(str(runs["dir"] / "sharded"))
    after = resumed.compute_log_prob(batch).batch["old_log_probs"]
    assert (after - before).abs().max() > 1e-3  # the checkpoint changed the weights ...
    torch.testing.assert_close(after, runs["sharded_logp_after"], atol=ATOL, rtol=0)  # ... to the trained ones
    worker = resumed.workers[0]
    assert worker.actor_optimizer.state_dict()["state"], "Adam moments were not restored"
    assert worker.actor_lr_scheduler.last_epoch == 1


def test_merge_writes_an_hf_folder_with_the_same_log_probs(runs, batch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tmp_path / "hf"
    assert merge_main(["--local_dir", str(runs["dir"] / "sharded"), "--target_dir", str(target)]) == 0
    assert (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file()
    AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target)
    b = batch.batch
    response_length = b["responses"].shape[1]
    logits = (
        model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
        .logits[:, -response_length - 1 : -1]
        .float()
    )
    logp = torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None])[..., 0]
    mask = b["response_mask"].bool()
    torch.testing.assert_close(logp[mask], runs["sharded_logp_after"][mask], atol=ATOL, rtol=0)


def test_merge_of_a_folder_that_is_not_a_checkpoint(tmp_path, capsys):
    assert merge_main(["--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "out")]) == 2
    assert "is not a worker checkpoint" in capsys.readouterr().err
