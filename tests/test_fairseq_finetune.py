"""Sparse attention on top of a pretrained softmax model, through the real fairseq-train: a
fairseq `transformer` checkpoint (fairseq's own architecture, trained in the test) fine-tunes
into adaptively_sparse_transformer with learned alpha (the alphas it lacks start from
--alpha-init, said in the log), a fixed normalizer and top-k, by --finetune-from-model and by
--restore-file with fairseq's reset flags; every other weight loads as saved, and a model of
another size is still refused with fairseq's error."""

import json
import math
import re

import pytest
import torch

from conftest import TINY_MODEL_ARGS, TRAINING_ARGS
from helpers import USER_DIR, fairseq_command, run

# fairseq's own architecture with the tiny models' sizes.
assert TINY_MODEL_ARGS[:2] == ["--arch", "adaptively_sparse_transformer"]
TRANSFORMER_ARGS = ["--arch", "transformer", *TINY_MODEL_ARGS[2:]]
PRETRAIN_UPDATES = 30
# fairseq's reset flags, which --finetune-from-model implies and --restore-file needs from
# another model's checkpoint.
RESET_FLAGS = ["--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader", "--reset-meters"]
# A learning rate of 0 keeps the loaded weights: the saved checkpoint and the validation at
# the end of training are those of the model as fine-tuning starts.
KEEP_WEIGHTS = ["--lr", "0"]
NEAR_ONE = ["--alpha-clamp", "1,2", "--alpha-init", "1.000001"]
ALPHA_STARTS = re.compile(r"(\S+\.alpha_logit): not in the checkpoint .*?--alpha-init (\S+): alpha (.*)$", re.M)


def json_records(log, tag):
    """The JSON stats fairseq-train logs with --log-format json under `tag` (train_inner, valid)."""
    return [json.loads(line[line.find("{") :]) for line in log.splitlines() if f"| {tag} |" in line and "{" in line]


@pytest.fixture(scope="module")
def softmax_checkpoint(tiny_data, tmp_path_factory):
    """A fairseq `transformer` trained for PRETRAIN_UPDATES updates: (checkpoint, its final
    validation loss). --user-dir only makes its validation see every sentence, as the
    fine-tuning runs' does (docs/fairseq.md, "Every sentence evaluated"); the architecture
    and the checkpoint are fairseq's own."""
    save_dir = tmp_path_factory.mktemp("softmax_transformer")
    proc = run(
        [
            fairseq_command("fairseq-train"),
            tiny_data.data_bin,
            "--user-dir",
            USER_DIR,
            *TRANSFORMER_ARGS,
            *TRAINING_ARGS,
            "--max-update",
            str(PRETRAIN_UPDATES),
            "--save-dir",
            save_dir,
        ]
    )
    (valid,) = json_records(proc.stdout + proc.stderr, "valid")
    return save_dir / "checkpoint_last.pt", float(valid["valid_loss"])


def fine_tune(tiny_data, save_dir, *args, check=True):
    """fairseq-train of the tiny adaptively_sparse_transformer with `args` (the checkpoint
    to start from, the normalizer, ...); returns fairseq-train's process, stdout and stderr
    joined as .log."""
    proc = run(
        [
            fairseq_command("fairseq-train"),
            tiny_data.data_bin,
            "--user-dir",
            USER_DIR,
            *TINY_MODEL_ARGS,
            *TRAINING_ARGS,
            "--log-interval",
            "1",
            "--save-dir",
            save_dir,
            *args,
        ],
        check=check,
    )
    proc.log = proc.stdout + proc.stderr
    return proc


def model_state(checkpoint):
    return torch.load(checkpoint, weights_only=True)["model"]


def test_near_one_alphas_start_from_the_softmax_model_exactly(tiny_data, softmax_checkpoint, tmp_path):
    """--finetune-from-model with learned alpha: each of the 6 missing alpha_logit is logged
    as starting from --alpha-init, every other weight is the checkpoint's, and alphas just
    above 1 give the softmax model's validation loss."""
    checkpoint, softmax_loss = softmax_checkpoint
    proc = fine_tune(
        tiny_data,
        tmp_path,
        "--finetune-from-model",
        checkpoint,
        "--attention-normalizer",
        "alpha_entmax",
        *NEAR_ONE,
        *KEEP_WEIGHTS,
        "--max-update",
        "2",
    )
    pretrained, started = model_state(checkpoint), model_state(tmp_path / "checkpoint_last.pt")
    alpha_keys = sorted(key for key in started if key.endswith(".alpha_logit"))
    assert len(alpha_keys) == 6  # 2 encoder self, 2 decoder self, 2 cross
    logged = {key: (init, alphas) for key, init, alphas in ALPHA_STARTS.findall(proc.log)}
    assert sorted(logged) == alpha_keys, proc.log[-3000:]
    for key in alpha_keys:
        assert logged[key] == ("1.000001", ", ".join(["1.000001"] * 4)), key
        assert torch.allclose(started[key], torch.full((4,), math.log(1e-6 / (1 - 1e-6)))), key
    # Every other weight as the softmax checkpoint saved it; the version keys are this
    # package's, added next to each alpha.
    ours = {key for key in started if key.endswith((".alpha_logit", ".sparse_attention_version"))}
    assert started.keys() - ours == pretrained.keys()
    for key, value in pretrained.items():
        assert torch.equal(started[key], value), key
    (valid,) = json_records(proc.log, "valid")
    assert float(valid["valid_loss"]) == pytest.approx(softmax_loss, abs=1e-3)


def test_fixed_normalizers_and_top_k_load_every_weight(tiny_data, softmax_checkpoint, tmp_path):
    """Normalizers without learned alpha (1.5-entmax in the encoder, top-k in the decoder)
    store what fairseq's MultiheadAttention stores: the model starts from exactly the
    checkpoint's weights, with nothing logged about alphas."""
    checkpoint, _ = softmax_checkpoint
    proc = fine_tune(
        tiny_data,
        tmp_path,
        "--restore-file",
        checkpoint,
        *RESET_FLAGS,
        "--attention-normalizer",
        "topk",
        "--topk",
        "3",
        "--encoder-self-attention-normalizer",
        "entmax15",
        *KEEP_WEIGHTS,
        "--max-update",
        "2",
    )
    assert not ALPHA_STARTS.search(proc.log)
    pretrained, started = model_state(checkpoint), model_state(tmp_path / "checkpoint_last.pt")
    assert started.keys() == pretrained.keys()
    for key, value in pretrained.items():
        assert torch.equal(started[key], value), key


def test_a_model_of_another_size_is_still_refused(tiny_data, softmax_checkpoint, tmp_path):
    """Only the alphas are supplied: a layer the checkpoint lacks stops fairseq-train with
    fairseq's error, for learned alpha too (whose alphas in that layer would be supplied)."""
    checkpoint, _ = softmax_checkpoint
    proc = fine_tune(
        tiny_data,
        tmp_path,
        "--finetune-from-model",
        checkpoint,
        "--attention-normalizer",
        "alpha_entmax",
        "--decoder-layers",
        "3",
        "--max-update",
        "2",
        check=False,
    )
    assert proc.returncode != 0
    assert f"Cannot load model parameters from checkpoint {checkpoint}; please ensure that the architectures match" in (
        proc.log
    )
    assert 'Missing key(s) in state_dict: "decoder.layers.2.' in proc.log
