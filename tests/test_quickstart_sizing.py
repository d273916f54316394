"""The quickstart's sizes on a user's own corpus (--data): the documented rule for BPE merges and
the cap on training updates, the count it is applied to, the patience that stops a model before
the cap, the plan with its time estimate printed before training, and the sentence under the
table that says whether the models converged. In process, nothing trained
(tests/test_quickstart.py runs the script itself)."""

import pytest

from examples.quickstart import quickstart
from examples.quickstart.quickstart import (
    OWN_CORPUS,
    PATIENCE,
    SIZES,
    convergence_note,
    count_training_tokens,
    estimated_seconds,
    own_corpus_bpe_merges,
    own_corpus_max_update,
    own_corpus_plan,
)


@pytest.mark.parametrize(
    "pairs,merges",
    [
        (500, 1000),
        (2_000, 1000),
        (3_200, 2000),
        (5_000, 3000),
        (9_000, 5000),
        (10_000, 5000),
        (14_999, 7000),
        (15_000, 8000),
        (16_000, 8000),
        (19_689, 8000),
        (200_000, 8000),
    ],
)
def test_bpe_merges_are_one_per_two_training_pairs_from_1000_to_8000(pairs, merges):
    """Rounded to the thousand, halves up (5,000 pairs: 2,500 -> 3,000)."""
    assert own_corpus_bpe_merges(pairs) == merges


@pytest.mark.parametrize(
    "tokens,updates",
    [
        # 16,000 pairs of the IWSLT16 TED sample after Moses and 8000 merges (docs/recipes.md):
        # 30 x 434,307 / 2048 = 6361.8 batches, rounded up to the hundred.
        (434_307, 6400),
        (20_000, 1500),  # a small corpus is capped at 1500 updates (the patience stops it sooner)
        (10_000_000, 8000),  # a large one at 8000 (raise --max-update for more)
        (409_600, 6000),  # 30 x 409,600 / 2048 = 6000 exactly: not rounded up to 6100
        (409_601, 6100),
    ],
)
def test_the_cap_is_thirty_passes_over_the_training_tokens_from_1500_to_8000(tokens, updates):
    assert own_corpus_max_update(tokens) == updates
    assert own_corpus_max_update(tokens, max_tokens=OWN_CORPUS["max_tokens"]) == updates


