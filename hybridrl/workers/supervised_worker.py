"""The workers of ``hybridrl sft`` and ``hybridrl rm``: one model trained on labelled rows.

They sit on the stack the PPO workers use: ``@register`` methods called through a worker group
(local, or Ray with FSDP2 over the group), the same optimizer, schedule, guarded optimizer step,
LoRA path and DCP checkpoint (:mod:`.checkpoint_io`, exported with ``hybridrl merge``). Each
rank trains on its share of the driver's batch; losses are normalised by the WHOLE batch's
count (tokens for SFT, pairs for the reward model), so any number of workers and any micro
batch size make the same update as one worker on the whole batch.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.functional import logprobs_from_logits
from hybridrl.algorithms.reward_loss import compute_bradley_terry_loss
from hybridrl.controller.decorator import Dispatch, register
from hybridrl.controller.worker import Worker
from hybridrl.data.preference_dataset import pad_pairs
from hybridrl.models import load_causal_lm, load_tokenizer, load_value_model, resolve_model_path, to_torch_dtype
from hybridrl.models.external import import_external_lib
from hybridrl.models.lora import apply_lora, lora_settings
from hybridrl.protocol import DataProto
from hybridrl.workers.checkpoint_io import load_worker_state, save_worker_state
from hybridrl.workers.memory import memory_metrics
from hybridrl.workers.model_forward import autocast
from hybridrl.workers.optim import build_optimizer, lr_schedule, optimizer_step
from hybridrl.workers.reward_model import forward_sequence_scores
from hybridrl.workers.sharding import apply_fsdp2, data_parallel_sum

SFT_KEYS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


def sft_tokenizer_path(model_cfg) -> str:
    """The SFT tokenizer's folder: ``model.tokenizer_path`` (verl's engine key) or the model's,
    resolved as ``hybridrl.models.resolve_model_path`` does."""
    if model_cfg.tokenizer_path:
        return resolve_model_path(model_cfg.tokenizer_path, config_key="model.tokenizer_path")
    return resolve_model_path(model_cfg.partial_pretrain, config_key="model.partial_pretrain")


# ---------------------------------------------------------------- the SFT loss


def trim_padding(batch: dict) -> dict:
    """Cut right-padding columns that no row of ``batch`` uses; tensors ``(bs, seqlen)``."""
    length = int(batch["attention_mask"].sum(-1).max().item())
    return {k: v[:, :length] for k, v in batch.items()}


def sft_row_losses(model, batch: dict, compute_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed negative log-likelihood of its loss-masked tokens, and their count.

    ``loss_sum[b] = -sum_{t>=1} loss_mask[b,t] * log p(input_ids[b,t] | input_ids[b,<t])``.

    Args:
        model: a causal LM returning ``logits (bs, seqlen, vocab)``.
        batch: ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``, each
            ``(bs, seqlen)``; ``loss_mask`` aligned with ``input_ids`` (1 = a label token).
        compute_dtype: bf16 runs the forward under autocast (fp32 weights).

    Returns:
        ``(loss_sum, n_tokens)``: fp32 ``(bs,)``; ``loss_sum`` in nats.
    """
    with autocast(model, compute_dtype, batch["input_ids"].device):  # not the (maybe offloaded) weights'
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).logits
    mask = batch["loss_mask"][:, 1:].to(torch.float32)
    log_probs = logprobs_from_logits(logits[:, :-1], batch["input_ids"][:, 1:])
    return -(log_probs * mask).sum(-1), mask.sum(-1)


