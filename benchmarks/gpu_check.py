"""The GPU check: on a CUDA machine, in under 10 minutes and with no network, everything about
the plugin that only a GPU can show, in one report.

Every step runs even when an earlier one failed; a failure is recorded in the report, and the
check then exits 1. The steps are those of STEPS, listed with their time limits by --help and
by the refusal below.

The text is a folder with train.de and train.en, line-aligned (--data): a few thousand lines
are enough. `make gpu-data` copies them from ../shared/data into .gpu-data/ (ignored by git),
which can be copied to a GPU machine as it is.

Writes gpu-check.md and gpu-check.json (every figure and ratio, and what failed) and a tarball
of the logs into --out, and prints the report. Without a CUDA device it stops at once, exit
status 2, saying what it would have run. --cpu-tiny runs the same steps at tiny size on the
CPU instead, the compiled trainings excepted: no measurement, a check of the check itself
(tests/test_gpu_check.py).

    python -m benchmarks.gpu_check --data .gpu-data --out gpu-check-out
    make gpu-check GPU_CHECK_ARGS="--data .gpu-data --out gpu-check-out"
    python -m benchmarks.gpu_check --cpu-tiny --data DIR --out DIR

On a GPU machine without network, benchmarks/gpu_install.sh installs what the check needs from
wheels downloaded beforehand (`make gpu-wheels`).
"""

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from examples.pipeline.tools import ToolError, run_logged

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEFAULT_DATA = ROOT / ".gpu-data"
DTYPES = ["float32", "bfloat16", "float16"]
# The training benchmark's second run: the sparse models with --compile-normalizers only.
COMPILED_ARGS = ["--compile", "--only-compiled", "--generate", "none"]
# Seconds kept for each later step when a step's time limit is set: no step can starve the
# ones after it of the whole budget.
RESERVE_S = 20


@dataclass(frozen=True)
class Size:
    """What the steps run at one size: full (on the GPU) or tiny (--cpu-tiny, on the CPU).

    Attributes:
        device: "cuda" or "cpu".
        pytest_args: extra arguments of the cuda-tests step's pytest.
        normalizer_args: benchmarks.normalizers' arguments.
        round_trip_size: the round trip model's fairseq-train size options.
        round_trip_updates: its training updates.
        round_trip_lines: its corpus lines.
        training_args: benchmarks.training's arguments.
        huggingface_args: benchmarks.huggingface's arguments.
        attention_args: benchmarks.attention's arguments.
        skip: {step name: why it is skipped at this size}.
        budget_s: the default seconds for all the steps together.
    """

    device: str
    pytest_args: list
    normalizer_args: list
    round_trip_size: list
    round_trip_updates: int
    round_trip_lines: int
    training_args: list
    huggingface_args: list
    attention_args: list
    skip: dict
    budget_s: int


def _model_size(layers, dim, ffn, heads):
    """fairseq-train's size options, the same for encoder and decoder."""
    return [
        option
        for side in ("encoder", "decoder")
        for option in (f"--{side}-layers", str(layers), f"--{side}-embed-dim", str(dim))
        + (f"--{side}-ffn-embed-dim", str(ffn), f"--{side}-attention-heads", str(heads))
    ]


# The round trip's model at full size: 2+2 layers of width 256, the paper's learned alpha-entmax.
FULL = Size(
    device="cuda",
    pytest_args=[],
    normalizer_args=["--rounds", "5"],
    round_trip_size=_model_size(2, 256, 1024, 4),
    round_trip_updates=300,
    round_trip_lines=3000,
    training_args=["--settings", "paper-size", "--fp16", "--rounds", "1", "--gen-repeats", "1", "--updates", "20"]
    + ["--lines", "3900", "--models", "sparsemax", "entmax15", "alpha_entmax", "topk"],
    huggingface_args=["--rounds", "3"],
    attention_args=["--tokens", "4096", "16384"],
    skip={},
    budget_s=520,
)
TINY = Size(
    device="cpu",
    # one CPU test of the file: the run and its report, not the tests themselves
    pytest_args=["-k", "alpha_given"],
    normalizer_args=["--rounds", "1", "--shapes", "16x8x8", "--threads", "1"],
    round_trip_size=_model_size(1, 32, 64, 4),
    round_trip_updates=6,
    round_trip_lines=200,
    # generation's speed not measured (fairseq-generate runs in round-trip): each fairseq
    # command costs seconds of CPU at start-up, and the check of the check should be quick
    training_args=["--settings", "tiny", "--models", "topk", "--rounds", "1", "--generate", "none"]
    + ["--updates", "10", "--lines", "300"],
    huggingface_args=["--size", "tiny", "--rounds", "1"],
    attention_args=["--tokens", "64"],
    # Inductor's C++ build would take the CPU for longer than the rest of the check;
    # tests/test_fairseq_compile.py compiles through fairseq on the CPU.
    skip={
        "training-compiled": "--cpu-tiny: compiling on the CPU is tested by tests/test_fairseq_compile.py",
        "attention": "--cpu-tiny: tests/test_attention_benchmark.py runs it on the CPU",
    },
    budget_s=900,
)


