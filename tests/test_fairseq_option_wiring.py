"""The model options reach the attention modules as docs/fairseq.md documents them, through
fairseq's real parser and checkpoints: --topk-fraction / --topk-min in every attention
module, each per-type --*-attention-normalizer in its own type only, and --model-overrides
changing k of a trained top-k model at loading.

Every check looks at each attention module as the package lists them
(fairseq_entmax.models.sparse_attention_modules) and at what the module computes (the
normalizer's output in a forward pass), not only at its attributes."""

import argparse
import math

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks

from blocked_calls import normalizers_see_blocked_calls
from conftest import TINY_MODEL_ARGS, TRAINING_ARGS
from fairseq_entmax.models import sparse_attention_modules
from fairseq_entmax.normalizers import alpha_entmax, entmax15, softmax, sparsemax
from helpers import USER_DIR, fairseq_command, run

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

# (attention type, layer) of every attention of the tiny 2+2-layer models, in the order
# sparse_attention_modules lists them.
EVERY_ATTENTION = [
    ("encoder_self", 0),
    ("encoder_self", 1),
    ("decoder_self", 0),
    ("cross", 0),
    ("decoder_self", 1),
    ("cross", 1),
]


def tiny_model_args(arch):
    """conftest's tiny model (2+2 layers, width 32, 4 heads) under another architecture."""
    return [arch if argument == "adaptively_sparse_transformer" else argument for argument in TINY_MODEL_ARGS]


def build_from_command_line(data_bin, arguments):
    """The model fairseq-train builds from this command line: fairseq's training parser with
    --user-dir, setup_task, build_model."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data_bin), "--user-dir", USER_DIR, "--cpu", *arguments])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model = task.build_model(args)
    model.eval()
    return model, task


def load_checkpoint(checkpoint, data_bin, overrides=None):
    """The model as fairseq-generate loads it with --model-overrides (load_model_ensemble
    with arg_overrides), prepared for inference."""
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data_bin), **(overrides or {})}
    )
    model = models[0]
    model.prepare_for_inference_(cfg)
    model.eval()
    return model, task


def attention_rows(model, task, beam=None, split="test"):
    """Run the model over the whole split (teacher forcing; with `beam`, beam search too) and
    return, per (attention type, layer), (visible keys, kept keys) of every query row of
    every head: visible = scores that are not -inf (padding and future masked), kept =
    weights > 0 in the normalizer's output."""
    rows = {}
    hooks = []
    for attention_type, layer, attention in sparse_attention_modules(model):

        def record(module, inputs, probabilities, key=(attention_type, layer)):
            visible = torch.isfinite(inputs[0]).sum(-1).flatten()
            kept = (probabilities > 0).sum(-1).flatten()
            rows.setdefault(key, []).append(torch.stack([visible, kept], dim=-1))

        hooks.append(attention.normalizer.register_forward_hook(record))
    try:
        task.load_dataset(split)
        batches = task.get_batch_iterator(
            dataset=task.dataset(split),
            max_sentences=8,
            required_batch_size_multiple=1,
        ).next_epoch_itr(shuffle=False)
        generator = task.build_generator([model], argparse.Namespace(beam=beam)) if beam else None
        sentences = 0
        with torch.no_grad(), normalizers_see_blocked_calls():
            for sample in batches:
                sentences += len(sample["id"])
                model(**sample["net_input"])
                if generator is not None:
                    task.inference_step(generator, [model], sample)
        assert sentences == len(task.dataset(split))
    finally:
        for hook in hooks:
            hook.remove()
    return {key: torch.cat(value) for key, value in rows.items()}


def assert_rows_keep(rows, expected_kept):
    """Every query row with a visible key keeps expected_kept(visible) keys, in every module."""
    assert list(rows) == EVERY_ATTENTION
    for key, pairs in rows.items():
        visible, kept = pairs[:, 0], pairs[:, 1]
        has_keys = visible > 0
        assert has_keys.any(), key
        expected = torch.tensor([expected_kept(int(n)) for n in visible[has_keys]])
        wrong = (kept[has_keys] != expected).nonzero()
        assert len(wrong) == 0, (
            f"{key}: {len(wrong)} of {int(has_keys.sum())} query rows keep another number of keys than "
            f"expected, e.g. {int(kept[has_keys][wrong[0]])} of {int(visible[has_keys][wrong[0]])} visible "
            f"(expected {int(expected[wrong[0]])})"
        )
        assert (kept[~has_keys] == 0).all(), key


# --- --topk-fraction / --topk-min reach every attention ---------------------------------

