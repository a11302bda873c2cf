"""`hybridrl config --show [key=value ...]`: print the resolved config as YAML.

The packaged `ppo_trainer.yaml` (or `--name sft_trainer|generation|evaluation|rm_trainer`)
with the same overrides `hybridrl train` takes, interpolations resolved, so what is printed
is what a run would get. `--only KEY` prints one section; `--check` also runs the start-up
checks of a PPO/GRPO config and prints their notes.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

from hybridrl.config import load_config
from hybridrl.config.loader import all_keys, unknown_key_message
from hybridrl.errors import ConfigError
from hybridrl.trainer.ppo.config_check import validate_ppo_config


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl config", description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", action="store_true", help="print the resolved config (the default action)")
    parser.add_argument(
        "--name",
        default="ppo_trainer",
        help="config file: ppo_trainer (default), sft_trainer, generation, evaluation, rm_trainer",
    )
    parser.add_argument(
        "--config-path", dest="config_dir", help="folder with your own YAML files (verl's --config-path)"
    )
    parser.add_argument("--only", metavar="KEY", help="print only this key or section, e.g. actor_rollout_ref.actor")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also run the start-up checks of a PPO/GRPO config (batch sizes, names) and print notes",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the same overrides as hybridrl train")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        print(render(args.overrides, args.name, args.config_dir, args.only), end="")
        if args.check:
            if args.name != "ppo_trainer" and args.config_dir is None:
                raise ConfigError(f"--check: the start-up checks are for ppo_trainer configs, not {args.name}")
            notes = validate_ppo_config(load_config(args.overrides, args.name, args.config_dir))
            for note in notes:
                print(f"hybridrl: note: {note}", file=sys.stderr)
            print(f"hybridrl config: checks passed ({len(notes)} note(s))", file=sys.stderr)
    except ConfigError as err:
        print(f"hybridrl config: error: {err}", file=sys.stderr)
        return 2
    return 0
