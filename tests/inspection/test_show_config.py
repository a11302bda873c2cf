"""`hybridrl config --show`: the resolved YAML after overrides, other config files, errors."""

import yaml

from hybridrl.cli import main as cli_main
from hybridrl.inspection.show_config import main, packaged_config_names


def test_show_prints_the_resolved_config_after_overrides(capsys):
    assert cli_main(["config", "--show", "trainer.total_epochs=3", "data.max_prompt_length=77"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["trainer"]["total_epochs"] == 3
    assert cfg["actor_rollout_ref"]["rollout"]["prompt_length"] == 77  # ${data.max_prompt_length} resolved
    assert cfg["trainer"]["rollout_data_dir"] is None


def test_only_prints_one_section_or_value(capsys):
    assert main(["--only", "trainer", "trainer.total_epochs=5"]) == 0
    section = yaml.safe_load(capsys.readouterr().out)
    assert section["total_epochs"] == 5 and "data" not in section
    assert main(["--only", "actor_rollout_ref.rollout.prompt_length", "data.max_prompt_length=64"]) == 0
    assert capsys.readouterr().out == "actor_rollout_ref.rollout.prompt_length: 64\n"


def test_other_config_files(capsys):
    assert {"ppo_trainer", "sft_trainer", "generation", "evaluation"} <= set(packaged_config_names())
    assert main(["--show", "--name", "generation", "data.n_samples=3"]) == 0
    generation = yaml.safe_load(capsys.readouterr().out)
    assert generation["data"]["n_samples"] == 3 and "algorithm" not in generation
    assert main(["--name", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "hybridrl config: error: --name nope: there is no nope.yaml in hybridrl/config; choose one of "
    )
    assert "ppo_trainer" in err and "sft_trainer" in err


def test_user_errors_are_one_line(capsys):
    assert main(["trainer.total_epoch=3"]) == 2
    assert capsys.readouterr().err == (
        "hybridrl config: error: unknown key 'trainer.total_epoch'; did you mean 'trainer.total_epochs'?\n"
    )
    assert main(["--only", "trainer.logr"]) == 2
    assert "did you mean 'trainer.logger'?" in capsys.readouterr().err
    assert main(["--only", "nothing.like.this"]) == 2
    assert "unknown key 'nothing.like.this'" in capsys.readouterr().err


def test_check_runs_the_start_up_checks(capsys):
    assert main(["--check", "--only", "data.train_batch_size", "data.train_batch_size=3"]) == 2
    err = capsys.readouterr().err
    assert "data.train_batch_size=3 is smaller than actor_rollout_ref.actor.ppo_mini_batch_size" in err
    good = [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4",
    ]
    assert main(["--check", "--only", "trainer.total_epochs", *good, "trainer.del_local_ckpt_after_load=True"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("hybridrl: note: trainer.del_local_ckpt_after_load=True is ignored") and len(err) == 2
    assert err[1] == "hybridrl config: checks passed (1 note(s))"
