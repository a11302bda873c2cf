"""Entry point: ``python -m hybridrl.trainer.main_ppo key=value ...`` (verl's command line).

Builds the pieces from the config (tokenizer, data, reward managers, worker groups) and hands
them to the driver. Errors the user can fix are printed as one line (exit code 2); set
``HYBRIDRL_DEBUG=1`` to see the traceback as well.
"""

from __future__ import annotations

import logging
import os
import sys

from hybridrl.algorithms.config import AlgoConfig, algo_config
from hybridrl.data import collate_fn, create_rl_dataloader, create_rl_dataset
from hybridrl.data.dataloader import stateful_dataloader
from hybridrl.data.errors import DataError
from hybridrl.data.sampler import create_custom_sampler
from hybridrl.errors import ConfigError
from hybridrl.models import load_tokenizer, resolve_model_path
from hybridrl.models.external import import_external_lib
from hybridrl.rewards import UnknownDataSourceError, known_data_sources
from hybridrl.rewards.load import load_reward_manager
from hybridrl.rewards.pool import build_reward_pool
from hybridrl.rewards.sandbox import build_sandbox, set_sandbox
from hybridrl.trainer.jobs.plan_cli import startup_line
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from hybridrl.trainer.ppo.correction_stage import share_rollout_correction
from hybridrl.trainer.ppo.ppo_trainer import PPOTrainer
from hybridrl.trainer.ppo.step_plan import StepPlan, make_step_plan
from hybridrl.trainer.run.checkpoint import find_latest_checkpoint
from hybridrl.trainer.run.checkpoint_lock import run_folder_lock
from hybridrl.trainer.run.tracking import tracker_for_run
from hybridrl.trainer.run.worker_groups import build_worker_groups, ppo_backend

logger = logging.getLogger(__name__)


def _build_dataloaders(config, tokenizer):
    data_cfg = config.data
    train_dataset = create_rl_dataset(data_cfg.train_files, data_cfg, tokenizer, config_key="data.train_files")
    if not config.reward_model.enable:
        _check_ground_truth_column(train_dataset, "data.train_files")
    filtering = config.algorithm.filter_groups.enable  # DAPO's dynamic sampling
    train_dataloader = create_rl_dataloader(
        train_dataset,
        batch_size=(filtering and data_cfg.gen_batch_size) or data_cfg.train_batch_size,
        shuffle=data_cfg.shuffle,
        seed=data_cfg.seed,
        num_workers=data_cfg.dataloader_num_workers,
        sampler=create_custom_sampler(data_cfg, train_dataset),
    )
    val_dataloader = None
    if data_cfg.val_files:
        val_dataset = create_rl_dataset(data_cfg.val_files, data_cfg, tokenizer, config_key="data.val_files")
        val_dataloader = stateful_dataloader(
            val_dataset,
            batch_size=data_cfg.val_batch_size or len(val_dataset),
            shuffle=False,
            drop_last=False,
            collate_fn=collate_fn,
        )
    return train_dataloader, val_dataloader


def _rows(dataset) -> list:
    """The parquet rows of an :class:`RLHFDataset` (a subclass's too), for the start-up checks; a
    ``data.custom_cls`` that is another Dataset has none, and its items are checked when scored."""
    rows = getattr(dataset, "rows", None)
    return rows if isinstance(rows, list) else []


def _check_ground_truth_column(dataset, config_key: str) -> None:
    """Without a reward model every row is scored by a rule against ``reward_model.ground_truth``:
    say so at start-up, not after the first generation."""
    missing = next((row for row in _rows(dataset) if not isinstance(row.get("reward_model"), dict)), None)
    if missing is not None:
        raise DataError(
            f"{config_key}: row {missing['_row']} of {missing['_source']} has no reward_model column (a dict with the "
            "ground_truth the reward function scores against, e.g. {'style': 'rule', 'ground_truth': '42'}); "
            "write the data with hybridrl preprocess, or set reward_model.enable=True for a reward model"
        )


