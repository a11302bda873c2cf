"""LoRA in the PPO workers (``actor_rollout_ref.model.lora_rank > 0``): the reference is the base
model (adapter disabled), an update moves only the adapter, the rollout generates with the
merged weights, checkpoints hold the adapter and resume, ``hybridrl merge`` folds it into an HF
folder, FSDP2 over two workers updates like one, and the critic trains adapter + value head."""

import copy

import pytest
import torch

pytest.importorskip("peft")

from hybridrl.config import load_config, worker_batch_sizes
from hybridrl.controller.local import LocalWorkerGroup
from hybridrl.protocol import DataProto
from hybridrl.trainer.run.checkpoint import CheckpointError
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from tests.tiny_models import actor_batch_sizes

A, M = "actor_rollout_ref.actor", "actor_rollout_ref.model"
RANK, ALPHA = 4, 8
PROMPT_LENS = [6, 3, 1, 4, 5, 2, 6, 2]
RESPONSE_LENS = [5, 2, 4, 1, 3, 5, 1, 2]
ATOL = 1e-5  # fp32 on the CPU (--device cpu); on a GPU see atol()


def atol(device: str) -> float:
    """Log-prob tolerance: fp32 is exact to 1e-5 between CPU runs; a GPU's kernels differ from
    the CPU's (the hand-computed references) by more."""
    return ATOL if device == "cpu" else 1e-4


def _overrides(tiny_model_dir, lora_rank=RANK):
    # 4 prompts x 2 responses in one mini batch; micro batches of 2 rows; lr large enough to move.
    return [
        f"{M}.path={tiny_model_dir}",
        f"{M}.lora_rank={lora_rank}",
        f"{M}.lora_alpha={ALPHA}",
        "data.train_batch_size=4",
        f"{A}.ppo_mini_batch_size=4",
        f"{A}.ppo_micro_batch_size_per_gpu=2",
        f"{A}.optim.lr=5e-2",
        f"{A}.use_kl_loss=true",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.response_length=5",
        f"{A}.fsdp_config.mixed_precision.param_dtype=fp32",
    ]  # exact comparisons on every CPU


@pytest.fixture(scope="module")
def actor_config(tiny_model_dir):
    return load_config(_overrides(tiny_model_dir)).actor_rollout_ref


@pytest.fixture(scope="module")
def batch(make_batch_module):
    b = make_batch_module(PROMPT_LENS, RESPONSE_LENS, seed=0)
    gen = torch.Generator().manual_seed(1)
    b["old_log_probs"] = -torch.rand(b["responses"].shape, generator=gen) * 3
    b["advantages"] = torch.randn(b["responses"].shape, generator=gen) * b["response_mask"]
    b["ref_log_prob"] = b["old_log_probs"].clone()
    return DataProto.from_dict(tensors=b)


@pytest.fixture(scope="module")
def make_batch_module():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import _build_batch

    return _build_batch


def _base_log_probs(tiny_model_dir, data: DataProto) -> torch.Tensor:
    """Log-probs of the responses under the plain base model, by hand."""
    from hybridrl.models import load_causal_lm

    b, R = data.batch, data.batch["responses"].shape[1]
    with torch.no_grad():
        logits = (
            load_causal_lm(tiny_model_dir)(
                input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
            )
            .logits[:, -R - 1 : -1]
            .float()
        )
    return torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None])[..., 0]


@pytest.fixture(scope="module")
def trained(actor_config, batch, tmp_path_factory, device):
    """One local LoRA worker: weights before/after one update, log-probs, and a checkpoint."""
    group = LocalWorkerGroup(
        ActorRolloutRefWorker, actor_config, actor_batch_sizes(actor_config), role="actor_rollout_ref", device=device
    )
    group.init_model()
    worker = group.workers[0]
    before = {n: p.detach().clone() for n, p in worker.actor.actor_module.named_parameters()}
    group.update_actor(batch)
    out = tmp_path_factory.mktemp("lora_ckpt")
    group.save_checkpoint(str(out / "actor"), 1)
    return {
        "group": group,
        "worker": worker,
        "before": before,
        "dir": out / "actor",
        "logp": group.compute_log_prob(batch).batch["old_log_probs"],
        "ref_logp": group.compute_ref_log_prob(batch).batch["ref_log_prob"],
    }


@pytest.mark.cuda
def test_update_moves_only_the_adapter(trained):
    module = trained["worker"].actor.actor_module
    moved = []
    for name, p in module.named_parameters():
        changed = not torch.equal(p, trained["before"][name])
        if "lora_" in name:
            moved.append(changed)
        else:
            assert not changed and not p.requires_grad, name
    assert moved and all(moved)  # lora_A and lora_B of every adapted layer moved
    opt_params = {id(p) for g in trained["worker"].actor_optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for n, p in module.named_parameters() if "lora_" in n}


