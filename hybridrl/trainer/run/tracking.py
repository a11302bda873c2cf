"""Experiment loggers (`trainer.logger`): console, file (JSON lines), tensorboard, wandb, mlflow, swanlab.

`Tracking` fans one metrics dict per step out to every chosen logger. Loggers live in a
registry; add one with `@register_logger("name")` on a class whose constructor takes the
keyword arguments project_name, experiment_name, config, local_dir, total_steps and that has
`log(data, step)` and `finish()`. A logger may also have `log_generations(samples, step)` to
receive validation samples (`trainer.log_val_generations`). tensorboard, wandb and mlflow
live in `loggers_optional.py` and import their package only when asked for.
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from typing import Any

from hybridrl.errors import UserError
from hybridrl.registry import Registry, RegistryError

# A metrics dict may carry validation samples under this key (a list of dicts with input,
# output, score, ground_truth, step; see rollout_dump.ValidationDump): `Tracking.log` hands
# them to the loggers' `log_generations` instead of logging them as a metric.
VAL_GENERATIONS_KEY = "val/generations"


class TrackingError(UserError, ValueError):
    """A logger was asked for that cannot be built (unknown name, missing folder or package)."""


class MissingLoggerPackage(TrackingError, ImportError):
    """A logger's optional package (tensorboard, wandb) is not installed."""


class LoggerNameError(TrackingError, RegistryError):
    """``trainer.logger`` names no registered logger, or a second class takes a name."""


# console and file are defined below; the loggers that need an optional package load on first use.
LOGGERS = Registry(
    "logger",
    "trainer.logger",
    error=LoggerNameError,
    hint="register your own with @register_logger",
    builtins={
        "tensorboard": "hybridrl.trainer.run.loggers_optional:TensorboardLogger",
        "wandb": "hybridrl.trainer.run.loggers_optional:WandbLogger",
        "mlflow": "hybridrl.trainer.run.loggers_optional:MlflowLogger",
        "swanlab": "hybridrl.trainer.run.loggers_optional:SwanlabLogger",
    },
)


def register_logger(name: str):
    """Class decorator: make a logger available as `trainer.logger=[..., name]`.

    Raises:
        LoggerNameError (a TrackingError): another logger is already registered under `name`.
    """
    return LOGGERS.register(name)


def available_loggers() -> list[str]:
    """Names accepted in `trainer.logger`, sorted."""
    return LOGGERS.names()


def plain_scalar(value):
    """numpy/torch scalars -> Python int/float/bool/str; None for anything non-scalar."""
    if hasattr(value, "numel"):  # torch.Tensor
        value = value.item() if value.numel() == 1 else None
    elif hasattr(value, "item") and getattr(value, "size", 0) == 1:  # numpy scalar/array
        value = value.item()
    if isinstance(value, (bool, int, float, str)):
        return value
    return None