def _check_data_sources(config, reward_fn, config_key: str, dataset) -> None:
    """Without a reward model every row is scored by the reward function of its data source
    (``data.reward_fn_key``): name the data sources that have none at start-up, not after the
    first generation. A reward manager without ``has_rule_scorer`` decides on its own."""
    has_rule_scorer = getattr(reward_fn, "has_rule_scorer", None)
    if config.reward_model.enable or has_rule_scorer is None:
        return
    column = config.data.reward_fn_key
    values: dict[str, object] = {}
    for row in _rows(dataset):
        value = row.get(column)
        values.setdefault(value if isinstance(value, str) else repr(value), value)
    unknown = sorted(name for name, value in values.items() if not has_rule_scorer(value))
    if unknown:
        shown = ", ".join(repr(name) for name in unknown[:10]) + (
            f" and {len(unknown) - 10} more" if unknown[10:] else ""
        )
        raise UnknownDataSourceError(
            f"{config_key}: no reward function for data_source {shown} (column data.reward_fn_key={column}); "
            f"known: {', '.join(known_data_sources())}; set custom_reward_function.path to a file with your "
            "compute_score, register one with @hybridrl.rewards.register_scorer in a module named by "
            "actor_rollout_ref.model.external_lib, or fix the column"
        )


def total_training_steps(config, steps_per_epoch: int) -> int:
    """``trainer.total_training_steps`` when set, else epochs x batches per epoch."""
    explicit = config.trainer.total_training_steps
    return int(explicit) if explicit else steps_per_epoch * int(config.trainer.total_epochs)


def run_ppo(config) -> None:
    """Trains with a resolved config (see ``hybridrl.config.load_config``).

    Raises:
        ConfigError: a key the config has no field for, a value of the wrong type, or a broken
            rule (:func:`~hybridrl.trainer.ppo.config_check.validate_ppo_config`); DataError: bad data;
            RunFolderBusy: another run holds ``trainer.default_local_dir``.
    """
    config = typed_ppo_config(config)
    _check_train_files(config)
    _, world_size = ppo_backend(config)
    # A module named here may register estimators, losses or KL forms: import it before the
    # start-up check looks their names up.
    import_external_lib(config.actor_rollout_ref.model.external_lib)
    algo = algo_config(config)  # the typed algorithm section, built once and handed down
    for note in validate_ppo_config(config, world_size=world_size, algo=algo):
        print(f"hybridrl: note: {note}", flush=True)
    print_memory_plan(config)
    with run_folder_lock(config.trainer.default_local_dir):  # one run per folder: a second one stops here
        _train(config, algo, make_step_plan(config, algo))


def _train(config, algo: AlgoConfig, plan: StepPlan) -> None:
    """The run of :func:`run_ppo` once its config is checked and its folder locked; ``plan``
    says which roles the run needs (a critic, a reference policy)."""
    import torch

    torch.manual_seed(config.data.seed)

    model_cfg = config.actor_rollout_ref.model
    tokenizer_key = "data.tokenizer" if config.data.tokenizer else "actor_rollout_ref.model.path"
    tokenizer_path = resolve_model_path(config.data.tokenizer or model_cfg.path, config_key=tokenizer_key)
    tokenizer = load_tokenizer(
        tokenizer_path, trust_remote_code=model_cfg.trust_remote_code, chat_template=model_cfg.custom_chat_template
    )
    train_dataloader, val_dataloader = _build_dataloaders(config, tokenizer)
    total_steps = total_training_steps(config, len(train_dataloader))
    share_rollout_correction(config)

    # The scoring processes (reward.num_workers > 1) live for the whole run; built after the code
    # sandbox is set, whose setting they take over.
    set_sandbox(build_sandbox(config.reward_model.sandbox, config.reward_model.sandbox_fusion))
    reward_pool = build_reward_pool(
        config.reward_model.num_workers, config.custom_reward_function.path, model_cfg.external_lib
    )
    try:
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0, pool=reward_pool)
        val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, pool=reward_pool)
        _check_data_sources(config, reward_fn, "data.train_files", train_dataloader.dataset)
        if val_dataloader is not None:
            _check_data_sources(config, val_reward_fn, "data.val_files", val_dataloader.dataset)
    except BaseException:
        if reward_pool is not None:
            reward_pool.close()
        raise
    groups = build_worker_groups(
        config,
        use_critic=plan.use_critic,
        use_reference=plan.use_reference_policy,
        use_reward_model=bool(config.reward_model.enable),
        total_training_steps=total_steps,
    )
    try:
        trainer = PPOTrainer(
            config,
            tokenizer,
            groups.actor_rollout,
            groups.critic,
            reward_fn,
            val_reward_fn,
            train_dataloader,
            val_dataloader,
            total_steps,
            algo=algo,
            plan=plan,
            n_workers=groups.world_size,
            rm_wg=groups.reward_model,
            rollout_wg=groups.rollout,
            teacher_wg=groups.teacher,
        )
        trainer_cfg = config.trainer
        save_run_config(config, trainer_cfg.default_local_dir)
        tracker = tracker_for_run(config, total_steps)
        try:
            trainer.fit(tracker)
        finally:
            tracker.finish()
        print(run_summary(trainer_cfg, trainer.global_steps), flush=True)
    finally:
        groups.shutdown()
        if reward_pool is not None:
            reward_pool.close()  # calls still running after pool.CLOSE_TIMEOUT_S are killed


