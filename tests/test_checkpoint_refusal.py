"""A checkpoint carrying a payload that would run code is refused wherever a checkpoint is
read, and nothing of it runs: fairseq-train resuming (--restore-file, checkpoint_last.pt in
--save-dir), fairseq-generate, -interactive, -validate, fairseq-entmax-analyze (its --user-dir
naming the package folder, USER_DIR or nothing), python -m benchmarks.translation generation, the hub
interface and the recipes' checkpoint averaging. The commands end with exit status 2 and a
message naming the file, no traceback.

The commands run with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, which makes torch.load unpickle
everything unless its caller asks for weights_only (as torch < 2.6 always did): the refusal
must come from the plugin, not from torch's default. Each test then loads the same file with
torch.load(weights_only=False) and sees the marker appear: the payload is live.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fairseq_entmax
from conftest import TINY_MODEL_ARGS, TRAINING_ARGS
from helpers import USER_DIR, fairseq_command, run

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

REPO = Path(__file__).resolve().parents[1]
# The folder the README gives --user-dir.
PACKAGE_FOLDER = os.path.dirname(fairseq_entmax.__file__)
TORCH_DEFAULT_OFF = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


class RunsCodeWhenUnpickled:
    """Unpickling this calls os.system, as a malicious checkpoint would."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def write_payload_checkpoint(source, path, marker):
    """A real checkpoint's state plus a payload that creates `marker` when unpickled."""
    state = torch.load(source, weights_only=True)
    state["extra_state"]["payload"] = RunsCodeWhenUnpickled(f"touch {marker}")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


def assert_payload_is_live(path, marker):
    """The positive control: the unsafe loader the refusal protects from runs the payload."""
    assert not marker.exists()
    torch.load(path, weights_only=False)
    assert marker.exists(), "the payload did not run even under torch.load(weights_only=False)"


@pytest.fixture
def payload(trained_model, tmp_path):
    """(checkpoint path, marker, trained model) of a payload checkpoint made from a tiny model."""
    model = trained_model("softmax")
    marker = tmp_path / "payload_ran"
    checkpoint = write_payload_checkpoint(model.checkpoint, tmp_path / "payload" / "checkpoint_payload.pt", marker)
    return checkpoint, marker, model


def _train(checkpoint, model, tmp_path, restore):
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    if restore == "checkpoint_last":
        # what `fairseq-train` resumes from by default: checkpoint_last.pt in --save-dir
        checkpoint = checkpoint.rename(save_dir / "checkpoint_last.pt")
        extra = []
    else:
        extra = ["--restore-file", checkpoint]
    args = [
        fairseq_command("fairseq-train"),
        model.data_bin,
        "--user-dir",
        USER_DIR,
        *TINY_MODEL_ARGS,
        *TRAINING_ARGS,
        "--max-update",
        "1",
        "--save-dir",
        save_dir,
        *extra,
    ]
    return args, checkpoint


