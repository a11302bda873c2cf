"""Experiment loggers (`trainer.logger`): console, file (JSON lines), tensorboard, wandb.

`Tracking` fans one metrics dict per step out to every chosen logger. Loggers live in a
registry; add one with `@register_logger("name")` on a class whose constructor takes the
keyword arguments project_name, experiment_name, config, local_dir, total_steps and that has
`log(data, step)` and `finish()`. tensorboard and wandb are imported only when asked for.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Callable

_LOGGERS: dict[str, Callable[..., Any]] = {}


class TrackingError(ValueError):
    """A logger was asked for that cannot be built (unknown name, missing folder or package)."""


class MissingLoggerPackage(TrackingError, ImportError):
    """A logger's optional package (tensorboard, wandb) is not installed."""


def register_logger(name: str):
    """Class decorator: make a logger available as `trainer.logger=[..., name]`.

    Raises:
        TrackingError: another logger is already registered under `name`.
    """

    def decorator(cls):
        if name in _LOGGERS and _LOGGERS[name] is not cls:
            raise TrackingError(
                f"register_logger: a logger named {name!r} is already registered "
                f"({_LOGGERS[name].__qualname__}); pick another name"
            )
        _LOGGERS[name] = cls
        return cls

    return decorator


def available_loggers() -> list[str]:
    """Names accepted in `trainer.logger`, sorted."""
    return sorted(_LOGGERS)


def _plain(value):
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
        TrackingError: an unknown logger name (listing the known ones), or a logger that
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
        names = list(dict.fromkeys(default_backend or []))  # drop repeats, keep order
        unknown = [n for n in names if n not in _LOGGERS]
        if unknown:
            raise TrackingError(
                f"trainer.logger: unknown logger(s) {unknown}; "
                f"known loggers are {available_loggers()}"
            )
        self.loggers: dict[str, Any] = {}
        try:
            for name in names:
                self.loggers[name] = _LOGGERS[name](
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
        """Log `data` (metric name -> number) as training step `step` to every logger."""
        for logger in self.loggers.values():
            logger.log(data, step)

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
        value = _plain(data.get(key))
        if isinstance(value, (int, float)):
            parts.append(f"{label} {_fmt(value)}")
    for key in sorted(data):
        if key.startswith("val-core/") and key.endswith("/reward/mean@1"):
            value = _plain(data[key])
            if isinstance(value, (int, float)):
                source = key[len("val-core/") : -len("/reward/mean@1")]
                parts.append(f"val {source} {_fmt(value)}")
    seconds = _plain(data.get("perf/time_per_step"))
    if isinstance(seconds, (int, float)):
        parts.append(f"{seconds:.1f}s/step")
    return " | ".join(parts)


@register_logger("console")
class ConsoleLogger:
    """One line per step on stdout, plus a tqdm bar on stderr when stderr is a terminal."""

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
        tqdm.write(format_console_line(data, step, self.total_steps), file=sys.stdout)
        sys.stdout.flush()  # a redirected stdout is block-buffered: show each step as it ends
        self._bar.update(1)

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
        value = _plain(value)
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
            raise TrackingError(
                "trainer.logger: the 'file' logger needs a folder; set trainer.default_local_dir"
            )
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


# ---------------------------------------------------------------- tensorboard, wandb


@register_logger("tensorboard")
class TensorboardLogger:
    """Scalars to a SummaryWriter under `$TENSORBOARD_DIR`, else `<local_dir>/tensorboard`."""

    def __init__(self, local_dir=None, **_):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise MissingLoggerPackage(
                "trainer.logger: 'tensorboard' needs the tensorboard package; "
                "run `pip install tensorboard` or drop 'tensorboard' from trainer.logger"
            ) from err
        log_dir = os.environ.get("TENSORBOARD_DIR") or (
            os.path.join(local_dir, "tensorboard") if local_dir else None
        )
        if not log_dir:
            raise TrackingError(
                "trainer.logger: 'tensorboard' needs a folder; set $TENSORBOARD_DIR "
                "or trainer.default_local_dir"
            )
        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, data: dict, step: int) -> None:
        for key, value in data.items():
            value = _plain(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


@register_logger("wandb")
class WandbLogger:
    """Weights & Biases run named `experiment_name` in `project_name`."""

    def __init__(self, project_name=None, experiment_name=None, config=None, **_):
        try:
            import wandb
        except ImportError as err:
            raise MissingLoggerPackage(
                "trainer.logger: 'wandb' needs the wandb package; "
                "run `pip install wandb` or drop 'wandb' from trainer.logger"
            ) from err
        if config is not None and not isinstance(config, dict):
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(config, resolve=True)
        self._wandb = wandb
        self._run = wandb.init(project=project_name, name=experiment_name, config=config)

    def log(self, data: dict, step: int) -> None:
        self._wandb.log(data, step=step)

    def finish(self) -> None:
        self._wandb.finish()
