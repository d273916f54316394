"""Alpha trajectories read back from logs written by fairseq's own progress bars (the code
fairseq-train logs with), in its simple and json formats and to tensorboard; validation
learning curves read from the logs of real fairseq-train runs and hand-written snippets, their
figure, and learning_curves.png through the real fairseq-entmax-analyze command."""

import json
import logging
import re
import struct

import pytest
from fairseq.logging import progress_bar

from fairseq_entmax.analysis.plots import mean_over_runs, plot_learning_curves
from fairseq_entmax.analysis.training_log import (
    group_by_normalizer,
    normalizer_name,
    read_log_file,
    read_tensorboard,
    read_trajectories,
    read_validation_curve,
)
from helpers import USER_DIR, arguments, fairseq_command, run, run_analyze

pytestmark = pytest.mark.usefixtures("fairseq_plugin")

# fairseq_cli.train's console format, and what its --log-file gets (the bare message)
CONSOLE_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
LOG_FILE_FORMAT = "%(message)s"

STEPS = (10, 20, 30)


def alpha_stats(step):
    """What the model logs at an update: alpha mean/min/max per type and per head."""
    heads = {
        f"alpha_encoder_self_L{layer}_H{head}": 1.0 + 0.01 * step + 0.1 * layer + 0.02 * head
        for layer in range(2)
        for head in range(2)
    }
    values = list(heads.values())
    return {
        "loss": 3.0 - 0.01 * step,
        "alpha_encoder_self_mean": sum(values) / len(values),
        "alpha_encoder_self_min": min(values),
        "alpha_encoder_self_max": max(values),
        "alpha_cross_mean": 1.9 - 0.001 * step,
        **heads,
        "num_updates": step,
    }


