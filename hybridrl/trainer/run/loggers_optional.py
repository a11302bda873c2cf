"""The loggers that need an optional package: tensorboard, wandb, mlflow, swanlab.

Each imports its package in its constructor, so `import hybridrl.trainer.run.tracking` stays
light, and raises `MissingLoggerPackage` (one line with the pip command) when it is absent.
`tracking`'s registry names them and imports this module on first use.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from hybridrl.trainer.run.tracking import MissingLoggerPackage, TrackingError, plain_scalar, register_logger

logger = logging.getLogger(__name__)


def _numbers(data: dict) -> dict[str, int | float]:
    """The int/float entries of a metrics dict as plain Python numbers (bools and text left out)."""
    out = {}
    for key, value in data.items():
        value = plain_scalar(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = value
    return out


def _samples_markdown(samples: list[dict]) -> str:
    """Validation samples as Markdown (tensorboard renders text summaries as Markdown)."""
    parts = []
    for i, s in enumerate(samples, 1):
        parts.append(
            f"**sample {i}** | score `{s.get('score')}` | ground truth `{s.get('ground_truth')}`\n\n"
            f"```\n{s.get('input', '')}\n```\n\n```\n{s.get('output', '')}\n```"
        )
    return "\n\n---\n\n".join(parts)


def _missing(name: str, package: str) -> MissingLoggerPackage:
    return MissingLoggerPackage(
        f"trainer.logger: '{name}' needs the {package} package; "
        f"run `pip install {package}` or drop '{name}' from trainer.logger"
    )


def _to_container(config):
    if config is None or isinstance(config, dict):
        return config
    from omegaconf import OmegaConf

    return OmegaConf.to_container(config, resolve=True)


# ---------------------------------------------------------------- tensorboard


@register_logger("tensorboard")
class TensorboardLogger:
    """Scalars to a SummaryWriter under `$TENSORBOARD_DIR`, else `<local_dir>/tensorboard`."""

    def __init__(self, local_dir=None, **_):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise _missing("tensorboard", "tensorboard") from err
        log_dir = os.environ.get("TENSORBOARD_DIR") or (os.path.join(local_dir, "tensorboard") if local_dir else None)
        if not log_dir:
            raise TrackingError(
                "trainer.logger: 'tensorboard' needs a folder; set $TENSORBOARD_DIR or trainer.default_local_dir"
            )
        self.writer = SummaryWriter(log_dir=log_dir)

    def log(self, data: dict, step: int) -> None:
        for key, value in _numbers(data).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_generations(self, samples: list[dict], step: int) -> None:
        self.writer.add_text("val/generations", _samples_markdown(samples), step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


# ---------------------------------------------------------------- wandb

_TABLE_COLUMNS = ("step", "input", "output", "score", "ground_truth")


@register_logger("wandb")
class WandbLogger:
    """Weights & Biases run named `experiment_name` in `project_name`.

    wandb reads its own environment: `WANDB_MODE=offline` writes the run to disk only (upload
    it later with `wandb sync`), `WANDB_API_KEY`/`wandb login` for online runs. Run files go
    under `<local_dir>/wandb` when `local_dir` is given, else under `./wandb`.
    """

    def __init__(self, project_name=None, experiment_name=None, config=None, local_dir=None, **_):
        try:
            import wandb
        except ImportError as err:
            raise _missing("wandb", "wandb") from err
        kwargs = {"project": project_name, "name": experiment_name, "config": _to_container(config)}
        if local_dir:
            os.makedirs(local_dir, exist_ok=True)
            kwargs["dir"] = local_dir
        wandb_error = getattr(getattr(wandb, "errors", None), "Error", None)
        try:
            self._run = wandb.init(**kwargs)
        except Exception as err:  # only wandb's own errors are turned into one line
            if wandb_error is None or not isinstance(err, wandb_error):
                raise
            raise TrackingError(
                f"trainer.logger: wandb could not start a run ({str(err).splitlines()[0]}); run "
                "`wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline to log to disk only"
            ) from err
        self._wandb = wandb
        self._table_rows: list[list] = []  # wandb tables are immutable: re-log all rows each time

    def log(self, data: dict, step: int) -> None:
        self._wandb.log(_numbers(data), step=step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        for s in samples:
            self._table_rows.append(
                [
                    step,
                    s.get("input"),
                    s.get("output"),
                    s.get("score"),
                    json.dumps(s.get("ground_truth"), ensure_ascii=False, default=str),
                ]
            )
        table = self._wandb.Table(columns=list(_TABLE_COLUMNS), data=[list(r) for r in self._table_rows])
        self._wandb.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self._wandb.finish()


# ---------------------------------------------------------------- mlflow

# MLflow metric and param names allow alphanumerics, _ - . / : and space.
_MLFLOW_BAD_CHARS = re.compile(r"[^/\w.\- :]")
_MLFLOW_PARAM_MAX = 6000  # characters of a param value MLflow stores


def mlflow_key(key: str) -> str:
    """A metric name MLflow accepts: `@` becomes `_at_` (as verl does), other bad characters `_`.

    E.g. `val-core/openai/gsm8k/reward/mean@1` -> `val-core/openai/gsm8k/reward/mean_at_1`.
    """
    return _MLFLOW_BAD_CHARS.sub("_", str(key).replace("@", "_at_"))


def flatten_params(config, prefix: str = "") -> dict[str, str]:
    """A nested config (dict/OmegaConf) as flat `a.b.c -> str(value)` params; lists stay one value."""
    params: dict[str, str] = {}
    for key, value in (_to_container(config) or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            params.update(flatten_params(value, name + "."))
        else:
            params[mlflow_key(name)] = str(value)[:_MLFLOW_PARAM_MAX]
    return params


@register_logger("mlflow")
class MlflowLogger:
    """An MLflow run named `experiment_name` in the MLflow experiment `project_name`.

    The tracking store is `$MLFLOW_TRACKING_URI` when set, else the SQLite file
    `<local_dir>/mlflow.db` with artifacts in `<local_dir>/mlartifacts` (browse them with
    `mlflow ui --backend-store-uri sqlite:///<path>`), else MLflow's default. The config is
    logged as params, metrics per step (names through `mlflow_key`), validation samples as
    `val_generations/step_<N>.json` artifacts.
    """

    def __init__(self, project_name=None, experiment_name=None, config=None, local_dir=None, **_):
        try:
            import mlflow
        except ImportError as err:
            raise _missing("mlflow", "mlflow") from err
        self._mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI") and local_dir:
            # MLflow 3 refuses new file stores (./mlruns); a SQLite file is its local default.
            # Artifacts would land in ./mlruns of the working directory: keep them in the run.
            os.makedirs(local_dir, exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{Path(local_dir, 'mlflow.db').resolve()}")
            if mlflow.get_experiment_by_name(project_name) is None:
                artifacts = Path(local_dir, "mlartifacts").resolve().as_uri()
                mlflow.create_experiment(project_name, artifact_location=artifacts)
        mlflow.set_experiment(project_name)
        self._run = mlflow.start_run(run_name=experiment_name)
        if config is not None:
            mlflow.log_params(flatten_params(config))

    def log(self, data: dict, step: int) -> None:
        metrics = {mlflow_key(k): float(v) for k, v in _numbers(data).items()}
        if metrics:
            self._mlflow.log_metrics(metrics, step=step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        self._mlflow.log_dict({"step": step, "samples": samples}, f"val_generations/step_{step}.json")

    def finish(self) -> None:
        if self._run is not None:
            self._mlflow.end_run()
            self._run = None


# ---------------------------------------------------------------- swanlab


@register_logger("swanlab")
class SwanlabLogger:
    """A SwanLab experiment named `experiment_name` in `project_name`, set up as verl sets it up:
    `SWANLAB_API_KEY` logs in when set, `SWANLAB_MODE` (verl's default `cloud`; `local`, `offline`,
    `disabled`) and `SWANLAB_LOG_DIR` (default `./swanlog`) are passed to `swanlab.init`, the config
    goes with `FRAMEWORK: hybridrl`. Validation samples are an echarts table, as verl logs them."""

    def __init__(self, project_name=None, experiment_name=None, config=None, **_):
        try:
            import swanlab
        except ImportError as err:
            raise _missing("swanlab", "swanlab") from err
        api_key = os.environ.get("SWANLAB_API_KEY")
        if api_key:
            swanlab.login(api_key)
        swanlab.init(
            project=project_name,
            experiment_name=experiment_name,
            config={"FRAMEWORK": "hybridrl", **(_to_container(config) or {})},
            logdir=os.environ.get("SWANLAB_LOG_DIR", "swanlog"),
            mode=os.environ.get("SWANLAB_MODE", "cloud"),
        )
        self._swanlab = swanlab

    def log(self, data: dict, step: int) -> None:
        self._swanlab.log(_numbers(data), step=step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        table = self._swanlab.echarts.Table()
        rows = [[step, s.get("input"), s.get("output"), s.get("score")] for s in samples]
        table.add(headers=["step", "input", "output", "score"], rows=rows)
        self._swanlab.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self._swanlab.finish()
