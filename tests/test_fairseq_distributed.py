"""Training on 2 processes through fairseq's distributed options (gloo on CPU, one process per
rank): the ranks train with learned alpha and their parameters stay identical."""
import os
import socket
import subprocess
import sys

import torch
from conftest import TINY_MODEL_ARGS, TRAINING_ARGS

from helpers import USER_DIR

# fairseq-train, plus: keep the model's parameters before and after training in a file, so
# the test can compare the ranks (fairseq saves checkpoints on rank 0 only).
RANK_WRAPPER = """
import sys
import torch
import fairseq.trainer
from fairseq_cli import train

output = sys.argv.pop(1)
states = {}
original_init = fairseq.trainer.Trainer.__init__

def init_and_keep(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    states["trainer"] = self
    states["initial"] = {k: v.detach().clone() for k, v in self.get_model().state_dict().items()}

fairseq.trainer.Trainer.__init__ = init_and_keep
train.cli_main()
trainer = states["trainer"]
torch.save({
    "initial": states["initial"],
    "final": {k: v.detach().clone() for k, v in trainer.get_model().state_dict().items()},
    "num_updates": trainer.get_num_updates(),
}, output)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_train_and_stay_identical(tiny_data, tmp_path):
    wrapper = tmp_path / "train_rank.py"
    wrapper.write_text(RANK_WRAPPER)
    port = free_port()
    processes = []
    for rank in range(2):
        command = [
            sys.executable, wrapper, tmp_path / f"rank{rank}.pt", tiny_data.data_bin,
            "--user-dir", USER_DIR, *TINY_MODEL_ARGS, *TRAINING_ARGS,
            "--max-update", "6", "--no-save", "--max-tokens", "500",
            "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
            "--distributed-world-size", "2", "--distributed-rank", str(rank),
            "--distributed-init-method", f"tcp://127.0.0.1:{port}",
            "--distributed-no-spawn", "--device-id", "0",
        ]
        processes.append(subprocess.Popen(
            [str(a) for a in command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        ))
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=300)[0])
        finally:
            process.kill()
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-4000:]
    assert "distributed init (rank 1)" in "".join(outputs)

    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert rank0["num_updates"] == rank1["num_updates"] == 6
    assert rank0["final"].keys() == rank1["final"].keys()
    assert any(key.endswith("alpha_logit") for key in rank0["final"])
    for key, value in rank0["final"].items():
        assert torch.equal(value, rank1["final"][key]), key
    # They trained (alphas included), and did not merely stay at a shared initialisation.
    changed = [k for k, v in rank0["final"].items() if not torch.equal(v, rank0["initial"][k])]
    assert any(k.endswith("alpha_logit") for k in changed)
    assert len(changed) > len(rank0["final"]) // 2
