"""A learned-alpha training killed mid-run resumes from every saved head and from its saved
optimizer state: what the resumed fairseq-train starts its first step from equals, tensor by
tensor, what the killed run saved in checkpoint_last.pt (every alpha_logit head, every other
parameter, Adam's exp_avg / exp_avg_sq / step, num_updates). A per-type summary (mean, min,
max of the alphas, as test_fairseq_commands compares) would not see heads swapped or a
reset optimizer."""

import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import TINY_MODEL_ARGS, TRAINING_ARGS
from helpers import USER_DIR, fairseq_command, run

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

# fairseq-train's own entry point (fairseq_cli.train.cli_main, what the fairseq-train script
# runs), with two probes that save what the trainer holds: before the checkpoint is loaded
# (the freshly built model) and when the first training step of the run begins.
PROBED_FAIRSEQ_TRAIN = r"""
import sys

import torch
from fairseq import checkpoint_utils
from fairseq.trainer import Trainer
from fairseq_cli import train

probe_path = sys.argv.pop(1)
probes = {}


def snapshot(trainer):
    return {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}


original_load_checkpoint = checkpoint_utils.load_checkpoint


def load_checkpoint(cfg, trainer, **kwargs):
    probes["before_loading"] = snapshot(trainer)
    return original_load_checkpoint(cfg, trainer, **kwargs)


original_train_step = Trainer.train_step


def train_step(self, samples, raise_oom=False):
    if "first_step" not in probes:
        names = {id(p): name for name, p in self.model.named_parameters()}
        groups = self.optimizer.optimizer.param_groups
        probes["first_step"] = {
            "model": snapshot(self),
            "optimizer": self.optimizer.state_dict(),
            # The optimizer state is indexed by position in its parameter groups.
            "optimizer_parameter_names": [names[id(p)] for group in groups for p in group["params"]],
            "num_updates": self.get_num_updates(),
        }
        torch.save(probes, probe_path)
    return original_train_step(self, samples, raise_oom)


checkpoint_utils.load_checkpoint = load_checkpoint
Trainer.train_step = train_step
sys.argv[0] = "fairseq-train"
train.cli_main()
"""

SAVE_EVERY = 3


def kill_after_first_save(command):
    """Run fairseq-train "forever" and kill it once it has saved a checkpoint (update
    SAVE_EVERY, mid-epoch)."""
    proc = subprocess.Popen(
        [str(a) for a in command] + ["--max-update", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    output = []
    try:
        for line in proc.stdout:
            output.append(line)
            if "Saved checkpoint" in line:
                break
    finally:
        proc.kill()
        proc.wait()
    return "".join(output)


def assert_equal_tensors(saved, loaded, what):
    assert torch.is_tensor(saved) and torch.is_tensor(loaded), what
    assert saved.dtype == loaded.dtype and saved.shape == loaded.shape, what
    assert torch.equal(saved, loaded), f"{what}: resumed from {loaded.tolist()}, saved {saved.tolist()}"


def test_resumed_training_starts_from_every_saved_head_and_optimizer_state(tiny_data, tmp_path):
    save_dir = tmp_path / "checkpoints"
    training = [
        tiny_data.data_bin,
        "--user-dir",
        USER_DIR,
        *TINY_MODEL_ARGS,
        *TRAINING_ARGS,
        "--attention-normalizer",
        "alpha_entmax",
        "--alpha-init",
        "random",
        "--save-dir",
        save_dir,
        "--save-interval-updates",
        str(SAVE_EVERY),
        "--log-interval",
        "1",
    ]
    log = kill_after_first_save([fairseq_command("fairseq-train"), *training])
    assert "Saved checkpoint" in log, log[-3000:]
    saved = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    saved_updates = saved["optimizer_history"][-1]["num_updates"]
    assert saved_updates == SAVE_EVERY
    alpha_names = sorted(name for name in saved["model"] if "alpha" in name)
    assert len(alpha_names) == 6 and all(name.endswith(".alpha_logit") for name in alpha_names)

    probe = tmp_path / "probe.pt"
    script = tmp_path / "probed_fairseq_train.py"
    script.write_text(PROBED_FAIRSEQ_TRAIN)
    resumed = run([sys.executable, script, probe, *training, "--max-update", str(saved_updates + 3)])
    resumed_log = resumed.stdout + resumed.stderr
    assert re.search(rf"Loaded checkpoint \S*checkpoint_last\.pt \(epoch 1 @ {saved_updates} updates\)", resumed_log), (
        resumed_log[-3000:]
    )
    probes = torch.load(probe, weights_only=True)
    fresh, started = probes["before_loading"], probes["first_step"]

    # Every head: the resumed run starts from the saved logit, which differs from the one
    # the resumed run built before loading (the comparison would see a head not loaded,
    # or heads swapped).
    for name in alpha_names:
        assert saved["model"][name].shape == (4,)
        assert (fresh[name] != saved["model"][name]).all(), f"{name}: a head did not move in training"
        assert len(set(saved["model"][name].tolist())) == 4, f"{name}: two heads alike, a swap would not show"
        assert_equal_tensors(saved["model"][name], started["model"][name], name)
    # And every other parameter.
    assert started["model"].keys() == saved["model"].keys()
    for name, value in saved["model"].items():
        assert_equal_tensors(value, started["model"][name], name)

    # The optimizer: num_updates, and Adam's state of every parameter, the alphas named.
    assert started["num_updates"] == saved_updates
    saved_optimizer, started_optimizer = saved["last_optimizer_state"], started["optimizer"]
    names = started["optimizer_parameter_names"]
    assert len(set(names)) == len(names) and set(names) <= saved["model"].keys()  # shared embeddings once
    assert set(alpha_names) <= set(names)
    assert set(started_optimizer["state"]) == set(saved_optimizer["state"]) == set(range(len(names)))
    for index, name in enumerate(names):
        saved_state, started_state = saved_optimizer["state"][index], started_optimizer["state"][index]
        assert saved_state.keys() == started_state.keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        assert started_state["step"] == saved_state["step"] == saved_updates, name
        assert saved_state["exp_avg"].shape == saved["model"][name].shape, name
        for key in ("exp_avg", "exp_avg_sq"):
            assert_equal_tensors(saved_state[key], started_state[key], f"{name} {key}")
    for name in alpha_names:
        state = saved_optimizer["state"][names.index(name)]
        assert (state["exp_avg"] != 0).all() and (state["exp_avg_sq"] > 0).all(), name
    assert started_optimizer["param_groups"] == saved_optimizer["param_groups"]

    # The resumed run then trained on and saved its own progress.
    final = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert final["optimizer_history"][-1]["num_updates"] == saved_updates + 3
    for name in alpha_names:
        assert not torch.equal(final["model"][name], saved["model"][name]), name
