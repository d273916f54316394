"""The stages every example runs, each a thin layer over the tool that does the work.

Stages write their outputs under one work directory and leave a `<stage>.done` marker when
they finish, so a second run skips what is finished; fairseq-train itself resumes from
checkpoint_last.pt. A marker records the settings its stage ran with: data and models made
with other settings are refused rather than reused (the table would not be what it says),
and translations or analyses of a checkpoint that has changed are made again. Problems the
user can fix raise PipelineError, whose message says what is wrong and what to do; the
scripts print it and exit with status 2.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from multiprocessing import Pool
from pathlib import Path

SPLITS = ("train", "valid", "test")
VARIANTS = ("softmax", "entmax15", "alpha_entmax", "topk")
# fairseq_entmax.modules.ATTENTION_TYPES, copied: importing it imports fairseq, which the
# pipeline's marker checks and tables do not need (tests/test_recipes.py checks they agree).
ATTENTION_TYPES = ("encoder_self", "decoder_self", "cross")
BIN_DIR = Path(sys.executable).parent


class PipelineError(Exception):
    """A problem with the user's input or set-up; the message says what to do."""


class ToolError(RuntimeError):
    """A tool (fairseq, subword-nmt) failed; the message holds the end of its log."""


def run_reporting_errors(run, args):
    """Run a script's stages. A PipelineError becomes its message on stderr and exit status
    2, a ToolError its message (with the tool's log) and exit status 1."""
    try:
        run(args)
    except PipelineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tool(name):
    """Path of a console script (fairseq-train, subword-nmt, ...) installed beside this Python."""
    path = BIN_DIR / name
    if not path.exists():
        raise PipelineError(f"{name} not found in {BIN_DIR}: run `make setup` and use .venv/bin/python")
    return str(path)


def user_dir():
    """The fairseq_entmax package directory, passed to fairseq as --user-dir. Imported here, not
    at the top: importing fairseq_entmax imports fairseq (seconds), which the stages that only
    check markers and settings do not need."""
    from fairseq_entmax import USER_DIR

    return USER_DIR


# --------------------------------------------------------------------------- stage bookkeeping

def is_done(marker):
    return Path(marker).exists()


def mark_done(marker, info=None, settings=None):
    """Write the marker, with what the stage reports (info) and the settings it ran with."""
    Path(marker).parent.mkdir(parents=True, exist_ok=True)
    record = dict(info or {}, **({"settings": settings} if settings is not None else {}))
    Path(marker).write_text(json.dumps(record) + "\n")


def read_done(marker):
    return json.loads(Path(marker).read_text())


def _as_recorded(settings):
    """settings as a marker holds them (tuples become lists), to compare with a marker's."""
    return json.loads(json.dumps(settings))


def done_with_same_settings(marker, settings):
    """Whether the stage behind `marker` is done with exactly these settings."""
    return is_done(marker) and read_done(marker).get("settings") == _as_recorded(settings)


def done_with(marker, settings, what):
    """Whether the stage behind `marker` is done. Done with other settings (a JSON-able dict)
    raises PipelineError naming what changed: its outputs are not what this run asks for."""
    if not is_done(marker):
        return False
    recorded = read_done(marker).get("settings")
    settings = _as_recorded(settings)
    if recorded is not None and recorded != settings:
        changed = "; ".join(f"{key}: {recorded.get(key)!r} then, {settings.get(key)!r} now"
                            for key in sorted(recorded.keys() | settings.keys())
                            if recorded.get(key) != settings.get(key))
        raise PipelineError(f"{what} in {Path(marker).parent} was made with other settings ({changed}): "
                            "use another --work-dir, or delete that folder to make it again")
    return True


def fingerprint(path):
    """Path, size and modification time of a file: what tells a checkpoint from its successor."""
    stat = Path(path).stat()
    return {"path": str(path), "size": stat.st_size, "modified_ns": stat.st_mtime_ns}


