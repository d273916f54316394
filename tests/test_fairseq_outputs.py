"""Sparse output distributions through fairseq's commands: fairseq-train with the entmax_loss
criterion (--loss-alpha 1, 1.5 with learned-alpha attention, 2), then fairseq-generate (beam
search, --nbest, --score-reference), fairseq-interactive and the hub on the result; beam
searches that run out of finite-probability continuations; softmax models unchanged.

The models train a handful of updates: these tests check the wiring (what is logged, what the
checkpoint records, what decoding does with exact zeros), not translation quality."""

import json
import math
import re

import pytest
import torch

from helpers import USER_DIR, arguments, run_interactive, run_on_checkpoint, train_tiny

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

N_TEST = 40  # sentences of the tiny test set
BEAM, NBEST = 5, 3
UPDATES = 12


def json_records(log, tag):
    """The JSON stats fairseq-train logs with --log-format json under `tag` (train_inner, ...)."""
    return [json.loads(line[line.find("{") :]) for line in log.splitlines() if f"| {tag} |" in line and "{" in line]


def hypotheses_by_sentence(output):
    """{sentence id: [(score, positional scores, text), ...]} from fairseq-generate/-interactive's
    H- and P- lines, in the order printed."""
    found = {}
    lines = output.splitlines()
    for index, line in enumerate(lines):
        hypothesis = re.match(r"^H-(\d+)\t(\S+)\t(.*)$", line)
        if hypothesis:
            positional = re.match(r"^P-\d+\t(.*)$", next(line for line in lines[index + 1 :] if line.startswith("P-")))
            found.setdefault(int(hypothesis.group(1)), []).append(
                (float(hypothesis.group(2)), [float(x) for x in positional.group(1).split()], hypothesis.group(3))
            )
    return found


# name: (fairseq-train arguments after the tiny model's, number of updates)
TRAININGS = {
    "sparsemax_output": (
        ["--attention-normalizer", "softmax", "--criterion", "entmax_loss", "--loss-alpha", "2", "--report-accuracy"],
        UPDATES,
    ),
    "entmax15_output_learned_alpha_attention": (
        [
            "--attention-normalizer",
            "alpha_entmax",
            "--criterion",
            "entmax_loss",
            "--loss-alpha",
            "1.5",
            "--label-smoothing",
            "0.1",
            "--report-accuracy",
        ],
        UPDATES,
    ),
    "softmax_output": (["--attention-normalizer", "softmax", "--criterion", "entmax_loss", "--loss-alpha", "1"], 5),
    "label_smoothed_cross_entropy": (
        ["--attention-normalizer", "softmax", "--criterion", "label_smoothed_cross_entropy"],
        5,
    ),
}
SPARSE_MODELS = ("entmax15_output_learned_alpha_attention", "sparsemax_output")


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """Factory: trained(name) runs fairseq-train on the tiny corpus for TRAININGS[name], once per
    module, with a log line per update; returns (save_dir, log)."""
    done = {}

    def train(name):
        if name not in done:
            arguments, updates = TRAININGS[name]
            save_dir = tmp_path_factory.mktemp(name)
            # (the options of TRAININGS[name] come after the tiny model's training options and win)
            proc = train_tiny(
                tiny_data.data_bin, save_dir, *arguments, "--log-interval", "1", "--max-update", str(updates)
            )
            done[name] = (save_dir, proc.log)
        return done[name]

    return train


def _vocabulary_size(tiny_data):
    from fairseq.data import Dictionary

    return len(Dictionary.load(str(tiny_data.data_bin / "dict.tgt.txt")))


def test_alpha_one_trains_as_label_smoothed_cross_entropy(trained):
    """--loss-alpha 1 is cross-entropy: the same losses, update by update, as fairseq's
    label_smoothed_cross_entropy (smoothing 0) from the same seed."""
    ours, theirs = (
        json_records(trained(name)[1], "train_inner") for name in ("softmax_output", "label_smoothed_cross_entropy")
    )
    assert len(ours) == len(theirs) == 5
    for step, (mine, their) in enumerate(zip(ours, theirs)):
        for key in ("loss", "nll_loss", "ppl"):
            assert float(mine[key]) == pytest.approx(float(their[key]), abs=0.0011), (step, key, mine, their)