FRACTION, MINIMUM, TOPK = 0.5, 3, 6


def kept_with_fraction(visible):
    """docs/fairseq.md: max(--topk-min, ceil(F * n)) keys, n the keys the query sees (never
    more than it sees)."""
    return min(visible, max(MINIMUM, math.ceil(FRACTION * visible)))


def test_topk_fraction_and_topk_min_reach_every_attention(tiny_data):
    model, task = build_from_command_line(
        tiny_data.data_bin,
        [
            *tiny_model_args("explicit_sparse_transformer"),
            "--topk",
            str(TOPK),
            "--topk-fraction",
            str(FRACTION),
            "--topk-min",
            str(MINIMUM),
        ],
    )
    listed = list(sparse_attention_modules(model))
    assert [(t, layer) for t, layer, _ in listed] == EVERY_ATTENTION
    for attention_type, layer, attention in listed:
        assert attention.normalizer.name == "topk", (attention_type, layer)
        assert (attention.normalizer.fraction, attention.normalizer.minimum) == (FRACTION, MINIMUM), (
            attention_type,
            layer,
        )

    rows = attention_rows(model, task, split="valid")
    assert_rows_keep(rows, kept_with_fraction)
    # The split has rows where each option decides what is kept: where --topk-min does
    # (ceil(F * n) < MIN < n) and where the fraction does (ceil(F * n) > MIN), and neither is
    # the fixed --topk, in every module.
    for key, pairs in rows.items():
        seen = set(pairs[:, 0].tolist())
        assert any(math.ceil(FRACTION * n) < MINIMUM < n for n in seen), (key, seen)
        assert any(math.ceil(FRACTION * n) > MINIMUM and math.ceil(FRACTION * n) != TOPK for n in seen), (key, seen)


# --- per-type normalizer options set only their type -------------------------------------

NORMALIZE = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}


@pytest.mark.parametrize(
    "chosen",
    [
        {"encoder_self": "sparsemax"},
        {"decoder_self": "sparsemax"},
        {"cross": "sparsemax"},
        {"encoder_self": "softmax", "decoder_self": "sparsemax", "cross": "alpha_entmax"},
    ],
    ids=["encoder-self", "decoder-self", "cross", "all-three"],
)
def test_each_per_type_normalizer_option_sets_only_its_type(tiny_data, chosen):
    default = "entmax15"
    arguments = [
        *tiny_model_args("adaptively_sparse_transformer"),
        "--attention-normalizer",
        default,
        "--alpha-init",
        "1.3",
    ]
    for attention_type, normalizer in chosen.items():
        arguments += [f"--{attention_type.replace('_', '-')}-attention-normalizer", normalizer]
    model, _ = build_from_command_line(tiny_data.data_bin, arguments)

    listed = list(sparse_attention_modules(model))
    assert [(t, layer) for t, layer, _ in listed] == EVERY_ATTENTION
    torch.manual_seed(1)
    scores = torch.randn(4 * 2, 3, 5) * 3  # (batch * heads, queries, keys)
    for attention_type, layer, attention in listed:
        expected = chosen.get(attention_type, default)
        assert attention.normalizer.name == expected, (attention_type, layer)
        # ...and it is what the module computes.
        if expected == "alpha_entmax":
            assert attention.normalizer.learns_alpha
            torch.testing.assert_close(attention.normalizer.head_alpha(), torch.full((4,), 1.3), atol=1e-5, rtol=0)
            reference = alpha_entmax(scores.view(2, 4, 3, 5), torch.full((1, 4, 1, 1), 1.3), dim=-1).view_as(scores)
        else:
            assert not attention.normalizer.learns_alpha
            reference = NORMALIZE[expected](scores, dim=-1)
        torch.testing.assert_close(attention.normalizer(scores).detach(), reference, atol=1e-6, rtol=0)
    learned = sorted(name for name, _ in model.named_parameters() if name.endswith("alpha_logit"))
    if "cross" in chosen and chosen["cross"] == "alpha_entmax":
        assert learned == [
            "decoder.layers.0.encoder_attn.normalizer.alpha_logit",
            "decoder.layers.1.encoder_attn.normalizer.alpha_logit",
        ]
    else:
        assert learned == []


# --- --model-overrides on a trained top-k model -------------------------------------------