def run_logged(args, log_path, show=None, env=None):
    """Run a command, appending all its output to `log_path`; lines for which `show(line)`
    returns a string are printed as progress. On failure, raise with the log's last lines."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = [str(a) for a in args]
    # Line-buffered: the log shows each line as it comes (for a user following it, and for a
    # resume test that interrupts once a checkpoint has been logged).
    with open(log_path, "a", encoding="utf-8", buffering=1) as log_file:
        log_file.write("$ " + " ".join(args) + "\n")
        log_file.flush()
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # Unbuffered, so fairseq's log lines arrive (and show) as they are written.
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), bufsize=1,
        )
        try:
            for line in proc.stdout:
                log_file.write(line)
                shown = show(line) if show else None
                if shown:
                    print("    " + shown, flush=True)
            returncode = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if returncode != 0:
        tail = "".join(log_path.read_text(encoding="utf-8").splitlines(keepends=True)[-25:])
        raise ToolError(f"{Path(args[0]).name} failed (exit {returncode}); full log in {log_path}; last lines:\n{tail}")


# --------------------------------------------------------------------------- corpus checks

def read_lines(path):
    """Lines of a text file split on "\n" only (str.splitlines would also split on the
    Unicode line separators some corpora hold inside sentences, breaking the alignment)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.replace("\r", " ") for line in lines]


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def count_nonblank_lines(path):
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def check_parallel_corpus(files):
    """`files` maps split -> (source path, target path). Checks, before any long work, that
    every file exists, that source and target have the same number of lines and that no
    split is empty. Returns split -> number of lines."""
    missing = [str(p) for pair in files.values() for p in pair if not Path(p).is_file()]
    if missing:
        raise PipelineError(
            "missing data files:\n  " + "\n  ".join(missing)
            + "\nEach split needs a source and a target file, plain text, one sentence per line, "
            "line i of the target translating line i of the source."
        )
    counts = {}
    for split, (source, target) in files.items():
        n_source, n_target = count_lines(source), count_lines(target)
        if n_source != n_target:
            raise PipelineError(
                f"{split}: {source} has {n_source} lines but {target} has {n_target}. Source and target "
                "must be line-aligned (line i of one translates line i of the other): re-extract or "
                "re-align the two files."
            )
        if count_nonblank_lines(source) == 0 or count_nonblank_lines(target) == 0:
            raise PipelineError(f"{split}: {source} or {target} has no text: the corpus is empty.")
        counts[split] = n_source
    return counts


# --------------------------------------------------------------------------- tokenisation

# Japanese and Chinese have no spaces between words, and Moses does not segment them: the
# recipes split these scripts into single characters and let joint BPE merge them again.
_CJK = re.compile(r"([\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff01-\uff60])")
_SPACE_BETWEEN_CJK = re.compile(r"(?<=[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff01-\uff60]) (?=[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff01-\uff60])")
CHARACTER_SEGMENTED_LANGS = ("ja", "zh")
# sacreBLEU's default tokenizer (13a) leaves a Japanese or Chinese sentence as one or two
# tokens, so BLEU reads about 0. "zh" is sacreBLEU's own for Chinese; "ja-mecab" would need
# sacrebleu[ja] (MeCab), so Japanese is scored over characters (the signature says tok:char).
SACREBLEU_TOKENIZER = {"ja": "char", "zh": "zh"}

_tokenizer = None


def _init_tokenizer(lang):
    global _tokenizer
    from sacremoses import MosesTokenizer

    _tokenizer = (lang, MosesTokenizer(lang=lang))


def _moses(tokenizer, lang, line, aggressive_dash_splits):
    line = line.strip()
    if lang in CHARACTER_SEGMENTED_LANGS:
        line = _CJK.sub(r" \1 ", line)
    # escape=False keeps & < > as they are (no HTML entities in the vocabulary).
    return tokenizer.tokenize(line, return_str=True, escape=False, aggressive_dash_splits=aggressive_dash_splits)


def _tokenize_line(line):
    # Aggressive dash splitting is Moses' -a, as in fairseq's prepare scripts.
    lang, tokenizer = _tokenizer
    return _moses(tokenizer, lang, line, aggressive_dash_splits=True)