def write_training_log(path, log_format, tensorboard_logdir=None, inner=True, line_format=CONSOLE_FORMAT):
    """Log STEPS as fairseq-train does: train_inner lines, then the end-of-epoch summary, and a
    validation summary (which carries no alpha)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(line_format))
    bar_logger = logging.getLogger("fairseq.logging.progress_bar")
    bar_logger.addHandler(handler)
    bar_logger.setLevel(logging.INFO)
    try:
        bar = progress_bar.progress_bar(
            range(len(STEPS)),
            log_format=log_format,
            log_interval=1,
            epoch=1,
            tensorboard_logdir=tensorboard_logdir,
            default_log_format=log_format,
        )
        for _, step in zip(bar, STEPS):
            if inner:
                bar.log(alpha_stats(step), tag="train_inner", step=step)
        bar.print(alpha_stats(STEPS[-1]), tag="train", step=STEPS[-1])
        valid = progress_bar.progress_bar(
            range(1), log_format=log_format, epoch=1, prefix="valid on 'valid' subset", default_log_format=log_format
        )
        valid.print({"loss": 2.5, "num_updates": STEPS[-1]}, tag="valid", step=STEPS[-1])
    finally:
        bar_logger.removeHandler(handler)
        handler.close()
    return path


def series(trajectories, attention, statistic, layer=None, head=None):
    found = [
        t
        for t in trajectories
        if (t["attention"], t["statistic"], t["layer"], t["head"]) == (attention, statistic, layer, head)
    ]
    assert len(found) == 1, f"expected one {attention} {statistic} L{layer} H{head} series"
    return found[0]


@pytest.mark.parametrize("line_format", [CONSOLE_FORMAT, LOG_FILE_FORMAT], ids=["console", "log_file"])
@pytest.mark.parametrize("log_format", ["simple", "json"])
def test_log_file_gives_the_logged_alpha_per_update(tmp_path, log_format, line_format):
    log = write_training_log(tmp_path / "train.log", log_format, line_format=line_format)
    trajectories = read_log_file(log)
    for statistic in ("mean", "min", "max"):
        trajectory = series(trajectories, "encoder_self", statistic)
        assert trajectory["steps"] == list(STEPS)
        expected = [alpha_stats(s)[f"alpha_encoder_self_{statistic}"] for s in STEPS]
        assert trajectory["values"] == pytest.approx(expected, rel=1e-5)
    head = series(trajectories, "encoder_self", "head", layer=1, head=0)
    assert head["values"] == pytest.approx([alpha_stats(s)["alpha_encoder_self_L1_H0"] for s in STEPS], rel=1e-5)
    assert series(trajectories, "cross", "mean")["steps"] == list(STEPS)
    # only alpha keys become trajectories (loss is not one), each series once
    assert len(trajectories) == 3 + 4 + 1


@pytest.mark.parametrize("line_format", [CONSOLE_FORMAT, LOG_FILE_FORMAT], ids=["console", "log_file"])
@pytest.mark.parametrize("log_format", ["simple", "json"])
def test_log_with_only_epoch_summaries_is_read_too(tmp_path, log_format, line_format):
    log = write_training_log(tmp_path / "train.log", log_format, inner=False, line_format=line_format)
    trajectory = series(read_log_file(log), "encoder_self", "mean")
    assert trajectory["steps"] == [STEPS[-1]]
    assert trajectory["values"] == pytest.approx([alpha_stats(STEPS[-1])["alpha_encoder_self_mean"]], rel=1e-5)


def test_tensorboard_logdir_gives_every_head(tmp_path):
    write_training_log(tmp_path / "train.log", "simple", tensorboard_logdir=str(tmp_path / "tb"))
    trajectories = read_trajectories(tmp_path / "tb")
    for layer in range(2):
        for head in range(2):
            key = f"alpha_encoder_self_L{layer}_H{head}"
            trajectory = series(trajectories, "encoder_self", "head", layer=layer, head=head)
            assert trajectory["steps"] == list(STEPS)
            assert trajectory["values"] == pytest.approx([alpha_stats(s)[key] for s in STEPS], rel=1e-6)
    assert read_tensorboard(tmp_path / "tb") == trajectories


def test_log_without_alpha_gives_no_trajectories_and_missing_log_is_an_error(tmp_path):
    log = tmp_path / "softmax.log"
    write_training_log(log, "simple")
    log.write_text("\n".join(line for line in log.read_text().splitlines() if "alpha" not in line))
    assert read_trajectories(log) == []
    with pytest.raises(FileNotFoundError, match="no_such.log"):
        read_trajectories(tmp_path / "no_such.log")


# --- validation learning curves ------------------------------------------------------------

VALIDATE_EVERY, VALIDATED_UPDATES = 10, 30


@pytest.fixture(scope="module")
def validated_run(tiny_data, tiny_model_args, tmp_path_factory):
    """A tiny softmax model trained through fairseq-train for 30 updates, validated every 10
    (--report-accuracy), logging in simple format to --log-file and to --tensorboard-logdir."""
    root = tmp_path_factory.mktemp("validated_run")
    run(
        [
            fairseq_command("fairseq-train"),
            tiny_data.data_bin,
            "--user-dir",
            USER_DIR,
            *tiny_model_args,
            "--attention-normalizer",
            "softmax",
            "--report-accuracy",
            "--log-format",
            "simple",
            "--validate-interval-updates",
            str(VALIDATE_EVERY),
            "--max-update",
            str(VALIDATED_UPDATES),
            "--save-dir",
            root / "checkpoints",
            "--log-file",
            root / "train.log",
            "--tensorboard-logdir",
            root / "tb",
        ]
    )
    return root


def logged_validations(text):
    """{num_updates: ppl} of the 'valid' subset's validation summaries in a raw fairseq log,
    by a regex on each format (independent of the parser under test), in the order logged."""
    found = []
    for line in text.splitlines():
        if "valid on 'valid' subset |" in line:
            found.append(
                (
                    int(re.search(r"\| num_updates (\d+)", line).group(1)),
                    float(re.search(r"\| ppl ([\d.]+)", line).group(1)),
                )
            )
        elif '"valid_num_updates"' in line:
            found.append(
                (
                    int(re.search(r'"valid_num_updates": "?(\d+)', line).group(1)),
                    float(re.search(r'"valid_ppl": "?([\d.]+)', line).group(1)),
                )
            )
    return found


@pytest.mark.slow
def test_validation_curve_of_a_fairseq_train_log_in_json_format(trained_model, tmp_path):
    """The session fixture's model: fairseq-train's own output (console format, json lines)."""
    log = tmp_path / "train.log"
    log.write_text(trained_model("alpha_entmax").train_log)
    logged = logged_validations(log.read_text())
    assert logged, "fairseq-train logged no validation"
    curve = read_validation_curve(log)
    assert set(curve) == {"num_updates", "loss", "nll_loss", "ppl"}  # no --report-accuracy
    assert len(curve["num_updates"]) == len(logged)
    assert curve["num_updates"][-1] == logged[-1][0] == 200  # validated at the end of training
    assert curve["ppl"][-1] == logged[-1][1]
    assert all(len(curve[k]) == len(logged) for k in curve)
    assert 1.0 < curve["ppl"][-1] < 1000 and curve["nll_loss"][-1] <= curve["loss"][-1]


@pytest.mark.slow
def test_validation_curve_of_a_fairseq_train_log_in_simple_format_and_its_tensorboard(validated_run):
    logged = logged_validations((validated_run / "train.log").read_text())
    # fairseq-train's --log-file writes each line once more per epoch begun (a FileHandler is
    # added per epoch): the same validation repeated, read once
    by_step = dict(logged)
    assert sorted(by_step) == [10, 20, 30] and len(logged) >= 3
    curve = read_validation_curve(validated_run / "train.log")
    assert set(curve) == {"num_updates", "loss", "nll_loss", "ppl", "accuracy"}  # --report-accuracy
    assert curve["num_updates"] == [10, 20, 30]
    assert curve["ppl"] == [by_step[step] for step in curve["num_updates"]]
    assert all(0.0 <= a <= 100.0 for a in curve["accuracy"])
    # the valid run of --tensorboard-logdir holds the same validations, unrounded
    from_tensorboard = read_validation_curve(validated_run / "tb")
    assert set(from_tensorboard) == set(curve) and from_tensorboard["num_updates"] == curve["num_updates"]
    for metric in ("loss", "nll_loss", "ppl", "accuracy"):
        assert from_tensorboard[metric] == pytest.approx(curve[metric], rel=2e-3, abs=0.01), metric


SIMPLE_SNIPPET = """\
2024-05-01 10:00:00 | INFO | fairseq_cli.train | begin validation on "valid" subset
2024-05-01 10:00:01 | INFO | train_inner | epoch 001:    100 / 1102 loss=9.1, nll_loss=8.7, ppl=416.2, wps=9000, num_updates=100
2024-05-01 10:00:05 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.012 | nll_loss 8.55 | ppl 374.8 | \
accuracy 12.5 | wps 20000 | wpb 3000 | bsz 120 | num_updates 500
2024-05-01 10:00:06 | INFO | valid | epoch 001 | valid on 'test' subset | loss 9.5 | nll_loss 9 | ppl 512 | num_updates 500
2024-05-01 10:00:07 | INFO | train | epoch 001 | loss 9.3 | nll_loss 8.9 | ppl 477.7 | num_updates 1102
epoch 002 | valid on 'valid' subset | loss 6.2 | nll_loss 5.1 | ppl 34.3 | accuracy 40.25 | num_updates 1000 | best_loss 6.2
"""

JSON_SNIPPET = """\
2024-05-01 10:00:01 | INFO | train_inner | {"epoch": 1, "update": 0.09, "loss": "9.1", "ppl": "416.2", "num_updates": "100"}
2024-05-01 10:00:05 | INFO | valid | {"epoch": 1, "valid_loss": "9.012", "valid_nll_loss": "8.55", "valid_ppl": "374.8", \
"valid_wps": "20000", "valid_num_updates": "500"}
{"epoch": 1, "test_loss": "9.5", "test_ppl": "512", "test_num_updates": "500"}
{"epoch": 1, "train_loss": "9.3", "train_ppl": "477.7", "train_num_updates": "1102"}
{"epoch": 2, "valid_loss": "6.2", "valid_nll_loss": "5.1", "valid_ppl": "34.3", "valid_num_updates": "1000", \
"valid_best_loss": "6.2"}
"""


def test_validation_curve_of_simple_and_json_snippets(tmp_path):
    (tmp_path / "simple.log").write_text(SIMPLE_SNIPPET)
    (tmp_path / "json.log").write_text(JSON_SNIPPET)
    # only the validations of the 'valid' subset: not train / train_inner lines, not 'test'
    assert read_validation_curve(tmp_path / "simple.log") == {
        "num_updates": [500, 1000],
        "loss": [9.012, 6.2],
        "nll_loss": [8.55, 5.1],
        "ppl": [374.8, 34.3],
        "accuracy": [12.5, 40.25],
    }
    assert read_validation_curve(tmp_path / "json.log") == {
        "num_updates": [500, 1000],
        "loss": [9.012, 6.2],
        "nll_loss": [8.55, 5.1],
        "ppl": [374.8, 34.3],
    }
    # another validation subset, by its name
    assert read_validation_curve(tmp_path / "simple.log", subset="test") == {
        "num_updates": [500],
        "loss": [9.5],
        "nll_loss": [9.0],
        "ppl": [512.0],
    }
    assert read_validation_curve(tmp_path / "json.log", subset="test")["ppl"] == [512.0]
    # a log without validations, and no log
    (tmp_path / "none.log").write_text(SIMPLE_SNIPPET.splitlines()[1] + "\n")
    assert read_validation_curve(tmp_path / "none.log") == {}
    with pytest.raises(FileNotFoundError, match="no_such.log"):
        read_validation_curve(tmp_path / "no_such.log")


def test_a_resumed_run_repeating_a_validation_keeps_the_later_one(tmp_path):
    # the first run validated at 100 and 200 and was cut; the resumed one restarts from the
    # checkpoint of update 100 and validates at 200 again, then at 300
    log = tmp_path / "train.log"
    log.write_text(
        "epoch 001 | valid on 'valid' subset | loss 8 | nll_loss 7.5 | ppl 181 | num_updates 100\n"
        "epoch 001 | valid on 'valid' subset | loss 7 | nll_loss 6.5 | ppl 90.5 | num_updates 200\n"
        "2024-05-02 09:00:00 | INFO | fairseq.checkpoint_utils | Loaded checkpoint checkpoint_last.pt (epoch 1 @ 100 updates)\n"
        "epoch 001 | valid on 'valid' subset | loss 6.9 | nll_loss 6.4 | ppl 84.4 | num_updates 200\n"
        "epoch 002 | valid on 'valid' subset | loss 6 | nll_loss 5.5 | ppl 45.3 | num_updates 300\n"
    )
    curve = read_validation_curve(log)
    assert curve["num_updates"] == [100, 200, 300]
    assert curve["loss"] == [8.0, 6.9, 6.0] and curve["ppl"] == [181.0, 84.4, 45.3]
    # written out of order (logs concatenated), still sorted by update
    log.write_text("".join(reversed(log.read_text().splitlines(keepends=True))))
    assert read_validation_curve(log)["num_updates"] == [100, 200, 300]


def test_model_names_group_by_normalizer_without_the_seed():
    assert normalizer_name("alpha_entmax-seed1") == normalizer_name("alpha_entmax_seed22") == "alpha_entmax"
    assert normalizer_name("softmax") == "softmax"
    assert normalizer_name("seed1") == "seed1" and normalizer_name("entmax-seed1-big") == "entmax-seed1-big"
    a1, a2, b1 = ({"num_updates": [i], "ppl": [float(i)]} for i in (1, 2, 3))
    groups = group_by_normalizer([("a-seed1", a1), ("b_seed1", b1), ("a-seed2", a2), ("c", None), ("d", {})])
    assert groups == {"a": [a1, a2], "b": [b1]}  # runs without validations left out


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_learning_curves_figure_averages_the_runs_of_each_label(tmp_path):
    run_a1 = {"num_updates": [100, 200, 300], "ppl": [100.0, 40.0, 20.0], "accuracy": [10.0, 30.0, 40.0]}
    run_a2 = {"num_updates": [100, 200], "ppl": [80.0, 50.0], "accuracy": [12.0, 28.0]}
    run_b1 = {"num_updates": [100, 200, 300], "ppl": [90.0, 30.0, 15.0], "accuracy": [11.0, 33.0, 45.0]}
    run_b2 = {"num_updates": [100, 200, 300], "ppl": [70.0, 36.0, 17.0], "accuracy": [13.0, 31.0, 47.0]}
    # the mean at the updates all runs have, the band from min to max
    assert mean_over_runs([run_a1, run_a2], "ppl") == ([100, 200], [90.0, 45.0], [80.0, 40.0], [100.0, 50.0])
    assert mean_over_runs([run_b1], "accuracy") == ([100, 200, 300], [11.0, 33.0, 45.0]) + ([11.0, 33.0, 45.0],) * 2
    assert mean_over_runs([run_a1, {"num_updates": [100], "loss": [5.0]}], "ppl")[0] == []

    path = tmp_path / "curves.png"
    assert plot_learning_curves({"alpha": [run_a1, run_a2], "softmax": [run_b1, run_b2]}, path) == path
    assert path.stat().st_size > 0 and png_size(path) == (800, 350)  # 8 x 3.5 inches at 100 dpi
    without_accuracy = tmp_path / "loss.png"
    plot_learning_curves({"alpha": [{"num_updates": [1, 2], "loss": [3.0, 2.0]}]}, without_accuracy, metric="loss")
    assert png_size(without_accuracy) == (800, 350)
    assert plot_learning_curves({"alpha": [{"num_updates": [1], "loss": [3.0]}]}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


@pytest.mark.slow
def test_analyze_command_writes_learning_curves_of_the_seeds_of_each_normalizer(
    validated_run, trained_model, tiny_data, tmp_path
):
    """Through the real fairseq-entmax-analyze: two 'seeds' of one normalizer (the validated run
    twice: its log found in the checkpoint, and given with --train-log) and another model given
    its fairseq-train output; --gen-subset for --subset."""
    checkpoint = validated_run / "checkpoints" / "checkpoint_last.pt"
    alpha = trained_model("alpha_entmax")
    alpha_log = tmp_path / "alpha_train.log"
    alpha_log.write_text(alpha.train_log)
    output_dir = tmp_path / "analysis"
    proc = run_analyze(
        tiny_data.data_bin,
        output_dir,
        *arguments(
            f"""
            --path {checkpoint} --name softmax-seed1 --train-log auto
            --path {checkpoint} --name softmax_seed2 --train-log {validated_run / "train.log"}
            --path {alpha.checkpoint} --name alpha --train-log {alpha_log}
            --gen-subset test --num-sentences 8
            """
        ),
    )
    assert "learning curves: softmax (2 runs), alpha (1 run)" in proc.stdout + proc.stderr

    analysis = json.loads((output_dir / "analysis.json").read_text())
    assert analysis["subset"] == "test" and {m["subset"] for m in analysis["models"]} == {"test"}
    seed1, seed2, alpha_model = analysis["models"]
    # "auto": the checkpoint recorded --tensorboard-logdir (read first) and --log-file
    assert seed1["validation_curve"] == read_validation_curve(validated_run / "tb")
    logged = dict(logged_validations((validated_run / "train.log").read_text()))
    assert seed2["validation_curve"]["num_updates"] == sorted(logged) == [10, 20, 30]
    assert seed2["validation_curve"]["ppl"] == [logged[step] for step in (10, 20, 30)]
    assert "accuracy" in seed2["validation_curve"]
    logged = logged_validations(alpha.train_log)
    assert alpha_model["validation_curve"]["num_updates"] == [step for step, _ in logged]
    assert alpha_model["validation_curve"]["ppl"] == [ppl for _, ppl in logged]

    figure = output_dir / "learning_curves.png"
    assert figure.stat().st_size > 0 and png_size(figure) == (800, 350)
    assert "learning_curves.png" in (output_dir / "written_files.txt").read_text().split()
