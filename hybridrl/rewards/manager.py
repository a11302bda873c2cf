"""Reward managers: turn a batch of generated responses into token-level scores.

A reward manager decodes each response, calls a scoring function and writes the score on the
last valid response token (verl's ``token_level_scores``). Managers are registered by name and
chosen with the config key ``reward_model.reward_manager`` (default ``"naive"``).

With a reward model (``reward_model.enable``) the batch also holds ``rm_scores`` and the
manager combines them with the rule scores, see :class:`NaiveRewardManager`.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any, Callable

import torch

from hybridrl.rewards import default_compute_score, known_data_sources
from hybridrl.rewards.custom import RewardConfigError, load_custom_reward_fn

__all__ = [
    "RewardFunctionError",
    "RewardInputError",
    "register_reward_manager",
    "get_reward_manager_cls",
    "NaiveRewardManager",
    "load_reward_manager",
]

logger = logging.getLogger(__name__)

_REWARD_MANAGERS: dict[str, type] = {}
# What a failing or late scoring call does: stop the run; score 0; score 0 and train nothing on
# the sample (the driver masks it); score 0 and drop its prompt group; try again, then stop.
ON_ERROR_POLICIES = ("raise", "zero", "mask_sample", "drop_group", "retry")
DEFAULT_RETRIES = 2
_SLOW_SAMPLES_LOGGED = 3
DEFAULT_SCORE_TIMEOUT_S = 60.0


class ScoreTimeoutError(TimeoutError):
    """A scoring call did not return within ``reward_model.timeout_s``."""


def call_with_deadline(fn: Callable[..., Any], timeout_s: float, **kwargs) -> Any:
    """``fn(**kwargs)`` in a daemon thread, waited for at most ``timeout_s`` seconds.

    A call that overruns keeps running in its thread (Python cannot stop it) but nobody waits
    for it, and being a daemon it does not hold the process at exit.

    Raises:
        ScoreTimeoutError: no result in time. Whatever ``fn`` raised, re-raised here.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="reward-fn", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ScoreTimeoutError(f"no result within reward_model.timeout_s={timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


class _Failure(str):
    """Why one sample's scoring failed (the text), and whether it ran out of time."""

    def __new__(cls, text: str, timed_out: bool):
        failure = super().__new__(cls, text)
        failure.timed_out = timed_out
        return failure


class RewardFunctionError(RuntimeError):
    """The scoring function raised (or returned something that is not a score) on a sample."""


class RewardInputError(ValueError):
    """The batch lacks a key the reward manager needs, or holds it in the wrong form."""


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator: make a reward manager available as ``reward_model.reward_manager=name``.

    The class is built as ``cls(tokenizer=..., num_examine=..., compute_score=...,
    reward_fn_key=..., on_error=..., **reward_model.reward_kwargs)`` and called as
    ``manager(data: DataProto, return_dict=False)``.

    Raises:
        RewardConfigError: another class is registered under ``name`` already.
    """

    def decorator(cls: type) -> type:
        old = _REWARD_MANAGERS.get(name)
        if old is not None and old is not cls:
            raise RewardConfigError(f"reward manager {name!r} is already registered to {old.__module__}."
                                    f"{old.__qualname__}; pick another name for {cls.__qualname__}")
        _REWARD_MANAGERS[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """Return the reward manager class registered as ``name``.

    Raises:
        RewardConfigError: ``name`` is not registered.
    """
    if name not in _REWARD_MANAGERS:
        raise RewardConfigError(
            f"reward_model.reward_manager={name!r} is unknown; known: {sorted(_REWARD_MANAGERS)}. "
            "Pick one of them or register yours with @register_reward_manager"
        )
    return _REWARD_MANAGERS[name]


def _split_result(result: Any) -> tuple[float, dict]:
    """A scorer result → (score, other per-sample values). Raises TypeError on a bad result."""
    if isinstance(result, dict):
        if "score" not in result:
            raise TypeError(f"it returned a dict without a 'score' key (keys: {sorted(result)})")
        extras = {k: v for k, v in result.items() if k != "score"}
        return float(result["score"]), extras
    if isinstance(result, (str, bytes)) or not hasattr(result, "__float__"):
        raise TypeError(f"it returned {type(result).__name__}; return a float or a dict with 'score'")
    return float(result), {}  # int, bool, numpy and 1-element torch scalars


@register_reward_manager("naive")
class NaiveRewardManager:
    """Score each response independently with a rule-based function (verl's naive manager).

    Combination with a reward model: when the batch holds ``rm_scores`` (the reward-model
    worker's score on the last response token), a row's reward is ``rm_score + rule_score`` if
    its data source has a rule scorer (a custom ``compute_score`` is set, or the data source is
    in :func:`hybridrl.rewards.known_data_sources`), and ``rm_score`` alone otherwise (e.g.
    Anthropic HH-RLHF, which has no verifiable answer). Unlike verl, which drops the rule score
    whenever ``rm_scores`` exists, a verifiable task keeps its correctness signal.

    Args:
        tokenizer: a Hugging Face tokenizer, used to decode prompts and responses.
        num_examine: how many samples per data_source to print on each call (0: none).
        compute_score: ``fn(data_source=, solution_str=, ground_truth=, extra_info=)`` returning
            a float or a dict with ``"score"``; default :func:`hybridrl.rewards.default_compute_score`.
        reward_fn_key: the non-tensor key holding each row's data source (``data.reward_fn_key``).
        on_error: what a failing (or late) scoring call does (``reward_model.on_error``):
            ``raise`` (stop with :class:`RewardFunctionError`); ``zero`` (score 0); ``mask_sample``
            (score 0, and the driver gives the sample no gradient); ``drop_group`` (score 0, and the
            driver drops its prompt group); ``retry`` (call again, up to ``retries`` more times,
            then stop). Except with ``raise``, ``reward_extra_info`` reports ``reward_error`` and
            ``reward_timeout`` (1.0/0.0) per sample.
        timeout_s: the longest one scoring call may take (``reward_model.timeout_s``); a call
            that overruns fails like one that raises (:class:`ScoreTimeoutError`).
        retries: extra attempts with ``on_error=retry`` (``reward_model.retries``).

    Raises:
        RewardConfigError: ``on_error`` is not one of :data:`ON_ERROR_POLICIES`.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        on_error: str = "raise",
        timeout_s: float = DEFAULT_SCORE_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        if on_error not in ON_ERROR_POLICIES:
            raise RewardConfigError(
                f"reward_model.on_error={on_error!r} is invalid; use one of {', '.join(ON_ERROR_POLICIES)} "
                "(docs/config.md: what each does with a failing reward function)"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise RewardConfigError(f"reward_model.retries={retries!r} must be a whole number >= 0")
        self.retries = retries
        self.tokenizer = tokenizer
        self.num_examine = int(num_examine)
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.on_error = on_error
        self.timeout_s = float(timeout_s)

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict:
        """Score a batch.

        Args:
            data: a ``DataProto`` with batch ``prompts`` (bs, P) left-padded, ``responses``
                (bs, R) right-padded, ``attention_mask`` (bs, P+R), and non-tensors
                ``<reward_fn_key>`` (str), ``reward_model`` (dict with ``ground_truth``) and
                optionally ``extra_info`` (dict). With batch ``rm_scores`` (bs, R) they are
                added to the rule scores as the class docstring says; rows scored by the reward
                model alone need no ``reward_model`` entry.
            return_dict: return ``{"reward_tensor", "reward_extra_info"}`` instead of the tensor.

        Returns:
            ``reward_tensor``: float32 (bs, R), zero except each sample's score on its last valid
            response token (a sample with no valid response token gets no score). With
            ``return_dict``, also ``reward_extra_info``: dict of lists of length bs, one per extra
            key returned by the scorer (``None`` where a sample lacked it), plus
            ``reward_error`` and ``reward_timeout`` (1.0/0.0) when ``on_error`` lets a failing sample
            through (``zero``, ``mask_sample``, ``drop_group``), and with ``rm_scores`` also
            ``rm_score`` and ``rule_score`` (``None`` for rows without a rule scorer).

        Raises:
            RewardInputError: a needed key is missing or malformed.
            RewardFunctionError: the scorer failed on a sample and ``on_error="raise"``, or on
                every sample of the batch with ``on_error="zero"``.
        """
        rm_scores = data.batch["rm_scores"] if "rm_scores" in data.batch.keys() else None
        for key in ("prompts", "responses", "attention_mask"):
            if key not in data.batch.keys():
                raise RewardInputError(
                    f"batch has no '{key}' tensor; the reward manager needs prompts, responses "
                    "and attention_mask from the rollout"
                )
        prompts, responses = data.batch["prompts"], data.batch["responses"]
        prompt_len = prompts.shape[-1]
        mask = data.batch["attention_mask"]
        valid_prompt = mask[:, :prompt_len].sum(-1).tolist()
        valid_resp = mask[:, prompt_len:].sum(-1).tolist()

        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        extras_per_sample, errors, timeouts, failures, printed, rule_scores = [], [], [], [], {}, []
        self._seconds: list[tuple[float, int, Any]] = []  # (seconds, row, data source) per scoring call
        for i in range(len(data)):
            vp, vr = int(valid_prompt[i]), int(valid_resp[i])
            response_str = self.tokenizer.decode(responses[i, :vr], skip_special_tokens=True)
            data_source = self._data_source(data, i)
            ground_truth, score, extras, failed = None, 0.0, {}, False
            if rm_scores is None or self.has_rule_scorer(data_source):
                _, ground_truth, extra_info = self._row_inputs(data, i)
                score, extras, failed = self._score(i, data_source, response_str, ground_truth, extra_info)
                score, extras = self.shape_score(score, extras, vr)
                rule_scores.append(score)
            else:
                rule_scores.append(None)
            if vr > 0:
                reward_tensor[i, vr - 1] = score
            if rm_scores is not None:
                extras = {**extras, "rm_score": float(rm_scores[i].sum())}
                score += extras["rm_score"]
            extras_per_sample.append(extras)
            errors.append(1.0 if failed else 0.0)
            timeouts.append(1.0 if failed and failed.timed_out else 0.0)
            if failed:
                failures.append(failed)
            if printed.get(data_source, 0) < self.num_examine:
                printed[data_source] = printed.get(data_source, 0) + 1
                prompt_str = self.tokenizer.decode(prompts[i, prompt_len - vp:], skip_special_tokens=True)
                self._print_sample(prompt_str, response_str, ground_truth, score, extras)

        self._log_slowest()
        scored = sum(score is not None for score in rule_scores)
        if failures and len(failures) == scored:
            raise RewardFunctionError(
                f"the reward function failed on all {scored} samples of this batch (reward_model.on_error="
                f"{self.on_error} would train on nothing but failures, which teaches nothing); first: {failures[0]}")
        if failures:
            logger.warning(
                "reward function failed on %d of %d samples in this batch; they were scored 0 "
                "(reward_model.on_error=%s). First: %s", len(failures), len(errors), self.on_error, failures[0]
            )
        if rm_scores is not None:  # both sit on the last valid response token
            reward_tensor = reward_tensor + rm_scores.to(reward_tensor)
        if not return_dict:
            return reward_tensor
        extra_info_out = _collect_extras(extras_per_sample)
        if self.on_error in ("zero", "mask_sample", "drop_group"):
            extra_info_out["reward_error"] = errors
            extra_info_out["reward_timeout"] = timeouts
        if rm_scores is not None:
            extra_info_out["rule_score"] = rule_scores
        return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info_out}

    def shape_score(self, score: float, extras: dict, response_length: int) -> tuple[float, dict]:
        """A subclass's change to a row's rule score (e.g. DAPO's overlong penalty); unchanged here.

        Args:
            score: the scorer's score; extras: its other outputs; response_length: valid tokens.
        """
        return score, extras

    def has_rule_scorer(self, data_source: Any) -> bool:
        """Whether rows of ``data_source`` get a rule score next to a reward model's score."""
        return self.compute_score is not default_compute_score or data_source in known_data_sources()

    def _data_source(self, data: Any, i: int) -> Any:
        nt = data.non_tensor_batch
        if self.reward_fn_key not in nt:
            raise RewardInputError(
                f"non_tensor_batch has no '{self.reward_fn_key}' (data.reward_fn_key); "
                f"present keys: {sorted(nt)}. Set data.reward_fn_key to the column naming each "
                "row's data source"
            )
        return nt[self.reward_fn_key][i]

    def _row_inputs(self, data: Any, i: int) -> tuple[Any, Any, Any]:
        """(data_source, ground_truth, extra_info) of row ``i``, with clear errors if missing."""
        nt = data.non_tensor_batch
        data_source = self._data_source(data, i)
        if "reward_model" not in nt:
            raise RewardInputError(
                "non_tensor_batch has no 'reward_model'; each dataset row needs "
                "reward_model={'style': 'rule', 'ground_truth': ...}"
            )
        reward_model = nt["reward_model"][i]
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise RewardInputError(
                f"reward_model of sample {i} is {reward_model!r}; it must be a dict with a "
                "'ground_truth' key, e.g. {'style': 'rule', 'ground_truth': '42'}"
            )
        extra_info = nt["extra_info"][i] if "extra_info" in nt else None
        if "__num_turns__" in nt:  # multi-turn rollouts: let scorers see the turn count (verl)
            extra_info = {**(extra_info or {}), "num_turns": nt["__num_turns__"][i]}
        if "reward_scores" in nt:  # agent loops: tools' calc_reward / interaction scores (verl's key)
            extra_info = {**(extra_info or {}), "rollout_reward_scores": nt["reward_scores"][i]}
        return data_source, reward_model["ground_truth"], extra_info

    def _score(self, i, data_source, solution_str, ground_truth, extra_info) -> tuple[float, dict, str | None]:
        """Call the scorer on one sample → (score, extras, failure or None), applying ``on_error``."""
        attempts = 1 + (self.retries if self.on_error == "retry" else 0)
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            try:
                result = call_with_deadline(self.compute_score, self.timeout_s, data_source=data_source,
                                            solution_str=solution_str, ground_truth=ground_truth,
                                            extra_info=extra_info)
                score, extras = _split_result(result)
                return score, extras, None
            except Exception as exc:
                failure = _Failure(f"sample {i} of the batch (data_source={data_source!r}): {type(exc).__name__}: "
                                   f"{' '.join(str(exc).split())}", isinstance(exc, ScoreTimeoutError))
                if self.on_error in ("zero", "mask_sample", "drop_group"):
                    return 0.0, {}, failure
                if attempt == attempts:
                    tried = f" after {attempts} attempts (reward_model.retries={self.retries})" if attempts > 1 else ""
                    raise RewardFunctionError(
                        f"reward function failed on {failure}{tried}; fix the function or set reward_model.on_error "
                        "to zero, mask_sample or drop_group to go on without such samples") from exc
            finally:
                self._seconds.append((time.perf_counter() - started, i, data_source))

    def _log_slowest(self) -> None:
        """Names the slowest scoring calls of the batch when one took over a second."""
        slowest = sorted(self._seconds, reverse=True)[:_SLOW_SAMPLES_LOGGED]
        if slowest and slowest[0][0] >= 1.0:
            logger.info("reward: slowest samples: %s", ", ".join(
                f"#{i} ({source}) {seconds:.1f} s" for seconds, i, source in slowest))

    @staticmethod
    def _print_sample(prompt: str, response: str, ground_truth: Any, score: float, extras: dict) -> None:
        print("[prompt]", prompt)
        print("[response]", response)
        print("[ground_truth]", ground_truth)
        print("[score]", score)
        for key, value in extras.items():
            print(f"[{key}]", value)


def _collect_extras(extras_per_sample: list[dict]) -> dict[str, list]:
    """Per-sample extra dicts → dict of lists of length bs (None where a sample lacks the key)."""
    keys: dict[str, None] = {}
    for extras in extras_per_sample:
        keys.update(dict.fromkeys(extras))
    return {k: [extras.get(k) for extras in extras_per_sample] for k in keys}


def _score_timeout(config: Any) -> float:
    value = _cfg_get(config, "reward_model.timeout_s", DEFAULT_SCORE_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise RewardConfigError(f"reward_model.timeout_s={value!r} must be a number of seconds > 0 "
                                f"(default {DEFAULT_SCORE_TIMEOUT_S:g})")
    return float(value)


def _cfg_get(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.a.b`` for a DictConfig or nested dicts, ``default`` where any part is missing."""
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part, None)
    return default if node is None else node


def _to_plain_dict(value: Any, key: str) -> dict:
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:  # plain dict configs work without omegaconf
        pass
    if not isinstance(value, dict):
        raise RewardConfigError(f"{key} is a {type(value).__name__}; it must be a mapping of keyword arguments")
    return value


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int = 0) -> Any:
    """Build the reward manager the trainer config asks for (verl's ``load_reward_manager``).

    Reads ``custom_reward_function.{path,name,reward_kwargs}`` (the custom scorer, with its kwargs
    bound by ``functools.partial``; default :func:`default_compute_score`),
    ``reward_model.reward_manager`` (default ``"naive"``), ``reward_model.reward_kwargs`` (extra
    constructor arguments of the manager), ``reward_model.on_error`` (default ``"raise"``) and
    ``data.reward_fn_key`` (default ``"data_source"``).

    Args:
        config: the whole trainer config (an omegaconf DictConfig or nested dicts).
        tokenizer: the tokenizer used to decode responses.
        num_examine: samples per data_source to print on each call.

    Raises:
        RewardConfigError: a bad custom function, manager name, on_error value or reward_kwargs.
    """
    path = _cfg_get(config, "custom_reward_function.path")
    compute_score = None
    if path:
        name = _cfg_get(config, "custom_reward_function.name", "compute_score")
        fn_kwargs = _to_plain_dict(
            _cfg_get(config, "custom_reward_function.reward_kwargs", {}), "custom_reward_function.reward_kwargs"
        )
        compute_score = load_custom_reward_fn(path, name, fn_kwargs)
    manager_name = _cfg_get(config, "reward_model.reward_manager", "naive")
    manager_cls = get_reward_manager_cls(manager_name)
    manager_kwargs = _to_plain_dict(_cfg_get(config, "reward_model.reward_kwargs", {}), "reward_model.reward_kwargs")
    optional = {  # passed to managers that take them (verl's naive one does not), unless reward_kwargs do
        "timeout_s": _score_timeout(config),
        "retries": _cfg_get(config, "reward_model.retries", DEFAULT_RETRIES),
        "overlong_buffer_cfg": _cfg_get(config, "reward_model.overlong_buffer"),
        "max_resp_len": _cfg_get(config, "data.max_response_length"),
    }
    accepted = inspect.signature(manager_cls).parameters
    try:
        return manager_cls(
            tokenizer=tokenizer,
            num_examine=num_examine,
            compute_score=compute_score,
            reward_fn_key=_cfg_get(config, "data.reward_fn_key", "data_source"),
            on_error=_cfg_get(config, "reward_model.on_error", "raise"),
            **{k: v for k, v in optional.items() if k in accepted and k not in manager_kwargs},
            **manager_kwargs,
        )
    except TypeError as exc:
        if not manager_kwargs:
            raise
        raise RewardConfigError(
            f"reward_model.reward_kwargs={manager_kwargs} do not fit reward manager "
            f"{manager_name!r}: {exc}; remove the keys it does not take"
        ) from exc


# Managers beyond "naive" register themselves on import; kept last so they can import the above.
from hybridrl.rewards import dapo  # noqa: E402,F401  isort: skip