def scoring_tokenize(lines, lang):
    """Moses tokenisation for tokenized BLEU: without -a, whose hyphen splitting turns every
    hyphenated word into three tokens and raises BLEU as compound splitting does."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [_moses(tokenizer, lang, line, aggressive_dash_splits=False) for line in lines]


def tokenize_file(in_path, out_path, lang, workers=1):
    """Moses-tokenise one file with sacremoses (in `workers` processes)."""
    lines = read_lines(in_path)
    if workers > 1:
        with Pool(workers, initializer=_init_tokenizer, initargs=(lang,)) as pool:
            tokenized = pool.map(_tokenize_line, lines, chunksize=2000)
    else:
        _init_tokenizer(lang)
        tokenized = [_tokenize_line(line) for line in lines]
    Path(out_path).write_text("\n".join(tokenized) + "\n", encoding="utf-8")


def detokenize_lines(lines, lang):
    """Undo Moses tokenisation (and the character split of ja/zh) for sacreBLEU."""
    from sacremoses import MosesDetokenizer

    detokenizer = MosesDetokenizer(lang=lang)
    out = []
    for line in lines:
        text = detokenizer.detokenize(line.split())
        if lang in CHARACTER_SEGMENTED_LANGS:
            text = _SPACE_BETWEEN_CJK.sub("", text)
        out.append(text)
    return out


# --------------------------------------------------------------------------- BPE and binarisation

def learn_joint_bpe(train_source, train_target, merges, codes_path, log_path):
    """Joint BPE on the concatenation of both training sides, as in the paper (subword-nmt)."""
    joint = Path(codes_path).with_suffix(".joint-train.txt")
    with open(joint, "w", encoding="utf-8") as out:
        for path in (train_source, train_target):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    out.write(line)
    run_logged(learn_bpe_command(joint, merges, codes_path), log_path)
    joint.unlink()


def learn_bpe_command(joint_text, merges, codes_path):
    return [str(a) for a in [tool("subword-nmt"), "learn-bpe", "--symbols", merges, "--input", joint_text,
                             "--output", codes_path]]


def apply_bpe_command(codes_path, in_path, out_path, workers=1):
    return [str(a) for a in [tool("subword-nmt"), "apply-bpe", "--codes", codes_path, "--input", in_path,
                             "--output", out_path, "--num-workers", workers]]


def apply_bpe(codes_path, in_path, out_path, log_path, workers=1):
    run_logged(apply_bpe_command(codes_path, in_path, out_path, workers), log_path)


def clean_training_pair(bpe_dir, src, tgt, max_len, max_ratio):
    """Drop training pairs that are empty, longer than max_len tokens, or whose length ratio
    exceeds max_ratio (None: no ratio rule), as Moses' clean-corpus-n.perl in fairseq's
    prepare scripts.
    Returns (kept, dropped)."""
    source_path, target_path = bpe_dir / f"train.{src}", bpe_dir / f"train.{tgt}"
    source_lines = read_lines(source_path)
    target_lines = read_lines(target_path)
    kept_source, kept_target = [], []
    for s, t in zip(source_lines, target_lines):
        ns, nt = len(s.split()), len(t.split())
        ratio_ok = max_ratio is None or max(ns, nt) <= max_ratio * min(ns, nt)
        if 1 <= ns <= max_len and 1 <= nt <= max_len and ratio_ok:
            kept_source.append(s)
            kept_target.append(t)
    if not kept_source:
        raise PipelineError(f"no training pair is left after cleaning (1..{max_len} tokens, length ratio <= {max_ratio})")
    source_path.write_text("\n".join(kept_source) + "\n", encoding="utf-8")
    target_path.write_text("\n".join(kept_target) + "\n", encoding="utf-8")
    return len(kept_source), len(source_lines) - len(kept_source)


def binarize(text_dir, src, tgt, dest_dir, log_path, workers=1):
    # fairseq-preprocess refuses a destination that holds a dictionary already, which an
    # interrupted run leaves behind: start from an empty folder.
    shutil.rmtree(dest_dir, ignore_errors=True)
    run_logged(preprocess_command(text_dir, src, tgt, dest_dir, workers), log_path)


def preprocess_command(text_dir, src, tgt, dest_dir, workers=1):
    """The fairseq-preprocess command: a joined dictionary for joint BPE."""
    return [str(a) for a in [
        tool("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt,
        "--trainpref", Path(text_dir) / "train", "--validpref", Path(text_dir) / "valid",
        "--testpref", Path(text_dir) / "test", "--destdir", dest_dir,
        "--joined-dictionary", "--workers", workers,
    ]]


# --------------------------------------------------------------------------- training

@dataclass
class TrainSettings:
    """fairseq-train settings shared by the attention variants of one experiment. Every field
    becomes fairseq-train options in `train_command`, the one place that spells them."""

    arch: str
    max_update: int                    # a cap: with a patience, training may stop before it
    max_tokens: int = 4096             # per device and batch; times update_freq and devices per update
    update_freq: int = 1
    lr: float = 5e-4                   # the peak, reached at the end of the linear warm-up
    warmup_updates: int = 4000
    dropout: float = 0.3
    attention_dropout: float = 0.0     # on the attention weights, after the normalizer
    activation_dropout: float = 0.0    # after the ReLU of the feed-forward sublayer
    normalize_before: bool = False     # pre-norm: LayerNorm before each sublayer, and a final one
    adam_betas: tuple = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0001
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    topk: int = 8
    keep_last_epochs: int = 5          # the checkpoints kept (and averaged when asked)
    save_interval_updates: int = 0     # > 0: checkpoint (and validate) every N updates instead of epochs
    validate_every_epoch: bool = True  # False: validate only every save_interval_updates updates
    patience: int = 0                  # > 0: stop after this many validations without a new best
    best_metric: str = "loss"          # what checkpoint_best.pt and the patience follow: loss or accuracy
    log_interval: int = 100
    model_args: list = field(default_factory=list)   # size overrides of the architecture
    extra_args: list = field(default_factory=list)


def variant_args(variant, topk):
    """fairseq-train options (contract 2 of the project) that select one attention variant."""
    if variant == "softmax":
        return ["--attention-normalizer", "softmax"]
    if variant == "entmax15":
        return ["--attention-normalizer", "entmax15"]
    if variant == "alpha_entmax":
        # The paper: one alpha per head, layer and attention type, initialised at random.
        return ["--attention-normalizer", "alpha_entmax", "--alpha-init", "random"]
    if variant == "topk":
        return ["--attention-normalizer", "topk", "--topk", topk]
    raise PipelineError(f"unknown attention variant {variant!r}; choose from {', '.join(VARIANTS)}")


def use_cpu():
    import torch

    return not torch.cuda.is_available()


def _progress_line(label, max_update):
    """Turn fairseq's log lines into one short progress line per log interval / epoch."""
    number = r"([-+0-9.e]+)"

    def show(line):
        if "| ERROR |" in line or "Traceback" in line or line.startswith(("RuntimeError", "ValueError")):
            return f"{label}: {line.strip()}"
        kind = "valid" if "| valid |" in line else "train" if ("| train_inner |" in line or "| train |" in line) else None
        if kind is None:
            return None
        fields = dict(re.findall(r"(\w+)[= ]" + number + r"(?=[,| ]|$)", line.strip()))
        parts = [f"{label}", kind]
        epoch = re.search(r"epoch (\d+)", line)
        if epoch:
            parts.append(f"epoch {int(epoch.group(1))}")
        if "num_updates" in fields:
            parts.append(f"update {fields['num_updates']}/{max_update}")
        if "loss" in fields:
            parts.append(f"loss {float(fields['loss']):.3f}")
        alphas = [f"alpha {t} {float(fields[f'alpha_{t}_mean']):.2f}" for t in ATTENTION_TYPES if f"alpha_{t}_mean" in fields]
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