@pytest.mark.cuda
def test_reference_is_the_base_model_with_no_second_copy(trained, tiny_model_dir, batch, device):
    mask = batch.batch["response_mask"].bool()
    base = _base_log_probs(tiny_model_dir, batch)
    torch.testing.assert_close(trained["ref_logp"][mask], base[mask], atol=atol(device), rtol=0)
    assert (trained["logp"] - trained["ref_logp"])[mask].abs().max() > 1e-3  # the actor has moved away
    worker = trained["worker"]
    ref_params = {id(p) for p in worker.ref_policy.actor_module.parameters()}
    assert ref_params == {id(p) for p in worker.actor.actor_module.parameters()}  # the same tensors


@pytest.mark.cuda
def test_rollout_weights_are_the_merged_adapter(trained):
    worker = trained["worker"]
    actor, rollout = worker.actor.actor_module, worker.rollout.module
    assert all(p.dtype == torch.bfloat16 for p in rollout.parameters())  # rollout.dtype=bfloat16
    layer = actor.base_model.model.model.layers[0].mlp.down_proj
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    by_hand = (layer.base_layer.weight + (ALPHA / RANK) * b @ a).to(torch.bfloat16)
    synced = rollout.model.layers[0].mlp.down_proj.weight
    assert torch.equal(synced, by_hand)
    assert not torch.equal(synced, layer.base_layer.weight.to(torch.bfloat16))
    # A weight without adapter is the base model's.
    assert torch.equal(
        rollout.model.embed_tokens.weight, actor.base_model.model.model.embed_tokens.weight.to(torch.bfloat16)
    )


@pytest.mark.cuda
def test_generate_sequences_runs_on_the_merged_rollout(trained, batch):
    P = batch.batch["prompts"].shape[1]
    prompts = DataProto.from_dict(
        tensors={k: batch.batch[k][:, :P].clone() for k in ("input_ids", "attention_mask", "position_ids")},
        meta_info={"do_sample": False},
    )
    out = trained["group"].generate_sequences(prompts)
    assert out.batch["responses"].shape == (len(PROMPT_LENS), 5)


@pytest.mark.cuda
def test_checkpoint_holds_the_adapter_and_resumes(trained, actor_config, batch, device):
    import torch.distributed.checkpoint as dcp

    folder = trained["dir"]
    assert (folder / "lora_adapter" / "adapter_model.safetensors").is_file()
    keys = [
        k
        for k in dcp.FileSystemReader(str(folder / "dcp")).read_metadata().state_dict_metadata
        if k.startswith("model.")
    ]
    assert keys and all("lora_" in k for k in keys)  # the frozen base weights stay out
    resumed = LocalWorkerGroup(
        ActorRolloutRefWorker, actor_config, actor_batch_sizes(actor_config), role="actor_rollout_ref", device=device
    )
    resumed.init_model()
    resumed.load_checkpoint(str(folder))
    torch.testing.assert_close(
        resumed.compute_log_prob(batch).batch["old_log_probs"], trained["logp"], atol=ATOL, rtol=0
    )
    torch.testing.assert_close(
        resumed.compute_ref_log_prob(batch).batch["ref_log_prob"], trained["ref_logp"], atol=ATOL, rtol=0
    )
    worker = resumed.workers[0]
    assert worker.actor_optimizer.state_dict()["state"], "Adam moments were not restored"
    # the rollout got the resumed adapter too
    assert torch.equal(
        worker.rollout.module.model.layers[1].self_attn.v_proj.weight,
        trained["worker"].rollout.module.model.layers[1].self_attn.v_proj.weight,
    )


@pytest.mark.cuda
def test_a_saved_adapter_starts_the_policy_and_the_reference_stays_the_base(trained, tiny_model_dir, batch, device):
    """``actor_rollout_ref.model.lora_adapter_path`` (verl's key) with ``lora_rank`` 0: the trained
    adapter's log-probs, the base model as the reference, and only the adapter trains on."""
    overrides = _overrides(tiny_model_dir, 0) + [f"{M}.lora_adapter_path={trained['dir'] / 'lora_adapter'}"]
    config = load_config(overrides).actor_rollout_ref
    group = LocalWorkerGroup(
        ActorRolloutRefWorker, config, actor_batch_sizes(config), role="actor_rollout_ref", device=device
    )
    group.init_model()
    torch.testing.assert_close(group.compute_log_prob(batch).batch["old_log_probs"], trained["logp"], atol=ATOL, rtol=0)
    torch.testing.assert_close(
        group.compute_ref_log_prob(batch).batch["ref_log_prob"], trained["ref_logp"], atol=ATOL, rtol=0
    )
    worker = group.workers[0]
    before = {n: p.detach().clone() for n, p in worker.actor.actor_module.named_parameters()}
    group.update_actor(batch)
    moved = [n for n, p in worker.actor.actor_module.named_parameters() if not torch.equal(p, before[n])]
    assert moved and all("lora_" in n for n in moved)