def accumulate_gradients(
    model,
    batch: dict,
    micro_batch_size: int,
    compute_dtype: torch.dtype = torch.float32,
    batch_tokens: float | None = None,
    dp_size: int = 1,
) -> float:
    """Add to ``.grad`` this worker's share of the gradient of the batch's mean token loss, one
    micro batch at a time.

    Each micro batch's summed loss is divided by the loss-token count of the WHOLE batch, so the
    accumulated gradient equals that of one forward/backward over the batch whatever the split
    (verl divides by each micro batch's own count, which weights short rows differently). With
    ``dp_size`` workers, each scales by ``dp_size``: FSDP averages the gradients over the workers.

    Args:
        batch: ``SFTDataset`` tensors ``(bs, seqlen)`` on the model's device.
        micro_batch_size: rows per forward/backward (``data.micro_batch_size_per_gpu``).
        batch_tokens: loss tokens of the whole batch over every worker (default: this one's).

    Returns:
        this worker's summed NLL (nats) divided by ``batch_tokens``.
    """
    if batch_tokens is None:
        batch_tokens = float(batch["loss_mask"][:, 1:].sum().item())
    batch_tokens = max(batch_tokens, 1.0)
    loss_total = 0.0
    for i in range(0, batch["input_ids"].shape[0], micro_batch_size):
        micro = trim_padding({k: v[i : i + micro_batch_size] for k, v in batch.items()})
        loss_sum = sft_row_losses(model, micro, compute_dtype)[0].sum()
        (loss_sum * (dp_size / batch_tokens)).backward()
        loss_total += loss_sum.item()
    return loss_total / batch_tokens


# ---------------------------------------------------------------- the workers