def train_command(data_bin, save_dir, variant, settings, seed, cpu=False):
    """The fairseq-train command (a list of strings) of one variant and seed."""
    s = settings
    args = [
        tool("fairseq-train"), data_bin, "--user-dir", user_dir(), "--task", "translation",
        "--arch", s.arch, *variant_args(variant, s.topk), *s.model_args, "--share-all-embeddings",
        "--dropout", s.dropout, "--attention-dropout", s.attention_dropout,
        "--activation-dropout", s.activation_dropout,
        *(["--encoder-normalize-before", "--decoder-normalize-before"] if s.normalize_before else []),
        "--optimizer", "adam", "--adam-betas", f"({s.adam_betas[0]}, {s.adam_betas[1]})", "--adam-eps", s.adam_eps,
        "--weight-decay", s.weight_decay, "--clip-norm", s.clip_norm,
        "--lr", s.lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", s.warmup_updates,
        "--warmup-init-lr", "1e-07",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", s.label_smoothing,
        "--report-accuracy",
        "--max-tokens", s.max_tokens, "--update-freq", s.update_freq, "--max-update", s.max_update,
        "--seed", seed, "--save-dir", save_dir,
        "--best-checkpoint-metric", s.best_metric,
        *(["--maximize-best-checkpoint-metric"] if s.best_metric == "accuracy" else []),
        *(["--patience", s.patience] if s.patience else []),
        "--tensorboard-logdir", Path(save_dir) / "tensorboard",
        "--log-format", "simple", "--log-interval", s.log_interval, "--no-progress-bar",
        "--skip-invalid-size-inputs-valid-test",
    ]
    if s.save_interval_updates:
        args += ["--save-interval-updates", s.save_interval_updates, "--validate-interval-updates",
                 s.save_interval_updates, "--keep-interval-updates", s.keep_last_epochs, "--no-epoch-checkpoints"]
        if not s.validate_every_epoch:
            # fairseq validates (and counts towards the patience) at every epoch's end unless its
            # epoch intervals are out of reach: then only the update intervals count.
            args += ["--validate-interval", 1_000_000, "--save-interval", 1_000_000]
    else:
        args += ["--keep-last-epochs", s.keep_last_epochs]
    if cpu:
        args.append("--cpu")
    return [str(a) for a in [*args, *s.extra_args]]


