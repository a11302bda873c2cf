"""`hybridrl config --show [key=value ...]`: print the resolved config as YAML.

The packaged `ppo_trainer.yaml` (or `--name sft_trainer|generation|evaluation|rm_trainer`)
with the same overrides `hybridrl train` takes, interpolations resolved, so what is printed
is what a run would get. `--only KEY` prints one section; `--check` also runs the start-up
checks a run makes before it loads a model (PPO/GRPO, SFT or RM by the config) and prints their
notes. verl's `--config-path DIR` / `--config-name NAME` (also `-cp` / `-cn`) pick a YAML of
your own, as `python -m hybridrl.trainer.main_ppo` takes them.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

from hybridrl.config import load_config
from hybridrl.config.loader import all_keys, refuse_engine_config, resolve_config_path, unknown_key_message
from hybridrl.errors import ConfigError
from hybridrl.trainer.jobs.supervised_config import ignored_notes, rm_config, sft_config
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from hybridrl.trainer.run.worker_groups import ppo_backend

# the checks per kind of config: a run's own checks before it loads a model
CHECKED_KINDS = ("ppo_trainer", "sft_trainer", "rm_trainer")


def packaged_config_names() -> list[str]:
    """Names of the YAML configs shipped in hybridrl/config (without `.yaml`), sorted."""
    folder = resources.files("hybridrl.config")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def render(
    overrides: list[str], name: str = "ppo_trainer", config_dir: str | None = None, only: str | None = None
) -> str:
    """The resolved config `name` after `overrides`, as YAML (or one key's value with `only`).

    Raises:
        ConfigError: an unknown config name (listing the packaged ones), a bad override, or an
            `only` key the config lacks (with the closest key).
    """
    from omegaconf import DictConfig, ListConfig, OmegaConf

    refuse_engine_config(name, "--config-name")  # verl's ppo_megatron_trainer and the like
    if config_dir is None and name not in packaged_config_names():
        raise ConfigError(
            f"--name {name}: there is no {name}.yaml in hybridrl/config; "
            f"choose one of {', '.join(packaged_config_names())}"
        )
    cfg = load_config(overrides, config_name=name, config_dir=config_dir)
    if not only:
        return OmegaConf.to_yaml(cfg)
    known = set(all_keys(cfg))
    if only not in known:
        message = unknown_key_message(only, known)
        if "did you mean" not in message:
            message = f"unknown key '{only}'; `hybridrl config --show` lists every key"
        raise ConfigError("--only: " + message)
    node = OmegaConf.select(cfg, only)
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_yaml(node)
    return f"{only}: {node}\n"


def config_kind(config, name: str) -> str:
    """Which trainer a composed config is for: ``name`` when it is a packaged trainer config, else
    by its sections (a user's YAML starting from ``defaults: [ppo_trainer, _self_]`` is PPO's)."""
    if name in CHECKED_KINDS:
        return name
    if "actor_rollout_ref" in config:
        return "ppo_trainer"
    if "model" in config and "partial_pretrain" in config.model:
        return "rm_trainer" if "chosen_key" in config.get("data", {}) else "sft_trainer"
    return name


def check_config(config, kind: str) -> list[str]:
    """The start-up checks of a ``kind`` run (``ppo_trainer``, ``sft_trainer``, ``rm_trainer``) on
    a composed ``config``, as the run makes them before it loads a model or reads data: the typed
    sections and their rules, and for PPO the world size (``trainer.nnodes`` x
    ``n_gpus_per_node``, the backend) and every rule of
    :func:`~hybridrl.trainer.ppo.config_check.validate_ppo_config`. Paths (model, data) are not
    opened. Returns the notes a run would print.

    Raises:
        ConfigError: the first problem, as the run would report it.
    """
    if kind == "ppo_trainer":
        typed = typed_ppo_config(config)
        _, world_size = ppo_backend(typed)
        return validate_ppo_config(typed, world_size=world_size)
    if kind == "sft_trainer":
        return ignored_notes(sft_config(config))
    if kind == "rm_trainer":
        return ignored_notes(rm_config(config))
    raise ConfigError(f"--check: the start-up checks are for {', '.join(CHECKED_KINDS)} configs, not {kind}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl config", description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", action="store_true", help="print the resolved config (the default action)")
    parser.add_argument(
        "--name",
        "--config-name",
        "-cn",
        default="ppo_trainer",
        help="config file: ppo_trainer (default), sft_trainer, generation, evaluation, rm_trainer, "
        "or one in --config-path (verl's --config-name)",
    )
    parser.add_argument(
        "--config-path", "-cp", dest="config_dir", help="folder with your own YAML files (verl's --config-path)"
    )
    parser.add_argument("--only", metavar="KEY", help="print only this key or section, e.g. actor_rollout_ref.actor")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also run the start-up checks of the run (batch sizes, names, refused features) and print notes",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the same overrides as hybridrl train")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        name = args.name[: -len(".yaml")] if args.name.endswith(".yaml") else args.name
        config_dir = resolve_config_path(args.config_dir)
        print(render(args.overrides, name, config_dir, args.only), end="")
        if args.check:
            config = load_config(args.overrides, name, config_dir)
            notes = check_config(config, config_kind(config, name))
            for note in notes:
                print(f"hybridrl: note: {note}", file=sys.stderr)
            print(f"hybridrl config: checks passed ({len(notes)} note(s))", file=sys.stderr)
    except ConfigError as err:
        print(f"hybridrl config: error: {err}", file=sys.stderr)
        return 2
    return 0
