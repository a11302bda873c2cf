"""One run per folder: a second run on a run folder stops with one line naming the holder; the
lock goes when its run ends (an error included), and one left by a killed run is taken over."""

import os
import socket
import subprocess
import sys

import pytest

from hybridrl.errors import UserError
from hybridrl.trainer.run.checkpoint_lock import LOCK_FILE, RunFolderBusy, run_folder_lock


def test_a_second_run_on_the_folder_stops_naming_the_holder(tmp_path, capsys):
    folder = tmp_path / "run"
    with run_folder_lock(str(folder)):
        with pytest.raises(RunFolderBusy) as caught:
            with run_folder_lock(str(folder)):
                pass
    message = str(caught.value)
    assert isinstance(caught.value, UserError) and "\n" not in message
    assert f"trainer.default_local_dir={folder} is in use by another run" in message
    assert f"pid {os.getpid()} on host {socket.gethostname()}, started 20" in message
    with run_folder_lock(str(folder)):  # released: the next run takes it silently
        pass
    assert capsys.readouterr().out == ""


def test_the_lock_is_released_when_the_run_fails(tmp_path, capsys):
    with pytest.raises(ValueError, match="boom"):
        with run_folder_lock(str(tmp_path)):
            raise ValueError("boom")
    with run_folder_lock(str(tmp_path)):
        pass
    assert capsys.readouterr().out == ""


def test_the_lock_of_a_killed_run_is_taken_over_with_one_warning(tmp_path, capsys):
    # the holder dies without its cleanup (as after SIGKILL): the kernel frees the lock, the file names it
    code = (
        "import os, sys; from hybridrl.trainer.run.checkpoint_lock import run_folder_lock; "
        "lock = run_folder_lock(sys.argv[1]); lock.__enter__(); print(os.getpid(), flush=True); os._exit(0)"
    )
    pid = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert (tmp_path / LOCK_FILE).read_text()
    with run_folder_lock(str(tmp_path)):
        pass
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"hybridrl: warning: taking over {tmp_path} from a run")
    assert f"pid {pid.stdout.strip()} on host {socket.gethostname()}" in out[0]
