"""The suite's command server (tests/command_server.py) runs a fairseq console script as the
script itself would run: the same output and exit status, whether it succeeds, refuses its
arguments or is stopped, and a launcher killed on a timeout takes its command with it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import command_server
from examples.pipeline.tools import ToolError
from helpers import TRAINING_ARGS, run, train_tiny

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of this file's own, with its launchers: (process, launcher folder)."""
    process, launchers, listening = command_server.start(tmp_path_factory.mktemp("command-server"))
    assert listening, "the command server did not start"
    yield process, launchers
    process.terminate()
    process.wait()


def test_scripts_other_than_fairseqs_are_linked_as_they_are(server):
    _, launchers = server
    assert (launchers / "subword-nmt").resolve() == (VENV_BIN / "subword-nmt").resolve()
    assert not (launchers / "fairseq-train").is_symlink()


@pytest.mark.parametrize(
    "arguments, status",
    [(["--help"], 0), (["--user-dir", "/nonexistent/plugin"], 1), (["--no-such-option"], 2)],
    ids=["help", "missing-plugin", "bad-option"],
)
def test_a_launcher_prints_and_exits_as_the_script_does(server, arguments, status):
    _, launchers = server
    fresh = run([VENV_BIN / "fairseq-preprocess", *arguments], check=False)
    forked = run([launchers / "fairseq-preprocess", *arguments], check=False)
    assert fresh.returncode == forked.returncode == status
    assert forked.stdout == fresh.stdout
    # The last line of stderr is the error itself; the lines above hold a traceback's paths.
    assert forked.stderr.strip().splitlines()[-1:] == fresh.stderr.strip().splitlines()[-1:]


def test_ctrl_c_stops_the_command_as_it_stops_the_script(server, tiny_data, tmp_path):
    """The training is a fork of the server, even after a compilation has set TORCHINDUCTOR_*
    (a setting read later), and stops on Ctrl-C as Python does."""
    server_process, launchers = server
    save_dir = tmp_path / "checkpoints"
    command = [
        launchers / "fairseq-train",
        tiny_data.data_bin,
        *TRAINING_ARGS,
        "--arch",
        "transformer_iwslt_de_en",
        "--max-update",
        "100000",
        "--save-dir",
        save_dir,
    ]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    process = subprocess.Popen(
        [str(a) for a in command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    for line in process.stdout:
        if "train_inner" in line or "begin training" in line:
            break
    assert psutil.Process(server_process.pid).children(recursive=True), "the training is not a fork of the server"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    # Python's status for a KeyboardInterrupt that reaches the top: killed by SIGINT.
    assert process.returncode == -signal.SIGINT, stderr[-2000:]
    assert "KeyboardInterrupt" in stderr


def test_a_launcher_killed_on_its_timeout_takes_its_command_with_it(server, tiny_data, tmp_path, monkeypatch):
    process, launchers = server
    monkeypatch.setenv("FAIRSEQ_ENTMAX_BIN", str(launchers))
    with pytest.raises(ToolError, match="timed out after"):
        train_tiny(tiny_data.data_bin, tmp_path / "checkpoints", "--max-update", "100000", timeout=15)
    deadline = time.monotonic() + 30
    while psutil.Process(process.pid).children(recursive=True):
        assert time.monotonic() < deadline, "the command outlived its launcher"
        time.sleep(0.2)
