"""The plugin through fairseq's own commands, as a user runs them: fairseq-train for every
normalizer, fairseq-generate (beam 4, BLEU, --print-alignment, --fp16), fairseq-interactive,
fairseq-validate, resuming a killed training, TensorBoard logging of every head's alpha."""

import argparse
import json
import math
import os
import re
import subprocess

import numpy
import pytest
import torch
from fairseq import checkpoint_utils

from conftest import TINY_MODEL_ARGS, TRAINING_ARGS
from fairseq_entmax.names import ATTENTION_TYPES
from fairseq_entmax.normalizers import NORMALIZER_NAMES
from helpers import USER_DIR, arguments, fairseq_command, read_hypotheses, run, run_interactive, run_on_model

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]


def train_command(tiny_data, save_dir, *arguments):
    """fairseq-train of a model of the session's size and training options (conftest) on the
    tiny corpus.

    Args:
        tiny_data: the `tiny_data` fixture.
        save_dir: fairseq's --save-dir.
        *arguments: more fairseq-train arguments (they come last, and win).

    Returns:
        The command, a list for run or subprocess.
    """
    return [
        fairseq_command("fairseq-train"),
        tiny_data.data_bin,
        "--user-dir",
        USER_DIR,
        *TINY_MODEL_ARGS,
        *TRAINING_ARGS,
        "--save-dir",
        save_dir,
        *arguments,
    ]


def json_records(log, tag):
    """The stats fairseq-train logs with --log-format json under one tag.

    Args:
        log: fairseq-train's output.
        tag: "train_inner", "train", "valid", ...

    Returns:
        A list of dicts, in the log's order.
    """
    records = []
    for line in log.splitlines():
        start = line.find("{")
        if start >= 0 and f"| {tag} |" in line:
            records.append(json.loads(line[start:]))
    return records


