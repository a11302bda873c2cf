"""The reward model: a causal-LM backbone with a scalar head, read at the last token.

One model class serves the critic and the reward model: ``load_value_model`` (an
``AutoModelForTokenClassification`` with ``num_labels=1``, as verl loads both). The critic reads
the head at every response position; the reward model reads it once, at the last attended
token of (prompt, response), which is what ``AutoModelForSequenceClassification`` pools. The
head's ``score.weight`` has the same name in both classes, so a sequence-classification reward
model (e.g. one trained with TRL) loads here too, and a model trained by ``hybridrl rm`` keeps
``score.bias`` at exactly 0 (the pairwise loss has no gradient for it), so it loads unchanged
in ``AutoModelForSequenceClassification``.
"""

from __future__ import annotations

import logging
import os

import torch

from hybridrl.controller.decorator import Dispatch, register
from hybridrl.controller.worker import Worker
from hybridrl.data.preference_dataset import encode_rm_inputs, right_pad
from hybridrl.errors import ConfigError
from hybridrl.models import load_tokenizer, load_value_model, resolve_model_path
from hybridrl.models.external import import_external_lib
from hybridrl.models.materialize import full_tensor
from hybridrl.protocol import DataProto
from hybridrl.workers.memory import memory_metrics
from hybridrl.workers.model_forward import autocast, compute_dtype_of
from hybridrl.workers.profiler import ProfiledWorker, role_profiler
from hybridrl.workers.sharding import sharder

logger = logging.getLogger(__name__)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(bs,)`` index of the last attended position of each row (left, right or both paddings);
    0 for a row with no attended token."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (positions * attention_mask.bool()).argmax(-1)


def forward_sequence_scores(
    module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Scalar score of each sequence, ``(bs,)`` fp32: the head's output at the last attended token.

    Args:
        module: a scalar-head model (``load_value_model``); its logits are ``(bs, seqlen, 1)``.
        input_ids, attention_mask, position_ids: ``(bs, seqlen)``, any padding side.
        compute_dtype: autocast dtype of the forward pass (fp32: none).
    """
    with autocast(module, compute_dtype, input_ids.device):
        logits = module(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
    index = last_token_index(attention_mask)
    return logits[torch.arange(len(index), device=index.device), index, 0].float()


def expand_to_token_level(scores: torch.Tensor, response_attention_mask: torch.Tensor) -> torch.Tensor:
    """``(bs,)`` sequence scores -> ``(bs, response_length)``: each score on its row's last valid
    response token, zero elsewhere; a row with no valid response token gets no score (as the
    rule-based reward managers do)."""
    token_level = torch.zeros(response_attention_mask.shape, dtype=torch.float32, device=scores.device)
    has_response = response_attention_mask.sum(-1) > 0
    rows = torch.nonzero(has_response).squeeze(-1)
    token_level[rows, last_token_index(response_attention_mask)[rows]] = scores[rows].float()
    return token_level


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers turn the same chat into the same ids (same vocabulary, merges,
    normalisation, special tokens and chat template)."""
    if a is b:
        return True
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None) or a.eos_token != b.eos_token:
        return False
    backend_a, backend_b = getattr(a, "backend_tokenizer", None), getattr(b, "backend_tokenizer", None)
    if backend_a is not None and backend_b is not None:
        return backend_a.to_str() == backend_b.to_str()
    return a.get_vocab() == b.get_vocab()


def head_is_untrained(module) -> bool:
    """True when every parameter outside the backbone is exactly zero, i.e. ``load_value_model``
    found no scalar head in the checkpoint (a plain causal LM) and zero-initialised it."""
    prefix = module.base_model_prefix + "."
    head = [p for name, p in module.named_parameters() if not name.startswith(prefix)]
    return bool(head) and all(not full_tensor(p.detach()).any() for p in head)