class Tracking:
    """Send each step's metrics to one or more loggers (verl's `Tracking`).

    Args:
        project_name, experiment_name: `trainer.project_name`, `trainer.experiment_name`.
        default_backend: a logger name or list of names (`trainer.logger`), e.g.
            ["console", "file"]. See `available_loggers()`.
        config: the run's config (OmegaConf or dict), passed to wandb.
        local_dir: folder for the file logger (`metrics.jsonl`) and tensorboard events.
        total_steps: number of training steps, for the console progress bar.

    Raises:
        TrackingError: an unknown logger name (LoggerNameError, listing the known ones), or a logger that
            needs `local_dir` without one. MissingLoggerPackage: tensorboard/wandb not installed.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | list[str] | None = "console",
        config=None,
        local_dir: str | None = None,
        total_steps: int | None = None,
    ):
        if isinstance(default_backend, str):
            default_backend = [default_backend]
        default_backend = list(default_backend or [])  # also an OmegaConf list
        names = list(dict.fromkeys(default_backend or []))  # drop repeats, keep order
        classes = [LOGGERS.get(name) for name in names]  # an unknown name fails before any is built
        self.loggers: dict[str, Any] = {}
        try:
            for name, cls in zip(names, classes):
                self.loggers[name] = cls(
                    project_name=project_name,
                    experiment_name=experiment_name,
                    config=config,
                    local_dir=local_dir,
                    total_steps=total_steps,
                )
        except BaseException:
            self.finish()  # do not leave open files/bars behind from the loggers already made
            raise

    def log(self, data: dict, step: int) -> None:
        """Log `data` (metric name -> number) as training step `step` to every logger.

        A list of sample dicts under `VAL_GENERATIONS_KEY` goes to `log_generations` instead.
        """
        samples = data.get(VAL_GENERATIONS_KEY)
        if samples is not None:
            data = {k: v for k, v in data.items() if k != VAL_GENERATIONS_KEY}
        for logger in self.loggers.values():
            logger.log(data, step)
        if samples:
            self.log_generations(samples, step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        """Give validation samples (dicts with input, output, score, ground_truth, step) to
        every logger that shows them: console prints them, tensorboard adds text, wandb a
        table, mlflow a JSON artifact. The file logger skips them (see
        `trainer.validation_data_dir` for full dumps)."""
        for logger in self.loggers.values():
            log_generations = getattr(logger, "log_generations", None)
            if log_generations is not None:
                log_generations(samples, step)

    def finish(self) -> None:
        """Flush and close every logger; safe to call more than once."""
        loggers, self.loggers = self.loggers, {}
        for logger in loggers.values():
            logger.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()


# ---------------------------------------------------------------- console

# (label, metric key) in display order; the most useful few of a step's ~100 metrics.
_CONSOLE_KEYS = (
    ("score", "critic/score/mean"),
    ("reward", "critic/rewards/mean"),
    ("kl_loss", "actor/kl_loss"),
    ("kl_penalty", "actor/reward_kl_penalty"),
    ("ppo_kl", "actor/ppo_kl"),
    ("entropy", "actor/entropy"),
    ("resp_len", "response_length/mean"),
    ("pg_loss", "actor/pg_loss"),
    ("vf_loss", "critic/vf_loss"),
    ("loss", "train/loss"),  # SFT / reward-model training
    ("val_loss", "val/loss"),
    ("acc", "train/accuracy"),
    ("val_acc", "val/accuracy"),
    ("lr", "train/lr"),
)


def tracker_for_run(config, total_steps: int) -> Tracking:
    """The run's :class:`Tracking` from its ``trainer`` section (``project_name``,
    ``experiment_name``, ``logger``, ``default_local_dir``): one factory for ``hybridrl train``,
    ``sft`` and ``rm``."""
    trainer_cfg = config.trainer
    return Tracking(
        project_name=trainer_cfg.project_name,
        experiment_name=trainer_cfg.experiment_name,
        default_backend=trainer_cfg.logger,
        config=config,
        local_dir=trainer_cfg.default_local_dir,
        total_steps=total_steps,
    )


def _fmt(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.3g}"


def format_console_line(data: dict, step: int, total_steps: int | None = None) -> str:
    """One readable line for a step, e.g. `step 3/40 | score 0.312 | ppo_kl 0.00123 | 12.3s/step`.

    Only keys present in `data` are shown; validation scores (`val-core/<source>/reward/mean@1`)
    appear as `val <source>`; the step time comes from `perf/time_per_step`.
    """
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    for label, key in _CONSOLE_KEYS:
        value = plain_scalar(data.get(key))
        if isinstance(value, (int, float)):
            parts.append(f"{label} {_fmt(value)}")
    for key in sorted(data):
        if key.startswith("val-core/") and key.endswith("/reward/mean@1"):
            value = plain_scalar(data[key])
            if isinstance(value, (int, float)):
                source = key[len("val-core/") : -len("/reward/mean@1")]
                parts.append(f"val {source} {_fmt(value)}")
    seconds = plain_scalar(data.get("perf/time_per_step"))
    if isinstance(seconds, (int, float)):
        parts.append(f"{seconds:.1f}s/step")
    return " | ".join(parts)


def _fmt_full(value) -> str:
    """A metric value in the full listing: ints as they are, floats to 6 significant digits."""
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    return f"{value:.6g}"


def format_console_metrics(data: dict, width: int = 120, indent: str = "  ") -> str:
    """Every numeric metric of a step by its full name, as verl's console logger prints them
    (``name:value``), sorted by name: one line per group (the name up to its first ``/``), wrapped
    at ``width`` characters. Values that are not one number (lists, strings) are left out; the
    ``file`` logger keeps full precision."""
    groups: dict[str, list[str]] = {}
    for key in sorted(data, key=str):
        value = plain_scalar(data[key])
        if key == "step" or not isinstance(value, (int, float)):
            continue
        groups.setdefault(str(key).split("/", 1)[0], []).append(f"{key}:{_fmt_full(value)}")
    lines = []
    for items in groups.values():
        line = indent
        for item in items:
            if line.strip() and len(line) + 2 + len(item) > width:
                lines.append(line)
                line = indent
            line += ("  " if line.strip() else "") + item
        lines.append(line)
    return "\n".join(lines)


def _clip(text: str, limit: int, keep_end: bool = False) -> str:
    text = str(text)
    if len(text) <= limit:
        return text
    return "..." + text[-limit:] if keep_end else text[:limit] + "..."


def format_generations(samples: list[dict], step: int, max_chars: int = 400) -> str:
    """Validation samples as readable console text, one block per sample.

    Prompts are cut to their last `max_chars` characters (the question sits at the end of a
    chat prompt), responses to their first `max_chars`.
    """
    blocks = []
    for i, sample in enumerate(samples, 1):
        head = f"step {step} | validation sample {i}/{len(samples)} | score {sample.get('score')}"
        if sample.get("ground_truth") is not None:
            head += f" | ground_truth {_clip(sample['ground_truth'], 80)}"
        prompt = _clip(str(sample.get("input", "")).strip(), max_chars, keep_end=True)
        response = str(sample.get("output", ""))
        # a response of only whitespace would print as blank lines: show it quoted instead
        response = _clip(response.strip(), max_chars) if response.strip() else repr(response)
        blocks.append(
            "\n".join(
                [head, "  input:", textwrap.indent(prompt, "    "), "  output:", textwrap.indent(response, "    ")]
            )
        )
    return "\n".join(blocks)


@register_logger("console")
class ConsoleLogger:
    """Each step on stdout: the summary line (:func:`format_console_line`), then every metric by
    name (:func:`format_console_metrics`), as verl's console logger prints every metric; a tqdm
    bar on stderr when stderr is a terminal.

    Validation samples (`trainer.log_val_generations`) are printed as text blocks.
    """

    def __init__(self, total_steps=None, **_):
        self.total_steps = total_steps
        self._bar = None

    def log(self, data: dict, step: int) -> None:
        from tqdm import tqdm

        if self._bar is None:
            # Created at the first log so a resumed run's bar starts at its first step.
            self._bar = tqdm(
                total=self.total_steps,
                initial=max(step - 1, 0),
                desc="training",
                file=sys.stderr,
                disable=not sys.stderr.isatty(),
                dynamic_ncols=True,
            )
        # tqdm.write clears and redraws the bar around the line, so the two don't interleave.
        text = format_console_line(data, step, self.total_steps)
        metrics = format_console_metrics(data)
        tqdm.write(f"{text}\n{metrics}" if metrics else text, file=sys.stdout)
        sys.stdout.flush()  # a redirected stdout is block-buffered: show each step as it ends
        self._bar.update(1)

    def log_generations(self, samples: list[dict], step: int) -> None:
        from tqdm import tqdm

        tqdm.write(format_generations(samples, step), file=sys.stdout)
        sys.stdout.flush()

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# ---------------------------------------------------------------- file (JSON lines)


def _json_record(data: dict, step: int) -> dict:
    """Plain JSON-able record; non-scalar values are left out, NaN/inf become null."""
    record = {"step": int(step)}
    for key, value in data.items():
        if key == "step":
            continue
        value = plain_scalar(value)
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        record[str(key)] = value
    return record


def _drop_stale_lines(path: str, first_step: int) -> None:
    """Keep only lines of steps < first_step (a resumed run rewrites later ones)."""
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash
            if isinstance(step, int) and step < first_step:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(tmp, path)


@register_logger("file")
class FileLogger:
    """JSON lines at `<local_dir>/metrics.jsonl`: one object per step with a `step` key."""

    def __init__(self, local_dir=None, **_):
        if not local_dir:
            raise TrackingError("trainer.logger: the 'file' logger needs a folder; set trainer.default_local_dir")
        os.makedirs(local_dir, exist_ok=True)
        self.path = os.path.join(local_dir, "metrics.jsonl")
        self._file = None

    def log(self, data: dict, step: int) -> None:
        if self._file is None:
            if os.path.exists(self.path):
                _drop_stale_lines(self.path, step)
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(_json_record(data, step)) + "\n")
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
