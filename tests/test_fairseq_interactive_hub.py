"""fairseq-interactive and the hub interface translate as fairseq-generate does, and bad
plugin options stop fairseq-train as docs/fairseq.md documents.

test_fairseq_commands and test_fairseq_checkpoints only check that interactive and the hub
produce words of the target vocabulary: a model loaded with other options, other alphas or
another normalizer would pass them. Here, for the same source sentences and the same search
(beam 5, same maximum length), their hypotheses must be fairseq-generate's, sentence by
sentence. Each tool keeps its own batching (generate: 16 sentences with
--required-batch-size-multiple 1; interactive: one at a time; the hub: by the checkpoint's
--max-tokens), so padding must not change a translation either."""

import math
import re

import pytest

from helpers import USER_DIR, arguments, fairseq_command, read_hypotheses, run, run_interactive, run_on_model

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

BEAM = 5
MAX_LEN_B = 30  # fairseq's default max_len_a = 0: at most 30 target tokens, in all three tools
N_TEST = 40  # the tiny test set


@pytest.fixture(scope="module")
def sources(tiny_data):
    """The tiny test set's source sentences, raw, in corpus order."""
    lines = (tiny_data.raw_dir / "test.src").read_text().splitlines()
    assert len(lines) == N_TEST
    return lines


def generate(model):
    """Translate the tiny test set with fairseq-generate (batches of 16, no batch dropped).

    Args:
        model: what the `trained_model` fixture returns.

    Returns:
        ({sentence id: (score, hypothesis)}, {sentence id: source line as fairseq read it}).
    """
    proc = run_on_model(
        "fairseq-generate",
        model,
        "--gen-subset",
        "test",
        "--cpu",
        "--beam",
        str(BEAM),
        "--max-len-b",
        str(MAX_LEN_B),
        "--batch-size",
        "16",
        "--required-batch-size-multiple",
        "1",
    )
    hypotheses = read_hypotheses(proc.stdout)
    assert sorted(hypotheses) == list(range(N_TEST)), "fairseq-generate did not translate every sentence"
    source_lines = {int(i): line for i, line in re.findall(r"^S-(\d+)\t(.*)$", proc.stdout, flags=re.M)}
    return hypotheses, source_lines


@pytest.mark.parametrize("normalizer", ["softmax", "alpha_entmax"])
def test_interactive_and_hub_translate_as_generate_does(trained_model, sources, normalizer):
    from fairseq.models.transformer import TransformerModel

    model = trained_model(normalizer)
    expected, generate_sources = generate(model)
    # The test set's source side, as fairseq-generate read it, is the raw file line by line.
    assert generate_sources == dict(enumerate(sources))

    interactive = read_hypotheses(
        run_interactive(
            model.data_bin, model.checkpoint, sources, *arguments(f"--cpu --beam {BEAM} --max-len-b {MAX_LEN_B}")
        ).stdout
    )
    assert sorted(interactive) == list(range(N_TEST))
    for i in range(N_TEST):
        assert interactive[i][1] == expected[i][1], (
            f"sentence {i} ({sources[i]!r}): interactive {interactive[i][1]!r}, generate {expected[i][1]!r}"
        )
        assert interactive[i][0] == pytest.approx(expected[i][0], abs=1e-4), i

    hub = TransformerModel.from_pretrained(
        str(model.save_dir),
        checkpoint_file=model.checkpoint.name,
        data_name_or_path=str(model.data_bin),
        user_dir=USER_DIR,
        beam=BEAM,
        max_len_b=MAX_LEN_B,
    )
    assert type(hub.models[0]).__name__ == "AdaptivelySparseTransformerModel"
    assert hub.models[0].encoder.layers[0].self_attn.normalizer.name == normalizer
    translations = hub.translate(sources)
    assert len(translations) == N_TEST
    for i, translation in enumerate(translations):
        assert translation == expected[i][1], (
            f"sentence {i} ({sources[i]!r}): hub {translation!r}, generate {expected[i][1]!r}"
        )
    # The hub's scores (natural log) are fairseq-generate's too (printed in bits in H- lines).
    best = [hypotheses[0] for hypotheses in hub.generate([hub.encode(s) for s in sources], beam=BEAM)]
    for i, hypothesis in enumerate(best):
        assert hub.decode(hypothesis["tokens"]) == expected[i][1], i
        assert float(hypothesis["score"]) / math.log(2) == pytest.approx(expected[i][0], abs=1e-4), i


# --- bad plugin options through fairseq-train: exit code 2 and the option named -------------

NORMALIZERS = "softmax, sparsemax, entmax15, alpha_entmax, topk"


@pytest.mark.parametrize(
    "arguments, option, allowed",
    [
        pytest.param(["--alpha-clamp", "2,1"], "--alpha-clamp", "1 <= MIN < MAX <= 2", id="alpha-clamp 2,1"),
        pytest.param(["--alpha-clamp", "1.5,1.5"], "--alpha-clamp", "1 <= MIN < MAX <= 2", id="alpha-clamp 1.5,1.5"),
        pytest.param(["--topk", "0"], "--topk", "integers >= 1", id="topk 0"),
        pytest.param(
            ["--attention-normalizer", "nosuch"],
            "--attention-normalizer",
            NORMALIZERS,
            id="attention-normalizer nosuch",
        ),
        # 3 is outside any clamp (alpha <= 2): refused at parsing, whatever --alpha-clamp says.
        pytest.param(
            ["--alpha-clamp", "1.01,1.2", "--alpha-init", "3"],
            "--alpha-init",
            "random or a number in (1, 2]",
            id="alpha-init 3",
        ),
    ],
)
def test_fairseq_train_exits_with_code_2_naming_the_bad_option(tmp_path, arguments, option, allowed):
    """docs/fairseq.md: a bad value stops the command at argument parsing, before any data is
    read, with fairseq's usage and "fairseq-train: error: argument --OPTION: ..." (exit code 2)."""
    value = arguments[-1]
    proc = run(
        [
            fairseq_command("fairseq-train"),
            tmp_path / "no-such-data-bin",
            "--user-dir",
            USER_DIR,
            "--arch",
            "adaptively_sparse_transformer",
            "--cpu",
            *arguments,
        ],
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith("usage: fairseq-train") or "\nusage: fairseq-train" in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("fairseq-train: error:")]
    assert len(error_lines) == 1, proc.stderr[-3000:]
    error = error_lines[0]
    assert error.startswith(f"fairseq-train: error: argument {option}:"), error
    assert f"'{value}'" in error, error  # the bad value, quoted
    assert allowed in error.replace("'", ""), error
    assert "Traceback" not in proc.stderr and "no-such-data-bin" not in proc.stderr
