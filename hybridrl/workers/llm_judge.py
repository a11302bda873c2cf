"""``reward_model.reward_manager=judge``: a generative judge, served by one of hybridrl's rollout engines.

Every response of a batch is put into the judge's prompt template (:mod:`hybridrl.rewards.judge`),
the judge model answers all of them in one batched call of its engine (``reward_model.rollout.name``:
``hf``, ``vllm``, ... as for the policy) within ``reward_model.judge.timeout_s``, and the score in
each answer becomes the row's reward in [0, 1]. A row whose answer holds no score (or whose prompt
cannot be built, or whose call ran out of time) fails like a failing rule scorer: the policy is
``reward_model.on_error``, applied by :class:`~hybridrl.rewards.manager.NaiveRewardManager`, which
this manager extends; ``retry`` asks the judge again for the unparseable rows (batched).

The judge is built in the process that scores rewards (the driver) and shared by the training and
validation managers of a run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any

import torch

from hybridrl.config.precision import resolve_auto_dtype
from hybridrl.config.typed import to_dataclass
from hybridrl.controller.worker import resolve_device
from hybridrl.models import load_causal_lm, load_tokenizer, resolve_model_path
from hybridrl.models.paths import EMBEDDED_MODEL_NAMES
from hybridrl.protocol import DataProto
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.judge import (
    JudgeParseError,
    JudgePromptError,
    JudgeSettings,
    load_score_parser,
    parse_score,
    render_template,
)
from hybridrl.rewards.manager import (
    DEFAULT_RETRIES,
    DEFAULT_SCORE_TIMEOUT_S,
    NaiveRewardManager,
    register_reward_manager,
)
from hybridrl.rewards.pool import ScoreTimeoutError, call_with_deadline
from hybridrl.workers.config import EngineConfig
from hybridrl.workers.rollout import RolloutEngineError, get_rollout_cls

__all__ = ["JudgeBusyError", "JudgeEngine", "JudgeRewardManager", "judge_engine_config", "shared_judge_engine"]

logger = logging.getLogger(__name__)


class JudgeBusyError(ScoreTimeoutError):
    """The judge is still answering an earlier call that ran past its deadline."""


_OUTCOME = "__judge_outcome__"  # extra_info key that carries a row's judgement to the per-row scorer
_ENGINES: dict[tuple, JudgeEngine] = {}


class JudgeEngine:
    """The judge model behind a rollout engine: prompt token ids in, answer texts out.

    Args:
        model_path: ``reward_model.model.path`` (any form :func:`hybridrl.models.resolve_model_path` takes).
        rollout: the engine's section (``reward_model.rollout``, :class:`EngineConfig`'s keys; a
            mapping: keys it lacks take the packaged defaults).
        device: ``cpu`` or ``cuda``: where the judge model runs.
        trust_remote_code: ``reward_model.model.trust_remote_code``.

    Raises:
        ModelPathError / ModelDependencyError: ``model_path`` cannot be loaded.
        RolloutEngineError: the engine cannot run the judge (missing package, unsupported model).
    """

    def __init__(self, model_path: str, rollout: Any, device: str, trust_remote_code: bool = False) -> None:
        from omegaconf import OmegaConf

        folder = resolve_model_path(model_path, config_key="reward_model.model.path")
        self.tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
        engine = judge_engine_config(rollout)
        dtype = _engine_dtype(engine.dtype, device)
        module = load_causal_lm(folder, dtype=dtype, trust_remote_code=trust_remote_code)
        module = module.requires_grad_(False).eval().to(device)
        module.config.use_cache = True
        self.response_length = int(engine.response_length)
        engine_cfg = OmegaConf.structured(dataclasses.replace(engine, dtype=dtype))
        engine_cls = get_rollout_cls(engine.name, engine.mode)
        self.engine = engine_cls(module, engine_cfg, self.tokenizer, getattr(module, "generation_config", None))
        self.pad_token_id = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.tokenizer.eos_token_id
        self._busy = threading.Lock()  # one call at a time; held on by a call that overran its deadline

    def generate(self, prompt_ids: list[list[int]]) -> list[str]:
        """The judge's answers to ``prompt_ids`` (unpadded ids), decoded without special tokens: one
        batched call of the engine. The caller bounds it in time (:class:`JudgeRewardManager`:
        ``reward_model.judge.timeout_s``).

        Raises:
            JudgeBusyError: an earlier call (one that overran its deadline) is still generating.
        """
        if not prompt_ids:
            return []
        if not self._busy.acquire(blocking=False):
            raise JudgeBusyError(
                "the judge is still generating an earlier batch that ran past its deadline "
                "(reward_model.judge.timeout_s); raise the deadline or lower "
                "reward_model.rollout.response_length"
            )
        try:
            out = self.engine.generate_sequences(self._left_padded(prompt_ids))
        finally:
            self._busy.release()
        responses, mask = out.batch["responses"], out.batch["response_mask"]
        return [self.tokenizer.decode(row[m.bool()], skip_special_tokens=True) for row, m in zip(responses, mask)]

    def _left_padded(self, prompt_ids: list[list[int]]):
        """The :class:`BaseRollout` input of ``prompt_ids``: left-padded ids, mask and positions (bs, P)."""
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, ids in enumerate(prompt_ids):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
        position_ids = (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)
        return DataProto.from_dict(
            tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
            meta_info={"response_length": self.response_length},
        )


def judge_engine_config(rollout: Any) -> EngineConfig:
    """``reward_model.rollout`` (:attr:`JudgeSettings.rollout`, a mapping) as the typed section the
    engines read.

    Raises:
        ConfigError: a key :class:`EngineConfig` has no field for, or a value of the wrong type.
    """
    return to_dataclass(EngineConfig, rollout, "reward_model.rollout")


def _engine_dtype(value: str, device: str) -> str:
    """``reward_model.rollout.dtype`` with ``auto`` resolved for ``device`` (bf16 where native)."""
    if value == "auto":
        return resolve_auto_dtype(device)[0]
    return str(value)


def shared_judge_engine(settings: JudgeSettings, device: str) -> JudgeEngine:
    """One :class:`JudgeEngine` per (model, engine settings, device) in this process: the training
    and validation reward managers of a run share the judge."""
    key = (settings.model_path, settings.trust_remote_code, repr(sorted(settings.rollout.items())), device)
    if key not in _ENGINES:
        _ENGINES[key] = JudgeEngine(settings.model_path, settings.rollout, device, settings.trust_remote_code)
    return _ENGINES[key]


def _judged_score(
    data_source: Any = None, solution_str: str = "", ground_truth: Any = None, extra_info: dict | None = None, **_: Any
) -> dict:
    """The per-row scorer :class:`NaiveRewardManager` calls: hands over the row's judgement (made
    for the whole batch beforehand), or raises why there is none."""
    outcome = (extra_info or {}).get(_OUTCOME)
    if outcome is None:
        raise RuntimeError("no judgement for this row (the judge manager was called without its batch pass)")
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


@register_reward_manager("judge")
class JudgeRewardManager(NaiveRewardManager):
    """Scores each response with an LLM judge (details in the module docstring and docs/rewards.md).

    Args:
        tokenizer, num_examine, reward_fn_key, on_error, timeout_s, retries: as
            :class:`~hybridrl.rewards.manager.NaiveRewardManager` (``timeout_s`` bounds the per-row
            bookkeeping; the judge call has ``reward_model.judge.timeout_s``).
        compute_score: must be None (``custom_reward_function`` is refused with the judge).
        config: the whole trainer config (reads ``reward_model.model``, ``reward_model.rollout``,
            ``reward_model.judge`` and ``trainer.device``).
        judge: an engine to use instead of building one (anything with :class:`JudgeEngine`'s
            ``tokenizer`` and ``generate``); tests pass their own.

    Returns per call (``return_dict``): ``reward_extra_info`` with ``judge_text`` (the judge's answer,
    None where none was generated) and ``judge_score`` (the number as the judge wrote it) beside
    :class:`NaiveRewardManager`'s keys.

    Raises:
        RewardConfigError: bad judge settings (:meth:`JudgeSettings.from_config`).
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score=None,
        reward_fn_key: str = "data_source",
        on_error: str = "raise",
        timeout_s: float = DEFAULT_SCORE_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        config: Any = None,
        judge: Any = None,
    ) -> None:
        if compute_score is not None:
            raise RewardConfigError(
                "custom_reward_function is set, but reward_model.reward_manager=judge scores with "
                "the judge; use reward_model.judge.score_parser to read its answer yourself"
            )
        super().__init__(tokenizer, num_examine, _judged_score, reward_fn_key, on_error, timeout_s, retries)
        if config is None:  # load_reward_manager hands it the run's config
            raise RewardConfigError(
                "reward_model.reward_manager=judge needs the run's config (its reward_model.judge "
                "and reward_model.rollout sections); build it with load_reward_manager(config, ...)"
            )
        self.settings = JudgeSettings.from_config(config)
        self.parser = (
            load_score_parser(self.settings.parser_path, self.settings.parser_name)
            if self.settings.parser_path
            else None
        )
        self.judge = judge if judge is not None else shared_judge_engine(self.settings, _device(config))
        if self.settings.apply_chat_template and not getattr(self.judge.tokenizer, "chat_template", None):
            raise RewardConfigError(
                f"reward_model.model.path={self.settings.model_path}: the judge's tokenizer has no "
                "chat template; set reward_model.judge.apply_chat_template=false (plain text)"
            )
        self._outcomes: list | None = None

    @classmethod
    def check_config(cls, config: Any) -> None:
        """The start-up check of the judge's keys (called by the config check before anything loads).

        Raises:
            RewardConfigError: bad judge settings, an unknown engine, a judge model that does not exist.
        """
        settings = JudgeSettings.from_config(config)
        path = settings.model_path
        if not (os.path.exists(os.path.expanduser(path)) or path.lower() in EMBEDDED_MODEL_NAMES):
            raise RewardConfigError(
                f"reward_model.model.path={path!r} does not exist; with "
                "reward_model.reward_manager=judge set it to the judge model (an HF folder, a .gguf"
                " file, or HuggingFaceTB/SmolLM2-135M-Instruct for the bundled one)"
            )
        engine = judge_engine_config(settings.rollout)
        try:
            get_rollout_cls(engine.name, engine.mode)
        except (ValueError, RolloutEngineError) as exc:  # the message names the policy's keys: name the judge's
            raise RewardConfigError(str(exc).replace("actor_rollout_ref.rollout", "reward_model.rollout")) from None

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict:
        """Judge the batch, then score it as :meth:`NaiveRewardManager.__call__` does (same
        arguments, returns and errors), each row's score being its judgement."""
        texts = self._judge_batch(data)
        try:
            result = super().__call__(data, return_dict=return_dict)
        finally:
            self._outcomes = None
        if return_dict:
            result["reward_extra_info"]["judge_text"] = texts
        return result

    def _job(self, data: Any, i: int, data_source: Any, response_str: str) -> dict:
        """The per-row scorer's arguments, with the row's judgement (made for the batch beforehand)."""
        job = super()._job(data, i, data_source, response_str)
        if self._outcomes is not None:
            job["extra_info"] = {**(job["extra_info"] or {}), _OUTCOME: self._outcomes[i]}
        return job

    # ------------------------------------------------------------------ the batch pass
    def _judge_batch(self, data: Any) -> list[str | None]:
        """Builds every row's prompt, asks the judge once for all, parses the answers (asking again
        for unparseable ones with ``on_error=retry``). Sets ``self._outcomes``; returns the texts."""
        started = time.perf_counter()
        rows = [self._template_values(data, i) for i in range(len(data))]
        outcomes: list[Any] = [None] * len(rows)
        texts: list[str | None] = [None] * len(rows)
        ids: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            try:
                ids[i] = self._prompt_ids(row)
            except JudgePromptError as exc:
                outcomes[i] = exc
        pending = list(ids)
        for _ in range(1 + (self.retries if self.on_error == "retry" else 0)):
            if not pending:
                break
            try:
                answers = self._ask([ids[i] for i in pending])
            except ScoreTimeoutError as exc:
                for i in pending:
                    outcomes[i] = exc
                break
            for i, answer in zip(pending, answers):
                texts[i] = self.settings.response_prefix + answer
                outcomes[i] = self._parse(texts[i], rows[i])
            pending = [i for i in pending if isinstance(outcomes[i], JudgeParseError)]
        self._outcomes = outcomes
        failed = sum(isinstance(o, BaseException) for o in outcomes)
        logger.info("judge: %d rows in %.1f s, %d without a score", len(rows), time.perf_counter() - started, failed)
        return texts

    def _ask(self, prompt_ids: list[list[int]]) -> list[str]:
        """``self.judge.generate(prompt_ids)`` within ``reward_model.judge.timeout_s``.

        Raises:
            ScoreTimeoutError: no answers in time (the call runs on in its thread, unwatched; the
                engine refuses further calls until it ends), or the judge is still busy.
        """
        timeout = self.settings.timeout_s
        try:
            return call_with_deadline(self.judge.generate, timeout, prompt_ids=prompt_ids)
        except JudgeBusyError:
            raise
        except ScoreTimeoutError:
            raise ScoreTimeoutError(
                f"the judge answered none of {len(prompt_ids)} prompts within "
                f"reward_model.judge.timeout_s={timeout:g} s"
            ) from None

    def _template_values(self, data: Any, i: int) -> dict:
        """The values a template may read for row ``i`` (:func:`~hybridrl.rewards.judge.render_template`)."""
        prompts, responses = data.batch["prompts"], data.batch["responses"]
        prompt_len = prompts.shape[-1]
        mask = data.batch["attention_mask"][i]
        vp, vr = int(mask[:prompt_len].sum()), int(mask[prompt_len:].sum())
        response = self.tokenizer.decode(responses[i, :vr], skip_special_tokens=True)
        job = super()._job(data, i, self._data_source(data, i), response)
        nt = data.non_tensor_batch
        if "raw_prompt" in nt:  # the chat (data.return_raw_chat): its last user turn
            users = [m for m in nt["raw_prompt"][i] if dict(m).get("role") == "user"]
            prompt = str(dict(users[-1])["content"]) if users else ""
        else:
            prompt = self.tokenizer.decode(prompts[i, prompt_len - vp :], skip_special_tokens=True).strip()
        extra = dict(job["extra_info"] or {})
        return dict(
            response=response,
            prompt=prompt,
            question=str(extra["question"]) if extra.get("question") is not None else None,
            ground_truth=job["ground_truth"],
            data_source=job["data_source"],
            extra_info=extra,
        )

    def _prompt_ids(self, row: dict) -> list[int]:
        """The judge's prompt for a row, as token ids: the system prompt and the rendered template as a
        user turn in the judge's chat template (or plain text), then the response prefix."""
        s, tokenizer = self.settings, self.judge.tokenizer
        text = render_template(s.template, **row)
        if s.apply_chat_template:
            messages = [{"role": "system", "content": s.system_prompt}] if s.system_prompt else []
            messages.append({"role": "user", "content": text})
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer.encode(prompt + s.response_prefix, add_special_tokens=False)
        else:
            ids = tokenizer.encode((s.system_prompt + "\n\n" if s.system_prompt else "") + text + s.response_prefix)
        limit = int(self.settings.rollout["prompt_length"])
        if len(ids) > limit:
            raise JudgePromptError(
                f"the judge's prompt has {len(ids)} tokens, over reward_model.rollout.prompt_length"
                f"={limit}; raise it or shorten data.max_response_length"
            )
        return ids

    def _parse(self, text: str, row: dict) -> dict | JudgeParseError:
        """The row's judgement ``{"score", "judge_score", "judge_text"}``, or why it has none."""
        if self.parser is None:
            try:
                score, number = parse_score(text, self.settings.score_range, self.settings.score_pattern)
            except JudgeParseError as exc:
                return exc
            return {"score": score, "judge_score": number, "judge_text": text}
        try:
            result = self.parser(
                text,
                data_source=row["data_source"],
                solution_str=row["response"],
                ground_truth=row["ground_truth"],
                extra_info=row["extra_info"],
            )
        except Exception as exc:  # noqa: BLE001 - the user's parser: a failure of this row
            return JudgeParseError(f"reward_model.judge.score_parser raised {type(exc).__name__}: {exc}")
        if result is None:
            return JudgeParseError(f"reward_model.judge.score_parser found no score in {text[:120]!r}")
        if isinstance(result, dict):
            return {**result, "judge_text": text}
        try:
            return {"score": float(result), "judge_text": text}
        except (TypeError, ValueError):
            return JudgeParseError(
                f"reward_model.judge.score_parser returned {type(result).__name__}; return a "
                "float, a dict with 'score', or None"
            )


def _device(config: Any) -> str:
    return resolve_device(str(config.trainer.device))
