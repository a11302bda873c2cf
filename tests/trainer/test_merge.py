"""``hybridrl merge`` of a damaged or crafted checkpoint: one line on stderr, no traceback, and
nothing in the checkpoint is ever unpickled as code."""

import os

import pytest
import torch
from crafted_checkpoints import craft_bytes_item, craft_metadata_file, craft_metadata_inside, write_zeros

from hybridrl.trainer.jobs.merge import main as merge_main
from hybridrl.trainer.run import checkpoint
from hybridrl.trainer.run.checkpoint_files import MANIFEST, write_manifest
from hybridrl.workers.checkpoint_io import save_worker_state


@pytest.fixture(scope="module")
def module(tiny_model_dir):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(tiny_model_dir, dtype="fp32")


@pytest.fixture
def step(tmp_path, module):
    def write(folder):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        save_worker_state(os.path.join(folder, "actor"), module, optimizer, scheduler, rank=0, world_size=1)

    from pathlib import Path

    return Path(checkpoint.save_checkpoint(str(tmp_path / "ckpt"), 1, write, None))


def _shard(step):
    return next((step / "actor" / "dcp").glob("*.distcp"))


def _merge(step, tmp_path, capsys):
    rc = merge_main(["--local_dir", str(step / "actor"), "--target_dir", str(tmp_path / "hf")])
    captured = capsys.readouterr()
    return rc, captured.err.strip().splitlines()


def _truncate(step):
    shard = _shard(step)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return shard.name


def _empty_metadata(step):
    (step / "actor" / "dcp" / ".metadata").write_bytes(b"")
    return ".metadata"


def _zeros(step):
    return write_zeros(_shard(step))


@pytest.mark.parametrize("damage", [_truncate, _empty_metadata, _zeros], ids=["truncated", "empty-metadata", "zeros"])
@pytest.mark.parametrize("manifest", [True, False], ids=["checksums", "older"])
def test_merging_a_damaged_checkpoint_is_one_line(step, tmp_path, capsys, damage, manifest):
    if not manifest:
        (step / MANIFEST).unlink()
    name = damage(step)
    rc, err = _merge(step, tmp_path, capsys)
    if damage is _zeros and not manifest:  # no checksums: zeros over tensor data go unseen, over a
        assert rc == 0 or (rc == 2 and len(err) == 1), err  # tensor's zip header the load fails
        return
    assert rc == 2 and len(err) == 1 and err[0].startswith("hybridrl: error: ") and name in err[0], err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("craft", [craft_metadata_file, craft_metadata_inside], ids=["whole", "nested"])
def test_merging_a_crafted_metadata_never_runs_it(step, tmp_path, capsys, monkeypatch, craft):
    monkeypatch.chdir(tmp_path)
    craft(step / "actor" / "dcp")
    write_manifest(str(step))
    rc, err = _merge(step, tmp_path, capsys)
    assert rc == 2 and len(err) == 1 and ".metadata" in err[0], err
    assert not (tmp_path / "pwned").exists()


def test_merging_a_crafted_bytes_item_never_runs_it(step, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    craft_bytes_item(step / "actor" / "dcp", "model.model.embed_tokens.weight")
    write_manifest(str(step))
    rc, err = _merge(step, tmp_path, capsys)
    assert rc == 2 and len(err) == 1 and "model.model.embed_tokens.weight" in err[0], err
    assert not (tmp_path / "pwned").exists()


def test_merging_an_intact_checkpoint_still_works(step, tmp_path, capsys):
    rc, _ = _merge(step, tmp_path, capsys)
    assert rc == 0 and (tmp_path / "hf" / "config.json").exists()