def train(data_bin, save_dir, variant, settings, seed=1, label=None, threads=None):
    """fairseq-train one variant; resumes from checkpoint_last.pt, skips a finished run.
    Returns the training wall time in seconds, summed over resumed runs."""
    save_dir = Path(save_dir)
    done, time_file = save_dir / "train.done", save_dir / "train_seconds.txt"
    label = label or variant
    # Recorded when training starts, so that a resumed run is checked too.
    started, run_settings = save_dir / "train.started", {"variant": variant, "seed": seed, **asdict(settings)}
    done_with(started, run_settings, f"the {variant} model (seed {seed})")
    if is_done(done):
        seconds = read_done(done)["seconds"]
        log(f"{label}: already trained ({seconds:.0f} s), skipping")
        return seconds
    save_dir.mkdir(parents=True, exist_ok=True)
    mark_done(started, settings=run_settings)
    _repair_interrupted_checkpoint_last(save_dir, label)
    if (save_dir / "checkpoint_last.pt").exists():
        log(f"{label}: resuming from {save_dir / 'checkpoint_last.pt'}")
    else:
        log(f"{label}: training ({settings.max_update} updates)")
    args = train_command(data_bin, save_dir, variant, settings, seed, cpu=use_cpu())
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else None
    previous = float(time_file.read_text()) if time_file.exists() else 0.0
    start = time.time()
    try:
        run_logged(args, save_dir / "train.log", show=_progress_line(label, settings.max_update), env=env)
    finally:
        # Kept across interruptions, so a resumed run reports its total training time.
        time_file.write_text(f"{previous + time.time() - start}\n")
    seconds = previous + time.time() - start
    mark_done(done, {"seconds": seconds})
    log(f"{label}: trained in {seconds:.0f} s")
    return seconds


# --------------------------------------------------------------------------- checkpoint averaging

def _checkpoint_order(path):
    """Sort key of fairseq's checkpoint names: checkpoint{epoch}.pt, checkpoint_{epoch}_{update}.pt."""
    numbers = [int(n) for n in re.findall(r"\d+", path.stem)]
    return numbers[-1] if numbers else -1


def _load(path):
    """A checkpoint's state, read with torch's safe unpickler and the allowlist of fairseq's
    checkpoint types (importing fairseq_entmax installs it): a checkpoint holding anything
    else raises fairseq_entmax.checkpoint_safety.UnsafeCheckpointError and nothing of it runs."""
    import fairseq_entmax  # noqa: F401 (the allowlist)
    from fairseq_entmax.checkpoint_safety import load_checkpoint_safely

    return load_checkpoint_safely(path, map_location="cpu")


def _num_updates(path):
    return _load(path)["optimizer_history"][-1]["num_updates"]


def last_checkpoints(save_dir, n):
    """The n most recent states of a run: its numbered checkpoints (update-interval ones if
    there are any), plus checkpoint_last.pt when training stopped (at --max-update) after the
    last numbered one was written, which is the usual case."""
    save_dir = Path(save_dir)
    by_update = sorted(save_dir.glob("checkpoint_*_*.pt"), key=_checkpoint_order)
    by_epoch = sorted((p for p in save_dir.glob("checkpoint*.pt") if re.fullmatch(r"checkpoint\d+", p.stem)),
                      key=_checkpoint_order)
    numbered = by_update or by_epoch
    last = save_dir / "checkpoint_last.pt"
    if last.exists() and (not numbered or _num_updates(last) > _num_updates(numbered[-1])):
        numbered = numbered + [last]
    return numbered[-n:]


def average_checkpoints(paths, out_path):
    """Average the model parameters of several checkpoints of one run (fairseq's
    scripts/average_checkpoints.py is not installed by pip). Everything but the parameters
    (config, optimizer history) is taken from the last checkpoint."""
    from fairseq import checkpoint_utils

    summed, last = None, None
    for path in paths:
        state = _load(path)
        params = state["model"]
        if summed is None:
            summed = {k: v.double() if v.is_floating_point() else v for k, v in params.items()}
        else:
            for k, v in params.items():
                if v.is_floating_point():
                    summed[k] = summed[k] + v.double()
        last = state
    for k, v in last["model"].items():
        last["model"][k] = (summed[k] / len(paths)).to(v.dtype) if v.is_floating_point() else v
    checkpoint_utils.torch_persistent_save(last, str(out_path))


def averaged_checkpoint(save_dir, n, label):
    """checkpoint_avg{n}.pt of a finished run (made once); falls back to checkpoint_last.pt
    when the run has a single state to average."""
    save_dir = Path(save_dir)
    out = save_dir / f"checkpoint_avg{n}.pt"
    if out.exists():
        return out
    paths = last_checkpoints(save_dir, n)
    if len(paths) < 2:
        log(f"{label}: a single checkpoint, nothing to average: using checkpoint_last.pt")
        return save_dir / "checkpoint_last.pt"
    log(f"{label}: averaging {', '.join(p.name for p in paths)}")
    average_checkpoints(paths, out)
    return out


