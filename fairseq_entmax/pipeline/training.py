"""fairseq-train of one normalizer: its settings, its command, and a run that resumes
from checkpoint_last.pt and skips a finished model."""

import re
import shutil
import time
import zipfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from fairseq_entmax import USER_DIR
from fairseq_entmax.names import NORMALIZER_NAMES

from .markers import done_with, is_done, mark_done, read_done
from .runner import command_step
from .tools import PipelineError, log, run_logged, tool, use_cpu

# fairseq's Transformer size options, each given once for the encoder and once for the decoder.
MODEL_SIZE_OPTIONS = ("layers", "embed-dim", "ffn-embed-dim", "attention-heads")


@dataclass
class TrainSettings:
    """fairseq-train settings shared by the normalizers of one experiment. Every field
    becomes fairseq-train options in `train_command`, the one place that spells them. A field
    added later takes the default that keeps the earlier command: a model trained before it
    existed is that default's (`train` reads its marker so)."""

    arch: str
    max_update: int  # a cap: with a patience, training may stop before it; 0: none
    max_epoch: int = 0  # a cap in epochs; 0: none
    max_tokens: int = 4096  # per device and batch; times update_freq and devices per update
    update_freq: int = 1
    lr: float = 5e-4  # the peak, reached at the end of the linear warm-up
    warmup_updates: int = 4000
    dropout: float = 0.3
    attention_dropout: float = 0.0  # on the attention weights, after the normalizer
    activation_dropout: float = 0.0  # after the ReLU of the feed-forward sublayer
    normalize_before: bool = False  # pre-norm: LayerNorm before each sublayer, and a final one
    adam_betas: tuple = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0001
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    topk: int = 8
    keep_last_epochs: int = 5  # the checkpoints kept (and averaged when asked)
    save_interval_updates: int = 0  # > 0: checkpoint (and validate) every N updates instead of epochs
    validate_every_epoch: bool = True  # False: validate only every save_interval_updates updates
    patience: int = 0  # > 0: stop after this many validations without a new best
    best_metric: str = "loss"  # what checkpoint_best.pt and the patience follow: loss or accuracy
    log_interval: int = 100
    share_all_embeddings: bool = True  # one matrix for source, target and output (a joined dictionary)
    model_args: list = field(default_factory=list)  # size overrides of the architecture
    extra_args: list = field(default_factory=list)


# What a marker written before a TrainSettings field existed stands for (markers.done_with).
TRAIN_SETTINGS_DEFAULTS = {f.name: f.default for f in fields(TrainSettings) if f.default is not MISSING}


def model_size_args(layers, embed_dim, ffn_embed_dim, attention_heads):
    """fairseq-train arguments that give the encoder and the decoder the same size.

    Args:
        layers: number of layers of each.
        embed_dim: width of the embeddings and of the attention.
        ffn_embed_dim: width of the feed-forward layers.
        attention_heads: heads of every attention.

    Returns:
        A list: --encoder-layers N --decoder-layers N --encoder-embed-dim D ..., in the order
        of MODEL_SIZE_OPTIONS, each value as given (str() them for a command line, as
        subprocess runners do; kept as given so that recorded settings do not change type).
    """
    arguments = []
    for option, value in zip(MODEL_SIZE_OPTIONS, (layers, embed_dim, ffn_embed_dim, attention_heads)):
        arguments += [f"--encoder-{option}", value, f"--decoder-{option}", value]
    return arguments


def normalizer_args(normalizer, topk):
    """The fairseq-train options that select one normalizer.

    Args:
        normalizer: one of NORMALIZER_NAMES.
        topk: k, for "topk".

    Returns:
        The options, a list.

    Raises:
        PipelineError: an unknown normalizer.
    """
    if normalizer == "softmax":
        return ["--attention-normalizer", "softmax"]
    if normalizer in ("sparsemax", "entmax15"):
        return ["--attention-normalizer", normalizer]
    if normalizer == "alpha_entmax":
        # The paper: one alpha per head, layer and attention type, initialised at random.
        return ["--attention-normalizer", "alpha_entmax", "--alpha-init", "random"]
    if normalizer == "topk":
        return ["--attention-normalizer", "topk", "--topk", topk]
    raise PipelineError(f"unknown normalizer {normalizer!r}; choose from {', '.join(NORMALIZER_NAMES)}")


