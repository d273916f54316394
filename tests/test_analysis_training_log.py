"""Alpha trajectories read back from logs written by fairseq's own progress bars (the code
fairseq-train logs with), in its simple and json formats and to tensorboard."""
import logging

import pytest
from fairseq.logging import progress_bar

from fairseq_entmax.analysis.training_log import read_log_file, read_tensorboard, read_trajectories

# fairseq_cli.train's console format, and what its --log-file gets (the bare message)
CONSOLE_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
LOG_FILE_FORMAT = "%(message)s"

STEPS = (10, 20, 30)


def alpha_stats(step):
    """What the model logs at an update: alpha mean/min/max per type and per head."""
    heads = {f"alpha_encoder_self_L{layer}_H{head}": 1.0 + 0.01 * step + 0.1 * layer + 0.02 * head
             for layer in range(2) for head in range(2)}
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
            range(len(STEPS)), log_format=log_format, log_interval=1, epoch=1,
            tensorboard_logdir=tensorboard_logdir, default_log_format=log_format,
        )
        for i, step in zip(bar, STEPS):
            if inner:
                bar.log(alpha_stats(step), tag="train_inner", step=step)
        bar.print(alpha_stats(STEPS[-1]), tag="train", step=STEPS[-1])
        valid = progress_bar.progress_bar(range(1), log_format=log_format, epoch=1, prefix="valid on 'valid' subset",
                                          default_log_format=log_format)
        valid.print({"loss": 2.5, "num_updates": STEPS[-1]}, tag="valid", step=STEPS[-1])
    finally:
        bar_logger.removeHandler(handler)
        handler.close()
    return path


def series(trajectories, attention, statistic, layer=None, head=None):
    found = [t for t in trajectories if (t["attention"], t["statistic"], t["layer"], t["head"])
             == (attention, statistic, layer, head)]
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