class SupervisedWorker(Worker):
    """What SFT and reward-model training share: model, LoRA, FSDP2, optimizer, schedule,
    checkpoints. Subclasses give ``_load_module(path)``, ``train_batch`` and ``evaluate_batch``.

    Args:
        config: the whole ``sft_trainer`` / ``rm_trainer`` config, typed
            (``hybridrl.trainer.jobs.supervised_config``, as a structured DictConfig).
        total_training_steps: optimizer steps of the run (the lr schedule's length).
        device: ``trainer.device`` (cpu | cuda | auto).
    """

    model_key = "model.path"  # the config key of the model to train
    role = ""  # in messages
    padding_side = "left"

    def __init__(self, config, total_training_steps: int, device: str = "auto") -> None:
        super().__init__(config, device)
        self.total_training_steps = int(total_training_steps)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Loads the model (LoRA-wrapped when ``model.lora_rank > 0``), shards it over the
        group, builds AdamW and the warmup + cosine/constant/wsd schedule.

        Raises:
            ModelPathError / ModelDependencyError / ModelConfigError: see ``hybridrl.models``.
            ConfigError: ``model.target_modules`` names no module of the model.
        """
        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        path = resolve_model_path(self._model_path(), config_key=self.model_key)
        self.tokenizer = load_tokenizer(
            self._tokenizer_path(path),
            trust_remote_code=model_cfg.trust_remote_code,
            padding_side=self.padding_side,
            chat_template=self.config.data.chat_template,
        )
        module = self._adapt(self._load_module(path).to(self.device))
        if self.world_size > 1:
            # SFT/RM shard over all workers, resharding after forward, without offload (the defaults)
            apply_fsdp2(module, self.device, param_dtype=model_cfg.fsdp_config.mixed_precision.param_dtype)
        self.module = module
        self.compute_dtype = to_torch_dtype(model_cfg.fsdp_config.mixed_precision.param_dtype)
        optim = self.config.optim
        self.optimizer = build_optimizer(module, optim)
        steps = self.total_training_steps
        warmup = optim.lr_warmup_steps if optim.lr_warmup_steps > 0 else int(optim.warmup_steps_ratio * steps)
        self.lr_scheduler = lr_schedule(
            self.optimizer,
            optim.lr_scheduler,
            warmup,
            steps,
            min_lr_ratio=optim.min_lr_ratio,
            num_cycles=optim.num_cycles,
            zero_indexed_step=optim.zero_indexed_step,
        )

    def _model_path(self) -> str:
        """The value of ``model_key``: the model to train, as the config names it."""
        return self.config.model.path

    def _tokenizer_path(self, model_path: str) -> str:
        """The tokenizer's folder (the model's, ``model_path`` resolved)."""
        return model_path

    def _load_module(self, path: str) -> torch.nn.Module:
        raise NotImplementedError

    def _adapt(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module to train: ``module`` itself, or wrapped with LoRA adapters."""
        return module

    def _step(self) -> dict:
        """The optimizer step after the gradients of a batch; the step's lr, grad norm and this
        process's memory after it (``perf/max_memory_allocated_gb`` ..., GiB:
        :func:`~hybridrl.workers.memory.memory_metrics`; the driver keeps the maximum over the workers)."""
        grad_norm = optimizer_step(self.module, self.optimizer, self.config.optim.clip_grad, self.role)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        return {"train/lr": lr, "train/grad_norm": grad_norm, **memory_metrics(self.device)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int) -> None:
        """This rank's part of ``local_path`` (a collective when sharded); see :mod:`.checkpoint_io`."""
        save_worker_state(
            local_path,
            self.module,
            self.optimizer,
            self.lr_scheduler,
            self.rank,
            self.world_size,
            tokenizer=self.tokenizer,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> None:
        """Model, optimizer, schedule (and RNG with the same number of workers) from ``local_path``.

        Raises:
            CheckpointError: not a complete worker checkpoint, or another ``model.lora_rank``.
        """
        load_worker_state(local_path, self.module, self.optimizer, self.lr_scheduler, self.rank, self.world_size)


class SFTWorker(SupervisedWorker):
    """Supervised fine-tuning of a causal LM on the loss-masked (assistant) tokens."""

    model_key = "model.partial_pretrain"  # verl's key
    role = "sft"

    def _model_path(self) -> str:
        return self.config.model.partial_pretrain

    def _tokenizer_path(self, model_path: str) -> str:
        return sft_tokenizer_path(self.config.model)

    def _adapt(self, module: torch.nn.Module) -> torch.nn.Module:
        """LoRA adapters (``model.lora_rank > 0``) on ``model.target_modules`` but not
        ``model.exclude_modules``, drawn from ``trainer.seed``."""
        settings = lora_settings(self.config.model)
        if settings is None:
            return module
        return apply_lora(
            module,
            settings["lora_rank"],
            settings["lora_alpha"],
            settings["target_modules"],
            settings["exclude_modules"],
            config_key="model",
            seed=self.config.trainer.seed,
        )

    def _load_module(self, path: str) -> torch.nn.Module:
        model_cfg = self.config.model
        return load_causal_lm(
            path,
            dtype=model_cfg.fsdp_config.model_dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            override_config=model_cfg.override_config,
            enable_gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_batch(self, data: DataProto) -> DataProto:
        """One optimizer step on this worker's rows of the batch (``SFT_KEYS``, ``(bs, seqlen)``).

        Returns ``meta_info["metrics"]``: ``train/loss`` (mean NLL per loss token of the whole
        batch, nats), ``train/loss_tokens``, ``train/lr``, ``train/grad_norm`` and the memory (``_step``).
        """
        batch = {k: v.to(self.device) for k, v in data.batch.items() if k in SFT_KEYS}
        tokens = data_parallel_sum(float(batch["loss_mask"][:, 1:].sum().item()), self.device)
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = accumulate_gradients(
            self.module,
            batch,
            int(self.config.data.micro_batch_size_per_gpu),
            self.compute_dtype,
            tokens,
            self.world_size,
        )
        metrics = {"train/loss": data_parallel_sum(loss, self.device), "train/loss_tokens": tokens, **self._step()}
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @torch.no_grad()
    def evaluate_batch(self, data: DataProto) -> DataProto:
        """Per row: ``loss_sum`` (summed NLL of its loss tokens, nats) and ``loss_tokens``, ``(bs,)`` fp32."""
        self.module.eval()
        batch = {k: v.to(self.device) for k, v in data.batch.items() if k in SFT_KEYS}
        micro = int(self.config.data.micro_batch_size_per_gpu)
        parts = [
            sft_row_losses(
                self.module, trim_padding({k: v[i : i + micro] for k, v in batch.items()}), self.compute_dtype
            )
            for i in range(0, len(data), micro)
        ]
        return DataProto.from_dict(
            tensors={
                "loss_sum": torch.cat([p[0] for p in parts]).cpu(),
                "loss_tokens": torch.cat([p[1] for p in parts]).cpu(),
            }
        )


class RewardModelTrainingWorker(SupervisedWorker):
    """Bradley-Terry training of a scalar-head reward model on preference pairs.

    The model is ``load_value_model`` (the critic's class), scored at each sequence's last
    token as the PPO reward-model worker reads it; the head's bias stays frozen at its zero init
    (the pairwise loss sees only score differences), so the checkpoint also loads unchanged as a
    bias-free ``AutoModelForSequenceClassification``.
    """

    role = "rm"
    padding_side = "right"

    def _load_module(self, path: str) -> torch.nn.Module:
        model_cfg = self.config.model
        model = load_value_model(
            path,
            dtype=model_cfg.fsdp_config.model_dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            override_config=model_cfg.override_config,
            enable_gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )
        prefix = model.base_model_prefix + "."
        for name, param in model.named_parameters():
            if not name.startswith(prefix) and name.endswith("bias"):
                param.requires_grad_(False)
        return model

    def _micro_batch_scores(self, data: DataProto):
        """Per micro batch of ``data.micro_batch_size_per_gpu`` pairs, in one forward each:
        ``(rows, chosen (B,), rejected (B,), tokens)`` with ``rows`` the micro batch's slice."""
        micro = int(self.config.data.micro_batch_size_per_gpu)
        chosen_ids, rejected_ids = (
            data.non_tensor_batch["chosen_input_ids"],
            data.non_tensor_batch["rejected_input_ids"],
        )
        for i in range(0, len(data), micro):
            rows = slice(i, i + micro)
            batch = {
                k: v.to(self.device)
                for k, v in pad_pairs(
                    list(chosen_ids[rows]), list(rejected_ids[rows]), self.tokenizer.pad_token_id
                ).items()
            }
            scores = forward_sequence_scores(
                self.module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], self.compute_dtype
            )
            n = len(scores) // 2
            yield rows, scores[:n], scores[n:], int(batch["attention_mask"].sum())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_batch(self, data: DataProto) -> DataProto:
        """One optimizer step on this worker's pairs: non-tensor ``chosen_input_ids`` /
        ``rejected_input_ids`` (id lists) and ``margin`` ``(B,)``.

        Returns ``chosen_scores`` / ``rejected_scores`` ``(B,)`` and ``meta_info["metrics"]``:
        ``train/loss`` (the whole batch's mean Bradley-Terry loss), ``train/lr``,
        ``train/grad_norm``, ``train/tokens`` and the memory (``_step``).
        """
        n_pairs = data_parallel_sum(float(len(data)), self.device)
        margins = data.batch["margin"].to(self.device, torch.float32)
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        chosen_all, rejected_all, tokens, loss_total = [], [], 0, 0.0
        for rows, chosen, rejected, n_tokens in self._micro_batch_scores(data):
            loss = compute_bradley_terry_loss(chosen, rejected, margins[rows]) * (len(chosen) / n_pairs)
            (loss * self.world_size).backward()  # FSDP averages over the workers; the sum is the batch mean
            loss_total += loss.item()
            chosen_all.append(chosen.detach())
            rejected_all.append(rejected.detach())
            tokens += n_tokens
        metrics = {
            "train/loss": data_parallel_sum(loss_total, self.device),
            "train/tokens": data_parallel_sum(float(tokens), self.device),
            **self._step(),
        }
        return DataProto.from_dict(
            tensors={"chosen_scores": torch.cat(chosen_all).cpu(), "rejected_scores": torch.cat(rejected_all).cpu()},
            meta_info={"metrics": metrics},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @torch.no_grad()
    def evaluate_batch(self, data: DataProto) -> DataProto:
        """``chosen_scores`` / ``rejected_scores`` ``(B,)`` fp32 of this worker's pairs."""
        self.module.eval()
        parts = [(chosen, rejected) for _, chosen, rejected, _ in self._micro_batch_scores(data)]
        return DataProto.from_dict(
            tensors={
                "chosen_scores": torch.cat([c for c, _ in parts]).cpu(),
                "rejected_scores": torch.cat([r for _, r in parts]).cpu(),
            }
        )


def pairs_to_proto(chosen: list, rejected: list, margins) -> DataProto:
    """Preference pairs (id lists and margins) as the rows the reward-model worker takes."""
    return DataProto.from_dict(
        tensors={"margin": torch.tensor([float(m) for m in margins], dtype=torch.float32)},
        non_tensors={"chosen_input_ids": list(chosen), "rejected_input_ids": list(rejected)},
    )