COMMANDS = {
    "train --restore-file": lambda c, m, t: _train(c, m, t, "restore_file"),
    "train checkpoint_last.pt": lambda c, m, t: _train(c, m, t, "checkpoint_last"),
    "generate": lambda c, m, t: (
        [fairseq_command("fairseq-generate"), m.data_bin, "--path", c, "--user-dir", USER_DIR, "--cpu"],
        c,
    ),
    "interactive": lambda c, m, t: (
        [
            fairseq_command("fairseq-interactive"),
            m.data_bin,
            "--path",
            c,
            "--user-dir",
            USER_DIR,
            "--cpu",
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
        ],
        c,
    ),
    "validate": lambda c, m, t: (
        [
            fairseq_command("fairseq-validate"),
            m.data_bin,
            "--path",
            c,
            "--user-dir",
            USER_DIR,
            "--cpu",
            "--task",
            "translation",
            "--valid-subset",
            "test",
            "--max-tokens",
            "4000",
        ],
        c,
    ),
    # fairseq-entmax-analyze by every route to the plugin (it reads the checkpoint in its process)
    **{
        f"analyze{route}": lambda c, m, t, user_dir=user_dir: (
            [
                fairseq_command("fairseq-entmax-analyze"),
                m.data_bin,
                "--path",
                c,
                *user_dir,
                "--output-dir",
                t / "analysis",
                "--cpu",
                "--no-figures",
            ],
            c,
        )
        for route, user_dir in (
            ("", []),
            (" --user-dir package folder", ["--user-dir", PACKAGE_FOLDER]),
            (" --user-dir USER_DIR", ["--user-dir", USER_DIR]),
        )
    },
    "python -m benchmarks.translation generation": lambda c, m, t: (
        [sys.executable, "-m", "benchmarks.translation", "generation", "--data-bin", m.data_bin, f"payload={c}"],
        c,
    ),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_command_refuses_payload_checkpoint(command, payload, tmp_path):
    checkpoint, marker, model = payload
    args, checkpoint = COMMANDS[command](checkpoint, model, tmp_path)
    proc = run(args, check=False, env=TORCH_DEFAULT_OFF, input="s1 s2 s3\n")
    output = proc.stdout + proc.stderr
    assert not marker.exists(), "the payload ran"
    assert proc.returncode == 2, output[-3000:]
    assert f"Refusing to load checkpoint {checkpoint}: it contains a pickled posix.system" in proc.stderr, output[
        -3000:
    ]
    assert "Traceback" not in output, output[-3000:]
    assert_payload_is_live(checkpoint, marker)


HUB_SCRIPT = """
import sys
from fairseq.models.transformer import TransformerModel
directory, name, data, user_dir = sys.argv[1:]
try:
    TransformerModel.from_pretrained(directory, checkpoint_file=name, data_name_or_path=data, user_dir=user_dir)
except Exception as error:
    print(f"TransformerModel: {type(error).__name__}: {error}")
else:
    print("TransformerModel: loaded")
from fairseq_entmax.models import AdaptivelySparseTransformerModel
# uncaught: ends the script as the commands end
AdaptivelySparseTransformerModel.from_pretrained(directory, checkpoint_file=name, data_name_or_path=data)
print("AdaptivelySparseTransformerModel: loaded")
"""


def test_hub_interface_refuses_payload_checkpoint(payload):
    """From Python: fairseq's TransformerModel.from_pretrained with the user dir named (the
    plugin is imported only then, in this fresh process) and the package's model class."""
    checkpoint, marker, model = payload
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, checkpoint.parent, checkpoint.name, model.data_bin, USER_DIR],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **TORCH_DEFAULT_OFF},
    )
    output = proc.stdout + proc.stderr
    assert not marker.exists(), "the payload ran"
    refusal = f"Refusing to load checkpoint {checkpoint}: it contains a pickled posix.system"
    assert f"TransformerModel: UnsafeCheckpointError: {refusal}" in proc.stdout, output[-3000:]
    assert proc.returncode == 2 and refusal in proc.stderr, output[-3000:]
    assert "Traceback" not in output and "loaded" not in proc.stdout, output[-3000:]
    assert_payload_is_live(checkpoint, marker)


def test_recipe_checkpoint_averaging_refuses_payload_checkpoint(trained_model, tmp_path, monkeypatch):
    from fairseq_entmax.pipeline import checkpoints
    from fairseq_entmax.pipeline.tools import PipelineError

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    model = trained_model("softmax")
    marker = tmp_path / "payload_ran"
    checkpoint = write_payload_checkpoint(model.checkpoint, tmp_path / "checkpoint2.pt", marker)
    with pytest.raises(PipelineError, match=f"Refusing to load checkpoint {checkpoint}: it contains"):
        checkpoints.average_checkpoints([model.checkpoint, checkpoint], tmp_path / "avg.pt")
    assert not marker.exists(), "the payload ran"
    assert not (tmp_path / "avg.pt").exists()
    # an averaging of sound checkpoints still works through the safe load
    checkpoints.average_checkpoints([model.checkpoint, model.checkpoint], tmp_path / "avg.pt")
    assert (tmp_path / "avg.pt").exists()
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    assert_payload_is_live(checkpoint, marker)


def test_a_recipe_stage_ends_a_refused_checkpoint_with_its_line(tmp_path):
    """The examples run fairseq's commands through run_logged: a command that refused a
    checkpoint becomes the PipelineError of its refusal line (exit status 2), not a failed tool."""
    from fairseq_entmax.pipeline.tools import PipelineError, ToolError, run_logged

    refusal = "Refusing to load checkpoint ckpt.pt: it contains a pickled posix.system, which is not ..."
    printing = [
        sys.executable,
        "-c",
        f"import sys; print('fairseq-generate: error: {refusal}', file=sys.stderr); sys.exit(2)",
    ]
    with pytest.raises(PipelineError) as raised:
        run_logged(printing, tmp_path / "refused.log")
    assert str(raised.value) == refusal
    with pytest.raises(ToolError, match="exit 3"):
        run_logged([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "failed.log")