def train_a_few_updates(data_bin, save_dir, arguments, updates=3):
    run(
        [
            fairseq_command("fairseq-train"),
            data_bin,
            "--user-dir",
            USER_DIR,
            *tiny_model_args("explicit_sparse_transformer"),
            *TRAINING_ARGS,
            *arguments,
            "--max-update",
            str(updates),
            "--save-dir",
            save_dir,
        ]
    )
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def topk8_checkpoint(tiny_data, tmp_path_factory):
    """explicit_sparse_transformer (top-k, its default k = 8) trained 3 updates by fairseq-train."""
    return train_a_few_updates(tiny_data.data_bin, tmp_path_factory.mktemp("topk8"), [])


@pytest.fixture(scope="module")
def fraction_checkpoint(tiny_data, tmp_path_factory):
    """The same with --topk-fraction 0.5 --topk-min 3 (and --topk 6, which the fraction
    overrides), trained 3 updates."""
    return train_a_few_updates(
        tiny_data.data_bin,
        tmp_path_factory.mktemp("topk_fraction"),
        ["--topk", str(TOPK), "--topk-fraction", str(FRACTION), "--topk-min", str(MINIMUM)],
    )


def test_model_overrides_set_k_of_a_trained_topk_model(topk8_checkpoint, tiny_data):
    """docs/fairseq.md: --model-overrides "{'topk': 4}" at inference. The model trained with
    k = 8 keeps at most 4 keys per query in all its attention, in teacher forcing and beam
    search; loaded without the override it keeps up to 8 (the control: the test set has
    queries that see more than 4 keys)."""
    trained, task = load_checkpoint(topk8_checkpoint, tiny_data.data_bin)
    assert [attention.normalizer.k for _, _, attention in sparse_attention_modules(trained)] == [8] * 6
    rows = attention_rows(trained, task, beam=2)
    assert_rows_keep(rows, lambda n: min(n, 8))
    for key, pairs in rows.items():
        assert (pairs[:, 1] > 4).any(), key

    overridden, task = load_checkpoint(topk8_checkpoint, tiny_data.data_bin, {"topk": 4})
    for attention_type, layer, attention in sparse_attention_modules(overridden):
        assert (attention.normalizer.name, attention.normalizer.k) == ("topk", 4), (attention_type, layer)
    rows = attention_rows(overridden, task, beam=2)
    assert_rows_keep(rows, lambda n: min(n, 4))
    # The override changes k only: the weights are the trained ones.
    for (name, value), (other_name, other) in zip(trained.state_dict().items(), overridden.state_dict().items()):
        assert name == other_name and torch.equal(value, other), name


def test_a_trained_topk_fraction_survives_the_checkpoint_and_takes_precedence(fraction_checkpoint, tiny_data):
    """--topk-fraction/--topk-min are in the checkpoint and reach every module of the loaded
    model; overriding only topk leaves the fraction in charge, and
    "{'topk': 4, 'topk_fraction': None}" (as docs/fairseq.md says to write) gives k = 4."""
    loaded, task = load_checkpoint(fraction_checkpoint, tiny_data.data_bin)
    for attention_type, layer, attention in sparse_attention_modules(loaded):
        assert (attention.normalizer.k, attention.normalizer.fraction, attention.normalizer.minimum) == (
            TOPK,
            FRACTION,
            MINIMUM,
        ), (
            attention_type,
            layer,
        )
    assert_rows_keep(attention_rows(loaded, task), kept_with_fraction)

    topk_only, task = load_checkpoint(fraction_checkpoint, tiny_data.data_bin, {"topk": 4})
    assert_rows_keep(attention_rows(topk_only, task), kept_with_fraction)

    fixed, task = load_checkpoint(fraction_checkpoint, tiny_data.data_bin, {"topk": 4, "topk_fraction": None})
    for attention_type, layer, attention in sparse_attention_modules(fixed):
        assert (attention.normalizer.k, attention.normalizer.fraction) == (4, None), (attention_type, layer)
    assert_rows_keep(attention_rows(fixed, task, beam=2), lambda n: min(n, 4))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"topk": -1}, id="topk -1"),
        pytest.param({"topk": 2.5}, id="topk 2.5"),
        # A 0 is refused too, not replaced by the default as a falsy value once was.
        pytest.param({"topk": 0}, id="topk 0"),
        pytest.param({"topk_min": 0, "topk_fraction": 0.5}, id="topk_min 0"),
    ],
)
def test_a_bad_k_in_model_overrides_is_refused(topk8_checkpoint, tiny_data, overrides):
    """AttentionNormalizers.from_args: "checked as the command-line parsers check it", for
    configs built in Python and --model-overrides: a k the command line refuses
    must not load as some other k."""
    with pytest.raises(ValueError, match="allowed values are integers >= 1"):
        load_checkpoint(topk8_checkpoint, tiny_data.data_bin, overrides)