def select_checkpoint(save_dir, select, n, label):
    """The checkpoint of a finished run to evaluate: "last" (checkpoint_last.pt), "best"
    (checkpoint_best.pt: the best validation metric fairseq saw, see TrainSettings.best_metric)
    or "average" (the parameters of the last n checkpoints averaged)."""
    save_dir = Path(save_dir)
    if select == "average":
        return averaged_checkpoint(save_dir, n, label)
    if select not in ("last", "best"):
        raise PipelineError(f"unknown checkpoint selection {select!r}: last, best or average")
    return save_dir / f"checkpoint_{select}.pt"


# --------------------------------------------------------------------------- translation and scoring

def generate_command(data_bin, checkpoint, subset, out_dir, beam=5, lenpen=1.0, max_len=None, cpu=False):
    """The fairseq-generate command (a list of strings) that translates `subset` into out_dir."""
    args = [tool("fairseq-generate"), data_bin, "--user-dir", user_dir(), "--task", "translation",
            "--path", checkpoint, "--gen-subset", subset, "--beam", beam, "--lenpen", lenpen,
            # (every test sentence is translated: --user-dir repairs fairseq's dropping of a last
            # batch that is not a multiple of --required-batch-size-multiple, evaluation_batches)
            "--max-tokens", 8000, "--remove-bpe", "--results-path", out_dir]
    if max_len:
        args += ["--max-len-a", max_len[0], "--max-len-b", max_len[1]]
    if cpu:
        args.append("--cpu")
    return [str(a) for a in args]


def generate(data_bin, checkpoint, subset, out_dir, beam=5, lenpen=1.0, label="", max_len=None):
    """fairseq-generate the subset; returns the hypotheses (BPE removed, still tokenised), in
    corpus order. max_len=(a, b) caps a translation at a * source length + b tokens (fairseq's
    default is 200 tokens, which a barely trained model may spend on every sentence)."""
    out_dir = Path(out_dir)
    hyp_path, marker = out_dir / f"{subset}.hyp", out_dir / f"{subset}.done"
    made_with = {"checkpoint": fingerprint(checkpoint), "beam": beam, "lenpen": lenpen, "max_len": max_len}
    if hyp_path.exists() and done_with_same_settings(marker, made_with):
        return read_lines(hyp_path)
    if hyp_path.exists() and is_done(marker):
        log(f"{label}: the translations in {out_dir} are of another checkpoint or settings")
    log(f"{label}: translating {subset} (beam {beam})")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = generate_command(data_bin, checkpoint, subset, out_dir, beam, lenpen, max_len, cpu=use_cpu())
    run_logged(args, out_dir / "generate.log")
    hypotheses = {}
    for line in read_lines(out_dir / f"generate-{subset}.txt"):
        if line.startswith("H-"):
            key, _score, *text = line.split("\t")
            hypotheses[int(key[2:])] = text[0] if text else ""
    missing = sorted(set(range(max(hypotheses, default=-1) + 1)) - set(hypotheses))
    if missing:
        raise ToolError(f"fairseq-generate gave no translation for sentences {missing[:10]} of {subset}")
    ordered = [hypotheses[i] for i in range(len(hypotheses))]
    hyp_path.write_text("\n".join(ordered) + "\n", encoding="utf-8")
    mark_done(marker, settings=made_with)
    return ordered


