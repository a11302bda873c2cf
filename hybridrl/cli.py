"""The ``hybridrl`` command: ``hybridrl train key=value ...`` and friends.

Each subcommand is one row of :data:`COMMANDS`: the module whose ``main(argv) -> int`` runs it
and a one-line description. Modules are imported only when their command runs, so ``hybridrl
--help`` stays fast and light.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module with main(argv) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("hybridrl.trainer.main_ppo", "PPO/GRPO training (same keys as verl's main_ppo)"),
    "sft": ("hybridrl.trainer.sft_trainer", "supervised fine-tuning, full or LoRA (same keys as verl's fsdp_sft_trainer)"),
    "rm": ("hybridrl.trainer.rm_trainer", "reward-model training on preference pairs (Bradley-Terry), for reward_model.enable"),
    "merge": ("hybridrl.trainer.merge", "checkpoint folder -> Hugging Face folder: --local_dir <ckpt>/actor --target_dir DIR"),
    "preprocess": ("hybridrl.data.preprocess", "write a data set as verl parquet: hybridrl preprocess <task> ..."),
    "generate": ("hybridrl.trainer.main_generation", "sample N responses per prompt into a parquet (verl's main_generation)"),
    "eval": ("hybridrl.trainer.main_eval", "score generated responses: mean@N, pass@k, maj@N, best@N per data source"),
    "plot": ("hybridrl.tools.plot", "draw reward, KL, entropy, length and throughput curves: hybridrl plot <run dir> -o curves.png"),
    "view": ("hybridrl.tools.viewer", "browse sample dumps (trainer.rollout_data_dir) by step and score; --print for a table"),
    "config": ("hybridrl.tools.show_config", "print the resolved config: hybridrl config --show [--name sft_trainer] [key=value ...]"),
    "diagnose": ("hybridrl.tools.diagnose", "versions, CPU/GPU devices, Ray status and which optional parts are usable"),
    "retriever": ("hybridrl.agents.retrieval_server", "BM25 retrieval for search agents: hybridrl retriever index|serve --corpus corpus.jsonl [--index_dir DIR]"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS) + 2
    lines = [f"  {name:<{width}}{text}" for name, (_, text) in COMMANDS.items()]
    return ("usage: hybridrl <command> [args]\n\ncommands:\n" + "\n".join(lines) + "\n\n"
            "hybridrl <command> --help for its usage. Start with the main job (GRPO on CPU, ~10 min):\n"
            "  bash examples/run_arithmetic_grpo.sh\n"
            "docs: README.md, docs/config.md, docs/algorithms.md, docs/rollout.md, docs/agents.md, docs/performance.md\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"hybridrl: error: unknown command {command!r}\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