@pytest.mark.parametrize("name", SPARSE_MODELS)
def test_training_logs_support_and_accuracy_and_the_checkpoint_records_alpha(trained, tiny_data, name):
    from fairseq import checkpoint_utils

    save_dir, log = trained(name)
    records = json_records(log, "train_inner")
    assert len(records) == UPDATES, log[-3000:]
    vocabulary = _vocabulary_size(tiny_data)
    for record in records:
        assert 1 <= float(record["output_support"]) < vocabulary, record
        assert 0 <= float(record["accuracy"]) <= 100
        assert "nll_loss" not in record  # no likelihood at alpha > 1
        assert math.isfinite(float(record["loss"]))
    assert float(records[-1]["loss"]) < float(records[0]["loss"]), "training did not learn"
    if "learned_alpha" in name:
        assert "alpha_cross_mean" in records[-1]
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save_dir / "checkpoint_last.pt"))
    arguments = TRAININGS[name][0]
    loss_alpha = float(arguments[arguments.index("--loss-alpha") + 1])
    assert state["cfg"]["model"].loss_alpha == loss_alpha


def test_softmax_output_logs_the_whole_vocabulary_as_support(trained, tiny_data):
    _, log = trained("softmax_output")
    records = json_records(log, "train_inner")
    assert records and all(float(r["output_support"]) == _vocabulary_size(tiny_data) for r in records)


def _generate(save_dir, tiny_data, *arguments):
    return run_on_checkpoint(
        "fairseq-generate",
        tiny_data.data_bin,
        save_dir / "checkpoint_last.pt",
        *("--gen-subset", "test", "--cpu", "--beam", str(BEAM), "--batch-size", "16"),
        *arguments,
    ).stdout


def _assert_no_nan_and_every_sentence(output, at_most):
    found = hypotheses_by_sentence(output)
    assert sorted(found) == list(range(N_TEST)), output[-3000:]
    assert not [line for line in output.splitlines() if line[:2] in ("H-", "D-", "P-") and "nan" in line.lower()]
    for hypotheses in found.values():
        assert 1 <= len(hypotheses) <= at_most
        scores = [score for score, _, _ in hypotheses]
        assert scores == sorted(scores, reverse=True)
        # -inf only for a sentence that found no hypothesis of nonzero probability (one then)
        assert all(math.isfinite(score) for score in scores) or len(scores) == 1
        for score, positional, _ in hypotheses:
            assert not math.isnan(score) and not any(math.isnan(x) for x in positional)
            # a finite score has finite positional scores, and a hypothesis that ran into a
            # zero-probability token is -inf
            assert math.isfinite(score) == all(math.isfinite(x) for x in positional)
    return found


def test_generate_nbest_from_sparse_outputs(trained, tiny_data):
    save_dir, _ = trained("entmax15_output_learned_alpha_attention")
    _assert_no_nan_and_every_sentence(_generate(save_dir, tiny_data, "--nbest", str(NBEST)), NBEST)


def test_score_reference_with_sparse_outputs(trained, tiny_data):
    """Scoring the references: a reference holding a token of probability 0 scores -inf."""
    save_dir, _ = trained("sparsemax_output")
    output = _generate(save_dir, tiny_data, "--score-reference")
    found = _assert_no_nan_and_every_sentence(output, 1)
    references = dict(re.findall(r"^T-(\d+)\t(.*)$", output, flags=re.M))
    for sentence, [(_, _, text)] in found.items():
        assert text == references[str(sentence)]
    assert any(math.isinf(hypotheses[0][0]) for hypotheses in found.values()), "no reference outside the support"


def test_interactive_with_sparse_outputs(trained, tiny_data):
    save_dir, _ = trained("entmax15_output_learned_alpha_attention")
    sources = (tiny_data.raw_dir / "test.src").read_text().splitlines()[:4]
    output = run_interactive(
        tiny_data.data_bin,
        save_dir / "checkpoint_last.pt",
        sources,
        *arguments(f"--beam {BEAM} --nbest {NBEST} --cpu"),
    ).stdout
    found = hypotheses_by_sentence(output)
    assert sorted(found) == list(range(len(sources))), output[-3000:]
    for hypotheses in found.values():
        assert 1 <= len(hypotheses) <= NBEST


def _hub(save_dir, tiny_data, **overrides):
    from fairseq.models.transformer import TransformerModel

    return TransformerModel.from_pretrained(
        str(save_dir),
        checkpoint_file="checkpoint_last.pt",
        data_name_or_path=str(tiny_data.data_bin),
        user_dir=USER_DIR,
        **overrides,
    )


