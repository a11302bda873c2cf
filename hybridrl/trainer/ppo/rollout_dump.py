"""Sample dumps: each step's prompts, responses and scores as JSON lines.

`trainer.rollout_data_dir` receives the training rollouts of every step, and
`trainer.validation_data_dir` the validation samples of every validation, each as one file
`step_<N>.jsonl` written whole through a temporary file (a crash never leaves half a file; a
resumed run that redoes a step replaces its file). One JSON object per sample:

    {"input": str, "output": str, "score": float, "ground_truth": ..., "step": int,
     "data_source": str, "uid": str, <reward_extra_info keys, e.g. "acc">}

`input` and `output` are decoded without special tokens and without padding, as the reward
function saw the response. `hybridrl view <folder>` browses these files; the reader below also
accepts verl's `<N>.jsonl` names.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile

import numpy as np

from hybridrl.data.jsonl import iter_jsonl
from hybridrl.errors import ConfigError, UserError
from hybridrl.trainer.run.tracking import VAL_GENERATIONS_KEY

_STEP_FILE = re.compile(r"^(?:step_)?(\d+)\.jsonl$")
_BASE_KEYS = ("input", "output", "score", "ground_truth", "step", "data_source", "uid", "param_version")


class SampleDumpError(UserError, ValueError):
    """A batch lacks what a sample dump needs, or a dump file cannot be read."""


def _to_json(value):
    """numpy/torch values -> plain Python (lists, numbers, str), for JSON and loggers."""
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON readers (jq, browsers) reject NaN
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def sample_records(batch, tokenizer, step: int, scores=None, reward_extra_info: dict | None = None) -> list[dict]:
    """One plain dict per sample of a generated batch (the format in the module docstring).

    Args:
        batch: DataProto with tensors ``prompts`` (bs, P) left-padded, ``responses`` (bs, R),
            ``attention_mask`` (bs, P+R), and ``token_level_scores`` (bs, R) unless ``scores``
            is given; optional non-tensor columns ``reward_model`` (dict with ground_truth),
            ``data_source`` and ``uid``.
        tokenizer: the tokenizer that made the token ids.
        step: the training step the samples belong to (0: validation before training).
        scores: optional (bs, R) token-level scores; each sample's score is their sum.
        reward_extra_info: optional name -> list of bs values from the reward manager; keys
            whose list has another length, or that clash with the fields above, are left out.

    Raises:
        SampleDumpError: a needed tensor is missing.
    """
    tensors = batch.batch
    need = ("prompts", "responses", "attention_mask") + (() if scores is not None else ("token_level_scores",))
    missing = [k for k in need if k not in tensors.keys()]
    if missing:
        raise SampleDumpError(f"sample dump: the batch has no {missing} tensor(s); dump after the reward stage")
    prompts, responses, mask = tensors["prompts"], tensors["responses"], tensors["attention_mask"]
    scores = tensors["token_level_scores"] if scores is None else scores
    width = prompts.shape[-1]
    prompt_lens = mask[:, :width].sum(-1).tolist()
    response_lens = mask[:, width:].sum(-1).tolist()
    inputs = tokenizer.batch_decode(
        [prompts[i, width - int(n) :].tolist() for i, n in enumerate(prompt_lens)], skip_special_tokens=True
    )
    outputs = tokenizer.batch_decode(
        [responses[i, : int(n)].tolist() for i, n in enumerate(response_lens)], skip_special_tokens=True
    )
    totals = scores.sum(-1).tolist()
    columns = batch.non_tensor_batch
    size = len(inputs)
    extra = {k: v for k, v in (reward_extra_info or {}).items() if k not in _BASE_KEYS and len(v) == size}
    records = []
    for i in range(size):
        reward_model = columns["reward_model"][i] if "reward_model" in columns else None
        record = {
            "input": inputs[i],
            "output": outputs[i],
            "score": _to_json(float(totals[i])),
            "ground_truth": _to_json(reward_model.get("ground_truth")) if isinstance(reward_model, dict) else None,
            "step": int(step),
        }
        for key in ("data_source", "uid", "param_version"):
            if key in columns:
                record[key] = _to_json(columns[key][i])
        record.update({k: _to_json(v[i]) for k, v in extra.items()})
        records.append(record)
    return records


def write_step(folder: str, step: int, records: list[dict], config_key: str = "trainer.rollout_data_dir") -> str:
    """Write `records` as `<folder>/step_<step>.jsonl` atomically; returns the file's path.

    Raises:
        ConfigError: the folder cannot be created or written (names `config_key`).
    """
    path = os.path.join(folder, f"step_{int(step)}.jsonl")
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".step_{int(step)}.", suffix=".tmp")
    except OSError as err:
        raise ConfigError(
            f"{config_key}={folder}: cannot write sample dumps there ({err.strerror}); "
            "pick a writable folder or set it to null"
        ) from err
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _check_folders(trainer_cfg) -> None:
    rollout, validation = trainer_cfg.rollout_data_dir, trainer_cfg.validation_data_dir
    if rollout and validation and os.path.realpath(rollout) == os.path.realpath(validation):
        raise ConfigError(
            f"trainer.rollout_data_dir and trainer.validation_data_dir are both {rollout}; training "
            "and validation files of one step would overwrite each other: use two folders"
        )


def dump_rollouts(trainer_cfg, batch, tokenizer, step: int, reward_extra_info: dict | None = None) -> str | None:
    """Write a training step's samples to `trainer.rollout_data_dir`; no-op when it is unset.

    `batch` is the step's DataProto after the reward stage (see `sample_records`). Returns the
    file written, or None.

    Raises:
        ConfigError: the folder is not writable, or is the validation folder too.
    """
    folder = trainer_cfg.rollout_data_dir
    if not folder:
        return None
    _check_folders(trainer_cfg)
    return write_step(folder, step, sample_records(batch, tokenizer, step, reward_extra_info=reward_extra_info))


def pick_generations(records: list[dict], n: int) -> list[dict]:
    """The `n` samples shown by `trainer.log_val_generations`, the same prompts every validation.

    As verl: sort by input, shuffle with a fixed seed (numpy RandomState(42)), take the first n.
    """
    ordered = sorted(records, key=lambda r: r["input"])
    order = np.random.RandomState(42).permutation(len(ordered))
    return [ordered[i] for i in order[:n]]


class ValidationDump:
    """Collects one validation's samples, then dumps and/or logs them.

    `trainer.validation_data_dir` receives all samples as `step_<step>.jsonl`;
    `trainer.log_val_generations` = N > 0 hands N of them (see `pick_generations`) to the
    loggers, through the metrics dict under `tracking.VAL_GENERATIONS_KEY`. With neither set,
    `add` decodes nothing.

    Raises:
        ConfigError: log_val_generations is not a whole number >= 0, or the folders clash.
    """

    def __init__(self, trainer_cfg, tokenizer, step: int):
        self.folder = trainer_cfg.validation_data_dir or None
        n = trainer_cfg.log_val_generations
        if n < 0:
            raise ConfigError(
                f"trainer.log_val_generations={n!r}: it must be a whole number >= 0 "
                "(validation samples given to the loggers; 0 turns it off)"
            )
        self.n_log = n
        self.tokenizer = tokenizer
        self.step = int(step)
        self.records: list[dict] = []
        _check_folders(trainer_cfg)

    @property
    def enabled(self) -> bool:
        return bool(self.folder) or self.n_log > 0

    def add(self, batch, scores, reward_extra_info: dict | None = None) -> None:
        """Record a validation batch; `scores` are its (bs, R) token-level scores."""
        if self.enabled:
            self.records += sample_records(batch, self.tokenizer, self.step, scores, reward_extra_info)

    def finish(self, metrics: dict) -> dict:
        """Write the dump file; returns `metrics` plus the samples to log, when asked for."""
        if self.folder:
            write_step(self.folder, self.step, self.records, config_key="trainer.validation_data_dir")
        if self.n_log and self.records:
            metrics = {**metrics, VAL_GENERATIONS_KEY: pick_generations(self.records, self.n_log)}
        return metrics


# ---------------------------------------------------------------- reading


def list_steps(folder: str) -> dict[int, str]:
    """`step -> file path` of the dump files in `folder` (`step_<N>.jsonl` or verl's `<N>.jsonl`),
    by step.

    Raises:
        FileNotFoundError: `folder` is not a folder.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"{folder}: no such folder; pass a trainer.rollout_data_dir or trainer.validation_data_dir of a run"
        )
    found = {}
    for name in os.listdir(folder):
        match = _STEP_FILE.match(name)
        if match:
            found[int(match.group(1))] = os.path.join(folder, name)
    return dict(sorted(found.items()))


def read_step(path: str) -> list[dict]:
    """The samples of one dump file.

    Raises:
        SampleDumpError: a line is not a JSON object (names the file and line).
    """
    records = []
    for number, record in iter_jsonl(path, error=SampleDumpError):
        if not isinstance(record, dict):
            raise SampleDumpError(f"{path}:{number}: expected a JSON object per line, got {type(record).__name__}")
        records.append(record)
    return records
