"""The quickstart's sizes on a user's own corpus (--data): the documented rule for BPE merges and
the cap on training updates, the count it is applied to, the patience that stops a model before
the cap, the plan with its time estimate printed before training, the projected total once the
first model is done, and the sentence under the table that says whether the models converged.
In process, nothing trained (tests/test_quickstart.py runs the script itself)."""

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from examples.quickstart import quickstart
from examples.quickstart.quickstart import (
    CAP_MARGIN,
    CONVERGENCE_FILE,
    OWN_CORPUS,
    PASSES_TO_STOP,
    PATIENCE,
    SIZES,
    convergence_note,
    count_training_tokens,
    estimated_seconds,
    expected_updates,
    own_corpus_bpe_merges,
    own_corpus_max_update,
    own_corpus_plan,
    planned_updates,
    projected_seconds,
)
from fairseq_entmax.pipeline.runner import call_step, run_steps

REPO = Path(__file__).resolve().parents[1]


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
        # Multi30k's first 11,422 pairs after Moses and 6000 merges (docs/recipes.md):
        # 1.5 x 37.7 passes x 187,457 / 2048 = 5,176.1 batches, rounded up to the hundred.
        (187_457, 5200),
        # The first 16,000 pairs of the IWSLT16 TED sample, 8000 merges: 11,992.2, just under the bound.
        (434_307, 12000),
        (20_000, 1500),  # a small corpus is capped at 1500 updates (the patience stops it sooner)
        (10_000_000, 12000),  # a large one at 12000 (raise --max-update for more)
        (217_294, 6000),  # 1.5 x 37.7 x 217,294 / 2048 = 5999.99: 6000
        (217_295, 6100),  # 6000.02: rounded up
    ],
)
def test_the_cap_is_one_and_a_half_times_the_slowest_measured_stop_from_1500_to_12000(tokens, updates):
    assert own_corpus_max_update(tokens) == updates
    assert own_corpus_max_update(tokens, max_tokens=OWN_CORPUS["max_tokens"]) == updates


def test_the_cap_leaves_every_measured_model_room_to_stop_on_the_patience():
    """The convergence measurements (convergence.json, the table of docs/recipes.md) as the rule
    reads them: the cap sized for each measured corpus is above the update at which the
    patience stopped each model there, by the margin the rule promises, and the typical stop is
    their mean."""
    measured = json.loads(CONVERGENCE_FILE.read_text(encoding="utf-8"))
    assert measured["max_tokens"] == OWN_CORPUS["max_tokens"] and len(measured["runs"]) == 14
    passes = []
    for run in measured["runs"]:
        tokens, stop = run["batch_tokens_per_pass"], run["stopped_at_update"]
        assert stop * CAP_MARGIN <= own_corpus_max_update(tokens), run
        assert stop <= expected_updates(tokens, passes=PASSES_TO_STOP["most"]), run
        passes.append(stop * OWN_CORPUS["max_tokens"] / tokens)
    assert max(passes) == pytest.approx(PASSES_TO_STOP["most"], abs=0.05)
    assert sum(passes) / len(passes) == pytest.approx(PASSES_TO_STOP["typical"], abs=0.05)


