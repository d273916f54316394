"""Training on 2 processes through fairseq's distributed options (gloo on CPU, one process per
rank), with fairseq's own data parallelism (--ddp-backend legacy_ddp) and PyTorch's
DistributedDataParallel (--ddp-backend pytorch_ddp, fairseq's default, what GPU users run):
the ranks train on different batches, learned alphas included, and their parameters stay
identical. pytorch_ddp runs with fairseq's default --find-unused-parameters off, so a
parameter that got no gradient in a step (an alpha_logit cut from the graph, say) fails the
run on the next step."""

import os
import socket
import subprocess
import sys

import pytest
import torch

from conftest import TINY_MODEL_ARGS, TRAINING_ARGS
from helpers import USER_DIR

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

# fairseq-train, plus: keep the model's parameters before and after training, the ids of the
# sentences each update trained on and the classes wrapping the model in a file, so the test
# can compare the ranks (fairseq saves checkpoints on rank 0 only).
RANK_WRAPPER = """
import sys
import torch
import fairseq.models.distributed_fairseq_model
import fairseq.trainer
from fairseq_cli import train

output = sys.argv.pop(1)
states = {"sentence_ids": []}
original_init = fairseq.trainer.Trainer.__init__
original_train_step = fairseq.trainer.Trainer.train_step

def init_and_keep(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    states["trainer"] = self
    states["initial"] = {k: v.detach().clone() for k, v in self.get_model().state_dict().items()}

def train_step_and_keep(self, samples, *args, **kwargs):
    states["sentence_ids"].append([i for s in samples if s for i in s["id"].tolist()])
    return original_train_step(self, samples, *args, **kwargs)


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    # fairseq passes its --device-id to PyTorch's DDP, which refuses device ids for a module
    # on the CPU: the one change to what a GPU run does.
    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if next(module.parameters()).device.type == "cpu":
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


fairseq.trainer.Trainer.__init__ = init_and_keep
fairseq.trainer.Trainer.train_step = train_step_and_keep
fairseq.models.distributed_fairseq_model.DistributedDataParallel = DistributedDataParallel
train.cli_main()
trainer = states["trainer"]
wrappers, module = [], trainer.model
while hasattr(module, "module"):
    wrappers.append([c.__name__ for c in type(module).__mro__])
    module = module.module
torch.save({
    "initial": states["initial"],
    "final": {k: v.detach().clone() for k, v in trainer.get_model().state_dict().items()},
    "num_updates": trainer.get_num_updates(),
    "sentence_ids": states["sentence_ids"],
    "wrappers": wrappers,
}, output)
"""

# ddp backend -> the class that must wrap the model, and the model: learned alpha in all
# attention (the default of adaptively_sparse_transformer), or (pytorch_ddp) learned alpha in
# the encoder self- and cross attention with top-k (k = 3) in the decoder self-attention, a
# model part of whose attention has no alphas.
DDP_BACKENDS = {
    "legacy_ddp": ("LegacyDistributedDataParallel", []),
    "pytorch_ddp": ("DistributedDataParallel", ["--decoder-self-attention-normalizer", "topk", "--topk", "3"]),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("ddp_backend", DDP_BACKENDS)
def test_two_gloo_ranks_train_and_stay_identical(tiny_data, tmp_path, ddp_backend):
    wrapper_class, model_args = DDP_BACKENDS[ddp_backend]
    wrapper = tmp_path / "train_rank.py"
    wrapper.write_text(RANK_WRAPPER)
    port = free_port()
    processes = []
    for rank in range(2):
        command = [
            sys.executable,
            wrapper,
            tmp_path / f"rank{rank}.pt",
            tiny_data.data_bin,
            "--user-dir",
            USER_DIR,
            *TINY_MODEL_ARGS,
            *TRAINING_ARGS,
            *model_args,
            "--max-update",
            "6",
            "--no-save",
            "--max-tokens",
            "500",
            "--distributed-backend",
            "gloo",
            "--ddp-backend",
            ddp_backend,
            "--distributed-world-size",
            "2",
            "--distributed-rank",
            str(rank),
            "--distributed-init-method",
            f"tcp://127.0.0.1:{port}",
            "--distributed-no-spawn",
            "--device-id",
            "0",
        ]
        processes.append(
            subprocess.Popen(
                [str(a) for a in command],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        )
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
    for rank in (rank0, rank1):
        assert any(wrapper_class == classes[0] for classes in rank["wrappers"]), rank["wrappers"]
    # The ranks trained on different sentences in every update. (At the end of an epoch with an
    # odd number of batches one rank has none and runs fairseq's dummy batch: empty here.)
    assert len(rank0["sentence_ids"]) == len(rank1["sentence_ids"]) == 6
    for update, (ids0, ids1) in enumerate(zip(rank0["sentence_ids"], rank1["sentence_ids"])):
        assert not set(ids0) & set(ids1), (update, ids0, ids1)
    assert sum(bool(ids0) and bool(ids1) for ids0, ids1 in zip(rank0["sentence_ids"], rank1["sentence_ids"])) >= 4
    assert rank0["final"].keys() == rank1["final"].keys()
    assert any(key.endswith("alpha_logit") for key in rank0["final"])
    for key, value in rank0["final"].items():
        assert torch.equal(value, rank1["final"][key]), key
    # They trained (alphas included), and did not merely stay at a shared initialisation.
    changed = [k for k, v in rank0["final"].items() if not torch.equal(v, rank0["initial"][k])]
    assert any(k.endswith("alpha_logit") for k in changed)
    assert len(changed) > len(rank0["final"]) // 2