def training_length(settings):
    """What ends a training, in words: "2500 updates", "90 epochs", "90 epochs or 2500 updates"."""
    caps = []
    if settings.max_epoch:
        caps.append(f"{settings.max_epoch} epochs")
    if settings.max_update or not settings.max_epoch:
        caps.append(f"{settings.max_update} updates")
    return " or ".join(caps)


def _progress_line(label, settings):
    """Turn fairseq's log lines into one short progress line per log interval / epoch."""
    # Imported here: importing fairseq_entmax imports fairseq (seconds), which the stages
    # that train nothing do not need.
    from fairseq_entmax.names import ATTENTION_TYPES, alpha_metric_name

    number = r"([-+0-9.e]+)"

    def show(line):
        if "| ERROR |" in line or "Traceback" in line or line.startswith(("RuntimeError", "ValueError")):
            return f"{label}: {line.strip()}"
        kind = (
            "valid" if "| valid |" in line else "train" if ("| train_inner |" in line or "| train |" in line) else None
        )
        if kind is None:
            return None
        fields = dict(re.findall(r"(\w+)[= ]" + number + r"(?=[,| ]|$)", line.strip()))
        parts = [f"{label}", kind]
        epoch = re.search(r"epoch (\d+)", line)
        if epoch:
            parts.append(f"epoch {int(epoch.group(1))}" + (f"/{settings.max_epoch}" if settings.max_epoch else ""))
        if "num_updates" in fields:
            parts.append(f"update {fields['num_updates']}" + (f"/{settings.max_update}" if settings.max_update else ""))
        if "loss" in fields:
            parts.append(f"loss {float(fields['loss']):.3f}")
        alphas = [
            f"alpha {t} {float(fields[alpha_metric_name(t, 'mean')]):.2f}"
            for t in ATTENTION_TYPES
            if alpha_metric_name(t, "mean") in fields
        ]
        return "  ".join(parts + alphas)

    return show


def _repair_interrupted_checkpoint_last(save_dir, label):
    """fairseq writes a numbered checkpoint and then copies it to checkpoint_last.pt; an
    interrupt during the copy leaves a truncated file, from which fairseq-train cannot resume
    (EOFError). torch checkpoints are zip archives, whose index is at the end, so a truncated
    one is not a valid zip: replace it with the newest complete numbered checkpoint, or remove
    it so that training starts over."""
    last = save_dir / "checkpoint_last.pt"
    if not last.exists() or zipfile.is_zipfile(last):
        return
    complete = [p for p in save_dir.glob("checkpoint*.pt") if p != last and zipfile.is_zipfile(p)]
    if complete:
        newest = max(complete, key=lambda p: p.stat().st_mtime)
        shutil.copyfile(newest, last)
        log(f"{label}: {last.name} was cut short by an interrupt; resuming from {newest.name} instead")
    else:
        last.unlink()
        log(f"{label}: {last.name} was cut short by an interrupt and no complete checkpoint is left; starting over")


# On the CPU, no data-loader process: it would take a core from the model, and its shutdown,
# once the command ends in this process (tools.run_logged), waits up to 5 s per epoch iterator.
CPU_ARGS = ["--cpu", "--num-workers", "0"]


def train_command(data_bin, save_dir, normalizer, settings, seed, cpu=False):
    """The fairseq-train command of one normalizer and seed.

    Args:
        data_bin: the data-bin.
        save_dir: fairseq's --save-dir.
        normalizer: one of NORMALIZER_NAMES.
        settings: the TrainSettings.
        seed: the training seed.
        cpu: whether to pass --cpu.

    Returns:
        The command, a list of str.
    """
    args = [
        tool("fairseq-train"),
        data_bin,
        "--user-dir",
        USER_DIR,
        "--task",
        "translation",
        *_model_args(normalizer, settings),
        *_optimization_args(settings, seed),
        *_checkpoint_args(settings, save_dir),
        *(CPU_ARGS if cpu else []),
        *settings.extra_args,
    ]
    return [str(a) for a in args]


