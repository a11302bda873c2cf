"""Damaged checkpoints never block a resume and never run code; a full disk loses nothing.

Each case writes two real checkpoints (a small module's DCP shards, its extra state, the
dataloader state), damages the newest one, and checks that resume falls back to the older one
with one line naming the file, or stops with one line when none is intact."""

import errno
import os
import pickle
import shutil

import pytest
import torch
from crafted_checkpoints import (
    Exploit,
    craft_bytes_item,
    craft_metadata_file,
    craft_metadata_inside,
    write_zeros,
)

from hybridrl.trainer.run import checkpoint
from hybridrl.trainer.run.checkpoint_files import MANIFEST, write_manifest
from hybridrl.workers.checkpoint_io import load_state_file, load_worker_state, save_worker_state


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


@pytest.fixture(scope="module")
def _two_checkpoints(tmp_path_factory, module):
    """A folder with two real checkpoints (steps 1 and 2), written once for the module."""
    folder = tmp_path_factory.mktemp("two_checkpoints")
    for step in (1, 2):
        checkpoint.save_checkpoint(str(folder), step, _writer(module), {"epoch": 0, "position": step})
    return folder


@pytest.fixture
def root(tmp_path, _two_checkpoints):
    """This test's own copy of the two checkpoints, to damage (a copy costs a tenth of writing them)."""
    shutil.copytree(_two_checkpoints, tmp_path, dirs_exist_ok=True)
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


def test_a_crafted_pickle_is_refused_never_run(root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(root / "global_step_2" / "data.pt", "wb") as f:
        pickle.dump({"state": Exploit()}, f)
    torch.save({"state": Exploit()}, root / "global_step_2" / "actor" / "extra_state_world_size_1_rank_0.pt")
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


@pytest.mark.parametrize("craft", [craft_metadata_file, craft_metadata_inside], ids=["whole", "nested"])
def test_a_crafted_dcp_metadata_is_refused_never_run(root, tmp_path, monkeypatch, capsys, craft):
    """DCP's .metadata is a plain pickle: a resume's verification must not unpickle code from it,
    even when the checksums were recorded again over the crafted file."""
    monkeypatch.chdir(tmp_path)
    craft(root / "global_step_2" / "actor" / "dcp")
    write_manifest(str(root / "global_step_2"))  # whoever crafts the file can rewrite the checksums
    assert checkpoint.find_latest_checkpoint(str(root)) == str(root / "global_step_1")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and ".metadata" in out[0] and "posix.system" in out[0], out
    assert not (tmp_path / "pwned").exists()


def test_a_crafted_dcp_bytes_item_is_refused_never_run(root, tmp_path, monkeypatch, capsys):
    """DCP reads non-tensor ("bytes") items with torch.load(weights_only=False): a .metadata of
    allowed classes only may still mark a weight as bytes, stored as a pickle that runs code."""
    monkeypatch.chdir(tmp_path)
    craft_bytes_item(root / "global_step_2" / "actor" / "dcp", "model.model.embed_tokens.weight")
    write_manifest(str(root / "global_step_2"))
    assert checkpoint.find_latest_checkpoint(str(root)) == str(root / "global_step_1")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "model.model.embed_tokens.weight" in out[0] and "dcp" in out[0], out
    assert not (tmp_path / "pwned").exists()


EMBED = "model.model.embed_tokens.weight"
WORKER_CRAFTS = {
    "whole .metadata": (craft_metadata_file, ".metadata"),
    "nested .metadata": (craft_metadata_inside, ".metadata"),
    "bytes item": (lambda dcp_dir: craft_bytes_item(dcp_dir, EMBED), EMBED),
}


@pytest.mark.parametrize("case", sorted(WORKER_CRAFTS))
def test_the_workers_load_refuses_a_crafted_dcp_folder_never_runs_it(root, module, tmp_path, monkeypatch, case):
    """A file swapped in after the driver verified the folder meets the workers' own load
    (load_worker_state), which reads .metadata and bytes items as plain data only too."""
    craft, name = WORKER_CRAFTS[case]
    monkeypatch.chdir(tmp_path)
    actor = root / "global_step_2" / "actor"
    craft(actor / "dcp")
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(checkpoint.CheckpointError) as err:
        load_worker_state(str(actor), module, optimizer, scheduler, rank=0, world_size=1)
    assert not (tmp_path / "pwned").exists()
    message = str(err.value)
    assert "\n" not in message and name in message and str(actor / "dcp") in message, message
    assert "nothing in it was run" in message, message


def test_resume_falls_back_from_a_crafted_checkpoint(root, tmp_path, monkeypatch, capsys):
    """What `hybridrl train` asks at resume (trainer.resume_mode=auto)."""
    from types import SimpleNamespace

    monkeypatch.chdir(tmp_path)
    craft_metadata_file(root / "global_step_2" / "actor" / "dcp")
    trainer_cfg = SimpleNamespace(resume_mode="auto", default_local_dir=str(root), resume_from_path=None)
    assert checkpoint.resume_checkpoint_path(trainer_cfg) == str(root / "global_step_1")
    assert len(capsys.readouterr().out.strip().splitlines()) == 1
    assert not (tmp_path / "pwned").exists()


def test_zeros_written_into_a_shard_are_caught_by_its_checksum(root, capsys):
    shard = _dcp_shard(root / "global_step_2")
    write_zeros(shard)
    assert checkpoint.find_latest_checkpoint(str(root)) == str(root / "global_step_1")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and shard.name in out[0] and "checksum" in out[0], out


def test_a_checkpoint_saved_before_checksums_still_loads(root, capsys, caplog):
    (root / "global_step_2" / MANIFEST).unlink()
    with caplog.at_level("INFO", logger="hybridrl.trainer.run.checkpoint_files"):
        assert checkpoint.find_latest_checkpoint(str(root)) == str(root / "global_step_2")
    assert capsys.readouterr().out == ""
    assert [r.getMessage() for r in caplog.records if MANIFEST in r.getMessage()], caplog.records
