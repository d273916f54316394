"""Sparse attention on top of a pretrained softmax model, through the real fairseq-train: a
fairseq `transformer` checkpoint (fairseq's own architecture, trained in the test) fine-tunes
into adaptively_sparse_transformer with learned alpha (the alphas it lacks start from
--alpha-init, said in the log), a fixed normalizer and top-k, by --finetune-from-model and by
--restore-file with fairseq's reset flags; every other weight loads as saved, and a model of
another size is still refused with fairseq's error."""

import argparse
import json
import math
import re

import pytest
import torch

from conftest import TINY_MODEL_ARGS
from helpers import USER_DIR, train_tiny

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

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
    proc = train_tiny(tiny_data.data_bin, save_dir, "--max-update", str(PRETRAIN_UPDATES), model_args=TRANSFORMER_ARGS)
    (valid,) = json_records(proc.log, "valid")
    return save_dir / "checkpoint_last.pt", float(valid["valid_loss"])


def fine_tune(tiny_data, save_dir, *args, check=True):
    """fairseq-train of the tiny adaptively_sparse_transformer with `args` (the checkpoint
    to start from, the normalizer, ...); returns fairseq-train's process, stdout and stderr
    joined as .log."""
    return train_tiny(tiny_data.data_bin, save_dir, "--log-interval", "1", *args, check=check)


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
    # Every other weight as the softmax checkpoint saved it; the version keys and warm-up
    # positions are this package's, added next to each alpha.
    ours = {key for key in started if key.endswith((".alpha_logit", ".warmup_fraction", ".sparse_attention_version"))}
    assert started.keys() - ours == pretrained.keys()
    for key, value in pretrained.items():
        assert torch.equal(started[key], value), key
    (valid,) = json_records(proc.log, "valid")
    assert float(valid["valid_loss"]) == pytest.approx(softmax_loss, abs=1e-3)


def attention_type_of(alpha_key):
    """encoder_self, decoder_self or cross, from a key such as decoder.layers.0.encoder_attn.normalizer.alpha_logit."""
    if alpha_key.startswith("encoder."):
        return "encoder_self"
    return "cross" if ".encoder_attn." in alpha_key else "decoder_self"


def test_random_alphas_warm_up_from_softmax_through_restore_file(tiny_data, softmax_checkpoint, tmp_path):
    """--restore-file with the reset flags, the default --alpha-init random and
    --alpha-warmup-updates 16: every head starts at alpha 1 (softmax) and moves linearly
    towards the starting alpha the log gave it; the model learns, alphas included; and the
    checkpoint, saved half-way through the warm-up, loads (as fairseq-generate and the hub
    load it, or as a state dict) with the alphas its last update ran with."""
    from fairseq import checkpoint_utils

    from fairseq_entmax.models import sparse_attention_modules

    checkpoint, _ = softmax_checkpoint
    proc = fine_tune(
        tiny_data,
        tmp_path,
        "--restore-file",
        checkpoint,
        *RESET_FLAGS,
        "--attention-normalizer",
        "alpha_entmax",
        "--alpha-warmup-updates",
        "16",
        "--max-update",
        "8",
    )
    logged = {}
    for key, init, alphas in ALPHA_STARTS.findall(proc.log):
        assert init == "random", key
        logged[key] = [float(alpha) for alpha in alphas.split(", ")]
    assert len(logged) == 6, proc.log[-3000:]
    records = json_records(proc.log, "train_inner")  # record i: the update that started from update i
    assert len(records) == 8 and all(math.isfinite(float(record["loss"])) for record in records)
    for attention_type in ("encoder_self", "decoder_self", "cross"):
        start = [
            alpha for key, alphas in logged.items() if attention_type_of(key) == attention_type for alpha in alphas
        ]
        assert len(start) == 8  # 2 layers of 4 heads
        assert float(records[0][f"alpha_{attention_type}_max"]) == 1.0
        # At update 4 of 16, a quarter of the way (the learned alphas themselves move by
        # less than the tolerance in 4 updates).
        for statistic, value in (("mean", sum(start) / 8), ("min", min(start)), ("max", max(start))):
            logged_value = float(records[4][f"alpha_{attention_type}_{statistic}"])
            assert logged_value == pytest.approx(1 + (value - 1) / 4, abs=2e-3), (attention_type, statistic)

    pretrained, trained = model_state(checkpoint), model_state(tmp_path / "checkpoint_last.pt")
    assert not torch.equal(trained["encoder.layers.0.fc1.weight"], pretrained["encoder.layers.0.fc1.weight"])
    (model,), config, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(tmp_path / "checkpoint_last.pt")], arg_overrides={"data": str(tiny_data.data_bin)}
    )
    # The warm-up position is in the model's state: the one its last update ran with (fairseq
    # sets the count before each update: 7 of 16), whether the loader also sets the count
    # (load_model_ensemble_and_task, before it loads the state) or not (build_model, then
    # load_state_dict).
    rebuilt = task.build_model(config.model)
    rebuilt.load_state_dict(trained)
    rebuilt_attentions = [attention for _, _, attention in sparse_attention_modules(rebuilt)]
    for (attention_type, layer, attention), other in zip(sparse_attention_modules(model), rebuilt_attentions):
        key = next(k for k in logged if attention_type_of(k) == attention_type and f".layers.{layer}." in k)
        learned = (1 + torch.sigmoid(trained[key])).clamp(1.01, 2)
        assert not torch.allclose(learned, torch.tensor(logged[key]), atol=1e-4), f"{key} did not learn"
        assert torch.allclose(attention.normalizer.head_alpha(), 1 + (learned - 1) * 7 / 16), key
        assert torch.equal(other.normalizer.head_alpha(), attention.normalizer.head_alpha()), key


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


@pytest.mark.parametrize("value", ["-1", "2.5", "ten"])
def test_a_bad_alpha_warmup_is_refused_at_parsing_and_in_a_config(tmp_path, capsys, value):
    """--alpha-warmup-updates takes an integer >= 0: fairseq's parser (every fairseq command's)
    stops at a bad one with the option's error, and a config built in Python or overridden
    in a checkpoint is checked the same way."""
    from fairseq import options

    from fairseq_entmax.options import AttentionNormalizers, sparse_attention_defaults

    with pytest.raises(SystemExit):
        options.parse_args_and_arch(
            options.get_training_parser(),
            [str(tmp_path), "--user-dir", USER_DIR, "--arch", "adaptively_sparse_transformer"]
            + ["--alpha-warmup-updates", value],
        )
    assert (
        f"argument --alpha-warmup-updates: allowed values are integers >= 0, got '{value}'" in capsys.readouterr().err
    )
    config = argparse.Namespace(alpha_warmup_updates=value)
    sparse_attention_defaults(config, "alpha_entmax")
    refusal = "invalid sparse attention option --alpha-warmup-updates: allowed values are integers >= 0"
    with pytest.raises(ValueError, match=refusal):
        AttentionNormalizers.from_args(config)
