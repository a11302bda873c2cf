"""The driver: the PPO/GRPO loop of DESIGN.md, one stage per call, each stage timed.

The driver holds only small tensors and control flow; models live in the worker groups.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from typing import Iterator

import numpy as np
import torch

from hybridrl.algorithms.config import AlgoConfig
from hybridrl.algorithms.kl import apply_kl_penalty
from hybridrl.algorithms.policy_loss import agg_loss
from hybridrl.algorithms.rollout_corr import compute_offpolicy_metrics
from hybridrl.data.sampler import curriculum_update
from hybridrl.protocol import DataProto
from hybridrl.rewards.manager import RewardFunctionError
from hybridrl.trainer.ppo.async_reward import PendingReward, reward_deadline_s, scores_async
from hybridrl.trainer.ppo.balance import balance_batch
from hybridrl.trainer.ppo.correction_stage import apply_bypass_mode, compute_rollout_correction_and_add_to_batch
from hybridrl.trainer.ppo.metrics import (
    compute_data_metrics,
    compute_rollout_probs_diff_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from hybridrl.trainer.ppo.rollout_dump import ValidationDump, dump_rollouts
from hybridrl.trainer.ppo.stages import (
    GEN_BATCH_KEYS,
    apply_reward_failures,
    build_dynamic_sampler,
    compute_advantage,
    compute_reward,
    object_array,
    trim_left_padding,
)
from hybridrl.trainer.ppo.step_plan import StepPlan
from hybridrl.trainer.run import checkpoint
from hybridrl.trainer.run.loop import LoopSettings, run_training
from hybridrl.trainer.run.metrics import marked_timer, merge_metrics, reduce_metrics, reduce_worker_metrics
from hybridrl.trainer.schedules.modes import Schedule, make_schedule
from hybridrl.workers.config.profiler import starts, stops


class PPOTrainer:
    """Runs ``fit()``: validation, then ``step()`` per batch, checkpoints and logging
    (:func:`~hybridrl.trainer.run.loop.run_training`), on the schedule of the config
    (:mod:`hybridrl.trainer.schedules.modes`: sync, one-step-off or fully async), chosen here once."""

    def __init__(
        self,
        config,
        tokenizer,
        actor_rollout_wg,
        critic_wg,
        reward_fn,
        val_reward_fn,
        train_dataloader,
        val_dataloader,
        total_training_steps: int,
        *,
        algo: AlgoConfig,
        plan: StepPlan,
        n_workers: int = 1,
        rm_wg=None,
        rollout_wg=None,
        teacher_wg=None,
    ):
        self.config = config
        # engines and teachers: in the actor's workers, or on pools of their own (rollout/distillation.nnodes > 0)
        self.rollout_wg = rollout_wg if rollout_wg is not None else actor_rollout_wg
        self.teacher_wg = teacher_wg if teacher_wg is not None else actor_rollout_wg
        self.rm_wg = rm_wg  # reward-model worker group (reward_model.enable) or None
        self.tokenizer = tokenizer
        self.actor_rollout_wg = actor_rollout_wg
        self.critic_wg = critic_wg
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.total_training_steps = total_training_steps
        self.n_workers = n_workers
        self.algo = algo  # the typed algorithm section, typed once by run_ppo
        self.plan = plan  # which passes every step runs, made once by run_ppo
        self.kl_ctrl_in_reward = self.algo.kl_ctrl.controller()
        self.rollout_correction = self.algo.rollout_correction
        self.dynamic_sampler = build_dynamic_sampler(config, tokenizer)
        self.reward_async = scores_async(config)  # score while the log-prob passes run
        self._pending_metrics, self._pending_timing = {}, {}  # of generation batches not trained on yet
        self._reward_extra_keys: dict[str, None] = {}  # the reward function's extra outputs seen so far
        self.global_steps = 0
        self._profiling = False  # the workers record a trace (global_profiler.steps)
        # where each batch is generated, when the engine gets the weights: started by fit()
        self.schedule: Schedule = make_schedule(config, self)

    # ---------------------------------------------------------------- one training step
    @staticmethod
    def prepare_generation(batch_dict: dict) -> tuple[DataProto, DataProto]:
        """``(rows, prompts)`` of a dataloader batch: its rows with their group ids (``uid``) and
        the generation input (left padding trimmed, with the rows' non-tensor fields), one row per prompt."""
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        prompts = trim_left_padding(batch.pop(batch_keys=GEN_BATCH_KEYS))
        prompts.non_tensor_batch.update(batch.non_tensor_batch)  # row fields for agent loops (agent_name, ...)
        return batch, prompts

    def generate(self, batch_dict: dict) -> tuple[DataProto, DataProto, DataProto]:
        """``(rows, prompts, responses)`` of a dataloader batch (:meth:`prepare_generation`), ``rollout.n``
        responses per prompt, each tagged with its ``param_version``. One-step-off runs it in a thread."""
        batch, prompts = self.prepare_generation(batch_dict)
        n = self.config.actor_rollout_ref.rollout.n
        return batch, prompts, self.actor_rollout_wg.generate_sequences(prompts.repeat(n, interleave=True))

    def join_responses(self, batch: DataProto, prompts: DataProto, responses: DataProto, timing_raw: dict) -> DataProto:
        """The prompts' rows (``batch``, one per prompt) repeated ``rollout.n`` times and joined with
        their ``responses``; for ReMax first each prompt's greedy baseline (``timing_s/gen_max``)."""
        if self.plan.reward_baselines:
            with marked_timer("gen_max", timing_raw):
                batch.batch["reward_baselines"] = self.greedy_reward_baselines(batch, prompts)
        return batch.repeat(self.config.actor_rollout_ref.rollout.n, interleave=True).union(responses)

    def rollout(self, batch_dict: dict, metrics: dict, timing_raw: dict) -> DataProto:
        """Samples ``rollout.n`` responses per prompt of a dataloader batch, with the group ids
        (``uid``) and, with a reward model, its ``rm_scores`` (the reward manager reads them).
        The schedule says where the batch was generated (:meth:`Schedule.rollout
        <hybridrl.trainer.schedules.modes.Schedule.rollout>`): now, during the previous step
        (one-step-off), or streamed (fully async)."""
        is_last = self.global_steps >= self.total_training_steps
        batch = self.schedule.rollout(batch_dict, self.global_steps, is_last, metrics, timing_raw)
        return self._score_with_reward_model(batch, metrics, timing_raw)

    def _score_with_reward_model(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        if self.rm_wg is not None:  # rm_scores first: the reward manager combines them with rule scores
            with marked_timer("reward", timing_raw):
                batch = self._rm_scores(batch, metrics)
            rm_seq = batch.batch["rm_scores"].sum(-1)
            metrics.update({f"rm/score/{s}": getattr(rm_seq, s)().item() for s in ("mean", "max", "min")})
        return batch

    def _rm_scores(self, batch: DataProto, metrics: dict | None = None) -> DataProto:
        """``batch`` with the reward model's ``rm_scores``; the memory its workers report with them goes
        into ``metrics`` (the maximum, :func:`merge_metrics`), or nowhere when None (validation)."""
        scored = self.rm_wg.compute_rm_score(batch)
        memory = scored.meta_info.pop("metrics", {})
        if metrics is not None:
            merge_metrics(metrics, reduce_metrics(memory))
        return batch.union(scored)

    def attach_reward(self, batch: DataProto, reward: tuple[torch.Tensor, dict], metrics: dict) -> DataProto:
        """Puts the reward manager's output on the batch: ``token_level_scores`` ``(bs, response_length)``,
        one non-tensor column per extra output, and ``reward_model.on_error`` applied to failed samples."""
        reward_tensor, reward_extra_info = reward
        batch.batch["token_level_scores"] = reward_tensor
        for key, values in reward_extra_info.items():
            if key in batch.non_tensor_batch:
                raise RewardFunctionError(
                    f"the reward function returns {key!r}, the name of a batch column; rename that key of its dict"
                )
            batch.non_tensor_batch[key] = object_array(values)
        self._reward_extra_keys.update(dict.fromkeys(reward_extra_info))
        batch, failure_metrics = apply_reward_failures(
            batch, self.config.reward_model.on_error, drop_rows=self.dynamic_sampler is not None
        )
        for key, value in failure_metrics.items():  # summed over the generation batches of a step
            metrics[key] = metrics.get(key, 0.0) + value
        return batch

    def rollout_and_score(self, batch_dict: dict, metrics: dict, timing_raw: dict) -> DataProto:
        """:meth:`rollout`, then the reward at once (:meth:`attach_reward`)."""
        batch = self.rollout(batch_dict, metrics, timing_raw)
        with marked_timer("reward", timing_raw):
            reward = compute_reward(batch, self.reward_fn)
        return self.attach_reward(batch, reward, metrics)

    def step(self, batch_dict: dict) -> dict | None:
        """One training step on a dataloader batch; with dynamic sampling (``algorithm.filter_groups``)
        None while the batch still collects groups (the call only generated and scored).

        With ``reward_model.launch_reward_fn_async`` the reward is computed in a thread from the end
        of generation (after balancing) to the advantage stage, overlapping the log-prob passes."""
        cfg = self.config
        metrics, timing_raw = self._pending_metrics, self._pending_timing  # kept over collecting calls
        if not self._profiling and starts(cfg.global_profiler, self.global_steps):
            self.set_profiling(True)
        with marked_timer("step", timing_raw):
            if self.reward_async:
                batch = self.rollout(batch_dict, metrics, timing_raw)
            else:
                batch = self.rollout_and_score(batch_dict, metrics, timing_raw)
            if self.dynamic_sampler is not None:
                batch, sampling_metrics = self.dynamic_sampler.collect(batch)
                if batch is None:
                    return None
                metrics.update(sampling_metrics)
            self._pending_metrics, self._pending_timing = {}, {}
            if cfg.trainer.balance_batch:  # equal tokens per data-parallel worker
                metrics.update(balance_batch(batch, self.n_workers))
            batch.meta_info["global_steps"] = self.global_steps
            batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
            batch.meta_info["max_prompt_length"] = cfg.data.max_prompt_length
            pending = (
                PendingReward(batch, self.reward_fn, reward_deadline_s(cfg, len(batch))) if self.reward_async else None
            )

            batch, entropys = self.old_log_probs(batch, timing_raw)

            if self.plan.ref_log_prob:
                with marked_timer("ref", timing_raw):
                    batch = batch.union(
                        self.actor_rollout_wg.compute_ref_log_prob(batch, full_kl=self.plan.ref_full_kl)
                    )

            if self.plan.teacher:  # on-policy distillation: the teachers score the responses
                with marked_timer("teacher", timing_raw):
                    batch = batch.union(self.teacher_wg.compute_teacher_log_prob(batch))

            if self.plan.use_critic:
                with marked_timer("values", timing_raw):
                    batch = batch.union(self.critic_wg.compute_values(batch))

            if pending is not None:  # the time the driver still waits for the scores
                with marked_timer("reward", timing_raw):
                    batch = self.attach_reward(batch, pending.result(), metrics)
            reward_extra_info = {key: list(batch.non_tensor_batch[key]) for key in self._reward_extra_keys}
            if entropys is not None:  # after the reward: mask_sample may have masked samples
                metrics["actor/entropy"] = agg_loss(
                    entropys, batch.batch["response_mask"], cfg.actor_rollout_ref.actor.loss_agg_mode
                ).item()

            with marked_timer("adv", timing_raw):
                batch = self.compute_advantages(batch, metrics)
            # before the update: its weight sync may be the last call a failing rollout pool answers
            self.collect_memory_metrics(metrics)
            batch = self.update(batch, metrics, timing_raw)
            self.rollout_mismatch_metrics(batch, metrics)
        if self._profiling and stops(cfg.global_profiler, self.global_steps):
            self.set_profiling(False)  # writes the traces (outside timing_s/step)

        curriculum_update(self.train_dataloader, batch)  # verl's curriculum sampler sees the trained batch
        metrics.update(compute_data_metrics(batch, use_critic=self.plan.use_critic))
        dump_rollouts(cfg.trainer, batch, self.tokenizer, self.global_steps, reward_extra_info)
        metrics.update(compute_timing_metrics(batch, timing_raw))
        metrics.update(compute_throughput_metrics(batch, timing_raw, n_devices=self.n_workers))
        metrics.update(self.schedule.step_metrics(timing_raw))
        return metrics

    def set_profiling(self, on: bool) -> None:
        """Starts (``on``) or stops the workers' torch profiler (verl's ``start_profile`` /
        ``stop_profile``; :mod:`hybridrl.workers.profiler`): the roles whose ``profiler.enable`` record
        the steps of ``global_profiler.steps``."""
        others = [self.critic_wg] if self.plan.use_critic else []
        for group in [self.actor_rollout_wg, *others, *([self.rm_wg] if self.rm_wg is not None else [])]:
            if on:
                group.start_profile(self.global_steps)
            else:
                group.stop_profile()
        self._profiling = on

    def old_log_probs(self, batch: DataProto, timing_raw: dict) -> tuple[DataProto, torch.Tensor | None]:
        """``(batch, entropys)``: the batch with ``old_log_probs`` where the step plan says they come
        from: the rollout's (bypass mode), a log-prob pass (with the ``entropys``), or (None) the
        update's own, which reports ``actor/entropy`` itself."""
        if self.plan.old_log_probs == "rollout":  # bypass mode: the rollout log-probs are the old ones
            apply_bypass_mode(batch)
        elif self.plan.old_log_probs == "compute":  # else ("update") the update reports actor/entropy
            with marked_timer("old_log_prob", timing_raw):
                old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
                entropys = old_log_prob.batch.pop("entropys")
                return batch.union(old_log_prob), entropys
        return batch, None

    def rollout_mismatch_metrics(self, batch: DataProto, metrics: dict) -> None:
        """The gap between the engine's and the trainer's log-probs (``training/rollout_probs_diff_*``,
        and the off-policy metrics when nothing corrects for it) into ``metrics``; in bypass mode
        the actor reports it."""
        keys = batch.batch.keys()
        if "rollout_log_probs" not in keys or "old_log_probs" not in keys or self.rollout_correction.bypass_mode:
            return
        mismatch = (batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"])
        metrics.update(compute_rollout_probs_diff_metrics(*mismatch))
        if not self.rollout_correction.corrects:  # else logged with the correction
            metrics.update(compute_offpolicy_metrics(*mismatch))

    def compute_advantages(self, batch: DataProto, metrics: dict) -> DataProto:
        """``token_level_rewards`` (the scores, minus the KL penalty with ``use_kl_in_reward``), the
        rollout-correction weights in decoupled mode, then ``advantages`` and ``returns``
        ``(bs, response_length)`` of ``algorithm.adv_estimator``."""
        algo = self.algo
        reward_tensor = batch.batch["token_level_scores"]
        if algo.use_kl_in_reward:
            rewards, kl_metrics = apply_kl_penalty(
                reward_tensor,
                batch.batch["old_log_probs"],
                batch.batch["ref_log_prob"],
                batch.batch["response_mask"],
                self.kl_ctrl_in_reward,
                algo.kl_penalty,
                full_kl=batch.batch.get("full_kl", None),
            )
            batch.batch["token_level_rewards"] = rewards
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = reward_tensor
        if self.rollout_correction.corrects and not self.rollout_correction.bypass_mode:
            batch, corr_metrics = compute_rollout_correction_and_add_to_batch(batch, self.rollout_correction)
            metrics.update(corr_metrics)
        return compute_advantage(
            batch, algo.adv_estimator, algo.gamma, algo.lam, algo.norm_adv_by_std_in_grpo, config=algo
        )

    def update(self, batch: DataProto, metrics: dict, timing_raw: dict) -> DataProto:
        """The critic's update, then the actor's (from ``trainer.critic_warmup`` on), then the
        schedule's ``after_update`` (fully async: the engines get the weights). On policy (no
        old-log-prob pass) the actor's update returns its own log-probs as ``old_log_probs``."""
        if self.plan.use_critic:
            with marked_timer("update_critic", timing_raw):
                critic_output = self.critic_wg.update_critic(batch)
            merge_metrics(metrics, reduce_metrics(critic_output.meta_info["metrics"]))
        if self.config.trainer.critic_warmup <= self.global_steps:
            with marked_timer("update_actor", timing_raw):
                # one-step-off: the engine gets the weights at the next step; fully async: in after_update
                actor_output = self.actor_rollout_wg.update_actor(
                    batch,
                    on_policy=self.plan.on_policy,
                    sync_rollout_weights=self.schedule.update_syncs_weights,
                )
            merge_metrics(metrics, reduce_metrics(actor_output.meta_info["metrics"]))
            if actor_output.batch is not None:
                batch.batch["old_log_probs"] = actor_output.batch["old_log_probs"]
        self.schedule.after_update(timing_raw)
        return batch

    def collect_memory_metrics(self, metrics: dict) -> None:
        """verl's ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb`` and
        ``perf/cpu_memory_used_gb`` (GiB, :func:`hybridrl.workers.memory.memory_metrics`) into ``metrics``:
        the maximum over every worker of every group. The updates and the reward model's scoring report
        theirs with their results; a group without such a call this step (the actor during
        ``trainer.critic_warmup``, a rollout or teacher pool of its own) is asked once (``get_memory_metrics``).
        With the local backend the workers run in the driver's process: theirs is the driver's memory."""
        silent = [self.actor_rollout_wg] if self.config.trainer.critic_warmup > self.global_steps else []
        silent += [wg for wg in (self.rollout_wg, self.teacher_wg) if wg is not self.actor_rollout_wg]
        for worker_group in silent:
            merge_metrics(metrics, reduce_worker_metrics(worker_group.get_memory_metrics()))

    def greedy_reward_baselines(self, batch: DataProto, prompts: DataProto) -> torch.Tensor:
        """ReMax's baseline: the reward of each prompt's greedy response, ``(n_prompts,)``.

        Source: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
        Aligning Large Language Models", arXiv 2310.10505. ``batch`` holds the prompts' rows
        (one per prompt, before ``repeat``), ``prompts`` their generation inputs.
        """
        prompts = DataProto(
            batch=prompts.batch,
            non_tensor_batch=dict(prompts.non_tensor_batch),
            meta_info={**prompts.meta_info, "do_sample": False},
        )
        greedy = self.rollout_wg.generate_sequences(prompts)
        scored = DataProto(
            batch=batch.batch.clone(False),
            non_tensor_batch=dict(batch.non_tensor_batch),
            meta_info=dict(batch.meta_info),
        ).union(greedy)
        reward_tensor, _ = compute_reward(scored, self.reward_fn)
        return reward_tensor.sum(dim=-1)

    # ---------------------------------------------------------------- validation
    def validate(self) -> dict:
        """Greedy (``rollout.val_kwargs``) generation on the validation set.

        Returns ``val-core/<data_source>/reward/mean@<n>``: the mean score per data source, plus
        ``val/generations`` (samples for the loggers) when ``trainer.log_val_generations`` > 0.
        Samples go to ``trainer.validation_data_dir`` when set.
        """
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        n = val_kwargs.n
        if self.rollout_wg is self.actor_rollout_wg:  # one-step-off: the engine still has the weights of a step ago
            self.actor_rollout_wg.sync_rollout_weights()
        scores_by_source: dict[str, list[float]] = defaultdict(list)
        dump = ValidationDump(self.config.trainer, self.tokenizer, self.global_steps)
        for batch_dict in self.val_dataloader:
            batch = DataProto.from_single_dict(batch_dict)
            gen_batch = trim_left_padding(batch.pop(batch_keys=GEN_BATCH_KEYS)).repeat(n, interleave=True)
            gen_batch.non_tensor_batch.update(batch.repeat(n, interleave=True).non_tensor_batch)  # for agent loops
            gen_batch.meta_info = {
                "do_sample": val_kwargs.do_sample,
                "temperature": val_kwargs.temperature,
                "top_p": val_kwargs.top_p,
                "top_k": val_kwargs.top_k,
                "validate": True,
            }
            batch = batch.repeat(n, interleave=True).union(self.rollout_wg.generate_sequences(gen_batch))
            if self.rm_wg is not None:
                batch = self._rm_scores(batch)
            reward_tensor, reward_extra_info = compute_reward(batch, self.val_reward_fn)
            dump.add(batch, reward_tensor, reward_extra_info)
            sources = batch.non_tensor_batch[self.config.data.reward_fn_key]
            for source, score in zip(sources, reward_tensor.sum(-1).tolist()):
                scores_by_source[str(source)].append(score)
        return dump.finish(
            {
                f"val-core/{source}/reward/mean@{n}": float(np.mean(scores))
                for source, scores in scores_by_source.items()
            }
        )

    # ---------------------------------------------------------------- checkpoints
    def has_validation(self) -> bool:
        """Whether the run has a validation set (``data.val_files``)."""
        return self.val_dataloader is not None

    def save_checkpoint(self) -> str:
        """Writes ``global_step_<N>`` (:func:`~hybridrl.trainer.run.checkpoint.save_checkpoint`): the actor
        (and critic) shards, the dataloader position and the schedule's state; returns its folder."""
        trainer_cfg = self.config.trainer

        def write_workers(folder: str) -> None:
            self.actor_rollout_wg.save_checkpoint(os.path.join(folder, "actor"), self.global_steps)
            if self.plan.use_critic:
                self.critic_wg.save_checkpoint(os.path.join(folder, "critic"), self.global_steps)

        keep = trainer_cfg.max_actor_ckpt_to_keep
        # one-step-off: the position before the next batch was drawn; fully async: before the oldest
        # batch with groups not trained (and which are): a resumed run generates them again
        dataloader_state, schedule_state = self.schedule.checkpoint_state()
        trainer_state = {"kl_coef_in_reward": self.kl_ctrl_in_reward.value, **schedule_state}
        return checkpoint.save_checkpoint(
            trainer_cfg.default_local_dir,
            self.global_steps,
            write_workers,
            dataloader_state,
            max_to_keep=keep,
            trainer_state=trainer_state,
            settings=self.resume_settings(),
        )

    def resume_settings(self) -> dict:
        """The config values (key -> value) a resume warns about when they changed: the learning
        rates, the batch sizes and the algorithm (:func:`~hybridrl.trainer.run.checkpoint.warn_changed_settings`)."""
        cfg = self.config
        actor = cfg.actor_rollout_ref.actor
        settings = {
            "data.train_batch_size": cfg.data.train_batch_size,
            "actor_rollout_ref.rollout.n": cfg.actor_rollout_ref.rollout.n,
            "algorithm.adv_estimator": self.algo.adv_estimator,
            "actor_rollout_ref.actor.policy_loss.loss_mode": actor.policy_loss.loss_mode,
        }
        roles = [("actor_rollout_ref.actor", actor)] + ([("critic", cfg.critic)] if self.plan.use_critic else [])
        for prefix, role in roles:
            settings[f"{prefix}.optim.lr"] = role.optim.lr
            settings[f"{prefix}.ppo_mini_batch_size"] = role.ppo_mini_batch_size
            settings[f"{prefix}.ppo_micro_batch_size"] = role.ppo_micro_batch_size
            settings[f"{prefix}.ppo_micro_batch_size_per_gpu"] = role.ppo_micro_batch_size_per_gpu
        return settings

    def load_checkpoint(self) -> Iterator[dict] | None:
        """Restores the latest (``resume_mode=auto``) or the given checkpoint (``resume_path``), the
        schedule's state included; returns the rest of the checkpoint's epoch (None: nothing to resume).

        Raises:
            CheckpointError: as :func:`~hybridrl.trainer.run.checkpoint.resume_checkpoint_path` and
                :func:`~hybridrl.trainer.run.checkpoint.read_checkpoint`.
        """
        path = checkpoint.resume_checkpoint_path(self.config.trainer)
        if path is None:
            return None
        trainer_state, dataloader_state = checkpoint.read_checkpoint(path)
        global_step = trainer_state["global_step"]
        self.kl_ctrl_in_reward.value = trainer_state.get("kl_coef_in_reward", self.kl_ctrl_in_reward.value)
        self.schedule.restore(trainer_state)
        if dataloader_state is not None:
            self.train_dataloader.load_state_dict(dataloader_state)
        # Starting an epoch's iterator draws a seed from the global RNG; do it before the workers
        # restore the RNG, so the resumed run samples exactly as an uninterrupted one would.
        resumed = iter(self.train_dataloader)
        self.actor_rollout_wg.load_checkpoint(os.path.join(path, "actor"))
        if self.plan.use_critic:
            self.critic_wg.load_checkpoint(os.path.join(path, "critic"))
        self.global_steps = global_step
        print(f"hybridrl: resumed from {path} (step {global_step})", flush=True)
        checkpoint.warn_changed_settings(path, trainer_state, self.resume_settings())
        return resumed

    # ---------------------------------------------------------------- the loop
    def fit(self, tracker) -> None:
        """Trains until ``total_training_steps`` (:func:`~hybridrl.trainer.run.loop.run_training`):
        resume, validation and checkpoints on schedule, logging; a run resumed at (or past) its
        last step trains nothing. The schedule starts here and is closed at the end."""
        trainer_cfg = self.config.trainer
        settings = LoopSettings(
            test_freq=trainer_cfg.test_freq,
            save_freq=trainer_cfg.save_freq,
            val_before_train=trainer_cfg.val_before_train,
            val_only=trainer_cfg.val_only,
        )
        run_training(self, tracker, settings, self.schedule)
