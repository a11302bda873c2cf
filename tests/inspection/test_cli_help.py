"""A newcomer's first commands: hybridrl --help, hybridrl train --help, hybridrl train with no data."""

import pytest

from hybridrl.cli import main as cli


def test_top_level_help_points_at_the_commands_the_main_job_and_the_docs(capsys):
    assert cli(["--help"]) == 0
    out = capsys.readouterr().out
    assert "train " in out and "hybridrl <command> --help" in out
    assert "bash examples/run_arithmetic_grpo.sh" in out and "docs/config.md" in out


@pytest.mark.parametrize(
    "command, config", [("train", "ppo_trainer"), ("sft", "sft_trainer"), ("generate", "generation")]
)
def test_command_help_says_how_settings_are_given(capsys, command, config):
    assert cli([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: hybridrl {command} key=value ...")
    assert f"hybridrl config --show --name {config}" in out and "examples/run_arithmetic_grpo.sh" in out


def test_command_help_answers_without_importing_the_command():
    """`hybridrl train --help` is instant: torch and the trainer load only when a command runs."""
    import subprocess
    import sys

    code = (
        "import sys; from hybridrl.cli import main; main(['train', '--help']); "
        "print(sorted(m for m in ('torch', 'hybridrl.trainer.main_ppo') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]"), out


def test_train_without_data_says_what_to_run_or_set(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the default data.train_files under ~ does not exist
    assert cli(["train"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybridrl: error: data.train_files=~/data/rlhf/gsm8k/train.parquet does not exist")
    assert "hybridrl preprocess gsm8k" in err and "examples/run_arithmetic_grpo.sh" in err and "\n" not in err