@dataclass
class Context:
    """What a step's run is given.

    Attributes:
        name: the step's name (its files in work are named after it).
        size: FULL or TINY.
        data: the folder with train.de and train.en.
        work: where the steps write their logs and results.
        timeout: the seconds this step may take.
    """

    name: str
    size: Size
    data: Path
    work: Path
    timeout: float


class StepFailed(Exception):
    """A step failed; the message says how, and partial holds what it measured before."""

    def __init__(self, message, partial=None):
        super().__init__(message)
        self.partial = partial


def run_command(context, args, log_name=None, timeout=None, input=None, check=True):
    """Run a step's command from the repository root, its output in the step's log.

    Args:
        context: the step's Context.
        args: the command and its arguments.
        log_name: the log's file name in context.work (default: "<step>.log").
        timeout: seconds (default: the step's time limit, context.timeout).
        input: text typed into it, or None.
        check: raise ToolError when it exits non-zero.

    Returns:
        tools.Finished.

    Raises:
        ToolError: it failed (with check) or ran past the step's time limit.
    """
    return run_logged(
        args,
        context.work / (log_name or f"{context.name}.log"),
        # This checkout's package and benchmarks, before any installed ones.
        env={"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)},
        cwd=ROOT,
        timeout=context.timeout if timeout is None else timeout,
        input=input,
        check=check,
    )


def environment(context):
    """What ran where: the environment step.

    Returns:
        The versions (None where one is not installed or not found).
    """
    import torch

    found = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        found.update(gpu=properties.name, gpu_memory_gib=round(properties.total_memory / 2**30, 1))
        found["gpu_capability"] = f"{properties.major}.{properties.minor}"
    smi = shutil.which("nvidia-smi")
    if smi:
        query = run_logged(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], timeout=30, check=False
        )
        if query.returncode == 0 and query.stdout.strip():
            name, driver, memory = (part.strip() for part in query.stdout.splitlines()[0].split(","))
            found.update(nvidia_smi_gpu=name, driver=driver, nvidia_smi_memory=memory)
    for module in ("triton", "fairseq", "fairseq_entmax", "entmax", "numpy"):
        try:
            found[module] = getattr(__import__(module), "__version__", "installed")
        except Exception as error:  # any failure to import is what is reported
            found[module] = None
            found[f"{module}_error"] = f"{type(error).__name__}: {error}"
    commit = run_logged(["git", "rev-parse", "HEAD"], cwd=ROOT, timeout=30, check=False)
    found["commit"] = commit.stdout.strip() if commit.returncode == 0 else None
    if found["fairseq"] is None or found["fairseq_entmax"] is None:
        raise StepFailed("fairseq or fairseq_entmax does not import: " + json.dumps(found))
    return found


def cuda_tests(context):
    """tests/test_normalizers_cuda.py under pytest (the file needs only torch, numpy and
    pytest: the suite's conftest loads fairseq only for the tests that ask for it).

    Returns:
        The counts of outcomes, the failed tests, and the outcome of each no-host-sync test.
    """
    junit = context.work / "cuda-tests.xml"
    done = run_command(
        context,
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"]
        + ["tests/test_normalizers_cuda.py", "--junitxml", junit, *context.size.pytest_args],
        check=False,
    )
    failure = f"exit status {done.returncode}: {' '.join(done.args)}\n{done.output[-4000:]}"
    if not junit.exists():
        raise StepFailed(failure if done.returncode else "pytest wrote no report")
    found = summarise_tests(read_junit(junit))
    if done.returncode != 0:
        raise StepFailed(f"{json.dumps(found)}\n{failure}")
    return found


