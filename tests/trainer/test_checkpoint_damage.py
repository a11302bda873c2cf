"""Damaged checkpoints never block a resume and never run code; a full disk loses nothing.

Each case writes two real checkpoints (a small module's DCP shards, its extra state, the
dataloader state), damages the newest one, and checks that resume falls back to the older one
with one line naming the file, or stops with one line when none is intact."""

import errno
import os
import pickle

import pytest
import torch

from hybridrl.trainer import checkpoint
from hybridrl.workers.checkpoint_io import load_state_file, save_worker_state


@pytest.fixture(scope="module")
def module(tiny_model_dir):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(tiny_model_dir, dtype="fp32")


def _writer(module):
    def write(folder):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        save_worker_state(os.path.join(folder, "actor"), module, optimizer, scheduler, rank=0, world_size=1)

    return write


@pytest.fixture
def root(tmp_path, module):
    for step in (1, 2):
        checkpoint.save_checkpoint(str(tmp_path), step, _writer(module), {"epoch": 0, "position": step})
    return tmp_path


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _dcp_shard(step_dir):
    return next((step_dir / "actor" / "dcp").glob("*.distcp"))


DAMAGE = {
    "truncated .distcp": lambda d: (_cut(_dcp_shard(d)), _dcp_shard(d).name),
    "empty .metadata": lambda d: ((d / "actor" / "dcp" / ".metadata").write_bytes(b""), ".metadata"),
    "empty trainer_state.json": lambda d: ((d / "trainer_state.json").write_text(""), "trainer_state.json"),
    "truncated data.pt": lambda d: (_cut(d / "data.pt"), "data.pt"),
    "truncated extra_state": lambda d: (_cut(next((d / "actor").glob("extra_state_*.pt"))), "extra_state_"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(root, case, capsys):
    _, name = DAMAGE[case](root / "global_step_2")
    assert checkpoint.find_latest_checkpoint(str(root)) == str(root / "global_step_1")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("hybridrl: skipping a damaged checkpoint: ") and name in out[0]
    with pytest.raises(checkpoint.CheckpointError, match=r"trainer.resume_from_path: .*" + name.replace(".", r"\.")):
        checkpoint.require_intact_checkpoint(str(root / "global_step_2"))


def test_no_intact_checkpoint_is_one_line(root):
    _cut(root / "global_step_1" / "data.pt")
    _cut(_dcp_shard(root / "global_step_2"))
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"no intact checkpoint in .*global_step_2.*"
        r"trainer.resume_mode=disable",
    ) as err:
        checkpoint.find_latest_checkpoint(str(root))
    assert "\n" not in str(err.value)


def test_intact_checkpoints_pass_and_load(root):
    checkpoint.verify_checkpoint(str(root / "global_step_2"))
    assert checkpoint.read_checkpoint(str(root / "global_step_2"))[1] == {"epoch": 0, "position": 2}


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_crafted_pickle_is_refused_never_run(root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(root / "global_step_2" / "data.pt", "wb") as f:
        pickle.dump({"state": _Exploit()}, f)
    torch.save({"state": _Exploit()}, root / "global_step_2" / "actor" / "extra_state_world_size_1_rank_0.pt")
    for file in ("data.pt", "actor/extra_state_world_size_1_rank_0.pt"):
        with pytest.raises(checkpoint.CheckpointError, match="not a readable hybridrl state file"):
            load_state_file(str(root / "global_step_2" / file))
    assert checkpoint.find_latest_checkpoint(str(root)) == str(root / "global_step_1")
    assert not (tmp_path / "pwned").exists()


def test_disk_full_during_a_save_is_one_line_and_keeps_the_last_good_one(root, module):
    def full(folder):
        _writer(module)(folder)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"no space left on the device of .*earlier checkpoints are "
        r"intact",
    ) as err:
        checkpoint.save_checkpoint(str(root), 3, full, {"position": 3})
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith((".", "global"))) == [
        "global_step_1",
        "global_step_2",
    ]
    assert checkpoint.find_latest_checkpoint(str(root)) == str(root / "global_step_2")