def test_the_measurements_file_is_the_table_of_the_docs():
    """Each run of convergence.json is a row of docs/recipes.md's convergence table: corpus and
    pairs, batch tokens per pass, (merges,) threads, model and stopping update."""
    table = (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")
    for run in json.loads(CONVERGENCE_FILE.read_text(encoding="utf-8"))["runs"]:
        cells = [f"{run['corpus']}, {run['pairs']:,}", f"{run['batch_tokens_per_pass']:,}"]
        after = [str(run["threads"]), run["normalizer"], f"{run['stopped_at_update']:,} ("]
        row = r"\| " + r" \| ".join(map(re.escape, cells)) + r" \| [\d,]+ \| " + r" \| ".join(map(re.escape, after))
        assert re.search(row, table), run


def test_training_tokens_are_the_longer_side_plus_end_of_sentence(tmp_path):
    (tmp_path / "train.de").write_text("ein kleines Haus\nja\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("a small house .\nyes , sure\n", encoding="utf-8")
    assert count_training_tokens(tmp_path, "de", "en") == (4 + 1) + (3 + 1)


@pytest.fixture
def round_passes(monkeypatch):
    """Round figures in place of the measured passes, so that the arithmetic below can be
    checked by hand: 20 passes typical, 30 the most."""
    monkeypatch.setattr(quickstart, "PASSES_TO_STOP", {"typical": 20, "most": 30})


# Rates as timing_steps gives them (seconds per update, timed on the user's machine).
RATES = {"softmax": 0.5, "entmax15": 0.5, "alpha_entmax": 0.75, "topk": 0.25}


def test_the_estimate_is_each_models_updates_at_its_timed_rate():
    # 6,400 x (0.5 + 0.5 + 0.75 + 0.25) = 12,800 s
    assert estimated_seconds(6400, RATES) == pytest.approx(12800.0)
    assert estimated_seconds(6400, {"softmax": 0.5}) == pytest.approx(3200.0)


def test_the_projection_scales_the_first_models_measured_cost_by_the_timed_rates():
    # softmax: 60 s of training for 100 updates timed at 0.5 s: 1.2 s per timed second, and 10 s
    # to evaluate. topk, 200 updates: 200 x 0.25 x 1.2 + 10 x 0.5 = 65 s; alpha_entmax:
    # 200 x 0.75 x 1.2 + 10 x 1.5 = 195 s; after the 100 s so far, 360 s in all.
    done = ("softmax", 100, 60.0, 10.0)
    assert projected_seconds(100.0, done, RATES, ["topk", "alpha_entmax"], 200) == pytest.approx(360.0)
    assert projected_seconds(100.0, done, RATES, [], 200) == pytest.approx(100.0)
    assert projected_seconds(0.0, done, RATES, ["topk"], 200) == pytest.approx(65.0)


def test_planned_updates_are_the_typical_stop_or_the_cap(round_passes):
    size = dict(OWN_CORPUS, max_update=9600)
    assert planned_updates(size, 434_307, patience=3) == 4300
    assert planned_updates(size, 434_307, patience=0) == 9600
    assert planned_updates(dict(size, max_update=50), 434_307, patience=3) == 50


def test_the_first_model_done_logs_the_projected_total(tmp_path, monkeypatch, round_passes):
    """Each model takes 60 s to train 100 updates and 10 s to evaluate on a clock the test
    moves; the first one done projects the others' time at its cost, once, before the next
    trains. 1,000 pairs of 4 batch tokens: 20 passes are 39 batches, planned as 100 updates."""
    clock = [0.0]
    monkeypatch.setattr(quickstart, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_text("x y z\n" * 1000, encoding="utf-8")

    def dataset_steps(raw_dir, src, tgt, work, bpe_merges, **kwargs):
        (work / "bpe").mkdir(parents=True)
        for lang in (src, tgt):
            (work / "bpe" / f"train.{lang}").write_text("x y z\n" * 1000, encoding="utf-8")
        return [call_step("# data", lambda: clock.__setitem__(0, clock[0] + 30))], work / "bpe", work / "data-bin"

    def model_steps(data_bin, work, model, settings, references, rows, decoding, selections, **kwargs):
        def train_and_evaluate():
            clock[0] += 70
            rows.append({"model": model.normalizer, "updates": 100, "train_seconds": 60.0})

        return [call_step(f"# {model.normalizer}", train_and_evaluate)]

    def timing_steps(data_bin, work, settings, models, threads, cpu, rates):
        rates.update({model: RATES[model] for model in models})
        return []

    logged = []
    monkeypatch.setattr(quickstart, "dataset_steps", dataset_steps)
    monkeypatch.setattr(quickstart, "model_steps", model_steps)
    monkeypatch.setattr(quickstart, "timing_steps", timing_steps)
    monkeypatch.setattr(quickstart, "analysis_step", lambda *args, **kwargs: call_step("# analysis", lambda: None))
    monkeypatch.setattr(quickstart, "log", logged.append)
    options = ["--data", str(corpus), "--src", "de", "--tgt", "en", "--threads", "1", "--max-update", "400"]
    args = quickstart.parse_args([*options, "--models", "softmax", "topk", "alpha_entmax"])
    corpus_of = quickstart.Corpus.of(args, tmp_path / "work")
    corpus_of.counts = {"train": 1000, "valid": 1000, "test": 1000}
    size = dict(OWN_CORPUS, bpe_merges=1000, max_update=400)
    run_steps(quickstart.quickstart_steps(args, tmp_path / "work", size, 3, corpus_of, []))
    [projection] = [line for line in logged if line.startswith("projected total")]
    # 30 s of data, 70 s of softmax; topk 100 x 0.25 x 1.2 + 10 x 0.5 = 35 s; alpha_entmax
    # 100 x 0.75 x 1.2 + 10 x 1.5 = 105 s: 240 s in all.
    assert projection.startswith("projected total: about 4m00s, 1m40s of it done; the 2 model(s) left each near 100")
    assert "softmax's measured cost (training with validation and checkpoints, 10s to translate" in projection
    assert logged.index(projection) == 1 + next(i for i, line in enumerate(logged) if line.startswith("softmax [1/3]"))


def test_the_timed_rate_leaves_out_the_first_log_line():
    """fairseq's updates per second after its first log line (start-up and first batches); the
    epochs' own lines where an epoch is shorter than the log interval; a log without either is
    refused, naming it."""
    inner = "".join(
        f"2026-12-06 09:00:1{i} | INFO | train_inner | epoch 001:  {2 * i} / 9 loss=1, ups={ups}, wpb=10, wall={i}\n"
        for i, ups in enumerate([0.5, 2, 4, 4], 1)
    )
    assert quickstart.timed_rate(inner, "log") == pytest.approx((1 / 2 + 1 / 4 + 1 / 4) / 3)
    epochs = "".join(
        f"2026-12-06 09:00:1{i} | INFO | train | epoch 00{i} | loss 1 | ups {ups} | wpb 10 | wall {i}\n"
        for i, ups in enumerate([1, 2.5], 1)
    )
    assert quickstart.timed_rate(epochs, "log") == pytest.approx(0.4)
    with pytest.raises(quickstart.PipelineError, match="no training rate to time \\(work/train.log\\)"):
        quickstart.timed_rate("| INFO | fairseq_cli.train | done training\n", "work/train.log")


def test_plan_states_the_sizes_the_typical_time_and_the_time_at_the_cap(round_passes):
    # 434,307 batch tokens per pass: 212.06 batches of 2048. The cap: 1.5 x 30 passes = 9,542.8
    # batches, rounded up to 9,600; the typical stop: 20 passes, 4,241.3, rounded up to 4,300.
    assert own_corpus_max_update(434_307) == 9600 and expected_updates(434_307) == 4300
    size = dict(OWN_CORPUS, bpe_merges=8000, max_update=9600)
    counts = {"train": 16_000, "test": 1305}
    plan = own_corpus_plan(size, counts, 434_307, RATES, max_update_given=False, threads=1)
    assert len(plan) == 2, "a cap of the rule's own is no reason for a warning"
    assert "8000 BPE merges" in plan[0] and "at most 9600 updates of 2048 tokens per model" in plan[0]
    assert "45.3 passes over the training data (1.5 x the 30 passes the slowest measured model" in plan[0]
    assert "stops earlier once its validation accuracy has not improved for 3 epochs" in plan[0]
    # 4,300 x 2 = 8,600 s; at the cap 9,600 x 2 = 19,200 s.
    assert plan[1].startswith("estimate: about 143m20s for 4 model(s) if each stops near 4300 updates (20 passes")
    assert "at most 320m00s at the cap; the training updates" in plan[1]
    rates = "softmax 0.500, entmax15 0.500, alpha_entmax 0.750, topk 0.250 s per update"
    assert f"timed on this machine at 1 thread(s) (--threads): {rates}" in plan[1]


def test_a_cap_below_the_slowest_measured_stop_is_warned_of(round_passes):
    size = dict(OWN_CORPUS, bpe_merges=8000, max_update=50)
    counts = {"train": 16_000, "test": 1305}
    given = own_corpus_plan(size, counts, 434_307, {"softmax": 0.5}, max_update_given=True, threads=2)
    assert "at most 50 updates of 2048 tokens per model, 0.2 passes over the training data (--max-update)" in given[0]
    # 50 x 0.5 = 25 s.
    assert given[1].startswith("estimate: about 25s for 1 model(s), each training to the cap of 50 updates")
    assert "at 2 thread(s) (--threads): softmax 0.500 s per update" in given[1]
    # The slowest stop: 30 passes, 6,361.8 batches, 6,400; room: the rule's 9,600, at most
    # 9,600 x 0.5 = 4,800 s.
    assert given[2] == (
        "warning: the cap of 50 updates is below the 6400 (30 passes) that the slowest measured model needed "
        "before the patience stopped it: models may stop at the cap, unconverged, which the table will say; "
        "--max-update 9600 gives them room, at most 80m00s"
    )
    zero = own_corpus_plan(size, counts, 434_307, {"softmax": 0.5}, max_update_given=True, patience=0, threads=2)
    assert "every model trains to the cap (--patience 0)" in zero[0]
    assert len(zero) == 2, "without a patience every model trains to the cap: nothing to warn of"


def test_the_note_under_the_table_says_whether_the_models_converged():
    converged = [{"model": "softmax", "stopped_early": True}, {"model": "entmax15", "stopped_early": True}]
    note = convergence_note(converged, 2200)
    assert note.startswith("Every model stopped on the patience") and "unconverged" not in note
    at_cap = [{"model": "softmax", "stopped_early": True}, {"model": "entmax15", "stopped_early": False}]
    note = convergence_note(at_cap, 2200)
    assert note.startswith("Not converged: entmax15 stopped at the cap of 2200 updates")
    assert "compares unconverged models" in note and "--max-update" in note
    assert "compares unconverged models" in convergence_note(converged[:1] + at_cap[1:], 50, patience=0)


def test_the_demo_sizes_are_unchanged():
    """The toy pair keeps the sizes whose table the docs record."""
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

    def dataset_steps(raw_dir, src, tgt, work, bpe_merges, **kwargs):
        chosen["bpe_merges"] = bpe_merges
        (work / "bpe").mkdir(parents=True)
        for split in ("train", "test"):
            for lang in (src, tgt):
                (work / "bpe" / f"{split}.{lang}").write_text("x y z\n" * 10, encoding="utf-8")
        return [], work / "bpe", work / "data-bin"

    class Stop(Exception):
        pass

    def model_steps(data_bin, work, model, settings, references, rows, decoding, selections, **kwargs):
        chosen["settings"], [chosen["select"]] = settings, selections
        raise Stop

    monkeypatch.setattr(quickstart, "dataset_steps", dataset_steps)
    monkeypatch.setattr(quickstart, "model_steps", model_steps)

    # No data-bin here to time updates on (tests/test_quickstart.py times them for real).
    def timing_steps(data_bin, work, settings, models, threads, cpu, rates):
        rates.update({model: RATES[model] for model in models})
        return []

    monkeypatch.setattr(quickstart, "timing_steps", timing_steps)

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
