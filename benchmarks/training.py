"""Training and generation speed of sparse attention against softmax, side by side, through
the real fairseq commands.

For each setting (model size and sentence length), every model is trained for the same
number of updates on the same data with fairseq-train, then translates the same sentences
with fairseq-generate (beam 5) forced to a fixed output length, so every model does the same
work. Runs are interleaved over rounds (model A, B, C, D, A, B, ...) and the median is kept,
which makes the ratios robust to a machine whose load changes during the run.

Reported per model: training target words/s (fairseq's wps, first log interval dropped as
warm-up), peak memory of the training process (on the CPU its peak resident set size; on a GPU
the peak of what torch allocated on the device, see benchmarks/cuda_peak_memory.py),
generation sentences/s, and the ratios of each to the softmax baseline (fairseq's own
`transformer` architecture). --json writes the same figures to a file.

Generation speed is the steady rate: fairseq-generate translates the test sentences and, in
another run, the 16 with the shortest sources, which are exactly the test run's first batch
(fairseq batches sentences sorted by length, 16 at a time here). The rate is the difference in
sentences over the difference in the times fairseq reports. What a process pays once (first
calls, one-off set-up, which differ between fairseq's attention path and ours) is paid on the
same first batch in both runs, so it cancels. After a round's models are trained, their
generation runs are interleaved (A, B, C, D, A, B, ...) and the median is kept: a run takes
seconds, and a machine's speed drifts from one to the next (benchmarks/RESULTS.md).

    python -m benchmarks.translation training                     # CPU, both settings
    python -m benchmarks.translation training --device cuda --fp16 --compile   # on a GPU
    python -m benchmarks.translation training --settings long-small --rounds 1 --updates 10   # quick look
"""

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.commands import BIN
from benchmarks.commands import run as run_command
from benchmarks.machine import run_record
from fairseq_entmax import USER_DIR
from fairseq_entmax.names import NORMALIZER_LABELS, NORMALIZER_NAMES

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared/data/iwslt16_de_en_sample"

# name (--models, the JSON's keys) -> extra fairseq-train arguments; the first entry, fairseq's
# own Transformer, is the baseline of every ratio. "softmax" is the same softmax through
# SparseMultiheadAttention, which forgoes PyTorch's fused attention: it separates the cost of
# the plugin's attention path from that of the maps.
MODEL_TRAIN_ARGS = {
    "transformer": ["--arch", "{base_arch}"],
    **{
        name: ["--arch", "adaptively_sparse_{base_arch}", "--attention-normalizer", name]
        for name in NORMALIZER_NAMES
        if name != "topk"
    },
    "topk": ["--arch", "explicit_sparse_{base_arch}", "--topk", "8"],
}
# How the reports name each model: the normalizers' labels, with what sets the two softmax
# baselines and top-k's k apart.
LABELS = {
    "transformer": "softmax (fairseq transformer)",
    **NORMALIZER_LABELS,
    "softmax": "softmax (fairseq_entmax attention)",
    "topk": "top-k (k=8)",
}
# With --compile, each sparse model again with its normalizers through torch.compile, as
# "<name>_compiled".
COMPILED = ["sparsemax", "entmax15", "alpha_entmax", "topk"]
COMPILED_SUFFIX = "_compiled"


def label(model):
    """How the reports name a model of MODEL_TRAIN_ARGS, or a compiled one ("<name>_compiled")."""
    if model.endswith(COMPILED_SUFFIX):
        return f"{LABELS[model.removesuffix(COMPILED_SUFFIX)]}, compiled"
    return LABELS[model]


# Sentences per fairseq-generate batch.
GEN_BATCH = 16


def model_size_args(layers, embed_dim, ffn_embed_dim, attention_heads):
    """fairseq-train's size options, the same for the encoder and the decoder."""
    values = {
        "layers": layers,
        "embed-dim": embed_dim,
        "ffn-embed-dim": ffn_embed_dim,
        "attention-heads": attention_heads,
    }
    return [
        arg for option, value in values.items() for arg in (f"--encoder-{option}", value, f"--decoder-{option}", value)
    ]


