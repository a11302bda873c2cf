"""Reward managers: turn a batch of generated responses into token-level scores.

A reward manager decodes each response, calls a scoring function and writes the score on the
last valid response token (verl's ``token_level_scores``). Managers are registered by name and
chosen with the config key ``reward_model.reward_manager`` (default ``"naive"``).

With a reward model (``reward_model.enable``) the batch also holds ``rm_scores`` and the
manager combines them with the rule scores, see :class:`NaiveRewardManager`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, NamedTuple

import torch

from hybridrl.errors import UserError
from hybridrl.registry import Registry, RegistryError
from hybridrl.rewards import compute_score_details, default_compute_score, known_data_sources
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.pool import RewardPool, ScoreTimeoutError, serial_calls

__all__ = [
    "RewardFunctionError",
    "RewardInputError",
    "RewardManagerNameError",
    "REWARD_MANAGERS",
    "VERL_ONLY_MANAGERS",
    "register_reward_manager",
    "get_reward_manager_cls",
    "NaiveRewardManager",
]

logger = logging.getLogger(__name__)


class RewardManagerNameError(RewardConfigError, RegistryError):
    """``reward_model.reward_manager`` names no registered manager, or a second class takes a name."""


# "naive" is defined below; "judge" registers with hybridrl.workers.llm_judge (it needs an engine).
REWARD_MANAGERS = Registry(
    "reward manager",
    "reward_model.reward_manager",
    error=RewardManagerNameError,
    hint="pick one of them or register yours with @register_reward_manager",
    builtins={"dapo": "hybridrl.rewards.dapo:DAPORewardManager"},
)

# verl's reward managers that hybridrl does not register, each with the feature and what to use instead
# (the start-up check refuses them with this line, unless a manager of that name was registered)
VERL_ONLY_MANAGERS = {
    "prime": "verl's PRIME reward manager (each batch scored in 64 processes, a failing or 300 s late score is 0) is "
    "not in hybridrl; the naive manager scores in processes with reward.num_workers=64 reward_model.on_error=zero "
    "reward_model.timeout_s=300",
    "batch": "verl's batch reward manager (one compute_score call for the whole batch) is not in hybridrl; use "
    "the naive manager with a per-sample compute_score (reward.num_workers scores in parallel)",
    "remote": "verl's remote reward manager (scoring in Ray actors) is not in hybridrl; reward.num_workers scores "
    "in processes of the driver's machine",
}

# What a failing or late scoring call does: stop the run; score 0; score 0 and train nothing on
# the sample (the driver masks it); score 0 and drop its prompt group; try again, then stop.
ON_ERROR_POLICIES = ("raise", "zero", "mask_sample", "drop_group", "retry")
DEFAULT_RETRIES = 2
_SLOW_SAMPLES_LOGGED = 3
DEFAULT_SCORE_TIMEOUT_S = 60.0


class _Failure(str):
    """Why one sample's scoring failed (the text), and whether it ran out of time."""

    def __new__(cls, text: str, timed_out: bool):
        failure = super().__new__(cls, text)
        failure.timed_out = timed_out
        return failure


class RewardFunctionError(UserError, RuntimeError):
    """The scoring function raised (or returned something that is not a score) on a sample."""


class RewardInputError(ValueError):
    """The batch lacks a key the reward manager needs, or holds it in the wrong form."""