def _model_args(normalizer, s):
    """The architecture, its normalizer, sizes and dropouts."""
    return [
        "--arch",
        s.arch,
        *normalizer_args(normalizer, s.topk),
        *s.model_args,
        *(["--share-all-embeddings"] if s.share_all_embeddings else []),
        "--dropout",
        s.dropout,
        "--attention-dropout",
        s.attention_dropout,
        "--activation-dropout",
        s.activation_dropout,
        *(["--encoder-normalize-before", "--decoder-normalize-before"] if s.normalize_before else []),
    ]


def _optimization_args(s, seed):
    """Adam with the inverse square root schedule, the loss, the batches and when to stop."""
    return [
        "--optimizer",
        "adam",
        "--adam-betas",
        f"({s.adam_betas[0]}, {s.adam_betas[1]})",
        "--adam-eps",
        s.adam_eps,
        "--weight-decay",
        s.weight_decay,
        "--clip-norm",
        s.clip_norm,
        "--lr",
        s.lr,
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        s.warmup_updates,
        "--warmup-init-lr",
        "1e-07",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        s.label_smoothing,
        "--report-accuracy",
        "--max-tokens",
        s.max_tokens,
        "--update-freq",
        s.update_freq,
        "--max-update",
        s.max_update,
        *(["--max-epoch", s.max_epoch] if s.max_epoch else []),
        "--seed",
        seed,
    ]


def _checkpoint_args(s, save_dir):
    """Where and when checkpoints are saved and validated, which one is best, and the logs."""
    args = [
        "--save-dir",
        save_dir,
        "--best-checkpoint-metric",
        s.best_metric,
        *(["--maximize-best-checkpoint-metric"] if s.best_metric == "accuracy" else []),
        *(["--patience", s.patience] if s.patience else []),
        "--tensorboard-logdir",
        Path(save_dir) / "tensorboard",
        "--log-format",
        "simple",
        "--log-interval",
        s.log_interval,
        "--no-progress-bar",
        "--skip-invalid-size-inputs-valid-test",
    ]
    if not s.save_interval_updates:
        return [*args, "--keep-last-epochs", s.keep_last_epochs]
    args += [
        "--save-interval-updates",
        s.save_interval_updates,
        "--validate-interval-updates",
        s.save_interval_updates,
        "--keep-interval-updates",
        s.keep_last_epochs,
        "--no-epoch-checkpoints",
    ]
    if not s.validate_every_epoch:
        # fairseq validates (and counts towards the patience) at every epoch's end unless its
        # epoch intervals are out of reach: then only the update intervals count.
        args += ["--validate-interval", 1_000_000, "--save-interval", 1_000_000]
    return args


