import os

import pytest

from hybridrl.trainer.run import checkpoint


def _writer(content):
    def write(folder):
        os.makedirs(os.path.join(folder, "actor"))
        with open(os.path.join(folder, "actor", "weights.txt"), "w") as f:
            f.write(content)

    return write


def test_save_then_find_and_read(tmp_path):
    path = checkpoint.save_checkpoint(str(tmp_path), 3, _writer("w3"), {"pos": 3}, trainer_state={"kl_coef": 0.2})
    assert path == str(tmp_path / "global_step_3")
    assert checkpoint.find_latest_checkpoint(str(tmp_path)) == path
    assert checkpoint.read_checkpoint(path) == ({"kl_coef": 0.2, "global_step": 3}, {"pos": 3})
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"


def test_a_crash_while_writing_leaves_the_last_good_checkpoint(tmp_path):
    root = str(tmp_path)
    good = checkpoint.save_checkpoint(root, 1, _writer("w1"), {"pos": 1})

    def crash(folder):
        _writer("half")(folder)
        raise KeyboardInterrupt("killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(root, 2, crash, {"pos": 2})
    assert not (tmp_path / "global_step_2").exists()
    assert checkpoint.find_latest_checkpoint(root) == good
    # the next save of that step replaces the leftover temporary folder
    checkpoint.save_checkpoint(root, 2, _writer("w2"), {"pos": 2})
    assert checkpoint.read_checkpoint(checkpoint.find_latest_checkpoint(root))[0]["global_step"] == 2


def test_a_tracker_naming_a_missing_step_falls_back_to_the_newest_complete_one(tmp_path):
    root = str(tmp_path)
    checkpoint.save_checkpoint(root, 1, _writer("w1"), None)
    checkpoint.save_checkpoint(root, 2, _writer("w2"), None)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    assert checkpoint.find_latest_checkpoint(root) == str(tmp_path / "global_step_2")


def test_resaving_a_step_and_pruning(tmp_path):
    root = str(tmp_path)
    for step in (1, 2, 3):
        checkpoint.save_checkpoint(root, step, _writer(f"w{step}"), None, max_to_keep=2)
    assert sorted(os.listdir(root)) == ["global_step_2", "global_step_3", "latest_checkpointed_iteration.txt"]
    checkpoint.save_checkpoint(root, 3, _writer("again"), None, max_to_keep=2)
    assert (tmp_path / "global_step_3" / "actor" / "weights.txt").read_text() == "again"


def test_reading_an_incomplete_folder_names_the_key(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="trainer.resume_from_path"):
        checkpoint.read_checkpoint(str(tmp_path))


def test_a_resume_with_changed_settings_warns_once_listing_them_all(tmp_path, capsys):
    saved = {"optim.lr": 1e-3, "data.train_batch_size": 4, "algorithm.adv_estimator": "grpo"}
    path = checkpoint.save_checkpoint(str(tmp_path), 2, _writer("w2"), None, settings=saved)
    trainer_state, _ = checkpoint.read_checkpoint(path)  # stored with the step, atomically
    checkpoint.warn_changed_settings(path, trainer_state, saved)
    assert capsys.readouterr().out == ""
    now = {**saved, "optim.lr": 2e-3, "algorithm.adv_estimator": "rloo", "critic.optim.lr": 1e-5}  # a new key: no
    checkpoint.warn_changed_settings(path, trainer_state, now)
    assert capsys.readouterr().out == (
        f"hybridrl: warning: resuming {path} with a changed config: "
        "optim.lr 0.001 -> 0.002, algorithm.adv_estimator 'grpo' -> 'rloo'\n"
    )
    checkpoint.warn_changed_settings(path, {"global_step": 2}, now)  # saved by an older version: nothing to compare
    assert capsys.readouterr().out == ""


def test_a_checkpoint_records_the_checksum_of_every_file(tmp_path):
    import hashlib
    import json

    from hybridrl.trainer.run.checkpoint_files import MANIFEST

    path = checkpoint.save_checkpoint(str(tmp_path), 1, _writer("w1"), {"pos": 1})
    with open(os.path.join(path, MANIFEST)) as f:
        files = json.load(f)["files"]
    assert sorted(files) == ["actor/weights.txt", "data.pt", checkpoint.STATE_FILE]
    assert files["actor/weights.txt"] == {"size": 2, "sha256": hashlib.sha256(b"w1").hexdigest()}
    checkpoint.verify_checkpoint(path)
    with open(os.path.join(path, "actor", "weights.txt"), "w") as f:
        f.write("w2")  # same size, other bytes
    with pytest.raises(checkpoint.CheckpointError, match=r"weights\.txt: .*checksum") as err:
        checkpoint.verify_checkpoint(path)
    assert "\n" not in str(err.value)
