"""Entry point: ``python -m hybridrl.trainer.main_ppo key=value ...`` (verl's command line).

Builds the pieces from the config (tokenizer, data, reward managers, worker groups) and hands
them to the driver. Errors the user can fix are printed as one line (exit code 2); set
``HYBRIDRL_DEBUG=1`` to see the traceback as well.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)


def _resolve_backend(config) -> tuple[str, int]:
    trainer_cfg = config.trainer
    world_size = int(trainer_cfg.nnodes) * int(trainer_cfg.n_gpus_per_node)
    backend = trainer_cfg.get("backend", "auto")
    if backend == "auto":
        backend = "local" if world_size == 1 else "ray"
    if backend == "ray" or world_size > 1:
        raise ValueError(
            f"trainer.backend={backend} with trainer.nnodes x trainer.n_gpus_per_node = {world_size} workers: "
            "this build runs one in-process worker (the Ray/FSDP2 backend is not in it yet); "
            "set trainer.nnodes=1 trainer.n_gpus_per_node=1 trainer.backend=local"
        )
    return backend, world_size


def _build_dataloaders(config, tokenizer):
    from hybridrl.data import RLHFDataset, collate_fn, create_rl_dataloader
    from torchdata.stateful_dataloader import StatefulDataLoader

    data_cfg = config.data
    train_dataset = RLHFDataset(data_cfg.train_files, tokenizer, data_cfg, config_key="data.train_files")
    train_dataloader = create_rl_dataloader(
        train_dataset, batch_size=data_cfg.train_batch_size, shuffle=data_cfg.get("shuffle", True),
        seed=data_cfg.get("seed", 1), num_workers=data_cfg.get("dataloader_num_workers", 0),
    )
    val_dataloader = None
    if data_cfg.get("val_files"):
        val_dataset = RLHFDataset(data_cfg.val_files, tokenizer, data_cfg, config_key="data.val_files")
        val_dataloader = StatefulDataLoader(
            val_dataset, batch_size=data_cfg.get("val_batch_size") or len(val_dataset),
            shuffle=False, drop_last=False, collate_fn=collate_fn,
        )
    return train_dataloader, val_dataloader


def total_training_steps(config, steps_per_epoch: int) -> int:
    """``trainer.total_training_steps`` when set, else epochs x batches per epoch."""
    explicit = config.trainer.get("total_training_steps")
    return int(explicit) if explicit else steps_per_epoch * int(config.trainer.total_epochs)


def run_ppo(config) -> None:
    """Trains with a resolved config (see ``hybridrl.config.load_config``)."""
    import torch
    from omegaconf import open_dict

    from hybridrl.config import validate_ppo_config
    from hybridrl.controller.local import LocalWorkerGroup
    from hybridrl.models import load_tokenizer, resolve_model_path
    from hybridrl.rewards.manager import load_reward_manager
    from hybridrl.trainer.ppo_trainer import PPOTrainer
    from hybridrl.trainer.tracking import Tracking
    from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    _, world_size = _resolve_backend(config)
    for note in validate_ppo_config(config, world_size=world_size):
        print(f"hybridrl: note: {note}", flush=True)
    torch.manual_seed(config.data.get("seed", 1))

    model_path = resolve_model_path(config.actor_rollout_ref.model.path, config_key="actor_rollout_ref.model.path")
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.actor_rollout_ref.model.get("trust_remote_code", False))
    train_dataloader, val_dataloader = _build_dataloaders(config, tokenizer)
    total_steps = total_training_steps(config, len(train_dataloader))
    with open_dict(config):
        config.actor_rollout_ref.actor.optim.total_training_steps = total_steps
        config.critic.optim.total_training_steps = total_steps

    reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1)
    algo = config.algorithm
    use_ref = algo.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss
    device = config.trainer.get("device", "auto")
    actor_rollout_wg = LocalWorkerGroup(
        ActorRolloutRefWorker, config.actor_rollout_ref,
        role="actor_rollout_ref" if use_ref else "actor_rollout", device=device,
    )
    actor_rollout_wg.init_model()
    critic_wg = None
    if algo.adv_estimator == "gae":
        critic_wg = LocalWorkerGroup(CriticWorker, config.critic, device=device)
        critic_wg.init_model()

    trainer = PPOTrainer(
        config, tokenizer, actor_rollout_wg, critic_wg, reward_fn, val_reward_fn,
        train_dataloader, val_dataloader, total_steps, n_workers=world_size,
    )
    trainer_cfg = config.trainer
    tracker = Tracking(
        project_name=trainer_cfg.project_name, experiment_name=trainer_cfg.experiment_name,
        default_backend=list(trainer_cfg.logger), config=config,
        local_dir=trainer_cfg.default_local_dir, total_steps=total_steps,
    )
    try:
        trainer.fit(tracker)
    finally:
        tracker.finish()


def is_user_error(exc: BaseException) -> bool:
    """Errors raised by hybridrl about the user's config, data or files: one line is enough."""
    module = type(exc).__module__ or ""
    return module.startswith("hybridrl") or isinstance(exc, FileNotFoundError)


def main(argv: list[str] | None = None) -> int:
    from hybridrl.config import load_config

    argv = sys.argv[1:] if argv is None else argv
    try:
        run_ppo(load_config(argv, config_name="ppo_trainer"))
    except Exception as exc:  # noqa: BLE001 - turned into one readable line below
        if os.environ.get("HYBRIDRL_DEBUG") or not is_user_error(exc):
            raise
        print(f"hybridrl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
