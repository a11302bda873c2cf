"""The ``hybridrl`` command: ``hybridrl train key=value ...`` and friends."""

from __future__ import annotations

import sys

USAGE = """usage: hybridrl <command> [args]

commands:
  train key=value ...     PPO/GRPO training (same keys as verl's main_ppo)
  preprocess <task> ...   write a data set as verl parquet: gsm8k, arithmetic
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        from hybridrl.trainer.main_ppo import main as train_main

        return train_main(rest)
    if command == "preprocess":
        return _preprocess(rest)
    print(f"hybridrl: error: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


def _preprocess(argv: list[str]) -> int:
    import importlib

    tasks = {"gsm8k": "hybridrl.data.preprocess.gsm8k", "arithmetic": "hybridrl.data.preprocess.arithmetic"}
    if not argv or argv[0] not in tasks:
        print(f"hybridrl: error: preprocess needs a task, one of {sorted(tasks)}", file=sys.stderr)
        return 2
    importlib.import_module(tasks[argv[0]]).main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
