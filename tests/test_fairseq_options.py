"""Bad option values stop fairseq at argument parsing, before any data is read, with
fairseq's argument error: exit code not 0, a message naming the option and what is allowed."""

import pytest
from fairseq import options

from helpers import USER_DIR, fairseq_command, run

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

NORMALIZERS = "softmax, sparsemax, entmax15, alpha_entmax, topk"
BAD_OPTIONS = [
    ("--attention-normalizer", "relu", NORMALIZERS),
    ("--encoder-self-attention-normalizer", "sparse", NORMALIZERS),
    ("--decoder-self-attention-normalizer", "entmax", NORMALIZERS),
    ("--cross-attention-normalizer", "entmax", NORMALIZERS),
    ("--topk", "0", "integers >= 1"),
    ("--topk", "2.5", "integers >= 1"),
    ("--topk-min", "-1", "integers >= 1"),
    ("--alpha-init", "2.5", "'random' or a number in (1, 2]"),
    ("--alpha-init", "1", "'random' or a number in (1, 2]"),
    ("--alpha-init", "uniform", "'random' or a number in (1, 2]"),
    ("--topk-fraction", "0", "numbers in (0, 1]"),
    ("--topk-fraction", "1.5", "numbers in (0, 1]"),
    ("--alpha-clamp", "0.5,2", "1 <= MIN < MAX <= 2"),
    ("--alpha-clamp", "1.5", "1 <= MIN < MAX <= 2"),
]


def unquoted(text):
    return text.replace("'", "")


@pytest.mark.parametrize("option, value, allowed", [BAD_OPTIONS[0], BAD_OPTIONS[7]])
def test_fairseq_train_stops_at_a_bad_option_before_reading_data(tmp_path, option, value, allowed):
    missing_data = tmp_path / "no-such-data-bin"  # reading data would fail differently
    proc = run(
        [
            fairseq_command("fairseq-train"),
            missing_data,
            "--user-dir",
            USER_DIR,
            "--arch",
            "adaptively_sparse_transformer",
            "--cpu",
            option,
            value,
        ],
        check=False,
    )
    assert proc.returncode != 0
    assert f"argument {option}:" in proc.stderr
    assert unquoted(allowed) in unquoted(proc.stderr)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("option, value, allowed", BAD_OPTIONS)
def test_fairseqs_parser_rejects_each_bad_value(tmp_path, capsys, option, value, allowed):
    """The same parser fairseq-train, -generate, -interactive and -validate use."""
    parser = options.get_training_parser()
    with pytest.raises(SystemExit) as stopped:
        options.parse_args_and_arch(
            parser,
            [
                str(tmp_path / "no-such-data-bin"),
                "--user-dir",
                USER_DIR,
                "--arch",
                "explicit_sparse_transformer",
                option,
                value,
            ],
        )
    assert stopped.value.code != 0
    error = capsys.readouterr().err
    assert f"argument {option}:" in error
    assert unquoted(allowed) in unquoted(error)
    assert repr(value) in error or value in error


def test_alpha_init_outside_the_alpha_clamp_is_refused(tiny_data):
    """A head that starts outside the clamp sits at the bound, where the clamp passes no
    gradient: its alpha would never be learned. Both options are fine alone, so the check
    comes when the model is built."""
    proc = run(
        [
            fairseq_command("fairseq-train"),
            tiny_data.data_bin,
            "--user-dir",
            USER_DIR,
            "--arch",
            "adaptively_sparse_transformer",
            "--cpu",
            "--max-update",
            "1",
            "--max-tokens",
            "200",
            "--alpha-clamp",
            "1.01,1.2",
            "--alpha-init",
            "1.3",
        ],
        check=False,
    )
    assert proc.returncode != 0
    assert "option --alpha-init: 1.3 is outside alpha_clamp (1.01, 1.2)" in proc.stderr
    assert "[1.01, 1.2]" in proc.stderr and "| epoch" not in proc.stdout


def test_a_trained_model_loads_with_another_clamp_when_alpha_init_is_overridden_too(trained_model):
    """At loading, alpha_init no longer matters (the checkpoint's alphas replace it), but the
    check still sees it: the refusal says to override it as well, and that works."""
    from fairseq import checkpoint_utils

    from fairseq_entmax.models import sparse_attention_modules

    model = trained_model("alpha_entmax")
    overrides = {"data": str(model.data_bin), "alpha_clamp": "1.6,2", "alpha_init": "1.5"}
    with pytest.raises(ValueError, match="override alpha_init too"):
        checkpoint_utils.load_model_ensemble_and_task([str(model.checkpoint)], arg_overrides=overrides)
    (loaded,), _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(model.checkpoint)], arg_overrides=dict(overrides, alpha_init="random")
    )
    for _, _, attention in sparse_attention_modules(loaded):
        assert attention.normalizer.clamp == (1.6, 2.0) and (attention.normalizer.head_alpha() >= 1.6).all()