def summarise_tests(outcomes):
    """What the report says of a pytest run.

    Args:
        outcomes: what read_junit returns.

    Returns:
        {"counts": {outcome: tests}, "failed": the failed tests' names, "no_host_sync":
        {normalizer: the outcome of its test_no_host_synchronisation_on_cuda}}.
    """
    counts = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return {
        "counts": counts,
        "failed": sorted(name for name, outcome in outcomes.items() if outcome in ("failed", "error")),
        "no_host_sync": {
            name.split("[", 1)[1].rstrip("]"): outcome
            for name, outcome in outcomes.items()
            if name.startswith("test_no_host_synchronisation_on_cuda[")
        },
    }


def read_junit(path):
    """pytest's --junitxml report.

    Args:
        path: the XML file.

    Returns:
        {test name with its parameters: "passed", "failed", "error" or "skipped"}.
    """
    outcomes = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        children = {child.tag for child in case}
        outcome = next((tag for tag in ("failure", "error", "skipped") if tag in children), "passed")
        outcomes[case.get("name")] = {"failure": "failed"}.get(outcome, outcome)
    return outcomes


def round_trip(context):
    """A small model trained on the given text (learned alpha-entmax), then
    fairseq-generate on its test sentences and fairseq-interactive on three typed ones.

    Returns:
        The last training loss, BLEU, the sentences translated by each command and a sample.
    """
    # Imported here: they import fairseq, whose absence the environment step reports.
    from benchmarks.training import make_data
    from fairseq_entmax import USER_DIR

    size, work = context.size, context.work / context.name
    deadline = time.time() + context.timeout
    cuda_args = ["--fp16"] if size.device == "cuda" else ["--cpu", "--num-workers", "0"]
    data_bin = make_data(context.data, work, 1, size.round_trip_lines, 32)

    save_dir = work / "checkpoints"
    log = run_command(
        context,
        [BIN / "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "adaptively_sparse_transformer"]
        + [*size.round_trip_size, "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.001"]
        + ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--criterion", "label_smoothed_cross_entropy"]
        + ["--label-smoothing", "0.1", "--max-tokens", "4096", "--max-update", str(size.round_trip_updates)]
        + ["--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval", "1000", "--validate-interval", "1000"]
        + ["--log-format", "json"]
        + ["--log-interval", str(max(1, size.round_trip_updates // 5)), "--seed", "1", "--no-progress-bar"]
        + cuda_args,
        "round-trip-train.log",
        timeout=deadline - time.time(),
    ).output
    losses = [float(json.loads(line[line.index("{") :])["loss"]) for line in log.splitlines() if "train_inner" in line]
    checkpoint = save_dir / "checkpoint_last.pt"
    # Outputs at most as long as the source and 10 tokens: a model this briefly trained may
    # otherwise repeat a word up to fairseq's default of 200 tokens.
    length = ["--max-len-a", "1", "--max-len-b", "10"]
    generated = run_command(
        context,
        [BIN / "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test"]
        + ["--beam", "5", "--batch-size", "16", "--required-batch-size-multiple", "1", *length, *cuda_args],
        "round-trip-generate.log",
        timeout=deadline - time.time(),
    ).output
    typed = (work / "raw" / "test.de").read_text(encoding="utf-8").splitlines()[:3]
    interactive = run_command(
        context,
        [BIN / "fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "5"]
        + ["--source-lang", "de", "--target-lang", "en", *length, *cuda_args],
        "round-trip-interactive.log",
        timeout=deadline - time.time(),
        input="\n".join(typed) + "\n",
    ).output
    hypotheses = re.findall(r"^H-\d+\t\S+\t(.*)$", generated, flags=re.M)
    typed_hypotheses = re.findall(r"^H-\d+\t\S+\t(.*)$", interactive, flags=re.M)
    bleu = re.search(r"BLEU4 = ([0-9.]+)", generated)
    found = {
        "train_updates": size.round_trip_updates,
        "train_loss_first_last": [losses[0], losses[-1]] if losses else None,
        "generate_sentences": len(hypotheses),
        "generate_bleu": float(bleu.group(1)) if bleu else None,
        "interactive_typed": len(typed),
        "interactive_translated": len(typed_hypotheses),
        "sample": [{"source": s, "translation": t} for s, t in zip(typed, typed_hypotheses)],
    }
    test_sentences = len((work / "raw" / "test.de").read_text(encoding="utf-8").splitlines())
    if len(hypotheses) != test_sentences or len(typed_hypotheses) != len(typed):
        raise StepFailed(f"sentences left untranslated ({test_sentences} test sentences): {json.dumps(found)}")
    return found


def attention_sync(context):
    """benchmarks.attention_sync, in a process of its own (a CUDA error there cannot touch the
    other steps).

    Returns:
        {"<normalizer> <options> <dtype>": "no host sync" or what went wrong}.
    """
    out = context.work / f"{context.name}.json"
    try:
        run_command(
            context, [sys.executable, "-m", "benchmarks.attention_sync", "--device", context.size.device, "--json", out]
        )
    finally:
        found = json.loads(out.read_text()) if out.exists() else None
    if found is None:
        raise StepFailed("the step wrote no results")
    from benchmarks.attention_sync import CPU_RAN, NO_SYNC

    if any(verdict not in (NO_SYNC, CPU_RAN) for verdict in found.values()):
        raise StepFailed(json.dumps(found, indent=1))
    return found


def run_benchmark(context, module, args=(), size_args=None):
    """A benchmark module's run: `python -m benchmarks.<module> --device D [the size's
    arguments] [args] --json <step>.json`, its JSON the step's result.

    Args:
        context: the step's Context.
        module: the module's name in benchmarks/.
        args: its arguments; "{data}" and "{work}" in them stand for the text folder and the
            step's own work folder.
        size_args: the name of the Size attribute with arguments for the module, or None.

    Returns:
        The JSON the benchmark wrote.

    Raises:
        StepFailed: it failed; what it had written before is kept as the partial result
            (benchmarks write their JSON as each measurement ends).
    """
    out = context.work / f"{context.name}.json"
    own = [str(a).format(data=context.data, work=context.work / context.name) for a in args]
    command = [sys.executable, "-m", f"benchmarks.{module}", "--device", context.size.device]
    command += [*(getattr(context.size, size_args) if size_args else []), *own, "--json", out]
    try:
        run_command(context, command)
    except ToolError as error:
        raise StepFailed(str(error), partial=json.loads(out.read_text()) if out.exists() else None) from None
    return json.loads(out.read_text())


def render_in_header(name, result):
    """The environment step's section: none, its figures are the report's first line.

    Returns:
        No lines.
    """
    return []


def render_cuda_tests(name, result):
    """The cuda-tests step's section of the report.

    Args:
        name: the step's name.
        result: what cuda_tests returns.

    Returns:
        The Markdown lines.
    """
    lines = ["", f"## {name}", "", f"outcomes: {json.dumps(result['counts'])}"]
    lines += [f"failed: {', '.join(result['failed']) or 'none'}"]
    lines += ["no host sync (set_sync_debug_mode('error')), each normalizer:"]
    return lines + [f"- {normalizer}: {outcome}" for normalizer, outcome in result["no_host_sync"].items()]


def render_verdicts(name, result):
    """A section listing each case's verdict (the attention-sync step's).

    Args:
        name: the step's name.
        result: {case: verdict}.

    Returns:
        The Markdown lines.
    """
    return ["", f"## {name}", ""] + [f"- {case}: {verdict}" for case, verdict in result.items()]


def render_json(name, result):
    """A section with the result as JSON: for a step without a table of its own.

    Args:
        name: the step's name.
        result: a JSON-able result.

    Returns:
        The Markdown lines.
    """
    return ["", f"## {name}", "", "```", json.dumps(result, indent=1, ensure_ascii=False), "```"]


def render_huggingface(name, result):
    """The huggingface step's section: benchmarks.huggingface's table.

    Returns:
        The Markdown lines.
    """
    from benchmarks.huggingface import format_report  # transformers only where the step ran

    return ["", f"## {name}", "", *format_report(result).splitlines()]


def render_normalizers(name, result):
    """A normalizers-<dtype> step's section: benchmarks.normalizers' table.

    Args:
        name: the step's name.
        result: benchmarks.normalizers' JSON.

    Returns:
        The Markdown lines.
    """
    lines = ["", f"## {name}", "", result["about"], "", result["machine"], ""]
    lines += ["| shape | normalizer | ours ms | ours/softmax | ours/package | ours MiB | softmax MiB | max abs diff |"]
    lines += ["|---|---|---|---|---|---|---|---|"]
    columns = [
        ("ours_ms", ".2f"),
        ("ours_over_softmax", ".2f"),
        ("ours_over_package", ".2f"),
        ("ours_mib", ".1f"),
        ("softmax_mib", ".1f"),
        ("max_abs_diff", ".1e"),
    ]
    for row in result["rows"]:
        cells = ["x".join(map(str, row["shape"])), row["normalizer"]]
        lines.append("| " + " | ".join(cells + [number(row[key], spec) for key, spec in columns]) + " |")
    return lines


def render_training(name, result):
    """A training step's section: benchmarks.training's table of each setting.

    Args:
        name: the step's name.
        result: benchmarks.training's JSON.

    Returns:
        The Markdown lines.
    """
    lines = []
    for setting, figures in result["settings"].items():
        lines += ["", f"## {name}: {setting}", "", figures["about"], "", result["machine"], ""]
        lines += [
            "| model | train words/s | ratio | peak memory MiB | ratio | generate sent/s | ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in figures["models"].values():
            lines.append(
                f"| {m['label']} | {number(m['train_words_per_s'], '.0f')} | "
                f"{number(m['train_words_per_s_ratio'], '.2f')} | {number(m['peak_memory_mib'], '.0f')} | "
                f"{number(m['peak_memory_ratio'], '.2f')} | {number(m['generate_sentences_per_s'], '.2f')} | "
                f"{number(m['generate_sentences_per_s_ratio'], '.2f')} |"
            )
        lines += ["", f"memory: {result['memory']}"]
    return lines


@dataclass(frozen=True)
class Step:
    """One step of the check.

    Attributes:
        name: its name (--steps, the report's rows, its files in the work folder).
        purpose: what it runs, one line; "{device}", "{training_args}" stand for the size's.
        time_limit_s: its longest run, seconds (less when the budget has less left).
        run: a function of its Context, returning its result (JSON-able); it raises on failure.
        render: a function of (name, result), returning the report's lines for the result.
        needs_data: whether it reads the text (--data).
    """

    name: str
    purpose: str
    time_limit_s: int
    run: Callable = field(repr=False)
    render: Callable = field(repr=False)
    needs_data: bool = False

    def about(self, size):
        """The purpose at a size.

        Args:
            size: FULL or TINY.

        Returns:
            The line, a str.
        """
        return self.purpose.format(device=size.device, training_args=" ".join(size.training_args))


TRAINING = "python -m benchmarks.training --device {device} {training_args}"
# The steps, in the order they run. A benchmark with --device and --json is one more line:
# Step(name, purpose, limit, partial(run_benchmark, module="...", args=[...]), render_json).
STEPS = [
    Step("environment", "versions of the GPU's driver, torch, CUDA, Triton, fairseq and this package", 60,
         environment, render_in_header),
    Step("cuda-tests", "pytest tests/test_normalizers_cuda.py (agreement with the CPU, no host sync)", 150,
         cuda_tests, render_cuda_tests),
    Step("attention-sync", "python -m benchmarks.attention_sync: the attention layer's normalizer step "
         "(every normalizer, float32 and float16) under set_sync_debug_mode('error')", 90,
         attention_sync, render_verdicts),
    *(
        Step(f"normalizers-{dtype}", f"python -m benchmarks.normalizers --device {{device}} --dtype {dtype} "
             "(against torch.softmax and the entmax package)", 90,
             partial(run_benchmark, module="normalizers", args=["--dtype", dtype], size_args="normalizer_args"),
             render_normalizers)
        for dtype in DTYPES
    ),
    Step("round-trip", "fairseq-train of a small learned alpha-entmax model on the text, then fairseq-generate "
         "and fairseq-interactive from its checkpoint", 150,
         round_trip, render_json, needs_data=True),
    Step("training", TRAINING + ": training words/s, peak memory and generation sentences/s, ratios to softmax",
         300, partial(run_benchmark, module="training", args=["--data", "{data}", "--work-dir", "{work}"],
                      size_args="training_args"), render_training, needs_data=True),
    Step("training-compiled", f"{TRAINING} {' '.join(COMPILED_ARGS)}: the same trainings with "
         "--compile-normalizers beside softmax (the first run's figures stand when this one runs out of time)",
         300, partial(run_benchmark, module="training",
                      args=["--data", "{data}", "--work-dir", "{work}", *COMPILED_ARGS],
                      size_args="training_args"), render_training, needs_data=True),
    Step("attention", "python -m benchmarks.attention --device {device} --settings raw --causal causal "
         "--tokens 4096 16384: the blocked attention of every normalizer against torch's sdpa and the "
         "materialized path", 150,
         partial(run_benchmark, module="attention", args=["--settings", "raw", "--causal", "causal"],
                 size_args="attention_args"), render_json),
    Step("huggingface", "python -m benchmarks.huggingface --device {device}: Marian and Llama at base width, "
         "each attention implementation against transformers' eager and sdpa", 120,
         partial(run_benchmark, module="huggingface", size_args="huggingface_args"), render_huggingface),
]  # fmt: skip
STEP_BY_NAME = {step.name: step for step in STEPS}


def step_lines(size):
    """The steps as the help and the refusal list them.

    Args:
        size: FULL or TINY.

    Returns:
        One line per step: its number, name, purpose and time limit.
    """
    return [
        f"  {i}. {step.name}: {step.about(size)} (at most {step.time_limit_s} s)" for i, step in enumerate(STEPS, 1)
    ]


def run_steps(size, data, work, budget_s, only=None):
    """Run every step, each within what is left of the budget, a failure recorded and the
    next step run.

    Args:
        size: FULL or TINY.
        data: the folder with train.de and train.en.
        work: where the steps write their logs and checkpoints.
        budget_s: seconds for all the steps together.
        only: None, or the names of the steps to run (the others are recorded as not run).

    Returns:
        A list of {"step", "about", "status" ("ok", "failed", "skipped" by the size, or "not run"
        when not among only), "seconds", "result" or "error" (why it failed or did not run)}.
    """
    deadline = time.time() + budget_s
    chosen = [step for step in STEPS if (only is None or step.name in only) and step.name not in size.skip]
    records = []
    for step in STEPS:
        record = {"step": step.name, "about": step.about(size)}
        if step not in chosen:
            why = size.skip.get(step.name, "not among --steps")
            records.append(
                dict(record, status="skipped" if step.name in size.skip else "not run", seconds=0.0, error=why)
            )
            continue
        later = len(chosen) - chosen.index(step) - 1
        timeout = min(step.time_limit_s, deadline - time.time() - RESERVE_S * later)
        print(f"[gpu-check] {step.name}: {record['about']} (limit {timeout:.0f}s)", flush=True)
        start = time.time()
        try:
            if timeout < 5:
                raise StepFailed("no time left in the budget")
            record.update(status="ok", result=step.run(Context(step.name, size, data, work, timeout)))
        except Exception as error:  # every failure is recorded; the next step runs
            message = str(error) if isinstance(error, (StepFailed, ToolError)) else traceback.format_exc()
            record.update(status="failed", error=message[-4000:])
            if getattr(error, "partial", None) is not None:
                record["result"] = error.partial
        record["seconds"] = round(time.time() - start, 1)
        print(f"[gpu-check] {step.name}: {record['status']} in {record['seconds']:.0f}s", flush=True)
        records.append(record)
    return records


# The report's first line after the title: (label, the environment step's key).
ENVIRONMENT_LINE = [
    ("GPU", "gpu"),
    ("driver", "driver"),
    ("torch", "torch"),
    ("CUDA", "cuda"),
    ("Triton", "triton"),
    ("fairseq", "fairseq"),
    ("fairseq_entmax", "fairseq_entmax"),
    ("entmax", "entmax"),
    ("Python", "python"),
    ("commit", "commit"),
]


def markdown_report(report):
    """The report as Markdown: the steps, then each step's figures, as its render gives them.

    Args:
        report: what gpu-check.json holds.

    Returns:
        The Markdown text.
    """
    env = next((r.get("result") or {} for r in report["steps"] if r["step"] == "environment"), {})
    lines = [f"# GPU check ({report['mode']})", ""]
    lines += [f"{report['started']}; " + ", ".join(f"{label} {env.get(key) or '-'}" for label, key in ENVIRONMENT_LINE)]
    lines += ["", f"Verdict: {report['verdict']}", "", "| step | status | s | what |", "|---|---|---|---|"]
    lines += [
        f"| {r['step']} | {r['status']} | {r['seconds']:.0f} | {r['about']}"
        + (f" ({r['error']})" if r["status"] in ("skipped", "not run") else "")
        + " |"
        for r in report["steps"]
    ]
    for record in report["steps"]:
        if record["status"] == "failed":
            lines += ["", f"## {record['step']}: failed", "", "```", record["error"].strip(), "```"]
        if record.get("result"):
            lines += STEP_BY_NAME[record["step"]].render(record["step"], record["result"])
    return "\n".join(lines) + "\n"


def number(value, spec):
    """A figure for a table: '-' where it was not measured."""
    return "-" if value is None else format(value, spec)


def write_report(records, out, mode, started, work):
    """Write gpu-check.json, gpu-check.md and gpu-check-logs.tar.gz (the steps' logs and
    JSON, no checkpoints) into out.

    Args:
        records: what run_steps returns.
        out: the folder written.
        mode: "cuda" or "cpu-tiny".
        started: when the check started, a str.
        work: the steps' work folder, whose logs are packed.

    Returns:
        The report, a dict (what gpu-check.json holds).
    """
    failed = [r["step"] for r in records if r["status"] == "failed"]
    report = {
        "mode": mode,
        "started": started,
        "verdict": "every step passed" if not failed else "failed: " + ", ".join(failed),
        "steps": records,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / "gpu-check.md").write_text(markdown_report(report))
    with tarfile.open(out / "gpu-check-logs.tar.gz", "w:gz") as archive:
        for path in sorted(work.rglob("*")):
            if path.is_file() and path.suffix in (".log", ".json", ".xml"):
                archive.add(path, arcname=str(path.relative_to(work)))
    return report


def refusal(size):
    """What the check says without a CUDA device.

    Returns:
        The message, a str.
    """
    lines = [
        "gpu_check: no CUDA device was found (torch.cuda.is_available() is False); nothing was run.",
        "On a CUDA machine it would run, in under 10 minutes:",
        *step_lines(size),
        "and write gpu-check.md and gpu-check.json. --cpu-tiny runs the same steps at tiny size on the CPU.",
    ]
    return "\n".join(lines)


def parse_args(argv=None):
    """The command line; its help lists the steps (STEPS).

    Returns:
        The parsed arguments.
    """
    description = __doc__ + "\nThe steps, at full size:\n" + "\n".join(step_lines(FULL))
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help=f"folder with train.de and train.en, line-aligned real text (default: {DEFAULT_DATA.name}/, "
        "which `make gpu-data` fills)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-check-out", help="where the report is written")
    parser.add_argument("--work-dir", type=Path, help="logs and checkpoints (default: a temporary folder)")
    parser.add_argument("--cpu-tiny", action="store_true", help="every step at tiny size on the CPU (no measurement)")
    parser.add_argument(
        "--budget-s",
        type=float,
        help=f"seconds for all the steps (default: {FULL.budget_s}; --cpu-tiny {TINY.budget_s})",
    )
    parser.add_argument("--steps", nargs="+", choices=list(STEP_BY_NAME), metavar="STEP", help="run only these steps")
    return parser.parse_args(argv)


def main(argv=None):
    """The command line (see the top). Exit status: 0 every step passed, 1 a step failed,
    2 no CUDA device (or a usage error)."""
    import torch

    args = parse_args(argv)
    size = TINY if args.cpu_tiny else FULL
    if not args.cpu_tiny and not torch.cuda.is_available():
        print(refusal(size), file=sys.stderr)
        return 2
    if any(step.needs_data and (args.steps is None or step.name in args.steps) for step in STEPS) and not all(
        (args.data / name).exists() for name in ("train.de", "train.en")
    ):
        print(
            f"gpu_check: error: --data {args.data}: no train.de and train.en there (`make gpu-data` copies them)",
            file=sys.stderr,
        )
        return 2
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    records = run_steps(size, args.data.resolve(), work.resolve(), args.budget_s or size.budget_s, args.steps)
    report = write_report(records, args.out, "cpu-tiny" if args.cpu_tiny else "cuda", started, work)
    print(markdown_report(report))
    print(f"[gpu-check] report: {args.out / 'gpu-check.md'}, {args.out / 'gpu-check.json'}; work dir: {work}")
    return 0 if report["verdict"] == "every step passed" else 1


if __name__ == "__main__":
    sys.exit(main())
