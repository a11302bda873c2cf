"""The ``hybridrl`` command: ``hybridrl train key=value ...`` and friends.

Each subcommand is one row of :data:`COMMANDS`: the module whose ``main(argv) -> int`` runs it
and a one-line description. Modules are imported only when their command runs, so ``hybridrl
--help`` stays fast and light. The config-driven commands (train, sft, rm, generate, eval) share
:func:`run_cli`. Whatever the command, a :class:`~hybridrl.errors.UserError` prints as one
``hybridrl: error: ...`` line with exit code 2; ``HYBRIDRL_DEBUG=1`` keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

from hybridrl.config import load_config
from hybridrl.config.loader import resolve_config_path, split_config_flags
from hybridrl.config.precision import resolve_precision
from hybridrl.errors import keeps_traceback

# name -> (module with main(argv) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("hybridrl.trainer.main_ppo", "PPO/GRPO training (same keys as verl's main_ppo)"),
    "sft": (
        "hybridrl.trainer.sft_trainer",
        "supervised fine-tuning, full or LoRA (same keys as verl's fsdp_sft_trainer)",
    ),
    "rm": (
        "hybridrl.trainer.rm_trainer",
        "reward-model training on preference pairs (Bradley-Terry), for reward_model.enable",
    ),
    "merge": (
        "hybridrl.trainer.jobs.merge",
        "checkpoint folder -> Hugging Face folder: --local_dir <ckpt>/actor --target_dir DIR",
    ),
    "preprocess": ("hybridrl.data.preprocess", "write a data set as verl parquet: hybridrl preprocess <task> ..."),
    "generate": (
        "hybridrl.trainer.main_generation",
        "sample N responses per prompt into a parquet (verl's main_generation)",
    ),
    "eval": ("hybridrl.trainer.main_eval", "score generated responses: mean@N, pass@k, maj@N, best@N per data source"),
    "plot": (
        "hybridrl.inspection.plot",
        "draw reward, KL, entropy, length and throughput curves: hybridrl plot <run dir> -o curves.png",
    ),
    "view": (
        "hybridrl.inspection.viewer",
        "browse sample dumps (trainer.rollout_data_dir) by step and score; --print for a table",
    ),
    "plan": (
        "hybridrl.trainer.jobs.plan_cli",
        "memory per role and device before launching, from config.json: "
        "hybridrl plan key=value ... [--device-memory GB] [--json]",
    ),
    "config": (
        "hybridrl.inspection.show_config",
        "print the resolved config: hybridrl config --show [--name sft_trainer] [key=value ...]",
    ),
    "diagnose": (
        "hybridrl.inspection.diagnose",
        "versions, CPU/GPU devices, Ray status and which optional parts are usable",
    ),
    "retriever": (
        "hybridrl.agents.retrieval_server",
        "BM25 retrieval for search agents: hybridrl retriever index|serve --corpus corpus.jsonl [--index_dir DIR]",
    ),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS) + 2
    lines = [f"  {name:<{width}}{text}" for name, (_, text) in COMMANDS.items()]
    return (
        "usage: hybridrl <command> [args]\n\ncommands:\n" + "\n".join(lines) + "\n\n"
        "hybridrl <command> --help for its usage. Start with the main job (GRPO on CPU, ~10 min):\n"
        "  bash examples/run_arithmetic_grpo.sh\n"
        "docs: README.md, docs/config.md, docs/algorithms.md, docs/rollout.md, docs/agents.md, docs/performance.md\n"
    )


_CONFIG_COMMANDS = {
    "ppo_trainer": "train",
    "sft_trainer": "sft",
    "rm_trainer": "rm",
    "generation": "generate",
    "evaluation": "eval",
}


def command_help(config_name: str) -> str:
    """``hybridrl <command> --help``: how the command takes its settings and where to start."""
    command = _CONFIG_COMMANDS.get(config_name, config_name)
    return "\n".join(
        [
            f"usage: hybridrl {command} key=value ...",
            "",
            f"Settings are verl's config keys as key=value overrides of the packaged {config_name}.yaml.",
            f"  all keys with their defaults:  hybridrl config --show --name {config_name}",
            f"  check a command line:          hybridrl config --check --name {config_name} key=value ...",
            "  the main job (GRPO on CPU, ~10 min):  bash examples/run_arithmetic_grpo.sh",
            "  docs: README.md, docs/config.md (keys), docs/algorithms.md, docs/rollout.md, docs/agents.md",
        ]
    )


def run_cli(run: Callable[[Any], Any], config_name: str, argv: list[str] | None = None) -> int:
    """The body of every config-driven command (``hybridrl train|sft|rm|generate|eval``):
    loads ``config_name`` with the ``key=value`` overrides in ``argv`` (verl's ``--config-path DIR``
    and ``--config-name NAME`` pick another YAML, :func:`~hybridrl.config.loader.split_config_flags`;
    ``--config-path=config`` is verl's own config folder: the packaged one), resolves ``auto``
    dtypes for the device (printed once) and calls ``run(config)``.

    Returns 0 on success, 2 after printing one ``hybridrl: error: ...`` line for a
    :class:`~hybridrl.errors.UserError` or a missing file. Any other exception, or any error with
    ``HYBRIDRL_DEBUG=1``, propagates with its traceback.
    """
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help", "help") for arg in argv):
        print(command_help(config_name))
        return 0
    try:
        overrides, config_path, name = split_config_flags(argv)
        config = load_config(
            overrides,
            config_name=name or config_name,
            config_dir=resolve_config_path(config_path),
            resolve_auto_dtypes=False,
        )
        line = resolve_precision(config)
        if line:
            print(f"hybridrl: {line}", flush=True)
        run(config)
    except Exception as exc:  # noqa: BLE001 - a user error becomes one readable line below
        return _one_line(exc)
    return 0


def _one_line(exc: Exception) -> int:
    """Prints a user error as one line (exit code 2); re-raises anything else."""
    if keeps_traceback(exc):
        raise exc
    print(f"hybridrl: error: {exc}", file=sys.stderr)
    return 2


def set_wait_policy() -> None:
    """Idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, unless the user
    set it): on a CPU that other processes share, spinning threads take their cores, and a thread
    that waits at a barrier for one whose core is busy burns its own (issue 33 item 7). OpenMP
    reads it once, when torch loads it: the training commands set it before importing torch, and
    the processes they start (Ray workers, the async vLLM engine) inherit it. ``python -m
    hybridrl.trainer.main_ppo`` loads torch first: set it in the shell there."""
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"hybridrl: error: unknown command {command!r}\n{usage()}", file=sys.stderr)
        return 2
    config_name = next((name for name, cmd in _CONFIG_COMMANDS.items() if cmd == command), None)
    if config_name and any(arg in ("-h", "--help", "help") for arg in rest):
        print(command_help(config_name))  # before importing the command's module (torch and all)
        return 0
    if config_name:  # before the command's module loads torch and with it OpenMP (issue 33 item 7)
        set_wait_policy()
    module = importlib.import_module(COMMANDS[command][0])
    try:
        return int(module.main(rest) or 0)
    except Exception as exc:  # noqa: BLE001 - merge, preprocess, plot, ... get the same one-line errors
        return _one_line(exc)


if __name__ == "__main__":
    sys.exit(main())