# A setting: architecture, size overrides, how many corpus lines are joined into one sentence
# (to make sentences long, where attention weighs most), tokens per batch, generated length,
# sentences translated (enough that a run's time is seconds: fairseq reports it to 0.1 s).
SETTINGS = {
    "paper-size": dict(
        base_arch="transformer",
        size=[],
        join_lines=1,
        max_tokens=4096,
        gen_len=30,
        gen_sentences=64,
        about="Transformer base as in the paper (6+6 layers, d=512, 8 heads), TED sentences",
    ),
    "long-small": dict(
        base_arch="transformer",
        size=model_size_args(layers=2, embed_dim=128, ffn_embed_dim=256, attention_heads=8),
        join_lines=8,
        max_tokens=4096,
        gen_len=60,
        gen_sentences=160,
        about="small model (2+2 layers, d=128, 8 heads) on long sentences (8 TED lines joined)",
    ),
    # Not a measurement: runs every step of the benchmark in seconds (benchmarks.gpu_check
    # --cpu-tiny, and its test). Not among the default settings.
    "tiny": dict(
        base_arch="transformer",
        size=model_size_args(layers=1, embed_dim=32, ffn_embed_dim=64, attention_heads=4),
        join_lines=1,
        max_tokens=256,
        gen_len=8,
        gen_sentences=64,
        about="tiny model (1+1 layers, d=32, 4 heads), a check of the benchmark itself",
    ),
}
DEFAULT_SETTINGS = ["paper-size", "long-small"]


def run(args, log, gpu_peak_file=None):
    """Run a fairseq command (benchmarks.commands.run) and read its peak memory.

    Args: args: the command and its arguments; log: the file its output is appended to; gpu_peak_file: None,
    or the file benchmarks/cuda_peak_memory.py wrote for this command (args must run it): the peak is read
    from there.
    Returns: (its output, stdout and stderr together; the peak memory of that process, MiB: its resident set
    size, or on the GPU what torch allocated there, from gpu_peak_file).
    Raises CommandFailed: the command failed; the message holds the end of its output.
    """
    finished = run_command(args, log)
    if gpu_peak_file is not None:
        return finished.output, json.loads(Path(gpu_peak_file).read_text())["peak_allocated_bytes"] / 2**20
    return finished.output, finished.peak_rss_mib