def train(data_bin, save_dir, normalizer, settings, seed=1, label=None, threads=None, cpu=None):
    """fairseq-train one normalizer; resumes from checkpoint_last.pt, skips a finished run.

    Args:
        data_bin: the data-bin.
        save_dir: fairseq's --save-dir (train.log and the markers go there too).
        normalizer: one of NORMALIZER_NAMES.
        settings: the TrainSettings.
        seed: the training seed.
        label: the model's name in progress lines (default: `normalizer`).
        threads: CPU threads of fairseq-train (None: torch's choice).
        cpu: whether to pass --cpu (None: when no CUDA device is visible).

    Returns:
        The training wall time in seconds, summed over resumed runs.

    Raises:
        PipelineError: the save_dir holds a run with other settings.
        ToolError: fairseq-train failed.
    """
    save_dir = Path(save_dir)
    done, time_file = save_dir / "train.done", save_dir / "train_seconds.txt"
    label = label or normalizer
    # Recorded when training starts, so that a resumed run is checked too.
    started, run_settings = save_dir / "train.started", {"normalizer": normalizer, "seed": seed, **asdict(settings)}
    done_with(started, run_settings, f"the {normalizer} model (seed {seed})", defaults=TRAIN_SETTINGS_DEFAULTS)
    if is_done(done):
        seconds = trained_seconds(save_dir)
        log(f"{label}: already trained ({seconds:.0f} s), skipping")
        return seconds
    save_dir.mkdir(parents=True, exist_ok=True)
    mark_done(started, settings=run_settings)
    _repair_interrupted_checkpoint_last(save_dir, label)
    if (save_dir / "checkpoint_last.pt").exists():
        log(f"{label}: resuming from {save_dir / 'checkpoint_last.pt'}")
    else:
        log(f"{label}: training ({training_length(settings)})")
    args = train_command(data_bin, save_dir, normalizer, settings, seed, cpu=use_cpu() if cpu is None else cpu)
    previous = float(time_file.read_text()) if time_file.exists() else 0.0
    start = time.time()
    progress = _progress_line(label, settings)

    def record_time():
        seconds = previous + time.time() - start
        time_file.write_text(f"{seconds}\n")
        return seconds

    def show(line):
        # Kept at every log line, so that a resumed run reports its total training time even
        # after a kill that skips the `finally` below (a SIGKILL, e.g. at a job's time limit).
        record_time()
        return progress(line)

    try:
        run_logged(args, save_dir / "train.log", show=show, threads=threads)
    finally:
        seconds = record_time()
    mark_done(done, {"seconds": seconds})
    log(f"{label}: trained in {seconds:.0f} s")
    return seconds


def training_step(data_bin, save_dir, model, settings, cpu):
    """fairseq-train of one model as a runner Step: its command, run by `train`.

    Args:
        data_bin: the data-bin.
        save_dir: fairseq's --save-dir.
        model: the evaluation.Model (normalizer, seed, label, threads).
        settings: the TrainSettings.
        cpu: whether to pass --cpu.

    Returns:
        A Step.
    """
    command = train_command(data_bin, save_dir, model.normalizer, settings, model.seed, cpu)
    return command_step(
        command,
        lambda: train(data_bin, save_dir, model.normalizer, settings, model.seed, model.shown, model.threads, cpu),
    )


def trained_seconds(save_dir):
    """The training wall time a finished run recorded in its train.done marker, in seconds."""
    return read_done(Path(save_dir) / "train.done")["seconds"]


# fairseq-train's message when --patience stops a run before --max-update.
PATIENCE_STOP_MESSAGE = "early stop since valid performance hasn't improved"


def training_summary(train_log):
    """What fairseq's log says of a finished training.

    Args:
        train_log: fairseq-train's log file.

    Returns:
        {"stopped_early" (the patience stopped it, before the update cap), "updates",
        "epochs", "valid_ppl"} (the last validation's), and with a logged accuracy
        "best_update", "best_valid_accuracy", "best_valid_ppl" (best = highest accuracy, the
        first validation to reach it, as fairseq keeps checkpoint_best.pt); None for what the
        log lacks.
    """
    # Imported here: importing fairseq_entmax imports fairseq (seconds).
    from fairseq_entmax.analysis.training_log import read_validation_curve

    text = Path(train_log).read_text(encoding="utf-8", errors="replace")
    curve = read_validation_curve(train_log)
    summary = {
        "stopped_early": PATIENCE_STOP_MESSAGE in text,
        "updates": curve["num_updates"][-1] if curve else None,
        "epochs": len(set(re.findall(r"\| valid \| epoch (\d+)", text))) or None,
        "valid_ppl": curve["ppl"][-1] if curve and "ppl" in curve else None,
    }
    if curve and "accuracy" in curve:
        best = max(range(len(curve["accuracy"])), key=curve["accuracy"].__getitem__)
        summary.update(
            best_update=curve["num_updates"][best],
            best_valid_accuracy=curve["accuracy"][best],
            best_valid_ppl=curve["ppl"][best],
        )
    return summary