def test_hub_decodes_with_the_recorded_entmax(trained, tiny_data):
    """The loaded model's output distribution is the trained map, with exact zeros (log-prob
    -inf), summing to 1; --model-overrides (here the hub's keyword) can decode it with softmax."""
    save_dir, _ = trained("sparsemax_output")
    hub = _hub(save_dir, tiny_data, beam=BEAM, max_len_b=20)
    model = hub.models[0]
    assert model.output_alpha == 2.0
    sources = (tiny_data.raw_dir / "test.src").read_text().splitlines()[:8]
    tokens = [hub.encode(source) for source in sources]
    source = tokens[0].unsqueeze(0)
    previous = torch.tensor([[hub.task.target_dictionary.eos()]])
    with torch.no_grad():
        net_output = model(source, torch.tensor([source.shape[1]]), previous)
        probs = model.get_normalized_probs(net_output, log_probs=False)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
    assert (probs == 0).any() and torch.equal(lprobs == -math.inf, probs == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 1))
    translations = hub.translate(sources)
    assert len(translations) == len(sources)
    softmax = _hub(save_dir, tiny_data, loss_alpha=1.0).models[0]
    assert softmax.output_alpha == 1.0
    with torch.no_grad():
        assert (
            softmax.get_normalized_probs(softmax(source, torch.tensor([source.shape[1]]), previous), False) > 0
        ).all()


def test_beam_search_that_runs_out_of_continuations_ends_every_sentence(trained, tiny_data):
    """--prefix-size 1 forces the reference's first token, to which the barely trained sparse
    model often gives probability 0: every candidate of the first step is then -inf. fairseq's
    own beam search extends those hypotheses to the maximum length and stops there
    (AssertionError); with the repair the sentence ends at once, with a single hypothesis
    (empty: no prefix had nonzero probability) scored -inf, never NaN, and the other sentences
    are searched as usual (--nbest 3)."""
    from fairseq.sequence_generator import SequenceGenerator

    save_dir, _ = trained("sparsemax_output")
    output = _generate(save_dir, tiny_data, "--prefix-size", "1", "--nbest", str(NBEST))
    found = _assert_no_nan_and_every_sentence(output, NBEST)
    dead_ends = sorted(sentence for sentence, hypotheses in found.items() if math.isinf(hypotheses[0][0]))
    assert dead_ends, "no sentence ran out of continuations: the case is not exercised"
    assert len(dead_ends) < N_TEST
    for sentence in dead_ends:
        assert found[sentence] == [(-math.inf, [-math.inf], "")]

    hub = _hub(save_dir, tiny_data, beam=BEAM, max_len_b=20)
    source = (tiny_data.raw_dir / "test.src").read_text().splitlines()[dead_ends[0]]
    reference = (tiny_data.raw_dir / "test.tgt").read_text().splitlines()[dead_ends[0]]
    prefix = {"prefix_tokens": torch.tensor([[hub.task.target_dictionary.index(reference.split()[0])]])}
    [hypotheses] = hub.generate([hub.encode(source)], beam=BEAM, inference_step_args=prefix)
    assert [(hub.decode(h["tokens"]), float(h["score"])) for h in hypotheses] == [("", -math.inf)]
    repaired = SequenceGenerator._generate
    SequenceGenerator._generate = repaired.__wrapped__
    try:
        with pytest.raises(AssertionError):
            hub.generate([hub.encode(source)], beam=BEAM, inference_step_args=prefix)
    finally:
        SequenceGenerator._generate = repaired


def test_softmax_models_decode_as_fairseq_does(trained, tiny_data):
    """A model trained without sparse outputs (here --loss-alpha 1) gets fairseq's softmax
    and fairseq's beam search: the same hypotheses and the same scores, bit for bit."""
    from fairseq.models.transformer import TransformerModel
    from fairseq.sequence_generator import SequenceGenerator

    save_dir, _ = trained("softmax_output")
    hub = _hub(save_dir, tiny_data, beam=BEAM, max_len_b=20)
    model = hub.models[0]
    assert model.output_alpha == 1.0
    tokens = [hub.encode(source) for source in (tiny_data.raw_dir / "test.src").read_text().splitlines()]
    ours = hub.generate(tokens, beam=BEAM, nbest=BEAM)
    repaired = SequenceGenerator._generate
    SequenceGenerator._generate = repaired.__wrapped__
    model.get_normalized_probs = TransformerModel.get_normalized_probs.__get__(model)
    try:
        fairseqs = hub.generate(tokens, beam=BEAM, nbest=BEAM)
    finally:
        SequenceGenerator._generate = repaired
        del model.get_normalized_probs
    for mine, theirs in zip(ours, fairseqs, strict=True):
        assert len(mine) == len(theirs) == BEAM
        for a, b in zip(mine, theirs):
            assert torch.equal(a["tokens"], b["tokens"])
            assert torch.equal(a["positional_scores"], b["positional_scores"]) and torch.equal(a["score"], b["score"])