def _leaves(value):
    """Every non-container value inside nested dicts, lists and tuples."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def bleu_unigram_precision(output):
    """The unigram precision of the BLEU line fairseq-generate prints ("BLEU4 = b, p1/p2/...").

    Args:
        output: fairseq-generate's output (stdout and stderr).

    Returns:
        p1, a float (percent).
    """
    found = re.search(r"BLEU4 = [0-9.]+, ([0-9.]+)/", output)
    assert found, f"no BLEU line in fairseq-generate output:\n{output[-3000:]}"
    return float(found.group(1))


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
def test_train_then_generate_with_beam_search(trained_model, normalizer):
    model = trained_model(normalizer)
    records = json_records(model.train_log, "train_inner")
    assert records, model.train_log[-3000:]
    assert float(records[-1]["loss"]) < float(records[0]["loss"]) - 0.5, "training did not learn"

    proc = run_on_model(
        "fairseq-generate", model, "--beam", "4", "--batch-size", "16", "--cpu", "--print-alignment", "soft"
    )
    output = proc.stdout + proc.stderr
    assert len(read_hypotheses(output)) == 40  # the tiny test set
    # The tiny corpus maps s<i> to t<i> (30 words) and reverses the order: guessing gives a
    # unigram precision of ~3%, the trained word mapping far more.
    assert bleu_unigram_precision(output) > 20.0

    # --print-alignment soft: "A-<id>\t" then, per target token, the last layer's cross
    # attention over the (unpadded) source tokens, averaged over heads.
    rows = re.findall(r"^A-\d+\t(.*)$", proc.stdout, flags=re.M)
    assert len(rows) == 40
    weights = [float(w) for row in rows for token in row.split() for w in token.split(",")]
    assert all(0.0 <= w <= 1.0 for w in weights)
    if normalizer in ("sparsemax", "topk"):
        # Zeros, as the normalizer gave them. (fairseq prints 6 decimals, so a peaked
        # softmax can print 0.000000 too: test_fairseq_attention checks exact zeros.)
        assert 0.0 in weights


def generated(output):
    """The translations and the positional scores fairseq-generate prints.

    Args:
        output: fairseq-generate's stdout.

    Returns:
        ({sentence id: hypothesis}, [every token's positional score, P- lines in order]).
    """
    hypotheses = {i: text for i, (_, text) in read_hypotheses(output).items()}
    scores = [float(s) for row in re.findall(r"^P-\d+\t(.*)$", output, flags=re.M) for s in row.split()]
    return hypotheses, scores


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
def test_generate_in_half_precision(trained_model, normalizer):
    """fairseq-generate --fp16 (the model in float16; the normalizers compute in float32 and
    return float16) translates as the float32 model does."""
    model = trained_model(normalizer)
    options = ["--beam", "4", "--batch-size", "16", "--cpu"]
    full_hypotheses, full_scores = generated(run_on_model("fairseq-generate", model, *options).stdout)
    half = run_on_model("fairseq-generate", model, *options, "--fp16")
    half_hypotheses, half_scores = generated(half.stdout)
    assert len(half_hypotheses) == 40
    assert half_scores != full_scores, "the same scores to the last digit: was the model in float16?"
    assert half_scores and all(math.isfinite(s) for s in half_scores)
    assert bleu_unigram_precision(half.stdout + half.stderr) > 20.0
    # Rounding in float16 may tip a close beam decision in a few sentences; a broken
    # half-precision path would change most of them.
    same = sum(half_hypotheses[i] == full_hypotheses[i] for i in full_hypotheses)
    assert same >= 30, f"only {same} of 40 hypotheses are those of the float32 model"


def test_learned_alpha_is_in_the_training_log(trained_model):
    records = json_records(trained_model("alpha_entmax").train_log, "train_inner")
    for record in records:
        for attention_type in ATTENTION_TYPES:
            low = float(record[f"alpha_{attention_type}_min"])
            mean = float(record[f"alpha_{attention_type}_mean"])
            high = float(record[f"alpha_{attention_type}_max"])
            assert 1.01 <= low <= mean <= high <= 2.0
    # alpha is learned: it moves during training.
    first, last = records[0], records[-1]
    assert any(first[f"alpha_{t}_mean"] != last[f"alpha_{t}_mean"] for t in ATTENTION_TYPES)
    # Softmax learns nothing of the kind, and says nothing about alpha.
    softmax_records = json_records(trained_model("softmax").train_log, "train_inner")
    assert softmax_records and not any(k.startswith("alpha_") for r in softmax_records for k in r)


def test_alphas_next_to_one_train(tiny_data, tmp_path):
    """--alpha-clamp lets alpha go down to 1. Heads started a hair above it used to make
    NaN attention (float32 rounding in the threshold search), and fairseq-train stopped at
    the first update; their alpha gradient was also off by orders of magnitude there."""
    proc = run(
        train_command(
            tiny_data,
            tmp_path / "checkpoints",
            "--max-update",
            "4",
            "--log-interval",
            "1",
            "--alpha-clamp",
            "1,2",
            "--alpha-init",
            "1.000001",
        )
    )
    records = json_records(proc.stdout + proc.stderr, "train_inner")
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(float(r["loss"])) and math.isfinite(float(r["gnorm"])) for r in records)
    for attention_type in ATTENTION_TYPES:
        assert float(records[0][f"alpha_{attention_type}_max"]) == pytest.approx(1.0, abs=1e-4)


def test_ema_keeps_its_own_learned_alphas(tiny_data, tmp_path):
    """fairseq's --store-ema trains a deep copy of the model beside it: the copy's normalizers
    hold learned alphas of their own, saved with the checkpoint, an average that lags the
    model's."""
    run(
        train_command(
            tiny_data, tmp_path, *arguments("--max-update 30 --store-ema --ema-decay 0.9 --ema-start-update 1")
        )
    )
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    model, ema = state["model"], state["extra_state"]["ema"]
    alpha_keys = sorted(key for key in model if key.endswith(".normalizer.alpha_logit"))
    assert len(alpha_keys) == 6 and alpha_keys == sorted(key for key in ema if key.endswith(".alpha_logit"))
    assert all(torch.isfinite(ema[key]).all() for key in alpha_keys)
    assert any(not torch.equal(ema[key], model[key]) for key in alpha_keys), "the average is the model itself"


def test_interactive_translates_typed_sentences(trained_model, tiny_data):
    model = trained_model("alpha_entmax")
    sources = (tiny_data.raw_dir / "test.src").read_text().splitlines()[:3]
    proc = run_interactive(model.data_bin, model.checkpoint, sources, *arguments("--beam 4 --cpu"))
    hypotheses = [text for _, text in read_hypotheses(proc.stdout).values()]
    assert len(hypotheses) == 3
    for hypothesis in hypotheses:
        assert hypothesis.split() and all(re.fullmatch(r"t\d+", w) for w in hypothesis.split())


def test_validate_loads_the_checkpoint(trained_model):
    model = trained_model("entmax15")
    proc = run_on_model(
        "fairseq-validate",
        model,
        "--task",
        "translation",
        "--cpu",
        "--valid-subset",
        "valid",
        "--max-tokens",
        "1000",
    )
    found = re.search(r"valid on 'valid' subset \| loss ([0-9.]+)", proc.stdout + proc.stderr)
    assert found and math.isfinite(float(found.group(1)))


def _alpha_summary(state_dict):
    """alpha_<type>_{mean,min,max} computed from the alpha_logit parameters of a checkpoint,
    as the training log reports them."""
    summary = {}
    for attention_type, module_name in (
        ("encoder_self", "self_attn"),
        ("decoder_self", "self_attn"),
        ("cross", "encoder_attn"),
    ):
        side = "encoder" if attention_type == "encoder_self" else "decoder"
        values = torch.cat(
            [
                torch.clamp(1 + torch.sigmoid(value.float()), 1.01, 2.0)
                for key, value in state_dict.items()
                if key.startswith(f"{side}.layers.") and key.endswith(f".{module_name}.normalizer.alpha_logit")
            ]
        )
        summary[f"alpha_{attention_type}_mean"] = round(values.mean().item(), 4)
        summary[f"alpha_{attention_type}_min"] = round(values.min().item(), 4)
        summary[f"alpha_{attention_type}_max"] = round(values.max().item(), 4)
    return summary


def test_training_killed_mid_run_resumes_with_its_saved_alphas(tiny_data, tmp_path):
    save_dir = tmp_path / "checkpoints"
    command = train_command(tiny_data, save_dir, "--log-interval", "1", "--save-interval-updates", "6")
    # Train "forever" and kill the process once it has saved a checkpoint.
    proc = subprocess.Popen(
        [str(a) for a in command] + ["--max-update", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        for line in proc.stdout:
            if "Saved checkpoint" in line:
                break
    finally:
        proc.kill()
        proc.wait()
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    saved_updates = state["optimizer_history"][-1]["num_updates"]
    assert saved_updates >= 6
    saved_summary = _alpha_summary(state["model"])

    resumed = run(command + ["--max-update", str(saved_updates + 3)])
    log = resumed.stdout + resumed.stderr
    assert re.search(rf"Loaded checkpoint .*checkpoint_last\.pt .*@ {saved_updates} updates", log), log[-3000:]
    records = json_records(log, "train_inner")
    # The first record is logged from the model as it was loaded (alphas are logged before
    # each step): it carries the alphas the killed run saved.
    first = records[0]
    assert int(first["num_updates"]) == saved_updates + 1
    for key, value in saved_summary.items():
        assert float(first[key]) == pytest.approx(value, abs=1e-4), key
    assert int(records[-1]["num_updates"]) == saved_updates + 3
    final = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert final["optimizer_history"][-1]["num_updates"] == saved_updates + 3


def test_tensorboard_gets_every_heads_alpha(tiny_data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tensorboard"
    run(
        train_command(
            tiny_data,
            tmp_path / "checkpoints",
            "--max-update",
            "4",
            "--log-interval",
            "1",
            "--tensorboard-logdir",
            logdir,
            "--alpha-init",
            "1.5",
            # Also: validation BLEU puts numpy arrays into the checkpoint's metrics state.
            "--eval-bleu",
            "--eval-bleu-args",
            '{"beam": 1, "max_len_b": 10}',
        )
    )
    # The allowlist fairseq_entmax installs covers what this checkpoint holds, with
    # weights_only on.
    checkpoint = tmp_path / "checkpoints" / "checkpoint_last.pt"
    state = torch.load(checkpoint, weights_only=True)
    assert isinstance(state["cfg"]["model"], argparse.Namespace)
    assert any(isinstance(v, numpy.ndarray) for v in _leaves(state["extra_state"]["metrics"]))
    assert checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["model"].keys() == state["model"].keys()
    events = EventAccumulator(str(logdir / "train_inner"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for attention_type in ATTENTION_TYPES:
        head_tags = [f"alpha_{attention_type}_L{layer}_H{head}" for layer in range(2) for head in range(4)]
        assert set(head_tags) <= tags
        assert {f"alpha_{attention_type}_{s}" for s in ("mean", "min", "max")} <= tags
        # Step 1 is logged before any update: every head at --alpha-init.
        first_values = [events.Scalars(tag)[0].value for tag in head_tags]
        assert first_values == pytest.approx([1.5] * len(head_tags), abs=1e-4)
        last_values = [events.Scalars(tag)[-1].value for tag in head_tags]
        mean = events.Scalars(f"alpha_{attention_type}_mean")[-1].value
        assert sum(last_values) / len(last_values) == pytest.approx(mean, abs=1e-3)