@pytest.mark.cuda
def test_resume_with_another_lora_rank_is_refused(trained, tiny_model_dir, device):
    full_config = load_config(_overrides(tiny_model_dir, 0)).actor_rollout_ref
    full = LocalWorkerGroup(
        ActorRolloutRefWorker, full_config, actor_batch_sizes(full_config), role="actor_rollout", device=device
    )
    full.init_model()
    with pytest.raises(CheckpointError, match=r"lora_rank=4 but this run has lora_rank=0"):
        full.load_checkpoint(str(trained["dir"]))


@pytest.mark.cuda
def test_merge_folds_the_adapter_into_an_hf_folder(trained, batch, tmp_path, device):
    from transformers import AutoModelForCausalLM

    from hybridrl.trainer.jobs.merge import main as merge_main

    target = tmp_path / "hf"
    assert merge_main(["--local_dir", str(trained["dir"]), "--target_dir", str(target)]) == 0
    assert (target / "model.safetensors").is_file() and not (target / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(target)
    b, R = batch.batch, batch.batch["responses"].shape[1]
    with torch.no_grad():
        logits = (
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
            .logits[:, -R - 1 : -1]
            .float()
        )
    logp = torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None])[..., 0]
    mask = b["response_mask"].bool()
    torch.testing.assert_close(logp[mask], trained["logp"][mask], atol=atol(device), rtol=0)


@pytest.mark.cuda
def test_merge_with_a_missing_base_model(trained, tmp_path, capsys):
    from hybridrl.trainer.jobs.merge import main as merge_main

    code = merge_main(
        [
            "--local_dir",
            str(trained["dir"]),
            "--target_dir",
            str(tmp_path / "hf"),
            "--base_model",
            str(tmp_path / "gone"),
        ]
    )
    assert code == 2 and "pass --base_model" in capsys.readouterr().err


@pytest.mark.cuda
def test_critic_lora_trains_the_adapter_and_the_value_head(tiny_model_dir, batch, device):
    cfg = load_config(
        _overrides(tiny_model_dir)
        + [
            "algorithm.adv_estimator=gae",
            f"critic.model.path={tiny_model_dir}",
            "critic.model.lora_rank=4",
            "critic.ppo_mini_batch_size=4",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.optim.lr=1e-2",
        ]
    )
    group = LocalWorkerGroup(
        CriticWorker, cfg.critic, worker_batch_sizes(cfg.critic, cfg.actor_rollout_ref.rollout.n, 1), device=device
    )
    group.init_model()
    module = group.workers[0].critic.critic_module
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    data = copy.deepcopy(batch)
    data.batch["values"] = group.compute_values(data).batch["values"]
    data.batch["returns"] = torch.ones_like(data.batch["values"]) * data.batch["response_mask"]
    group.update_critic(data)
    changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert any("lora_" in n for n in changed) and any("score" in n for n in changed)
    assert all("lora_" in n or "score" in n for n in changed)


# ----------------------------------------------------------------------------- FSDP2, two workers


def test_two_sharded_lora_workers_update_like_one(ray_cluster, actor_config, batch, trained, tmp_path, device):
    # CPU Ray workers (the ray_cluster fixture skips without Ray) against the local worker of `trained`
    if device != "cpu":
        pytest.skip("the Ray workers run on the CPU: compared with `trained` under --device cpu only")
    from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    sharded = RayWorkerGroup(
        RayResourcePool([1, 1]),
        RayClassWithInitArgs(
            ActorRolloutRefWorker,
            actor_config,
            actor_batch_sizes(actor_config, 2),
            role="actor_rollout_ref",
            device="cpu",
        ),
    )
    try:
        sharded.init_model()
        sharded.update_actor(batch)
        logp = sharded.compute_log_prob(batch).batch["old_log_probs"]
        ref_logp = sharded.compute_ref_log_prob(batch).batch["ref_log_prob"]
        sharded.save_checkpoint(str(tmp_path / "actor"), 1)
    finally:
        sharded.shutdown()
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(logp[mask], trained["logp"][mask], atol=ATOL, rtol=0)
    torch.testing.assert_close(ref_logp[mask], trained["ref_logp"][mask], atol=ATOL, rtol=0)
    # the adapter written by two ranks resumes on one worker
    resumed = LocalWorkerGroup(
        ActorRolloutRefWorker, actor_config, actor_batch_sizes(actor_config), role="actor_rollout_ref", device="cpu"
    )
    resumed.init_model()
    resumed.load_checkpoint(str(tmp_path / "actor"))
    torch.testing.assert_close(
        resumed.compute_log_prob(batch).batch["old_log_probs"][mask], logp[mask], atol=ATOL, rtol=0
    )