def make_data(data_dir, work, join_lines, n_lines, n_gen):
    """Binarize the benchmark's data with fairseq-preprocess.

    Args: data_dir: the folder of train.de and train.en; work: the work folder (raw/ and bin/ are written
    there); join_lines: corpus lines joined into one sentence (long inputs); n_lines: corpus lines for
    training; n_gen: sentences (after joining) for generation ("test"); the GEN_BATCH of those with the
    shortest sources are "valid", the test run's first batch.
    Returns: The data-bin's path.
    """
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    joined = {}
    for lang in ("de", "en"):
        lines = (data_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[: n_lines + n_gen * join_lines]
        joined[lang] = [" ".join(lines[i : i + join_lines]) for i in range(0, len(lines), join_lines)]
    # The generation sentences with the shortest sources, ties broken as fairseq sorts them
    # (by target length, then by position), so that they form the test run's first batch.
    test = {lang: joined[lang][-n_gen:] for lang in joined}
    by_length = sorted(range(n_gen), key=lambda i: (len(test["de"][i].split()), len(test["en"][i].split()), i))
    shortest = sorted(by_length[:GEN_BATCH])
    for lang in ("de", "en"):
        (raw / f"train.{lang}").write_text("\n".join(joined[lang][:-n_gen]) + "\n", encoding="utf-8")
        (raw / f"test.{lang}").write_text("\n".join(test[lang]) + "\n", encoding="utf-8")
        (raw / f"valid.{lang}").write_text("\n".join(test[lang][i] for i in shortest) + "\n", encoding="utf-8")
    split_args = ["--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test"]
    options = "--source-lang de --target-lang en --joined-dictionary --nwordssrc 8000 --workers 2".split()
    run([BIN / "fairseq-preprocess", *options, *split_args, "--destdir", work / "bin"], work / "preprocess.log")
    return work / "bin"


def train(data_bin, save_dir, model_args, setting, device_args, updates, cuda=False, save=True):
    """Train one model with fairseq-train, validation off.

    Args: data_bin: the data-bin; save_dir: fairseq's --save-dir (its log is written beside it); model_args:
    the architecture and attention options of the model; setting: an entry of SETTINGS (size, max_tokens);
    device_args: ["--cpu"], or the GPU's options (e.g. ["--fp16"]); updates: training updates; cuda: whether
    it trains on the GPU: fairseq-train then runs through benchmarks.cuda_peak_memory, which records the peak
    GPU memory; save: whether to save the checkpoint (generate needs it); a Transformer base's, with Adam's
    state, takes seconds to write.
    Returns: (target words/s, the mean of fairseq's wps without the first log interval; peak memory of the
    process, MiB: resident on the CPU, allocated by torch on the GPU).
    """
    log_path = save_dir.parent / f"{save_dir.name}.train.log"
    gpu_peak_file = save_dir.parent / f"{save_dir.name}.gpu-peak.json" if cuda else None
    # The same fairseq-train, in a process that records its peak GPU memory.
    command = (
        [sys.executable, "-m", "benchmarks.cuda_peak_memory", gpu_peak_file, "fairseq_cli.train"]
        if cuda
        else [BIN / "fairseq-train"]
    )
    text, peak_mib = run(
        [*command, *train_args(data_bin, save_dir, model_args, setting, device_args, updates, save)],
        log_path,
        gpu_peak_file,
    )
    inner = [json.loads(line[line.index("{") :]) for line in text.splitlines() if "train_inner" in line and "{" in line]
    if len(inner) < 2:
        sys.exit(f"too few log intervals in {log_path}: raise --updates")
    return statistics.mean(float(s["wps"]) for s in inner[1:]), peak_mib


def train_args(data_bin, save_dir, model_args, setting, device_args, updates, save):
    """fairseq-train's arguments for train (which documents them), a list."""
    fixed = (
        "--task translation --optimizer adam --adam-betas (0.9,0.98) --lr 5e-4 --lr-scheduler inverse_sqrt "
        "--warmup-updates 4000 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 "
        "--max-source-positions 2048 --max-target-positions 2048 --disable-validation --no-epoch-checkpoints "
        "--seed 1 --log-format json --log-interval 5"
    ).split()
    sized = ["--max-tokens", str(setting["max_tokens"]), "--max-update", str(updates)]
    saving = ["--save-dir", save_dir, "--save-interval-updates", str(updates), *([] if save else ["--no-save"])]
    return [data_bin, "--user-dir", USER_DIR, *model_args, *setting["size"], *fixed, *sized, *saving, *device_args]


def generate(data_bin, save_dir, setting, device_args):
    """Steady generation speed: the test sentences against their first batch (see the top).

    Args: data_bin: the data-bin (make_data's); save_dir: the trained model's --save-dir (checkpoint_last.pt
    is used); setting: an entry of SETTINGS (gen_len: the forced output length); device_args: ["--cpu"], or
    the GPU's options (e.g. ["--fp16"]).
    Returns: Sentences per second; None when the two runs' times, which fairseq reports to 0.1 s, do not
    differ (too few sentences for the rate to be measured).
    """
    n = setting["gen_len"]
    done = {}
    for subset in ("test", "valid"):
        # Every translation forced to n tokens: each model does the same work.
        length = f"--beam 5 --batch-size {GEN_BATCH} --min-len {n} --max-len-a 0 --max-len-b {n}".split()
        command = [
            BIN / "fairseq-generate",
            data_bin,
            "--user-dir",
            USER_DIR,
            "--path",
            save_dir / "checkpoint_last.pt",
        ]
        text, _ = run(
            [*command, "--gen-subset", subset, *length, *device_args],
            save_dir.parent / f"{save_dir.name}.generate-{subset}.log",
        )
        match = re.search(r"Translated ([\d,]+) sentences \(.*?\) in ([\d.]+)s", text)
        done[subset] = (int(match.group(1).replace(",", "")), float(match.group(2)))
    (all_sentences, all_seconds), (batch_sentences, batch_seconds) = done["test"], done["valid"]
    if all_seconds <= batch_seconds:
        return None
    return (all_sentences - batch_sentences) / (all_seconds - batch_seconds)


def setting_report(report, name, about, results, json_path):
    """Put one setting's medians and ratios into the report, and write it to json_path.

    Args: report: the whole report (its "settings" gets this one's entry); name: the setting's name; about:
    what was run, a str; results: {model: {"wps", "memory", "sps": lists of measurements}}, the baseline
    first; a model with no training measured yet is left out; json_path: None, or the file written.
    """
    # A generation too short to be timed gave None (generate): the median is of the others.
    median = {
        model: {key: median_of_measured(values) for key, values in r.items()}
        for model, r in results.items()
        if r["wps"]
    }
    if not median:
        return
    base = next(iter(median.values()))
    report["settings"][name] = {
        "about": about,
        "models": {
            model: {
                "label": label(model),
                "train_words_per_s": m["wps"],
                "train_words_per_s_ratio": m["wps"] / base["wps"],
                "peak_memory_mib": m["memory"],
                "peak_memory_ratio": m["memory"] / base["memory"],
                "generate_sentences_per_s": m["sps"],
                "generate_sentences_per_s_ratio": None if None in (m["sps"], base["sps"]) else m["sps"] / base["sps"],
            }
            for model, m in median.items()
        },
    }
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")


def median_of_measured(values):
    """The median of the values that are not None.

    Args: values: floats or None (not measured).
    Returns: Their median, or None when none was measured.
    """
    measured = [value for value in values if value is not None]
    return statistics.median(measured) if measured else None


def results_table(models, memory_label):
    """The results of one setting as a Markdown table, each figure beside its ratio to the baseline (the first
    model).

    Args: models: the setting's report entry's "models" (setting_report); memory_label: the memory column's
    title.
    Returns: The table, a str ("-" where generation was not measured).
    """
    lines = [
        f"| model | train words/s | ratio | {memory_label} | ratio | generate sent/s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in models.values():
        sps = (
            "- | -"
            if m["generate_sentences_per_s_ratio"] is None
            else (f"{m['generate_sentences_per_s']:.2f} | {m['generate_sentences_per_s_ratio']:.2f}")
        )
        lines.append(
            f"| {m['label']} | {m['train_words_per_s']:.0f} | {m['train_words_per_s_ratio']:.2f} | "
            f"{m['peak_memory_mib']:.0f} | {m['peak_memory_ratio']:.2f} | {sps} |"
        )
    return "\n".join(lines)


def build_parser():
    """The benchmark's command line (see the top).

    Returns: The argparse.ArgumentParser.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with train.de and train.en")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--fp16", action="store_true", help="train and generate in mixed precision (fairseq's --fp16; GPU only)"
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=list(SETTINGS),
        default=DEFAULT_SETTINGS,
        help=f"default: {' '.join(DEFAULT_SETTINGS)} ('tiny' only checks that the benchmark runs)",
    )
    parser.add_argument("--updates", type=int, default=15, help="training updates per run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions; the median is kept")
    parser.add_argument("--lines", type=int, default=6000, help="corpus lines used for training")
    parser.add_argument(
        "--gen-sentences",
        type=int,
        help="test sentences translated, a multiple of 16 (batches of 16); the first batch again for "
        "the steady rate (default: the setting's, 64 for paper-size, 160 for long-small)",
    )
    parser.add_argument(
        "--gen-repeats",
        type=int,
        default=3,
        help="fairseq-generate runs per trained model, interleaved across models; the median is kept",
    )
    parser.add_argument(
        "--generate",
        choices=["all", "uncompiled", "none"],
        default="all",
        help="which models' generation speed is measured (default: all; uncompiled: not those "
        "trained with --compile-normalizers)",
    )
    parser.add_argument("--work-dir", type=Path, help="keep logs and checkpoints here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the results to this file (JSON)")
    parser.add_argument(
        "--models",
        nargs="+",
        choices=list(MODEL_TRAIN_ARGS),
        metavar="MODEL",
        help="measure only these models (and the baseline, always first); default: all of "
        + " ".join(MODEL_TRAIN_ARGS),
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also run each sparse model with --compile-normalizers (compiling is in the first, "
        "dropped, log interval of training and the first, cancelled, batch of generation)",
    )
    parser.add_argument(
        "--only-compiled",
        action="store_true",
        help="with --compile, the sparse models only with --compile-normalizers (the baseline stays)",
    )
    return parser


@dataclass
class BenchmarkRun:
    """What a run measures, from its command line.

    Attributes: args: the parsed command line; models: name -> fairseq-train arguments of each model trained
    (the baseline first); compiled: name -> the model it compiles, for those trained with
    --compile-normalizers; generated: the models whose generation speed is measured; device_args: fairseq's
    arguments for the device.
    """

    args: argparse.Namespace
    models: dict
    compiled: dict
    generated: list
    device_args: list

    @property
    def cuda(self):
        """Whether it runs on a GPU."""
        return self.args.device == "cuda"

    @property
    def memory_label(self):
        """The tables' name of the peak memory measured."""
        return "peak GPU MiB" if self.cuda else "peak RSS MiB"


def benchmark_run(args, parser):
    """Check the command line and choose the models.

    Args: args: the parsed command line; parser: its parser (for the errors).
    Returns: The BenchmarkRun.
    """
    models = {
        name: model_args
        for name, model_args in MODEL_TRAIN_ARGS.items()
        if args.models is None or name in args.models or name == next(iter(MODEL_TRAIN_ARGS))
    }
    compiled = {}
    if args.only_compiled and not args.compile:
        parser.error("--only-compiled needs --compile")
    if args.compile:
        compiled = {name + COMPILED_SUFFIX: name for name in COMPILED if name in models}
        if args.only_compiled:
            models = {name: model_args for name, model_args in models.items() if name not in COMPILED}
        models.update((label, MODEL_TRAIN_ARGS[name] + ["--compile-normalizers"]) for label, name in compiled.items())
    if args.rounds < 1 or args.gen_repeats < 1 or args.updates < 1:
        parser.error("--rounds, --gen-repeats and --updates must be at least 1")
    if args.gen_sentences is not None and (args.gen_sentences < 2 * GEN_BATCH or args.gen_sentences % GEN_BATCH):
        parser.error(f"--gen-sentences must be a multiple of {GEN_BATCH}, at least {2 * GEN_BATCH}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available to torch")
    if args.fp16 and args.device != "cuda":
        parser.error("--fp16 needs --device cuda (fairseq trains in fp16 on GPUs only)")
    if not (args.data / "train.de").exists():
        parser.error(
            f"{args.data}/train.de not found: pass --data, a folder with train.de and train.en (any "
            "German-English text, e.g. Multi30k as examples.reproduction.reduced_scale downloads it "
            "into ~/.cache/fairseq-entmax/multi30k)"
        )
    if args.work_dir is not None and args.work_dir.is_dir() and any(args.work_dir.iterdir()):
        # fairseq-preprocess refuses its dictionaries there, and fairseq-train would resume the
        # checkpoints it finds instead of training afresh.
        parser.error(f"--work-dir {args.work_dir} holds an earlier run: give an empty or new folder, or remove it")
    device_args = ["--fp16"] if args.fp16 else []
    if args.device != "cuda":
        device_args += ["--cpu", "--num-workers", "0"]
    generated = [
        model for model in models if args.generate == "all" or (args.generate == "uncompiled" and model not in compiled)
    ]
    return BenchmarkRun(args, models, compiled, generated, device_args)


def measure_setting(bench, name, work, report):
    """Train and time every model of the run at one setting, printing progress and its table.

    Args: bench: the BenchmarkRun; name: the setting, a key of SETTINGS; work: the setting's work folder;
    report: the report (--json), updated as each measurement ends.
    """
    args, models, generated = bench.args, bench.models, bench.generated
    setting = SETTINGS[name]
    n_gen = args.gen_sentences or setting["gen_sentences"]
    data_bin = make_data(args.data, work, setting["join_lines"], args.lines, n_gen)
    results = {model: {"wps": [], "memory": [], "sps": []} for model in models}
    for round_ in range(args.rounds):
        save_dirs = {}
        for model, model_args in models.items():
            save_dirs[model] = work / f"{model}_r{round_}"
            t0 = time.time()
            wps, memory = train(
                data_bin,
                save_dirs[model],
                [a.format(**setting) for a in model_args],
                setting,
                bench.device_args,
                args.updates,
                cuda=bench.cuda,
                save=model in generated,
            )
            results[model]["wps"].append(wps)
            results[model]["memory"].append(memory)
            # What was measured so far, in --json: a run stopped at a time limit keeps it.
            setting_report(report, name, f"{setting['about']} (unfinished)", results, args.json)
            print(
                f"[{name} round {round_ + 1}/{args.rounds}] {label(model)}: {wps:.0f} words/s, "
                f"{bench.memory_label} {memory:.0f} ({time.time() - t0:.0f}s)",
                flush=True,
            )
        for repeat in range(args.gen_repeats if generated else 0):
            rates = {model: generate(data_bin, save_dirs[model], setting, bench.device_args) for model in generated}
            for model, sps in rates.items():
                results[model]["sps"].append(sps)
            setting_report(report, name, f"{setting['about']} (unfinished)", results, args.json)
            print(
                f"[{name} round {round_ + 1}/{args.rounds}] generation {repeat + 1}/{args.gen_repeats}, "
                "sentences/s: "
                + ", ".join(f"{label(model)} {'-' if sps is None else f'{sps:.2f}'}" for model, sps in rates.items()),
                flush=True,
            )
    generation = (
        f"generation of {n_gen} sentences, beam 5, to exactly {setting['gen_len']} tokens"
        if generated
        else "no generation"
    )
    about = (
        f"{setting['about']}; {args.updates} updates of {setting['max_tokens']} tokens"
        f"{', fp16' if args.fp16 else ''}, {generation}; median of {args.rounds} rounds"
        + (f" (generation: of {args.rounds * args.gen_repeats} runs)" if generated else "")
    )
    setting_report(report, name, about, results, args.json)
    print(f"\n### {name}: {about}\n")
    print(results_table(report["settings"][name]["models"], bench.memory_label))
    print(flush=True)


def main():
    """The benchmark's command line (see the top); prints the results table."""
    parser = build_parser()
    bench = benchmark_run(parser.parse_args(), parser)
    args = bench.args
    work_root = args.work_dir or Path(tempfile.mkdtemp(prefix="fairseq-entmax-bench-"))
    report = run_record(args.device)
    print(f"work dir: {work_root}", flush=True)
    report |= {
        "device": args.device,
        "fp16": args.fp16,
        "memory": "peak GPU memory allocated by torch" if bench.cuda else "peak resident set size",
        "settings": {},
    }
    for name in args.settings:
        measure_setting(bench, name, work_root / name, report)