def score(hypotheses_tok, references_tok, references_raw, tgt_lang, tokenized_bleu=True, retokenize=False):
    """BLEU and chrF with sacrebleu. `bleu_tok`: BLEU on tokenised text, as the paper reports it
    (multi-bleu.perl): hypotheses_tok against references_tok, or with `retokenize` the
    detokenised hypotheses against the raw references, both through `scoring_tokenize`.
    `bleu`/`chrf`: sacreBLEU on detokenised output against the raw references, with their
    signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses_tok) != len(references_tok):
        raise ToolError(f"{len(hypotheses_tok)} translations for {len(references_tok)} references")
    detokenized = detokenize_lines(hypotheses_tok, tgt_lang) if tokenized_bleu else hypotheses_tok
    bleu, chrf = BLEU(tokenize=SACREBLEU_TOKENIZER.get(tgt_lang, "13a")), CHRF()
    result = {
        "bleu": round(bleu.corpus_score(detokenized, [references_raw]).score, 2),
        "chrf": round(chrf.corpus_score(detokenized, [references_raw]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
    if tokenized_bleu:
        # force: sacrebleu would warn that this text looks tokenised, which it is on purpose.
        bleu_tok = BLEU(tokenize="none", force=True)
        if retokenize:
            hypotheses_tok = scoring_tokenize(detokenized, tgt_lang)
            references_tok = scoring_tokenize(references_raw, tgt_lang)
        result["bleu_tok"] = round(bleu_tok.corpus_score(hypotheses_tok, [references_tok]).score, 2)
        result["bleu_tok_signature"] = str(bleu_tok.get_signature())
    return result


# --------------------------------------------------------------------------- attention analysis

def analyze_command(data_bin, checkpoints, subset, out_dir, num_sentences=None):
    """The fairseq-entmax-analyze command over the checkpoints (label -> path)."""
    args = [BIN_DIR / "fairseq-entmax-analyze", data_bin, "--user-dir", user_dir(), "--subset", subset,
            "--output-dir", out_dir]
    for label, path in checkpoints.items():
        args += ["--path", path, "--name", label]
    if num_sentences:
        args += ["--num-sentences", num_sentences]
    return [str(a) for a in args]


def analyze(data_bin, checkpoints, subset, out_dir, log_path, num_sentences=None):
    """Run fairseq-entmax-analyze over the given checkpoints (label -> path); returns
    label -> {"density": {type: mean fraction}, "alpha": {type: (mean, min, max)}} and writes
    its figures to out_dir. Returns None if the analysis command is not installed."""
    command = BIN_DIR / "fairseq-entmax-analyze"
    if not command.exists():
        log("fairseq-entmax-analyze is not installed: no attention density, alphas or figures")
        return None
    out_dir = Path(out_dir)
    report, marker = out_dir / "analysis.json", out_dir / "analysis.done"
    # Reuse an earlier analysis only if it was made of exactly these checkpoints, unchanged.
    made_with = {"subset": subset, "num_sentences": num_sentences,
                 "models": {label: fingerprint(path) for label, path in checkpoints.items()}}
    if not (report.exists() and done_with_same_settings(marker, made_with)):
        report.unlink(missing_ok=True)
    if not report.exists():
        log(f"analysing attention of {len(checkpoints)} models on {subset} (fairseq-entmax-analyze)")
        run_logged(analyze_command(data_bin, checkpoints, subset, out_dir, num_sentences), log_path)
        mark_done(marker, settings=made_with)
    models = {m["name"]: m for m in json.loads(report.read_text())["models"]}
    summary = {}
    for label in checkpoints:
        model = models[label]
        density, alphas = defaultdict(list), defaultdict(list)
        for row in model["density"]:
            density[row["attention"]].append(row["fraction"])
        for row in model["alpha"]:
            if row["alpha"] is not None:
                alphas[row["attention"]].append(row["alpha"])
        summary[label] = {
            "density": {t: sum(v) / len(v) for t, v in density.items()},
            "alpha": {t: (sum(v) / len(v), min(v), max(v)) for t, v in alphas.items()},
        }
    return summary


# --------------------------------------------------------------------------- whole experiments

def build_dataset(raw_dir, src, tgt, work, bpe_merges, tokenize=True, clean=(250, 1.5), workers=1):
    """raw text -> [Moses tokenisation] -> joint BPE [+ cleaning of training pairs] ->
    fairseq-preprocess, each step skipped when done. Returns (tokenised text dir, data-bin)."""
    work = Path(work)
    text_dir = work / "tok" if tokenize else Path(raw_dir)
    # The corpus by its folder, relative to the work dir when inside it (a moved work dir
    # still matches its markers).
    raw, resolved_work = Path(raw_dir).resolve(), work.resolve()
    inside = raw.is_relative_to(resolved_work)
    corpus = {"raw_dir": str(raw.relative_to(resolved_work) if inside else raw), "src": src, "tgt": tgt}
    if tokenize and not done_with(text_dir / "tokenize.done", corpus, "the tokenized corpus"):
        log("tokenize: Moses (sacremoses)" + ("; ja/zh split into characters" if {src, tgt} & set(CHARACTER_SEGMENTED_LANGS) else ""))
        text_dir.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            for lang in (src, tgt):
                tokenize_file(Path(raw_dir) / f"{split}.{lang}", text_dir / f"{split}.{lang}", lang, workers=workers)
        mark_done(text_dir / "tokenize.done", settings=corpus)
    bpe_dir = work / "bpe"
    bpe_settings = {**corpus, "tokenized": tokenize, "merges": bpe_merges, "clean": clean}
    if not done_with(bpe_dir / "bpe.done", bpe_settings, "the BPE-segmented corpus"):
        log(f"bpe: learning {bpe_merges} joint merges (subword-nmt)")
        bpe_dir.mkdir(parents=True, exist_ok=True)
        codes = bpe_dir / "codes"
        learn_joint_bpe(text_dir / f"train.{src}", text_dir / f"train.{tgt}", bpe_merges, codes, bpe_dir / "bpe.log")
        for split in SPLITS:
            for lang in (src, tgt):
                apply_bpe(codes, text_dir / f"{split}.{lang}", bpe_dir / f"{split}.{lang}", bpe_dir / "bpe.log", workers=workers)
        info = {}
        if clean:
            kept, dropped = clean_training_pair(bpe_dir, src, tgt, *clean)
            rule = f"empty, > {clean[0]} tokens" + (f" or length ratio > {clean[1]}" if clean[1] else "")
            log(f"bpe: {kept} training pairs kept, {dropped} dropped ({rule})")
            info = {"kept": kept, "dropped": dropped}
        mark_done(bpe_dir / "bpe.done", info, settings=bpe_settings)
    data_bin = work / "data-bin"
    if not done_with(data_bin / "preprocess.done", bpe_settings, "the binarized data"):
        log("binarize: fairseq-preprocess")
        binarize(bpe_dir, src, tgt, data_bin, work / "preprocess.log", workers=workers)
        mark_done(data_bin / "preprocess.done", settings=bpe_settings)
    return text_dir, data_bin


def train_and_evaluate(data_bin, work, variant, seed, settings, references_tok, references_raw, tgt,
                       label=None, select="last", average_last=None, beam=5, lenpen=1.0, max_len=None,
                       tokenized_bleu=True, retokenize=False, threads=None):
    """Train one variant with one seed (skipped when trained), translate the test set with the
    checkpoint `select` names (see select_checkpoint; "average" averages the last
    `average_last`, by default all the checkpoints kept) and score it. Returns a result row
    (without the attention analysis)."""
    name = f"{variant}-seed{seed}"
    label = label or name
    save_dir = Path(work) / "models" / name
    seconds = train(data_bin, save_dir, variant, settings, seed=seed, label=label, threads=threads)
    checkpoint = select_checkpoint(save_dir, select, average_last or settings.keep_last_epochs, label)
    eval_dir = Path(work) / "eval" / (name if select == "last" else f"{name}-{select}")
    hypotheses = generate(data_bin, checkpoint, "test", eval_dir, beam=beam, lenpen=lenpen, label=label,
                          max_len=max_len)
    scores = score(hypotheses, references_tok, references_raw, tgt, tokenized_bleu=tokenized_bleu,
                   retokenize=retokenize)
    shown = [f"tokenized BLEU {scores['bleu_tok']:.2f}"] if tokenized_bleu else []
    log(f"{label}: " + ", ".join(shown + [f"BLEU {scores['bleu']:.2f}", f"chrF {scores['chrf']:.2f}"]))
    return {"model": variant, "seed": seed, "selection": select, "checkpoint": str(checkpoint),
            "hypotheses": str(eval_dir / "test.hyp"), **scores, "train_seconds": seconds}


# --------------------------------------------------------------------------- results table

_SHORT = {"encoder_self": "enc", "decoder_self": "dec", "cross": "cross"}


def format_table(rows, bleu_tok=False):
    """rows: dicts with model, bleu, chrf, [bleu_tok], density, alpha, train_seconds.
    A Markdown table, readable as plain text too."""
    header = ["model"] + (["tok BLEU"] if bleu_tok else []) + ["BLEU", "chrF"]
    header += [f"density {_SHORT[t]}" for t in ATTENTION_TYPES]
    header += [f"alpha {_SHORT[t]} mean (min-max)" for t in ATTENTION_TYPES]
    header += ["train time"]
    lines = [header]
    for row in rows:
        density = row.get("density") or {}
        alpha = row.get("alpha") or {}
        cells = [row["model"]] + ([f"{row['bleu_tok']:.2f}"] if bleu_tok else [])
        cells += [f"{row['bleu']:.2f}", f"{row['chrf']:.2f}"]
        cells += [f"{density[t]:.3f}" if t in density else "-" for t in ATTENTION_TYPES]
        cells += [f"{alpha[t][0]:.2f} ({alpha[t][1]:.2f}-{alpha[t][2]:.2f})" if t in alpha else "-"
                  for t in ATTENTION_TYPES]
        cells.append(format_seconds(row["train_seconds"]))
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(text)


def format_seconds(seconds):
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