class RewardModel:
    """Scores (prompt, response) rows of a rollout batch with a scalar-head reward model.

    Args:
        reward_module: the model (``load_value_model``), in eval mode on its device.
        tokenizer: the reward model's tokenizer.
        input_tokenizer: the policy's tokenizer when it differs from ``tokenizer``: each row is
            then decoded and re-templated with the reward model's own chat template
            (:func:`hybridrl.data.preference_dataset.encode_rm_inputs`, the format the reward
            model was trained on). None: the batch's ``input_ids`` are read as they are.
        max_length: longest re-tokenised input; longer ones keep their last ``max_length``
            tokens (the score is read at the end). None: no limit.
        compute_dtype: autocast dtype of the forward passes.
    """

    def __init__(
        self,
        reward_module,
        tokenizer,
        input_tokenizer=None,
        max_length: int | None = None,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.reward_module = reward_module
        self.tokenizer = tokenizer
        self.input_tokenizer = input_tokenizer
        self.max_length = max_length
        self.compute_dtype = compute_dtype

    @torch.no_grad()
    def compute_rm_score(self, data: DataProto, micro_batch_size: int) -> torch.Tensor:
        """``rm_scores`` ``(bs, response_length)`` fp32: the score on the last response token.

        ``data`` holds ``responses`` (bs, R) and ``input_ids`` / ``attention_mask`` /
        ``position_ids`` (bs, P+R); with re-tokenisation also the non-tensor ``raw_prompt``.

        Raises:
            ConfigError: re-tokenisation is needed but the batch has no ``raw_prompt``.
        """
        self.reward_module.eval()
        if self.input_tokenizer is None:
            inputs = {k: data.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
        else:
            inputs = self.retokenize(data)
        device = next(self.reward_module.parameters()).device
        inputs = {k: v.to(device) for k, v in inputs.items()}
        n = inputs["input_ids"].shape[0]
        scores = torch.cat(
            [
                forward_sequence_scores(
                    self.reward_module,
                    *(inputs[k][i : i + micro_batch_size] for k in ("input_ids", "attention_mask", "position_ids")),
                    self.compute_dtype,
                )
                for i in range(0, n, micro_batch_size)
            ]
        )
        response_length = data.batch["responses"].shape[-1]
        return expand_to_token_level(scores, data.batch["attention_mask"][:, -response_length:].to(device))

    def retokenize(self, data: DataProto) -> dict[str, torch.Tensor]:
        """Right-padded reward-model inputs of the batch's chats + decoded responses."""
        if "raw_prompt" not in data.non_tensor_batch:
            raise ConfigError(
                "reward_model.model.input_tokenizer: the reward model's tokenizer differs from the policy's, so "
                "each chat is re-templated for it, which needs the chat messages; set data.return_raw_chat=True"
            )
        responses = data.batch["responses"]
        lengths = data.batch["attention_mask"][:, -responses.shape[-1] :].sum(-1).tolist()
        src = self.input_tokenizer
        stop_ids = set(src.all_special_ids)  # a response that ends on one stopped (EOS, <|im_end|>, ...)
        texts, ended = [], []
        for row, length in zip(responses, lengths):
            valid = row[: int(length)]
            texts.append(src.decode(valid, skip_special_tokens=True))
            ended.append(bool(length) and int(valid[-1]) in stop_ids)
        chats = [[dict(m) for m in chat] for chat in data.non_tensor_batch["raw_prompt"]]
        ids = encode_rm_inputs(self.tokenizer, chats, texts, ended)
        if self.max_length:
            ids = [seq[-self.max_length :] for seq in ids]
        return right_pad(ids, self.tokenizer.pad_token_id)


def load_reward_model(config, device: str, shard=None) -> RewardModel:
    """Build :class:`RewardModel` from the ``reward_model`` config section.

    Reads ``model.path``, ``model.input_tokenizer`` (null: never re-tokenise),
    ``model.trust_remote_code``, ``model.fsdp_config.model_dtype`` /
    ``mixed_precision.param_dtype`` and ``max_length``. The model is built on ``device``,
    sharded by ``shard`` (FSDP2's ``fully_shard``, applied while it is still empty) when given.

    Raises:
        ModelPathError / ModelDependencyError: a path that cannot be resolved.
        ConfigError: ``model.path`` holds no trained scalar head (a plain causal LM).
    """
    model_cfg = config.model
    trust = bool(model_cfg.trust_remote_code)
    path = resolve_model_path(model_cfg.path, config_key="reward_model.model.path")
    fsdp_config = model_cfg.fsdp_config
    module = load_value_model(path, dtype=fsdp_config.model_dtype, trust_remote_code=trust, device=device, shard=shard)
    if head_is_untrained(module):
        raise ConfigError(
            f"reward_model.model.path={model_cfg.path}: the model has no trained reward head (it looks like a plain "
            "causal LM); train one with `hybridrl rm` and pass its checkpoint folder"
        )
    module.requires_grad_(False).eval()
    tokenizer = load_tokenizer(path, trust_remote_code=trust, padding_side="right")
    input_tokenizer = None
    if model_cfg.input_tokenizer:
        source = os.path.expanduser(str(model_cfg.input_tokenizer))
        if not os.path.isdir(source):  # a tokenizer-only folder is fine; anything else resolves as a model
            source = resolve_model_path(source, config_key="reward_model.model.input_tokenizer")
        input_tokenizer = load_tokenizer(source, trust_remote_code=trust)
        if same_tokenizer(input_tokenizer, tokenizer):
            input_tokenizer = None
        else:
            logger.warning(
                "reward model: its tokenizer differs from %s; rows are re-templated for it", model_cfg.input_tokenizer
            )
    return RewardModel(module, tokenizer, input_tokenizer, config.max_length, compute_dtype_of(fsdp_config))


class RewardModelWorker(ProfiledWorker, Worker):
    """Reward-model worker: scores each (prompt, response) with a scalar-head model.

    ``config`` is the ``reward_model`` section. The model is frozen; ``compute_rm_score`` returns
    ``rm_scores`` ``(bs, response_length)``: the score on the last response token, zero elsewhere.
    When ``model.input_tokenizer`` (the policy's) differs from the reward model's tokenizer, each
    row is decoded and re-templated with the reward model's chat template (needs
    ``data.return_raw_chat=True``); see ``hybridrl/workers/reward_model.py``.
    """

    def __init__(self, config, device: str = "auto") -> None:
        super().__init__(config, device)
        self.profiler = role_profiler("reward_model", [config.profiler], self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        import_external_lib(self.config.model.external_lib)
        fsdp_config = self.config.model.fsdp_config
        self.reward_model = load_reward_model(
            self.config, self.device, shard=sharder(self.world_size, self.device, fsdp_config)
        )

    def _micro_batch_size(self, n_rows: int) -> int:
        """``micro_batch_size_per_gpu``, else the deprecated global ``micro_batch_size`` / workers,
        else (``use_dynamic_bsz``, not in this build yet) all rows at once."""
        cfg = self.config
        if cfg.micro_batch_size_per_gpu:
            return int(cfg.micro_batch_size_per_gpu)
        if cfg.micro_batch_size:
            return max(1, int(cfg.micro_batch_size) // self.world_size)
        return max(1, n_rows)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` ``(bs, response_length)`` fp32 of a rollout batch, and this process's memory in
        ``meta_info["metrics"]`` (GiB, :func:`~hybridrl.workers.memory.memory_metrics`; the driver pops it)."""
        data = data.to(self.device)
        scores = self.reward_model.compute_rm_score(data, self._micro_batch_size(len(data)))
        return DataProto.from_dict(
            tensors={"rm_scores": scores}, meta_info={"metrics": memory_metrics(self.device)}
        ).to("cpu")