def test_training_tokens_are_the_longer_side_plus_end_of_sentence(tmp_path):
    (tmp_path / "train.de").write_text("ein kleines Haus\nja\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("a small house .\nyes , sure\n", encoding="utf-8")
    assert count_training_tokens(tmp_path, "de", "en") == (4 + 1) + (3 + 1)


def test_plan_states_the_sizes_the_patience_and_the_estimate_at_the_cap(monkeypatch):
    monkeypatch.setattr(quickstart, "SECONDS_PER_UPDATE", dict.fromkeys(quickstart.MODELS, 0.5))
    monkeypatch.setattr(quickstart, "SECONDS_PER_TEST_SENTENCE", 0.1)
    size = dict(OWN_CORPUS, bpe_merges=8000, max_update=6400)
    # 4 x (6400 x 0.5 + 1305 x 0.1) = 13,322 s
    assert estimated_seconds(6400, quickstart.MODELS, 1305) == pytest.approx(13322.0)
    plan = "\n".join(own_corpus_plan(size, 16_000, 434_307, quickstart.MODELS, 1305, max_update_given=False))
    assert "8000 BPE merges" in plan and "at most 6400 updates of 2048 tokens per model" in plan
    assert "30.2 passes over the training data (30 passes rounded up to the hundred, 1500 to 8000)" in plan
    assert "stops earlier once its validation accuracy has not improved for 3 epochs" in plan
    assert "evaluated with its best checkpoint" in plan
    assert "at most about 222m02s for 4 model(s) (55m30s each at the cap" in plan and "--max-update N" in plan
    given = "\n".join(
        own_corpus_plan(
            dict(size, max_update=50), 16_000, 434_307, ["softmax"], 1305, max_update_given=True, patience=0
        )
    )
    assert "at most 50 updates of 2048 tokens per model, 0.2 passes over the training data (--max-update)" in given
    assert "every model trains to the cap (--patience 0)" in given
    assert "at most about 2m36s for 1 model(s)" in given  # 50 x 0.5 + 1305 x 0.1 = 155.5 s


def test_the_note_under_the_table_says_whether_the_models_converged():
    converged = [{"model": "softmax", "stopped_early": True}, {"model": "entmax15", "stopped_early": True}]
    note = convergence_note(converged, 2200)
    assert note.startswith("Every model stopped on the patience") and "unconverged" not in note
    at_cap = [{"model": "softmax", "stopped_early": True}, {"model": "entmax15", "stopped_early": False}]
    note = convergence_note(at_cap, 2200)
    assert note.startswith("Not converged: entmax15 stopped at the cap of 2200 updates")
    assert "compares unconverged models" in note and "--max-update" in note
    assert "compares unconverged models" in convergence_note(converged[:1] + at_cap[1:], 50, patience=0)


def test_measured_rates_are_filled_in_and_the_demo_sizes_are_unchanged():
    """The estimate uses measured rates (docs/recipes.md), and the toy pair keeps the sizes
    whose table the docs record."""
    assert set(quickstart.SECONDS_PER_UPDATE) == set(quickstart.MODELS)
    assert all(rate > 0 for rate in quickstart.SECONDS_PER_UPDATE.values())
    assert quickstart.SECONDS_PER_TEST_SENTENCE > 0
    assert SIZES["demo"]["bpe_merges"] == 300 and SIZES["demo"]["max_update"] == 200
    assert PATIENCE == 3  # the reproduction's patience


def test_max_update_and_bpe_merges_override_the_rule(tmp_path, monkeypatch):
    """--max-update and --bpe-merges replace the sized values; the warm-up stays within a
    quarter of the updates; every model stops on the patience of validation accuracy and is
    evaluated with its best checkpoint. Stops after the sizes are chosen (no training)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.de").write_text("ein Haus .\n" * 10, encoding="utf-8")
        (corpus / f"{split}.en").write_text("a house .\n" * 10, encoding="utf-8")
    chosen = {}

    def build_dataset(raw_dir, src, tgt, work, bpe_merges, **kwargs):
        chosen["bpe_merges"] = bpe_merges
        (work / "bpe").mkdir(parents=True)
        for split in ("train", "test"):
            for lang in (src, tgt):
                (work / "bpe" / f"{split}.{lang}").write_text("x y z\n" * 10, encoding="utf-8")
        return work / "bpe", work / "data-bin"

    class Stop(Exception):
        pass

    def train_and_evaluate(data_bin, work, model, settings, *args, **kwargs):
        chosen["settings"], chosen["select"] = settings, kwargs["select"]
        raise Stop

    monkeypatch.setattr(quickstart, "build_dataset", build_dataset)
    monkeypatch.setattr(quickstart, "train_and_evaluate", train_and_evaluate)

    def sizes(*options):
        work = tmp_path / ("work" + "".join(options))
        args = quickstart.parse_args(
            [
                "--data",
                str(corpus),
                "--src",
                "de",
                "--tgt",
                "en",
                "--models",
                "softmax",
                "--work-dir",
                str(work),
                *options,
            ]
        )
        with pytest.raises(Stop):
            quickstart.run(args)
        return chosen["bpe_merges"], chosen["settings"].max_update, chosen["settings"].warmup_updates

    # 10 pairs of 4 batch tokens (3 + end of sentence): the rule's floors, 1000 merges and a cap
    # of 1500 updates, 375 of them warm-up.
    assert sizes() == (1000, 1500, 375)
    settings = chosen["settings"]
    assert (settings.patience, settings.best_metric, chosen["select"]) == (3, "accuracy", "best")
    assert sizes("--max-update", "40") == (1000, 40, 10)
    assert sizes("--max-update", "4000", "--bpe-merges", "500") == (500, 4000, 400)
    sizes("--patience", "0")
    assert chosen["settings"].patience == 0 and chosen["settings"].best_metric == "accuracy"


def test_patience_is_for_a_users_corpus():
    with pytest.raises(SystemExit) as stop:
        quickstart.parse_args(["--patience", "2"])
    assert stop.value.code == 2
    with pytest.raises(SystemExit):
        quickstart.parse_args(["--data", "x", "--src", "de", "--tgt", "en", "--patience", "-1"])