def print_memory_plan(config) -> None:
    """Prints the memory plan's one-line total (``hybridrl plan`` has the table) and warns when it
    predicts a device will not fit. It reads config.json only; a plan that cannot be made (an
    architecture it does not model, ...) never stops the run: one debug line says why."""
    try:
        line, fits = startup_line(config)
    except Exception as exc:  # noqa: BLE001 - the plan is advice; training goes on without it
        logger.debug("memory plan: not made (%s: %s)", type(exc).__name__, exc)
        return
    print(f"hybridrl: {line}", flush=True)
    if not fits:
        logger.warning(
            "the memory plan predicts a device will not fit this run; `hybridrl plan` with the same "
            "overrides lists the keys that would make it fit"
        )


def run_summary(trainer_cfg, last_step: int) -> str:
    """What a finished run leaves behind and what to do next, for the end of ``hybridrl train``."""
    folder = os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    lines = [
        f"hybridrl: done after step {last_step}. Run folder: {folder}",
        f"  config:      {os.path.join(folder, 'config.yaml')}",
    ]
    metrics = os.path.join(folder, "metrics.jsonl")
    if os.path.exists(metrics):
        lines.append(f"  metrics:     {metrics}   (plot: hybridrl plot {folder} -o curves.png)")
    latest = find_latest_checkpoint(folder, verify=False)
    if latest:
        lines.append(
            f"  checkpoint:  {latest}   (resume: the same command with more trainer.total_training_steps; "
            f"an HF model: hybridrl merge --local_dir {os.path.join(latest, 'actor')} --target_dir DIR)"
        )
    else:
        lines.append("  checkpoint:  none (trainer.save_freq > 0 writes them)")
    if trainer_cfg.rollout_data_dir:
        lines.append(
            f"  samples:     {trainer_cfg.rollout_data_dir}   (browse: hybridrl view {trainer_cfg.rollout_data_dir})"
        )
    return "\n".join(lines)


def _check_train_files(config) -> None:
    """``hybridrl train`` without data: say what to run or set, before any other check."""
    files = config.data.train_files
    if files is None:
        return  # the data check names the missing key
    paths = [files] if isinstance(files, str) else list(files)
    missing = [p for p in paths if not os.path.exists(os.path.expanduser(str(p)))]
    if missing:
        raise ConfigError(
            f"data.train_files={missing[0]} does not exist; make a data set (hybridrl preprocess gsm8k ...), "
            "set data.train_files=<parquet> (and data.val_files), or run the main job: "
            "bash examples/run_arithmetic_grpo.sh (hybridrl train --help for more)"
        )


def save_run_config(config, folder: str) -> str:
    """Writes the resolved config (``auto`` dtypes already replaced) to ``<folder>/config.yaml``
    atomically, so a run's folder says what it ran with. Returns the path."""
    from omegaconf import OmegaConf

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.yaml")
    tmp = f"{path}.tmp{os.getpid()}"
    OmegaConf.save(config, tmp)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridrl.trainer.main_ppo key=value ...``, verl's spelling of ``hybridrl train``."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_ppo, "ppo_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