class _Row(NamedTuple):
    """One sample to score: its row, data source, decoded response, valid response tokens, and
    the scorer's keyword arguments (None: a reward-model score alone, no rule scorer)."""

    i: int
    data_source: Any
    response_str: str
    valid_len: int
    job: dict | None


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator: make a reward manager available as ``reward_model.reward_manager=name``.

    The class is built as ``cls(tokenizer=..., num_examine=..., compute_score=...,
    reward_fn_key=..., on_error=..., **reward_model.reward_kwargs)`` and called as
    ``manager(data: DataProto, return_dict=False)``.

    Raises:
        RewardManagerNameError (a RewardConfigError): another class is registered under ``name`` already.
    """
    return REWARD_MANAGERS.register(name)


def get_reward_manager_cls(name: str) -> type:
    """Return the reward manager class registered as ``name``.

    Raises:
        RewardManagerNameError (a RewardConfigError): ``name`` is not registered (the message lists
            the known ones and suggests the closest).
    """
    return REWARD_MANAGERS.get(name)


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
            that overruns fails like one that raises (:class:`ScoreTimeoutError`). In the driver the
            late call runs on unwatched in its thread; in a ``pool`` its process is killed.
        retries: extra attempts with ``on_error=retry`` (``reward_model.retries``).
        pool: a :class:`hybridrl.rewards.pool.RewardPool` (``reward.num_workers`` > 1) to run the
            scoring calls in, all of a batch at once; None: one after the other in the driver.
            ``compute_score`` must then pickle (a top-level function). Scores, extras and
            ``on_error`` are the same either way.

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
        pool: RewardPool | None = None,
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
        # the default keeps the scorers' details (e.g. the code scorers' passed / total / reason)
        self._score_fn = compute_score_details if self.compute_score is default_compute_score else self.compute_score
        self.reward_fn_key = reward_fn_key
        self.on_error = on_error
        self.timeout_s = float(timeout_s)
        self.pool = pool

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
        _check_batch_keys(data)
        prompts, responses = data.batch["prompts"], data.batch["responses"]
        prompt_len = prompts.shape[-1]
        mask = data.batch["attention_mask"]
        valid_prompt = mask[:, :prompt_len].sum(-1).tolist()
        valid_resp = mask[:, prompt_len:].sum(-1).tolist()

        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        rows = [self._row(data, i, int(valid_resp[i]), rm_scores is None) for i in range(len(data))]
        outcomes = self._score_rows(rows)
        extras_per_sample, errors, timeouts, failures, printed, rule_scores = [], [], [], [], {}, []
        for row in rows:
            score, extras, failed = 0.0, {}, None
            if row.job is not None:
                score, extras, failed = outcomes[row.i]
                score, extras = self.shape_score(score, extras, row.valid_len)
            rule_scores.append(score if row.job is not None else None)
            if row.valid_len > 0:
                reward_tensor[row.i, row.valid_len - 1] = score
            if rm_scores is not None:
                extras = {**extras, "rm_score": float(rm_scores[row.i].sum())}
                score += extras["rm_score"]
            extras_per_sample.append(extras)
            errors.append(1.0 if failed else 0.0)
            timeouts.append(1.0 if failed and failed.timed_out else 0.0)
            if failed:
                failures.append(failed)
            if printed.get(row.data_source, 0) < self.num_examine:
                printed[row.data_source] = printed.get(row.data_source, 0) + 1
                vp = int(valid_prompt[row.i])
                prompt_str = self.tokenizer.decode(prompts[row.i, prompt_len - vp :], skip_special_tokens=True)
                ground_truth = row.job["ground_truth"] if row.job is not None else None
                self._print_sample(prompt_str, row.response_str, ground_truth, score, extras)

        self._log_slowest()
        self._report_failures(failures, scored=sum(score is not None for score in rule_scores), total=len(errors))
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

    def _report_failures(self, failures: list, scored: int, total: int) -> None:
        """A batch whose every rule-scored sample failed stops the run; some failures are logged once."""
        if failures and len(failures) == scored:
            raise RewardFunctionError(
                f"the reward function failed on all {scored} samples of this batch (reward_model.on_error="
                f"{self.on_error} would train on nothing but failures, which teaches nothing); first: {failures[0]}"
            )
        if failures:
            logger.warning(
                "reward function failed on %d of %d samples in this batch; they were scored 0 "
                "(reward_model.on_error=%s). First: %s",
                len(failures),
                total,
                self.on_error,
                failures[0],
            )

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

    def _job(self, data: Any, i: int, data_source: Any, response_str: str) -> dict:
        """The scorer's keyword arguments for row ``i``, with clear errors where an input is missing."""
        nt = data.non_tensor_batch
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
        return {
            "data_source": data_source,
            "solution_str": response_str,
            "ground_truth": reward_model["ground_truth"],
            "extra_info": extra_info,
        }

    def _row(self, data: Any, i: int, valid_len: int, rule_always: bool) -> _Row:
        """Row ``i`` decoded, with the scorer's arguments when it gets a rule score (always without
        a reward model; with one, where :meth:`has_rule_scorer`)."""
        response_str = self.tokenizer.decode(data.batch["responses"][i, :valid_len], skip_special_tokens=True)
        data_source = self._data_source(data, i)
        rule = rule_always or self.has_rule_scorer(data_source)
        return _Row(
            i, data_source, response_str, valid_len, self._job(data, i, data_source, response_str) if rule else None
        )

    def _score_rows(self, rows: list[_Row]) -> dict[int, tuple[float, dict, _Failure | None]]:
        """Scores the rows that have a job → ``{row: (score, extras, failure or None)}``.

        The calls run one by one in the driver or all at once in ``self.pool``; ``on_error`` is
        applied to their outcomes here, the same way for both (``retry`` calls the failed rows again
        after each pass).
        """
        outcomes: dict[int, tuple[float, dict, _Failure | None]] = {}
        self._seconds: list[tuple[float, int, Any]] = []  # (seconds, row, data source) per scoring call
        pending, attempt = [row for row in rows if row.job is not None], 0
        while pending:
            attempt, retry = attempt + 1, []
            jobs = [row.job for row in pending]
            calls = (
                self.pool.calls(self._score_fn, jobs, self.timeout_s)
                if self.pool is not None
                else serial_calls(self._score_fn, jobs, self.timeout_s)
            )
            with contextlib.closing(calls):  # a raise stops the calls not yet made
                for row, (outcome, seconds) in zip(pending, calls):
                    self._seconds.append((seconds, row.i, row.data_source))
                    try:
                        if isinstance(outcome, BaseException):
                            raise outcome
                        score, extras = _split_result(outcome)
                        outcomes[row.i] = (score, extras, None)
                    except Exception as exc:  # noqa: BLE001 - on_error decides
                        failure = self._on_failure(exc, row, attempt)
                        if failure is None:
                            retry.append(row)
                        else:
                            outcomes[row.i] = (0.0, {}, failure)
            pending = retry
        return outcomes

    def _on_failure(self, exc: Exception, row: _Row, attempt: int) -> _Failure | None:
        """``on_error`` for one failed call: the failure to record (``zero``, ``mask_sample``,
        ``drop_group``), or None to call again (``retry`` with attempts left).

        Raises:
            RewardFunctionError: ``raise``, or ``retry`` after its last attempt.
            RewardConfigError: whatever ``on_error`` says, when the call raised one (e.g.
                :class:`hybridrl.rewards.sandbox.SandboxUnavailableError`).
        """
        if isinstance(exc, RewardConfigError):  # the set-up is wrong (e.g. no code sandbox), not this sample
            raise exc
        failure = _Failure(
            f"sample {row.i} of the batch (data_source={row.data_source!r}): {type(exc).__name__}: "
            f"{' '.join(str(exc).split())}",
            isinstance(exc, ScoreTimeoutError),
        )
        if self.on_error in ("zero", "mask_sample", "drop_group"):
            return failure
        attempts = 1 + (self.retries if self.on_error == "retry" else 0)
        if attempt < attempts:
            return None
        tried = f" after {attempts} attempts (reward_model.retries={self.retries})" if attempts > 1 else ""
        raise RewardFunctionError(
            f"reward function failed on {failure}{tried}; fix the function or set reward_model.on_error "
            "to zero, mask_sample or drop_group to go on without such samples"
        ) from exc

    def _log_slowest(self) -> None:
        """Names the slowest scoring calls of the batch when one took over a second."""
        slowest = sorted(self._seconds, reverse=True)[:_SLOW_SAMPLES_LOGGED]
        if slowest and slowest[0][0] >= 1.0:
            logger.info(
                "reward: slowest samples: %s",
                ", ".join(f"#{i} ({source}) {seconds:.1f} s" for seconds, i, source in slowest),
            )

    @staticmethod
    def _print_sample(prompt: str, response: str, ground_truth: Any, score: float, extras: dict) -> None:
        fields = [("prompt", prompt), ("response", response), ("ground_truth", ground_truth), ("score", score)]
        for key, value in fields + list(extras.items()):
            print(f"[{key}]", value)


def _check_batch_keys(data: Any) -> None:
    for key in ("prompts", "responses", "attention_mask"):
        if key not in data.batch.keys():
            raise RewardInputError(
                f"batch has no '{key}' tensor; the reward manager needs prompts, responses "
                "and attention_mask from the rollout"
            )


def _collect_extras(extras_per_sample: list[dict]) -> dict[str, list]:
    """Per-sample extra dicts → dict of lists of length bs (None where a sample lacks the key)."""
    keys: dict[str, None] = {}
    for extras in extras_per_sample:
        keys.update(dict.fromkeys(extras))
    return {k: [extras.get(k) for extras in extras_per_sample] for k in keys}
