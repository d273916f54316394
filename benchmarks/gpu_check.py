"""The GPU check: on a CUDA machine, in under 10 minutes and with no network, everything about
the plugin that only a GPU can show, in one report.

Steps (each runs even when an earlier one failed; a failure is recorded in the report, and the
check then exits 1):

1. environment: GPU, driver, torch, CUDA, Triton, fairseq and this package's versions.
2. cuda-tests: tests/test_normalizers_cuda.py under pytest (the GPU agrees with the CPU, and
   forward and backward of every normalizer make no host synchronisation under
   torch.cuda.set_sync_debug_mode("error")); each test's outcome is reported.
3. attention-sync: the attention layer's normalizer step, the module SparseMultiheadAttention
   calls on its scores (softmax, sparsemax, 1.5-entmax, learned alpha-entmax, top-k), forward
   and backward in float32 and float16, under torch.cuda.set_sync_debug_mode("error").
4. normalizers-<dtype>: benchmarks/normalizers.py --device cuda in float32, bfloat16 and
   float16 (against torch.softmax and, where installed, the entmax package).
5. round-trip: a small learned alpha-entmax model trained with fairseq-train on the given text,
   then fairseq-generate and fairseq-interactive from its checkpoint.
6. training: benchmarks/training.py --device cuda --fp16 at the paper's Transformer-base size on
   the given text: training words/s and peak GPU memory of softmax, sparsemax, 1.5-entmax,
   learned alpha-entmax and top-k, and fairseq-generate sentences/s, each as a ratio to softmax.
7. training-compiled: the same trainings (no generation) with --compile-normalizers, in a run
   of their own beside softmax: the first run's figures stand when this one runs out of time.

The text is a folder with train.de and train.en, line-aligned (--data): a few thousand lines
are enough. `make gpu-data` copies them from ../shared/data into .gpu-data/ (ignored by git),
which travels to a GPU machine as it is.

Writes gpu-check.md and gpu-check.json (every figure and ratio, and what failed) and a tarball
of the logs into --out, and prints the report. Without a CUDA device it stops at once, exit
status 2, saying what it would have run. --cpu-tiny runs the same steps at tiny size on the
CPU instead, the compiled trainings excepted: no measurement, a check of the check itself
(tests/test_gpu_check.py).

    python benchmarks/gpu_check.py --data .gpu-data --out gpu-check-out
    make gpu-check GPU_CHECK_ARGS="--data .gpu-data --out gpu-check-out"
    python benchmarks/gpu_check.py --cpu-tiny --data DIR --out DIR

benchmarks/gpu_install.sh installs what it needs on the GPU machine, offline, and says how a
session with a GPU runs it.
"""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This checkout's package, before any installed one (its commands get the same, subprocess_env).
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
DEFAULT_DATA = ROOT / ".gpu-data"
DTYPES = ["float32", "bfloat16", "float16"]
# The attention layer's normalizers, as build_normalizer names them, with their options.
LAYER_NORMALIZERS = [
    ("softmax", {}),
    ("sparsemax", {}),
    ("entmax15", {}),
    ("alpha_entmax", {}),
    ("topk", {"topk": 8}),
    ("topk", {"topk_fraction": 0.3}),
]
# The training benchmark's second run: the sparse models with --compile-normalizers only.
COMPILED_ARGS = "--compile --only-compiled --generate none"
# Seconds kept for each later step when a step's time limit is set: no step can starve the
# ones after it of the whole budget.
RESERVE_S = 20

# What each step runs, at full size (GPU) and at tiny size (--cpu-tiny). The round trip's
# model: 2+2 layers of width 256, the paper's learned alpha-entmax.
FULL = dict(
    device="cuda",
    pytest_args=[],
    normalizer_args=["--rounds", "5"],
    round_trip_size=["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "256"]
    + ["--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024"]
    + ["--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
    round_trip_updates=300,
    round_trip_lines=3000,
    training_args=["--settings", "paper-size", "--fp16", "--rounds", "1", "--gen-repeats", "1", "--updates", "20"]
    + ["--lines", "3900", "--models", "sparsemax", "1.5-entmax", "alpha-entmax (learned)", "top-k (k=8)"],
    skip={},
    budget_s=520,
)
TINY = dict(
    device="cpu",
    # one CPU test of the file: the run and its report, not the tests themselves
    pytest_args=["-k", "alpha_given"],
    normalizer_args=["--rounds", "1", "--shapes", "16x8x8", "--threads", "1"],
    round_trip_size=["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32"]
    + ["--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]
    + ["--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
    round_trip_updates=6,
    round_trip_lines=200,
    # generation's speed not measured (fairseq-generate runs in round-trip): each fairseq
    # command costs seconds of CPU at start-up, and the check of the check should be quick
    training_args=["--settings", "tiny", "--models", "top-k (k=8)", "--rounds", "1", "--generate", "none"]
    + ["--updates", "10", "--lines", "300"],
    # Inductor's C++ build would take the CPU for longer than the rest of the check;
    # tests/test_fairseq_compile.py compiles through fairseq on the CPU.
    skip={"training-compiled": "--cpu-tiny: compiling on the CPU is tested by tests/test_fairseq_compile.py"},
    budget_s=900,
)


def step_list(size):
    """The steps, in the order they run.

    Args:
        size: FULL or TINY.

    Returns:
        A list of (name, what it runs, its longest run in seconds).
    """
    device = size["device"]
    training_args = " ".join(f"'{a}'" if " " in a else a for a in size["training_args"])
    return [
        ("environment", "versions of the GPU's driver, torch, CUDA, Triton, fairseq and this package", 60),
        ("cuda-tests", "pytest tests/test_normalizers_cuda.py (agreement with the CPU, no host sync)", 150),
        ("attention-sync", "the attention layer's normalizer step under set_sync_debug_mode('error')", 90),
        *(
            (f"normalizers-{dtype}", f"benchmarks/normalizers.py --device {device} --dtype {dtype} --json", 90)
            for dtype in DTYPES
        ),
        ("round-trip", "fairseq-train of a small model, then fairseq-generate and fairseq-interactive", 150),
        ("training", f"benchmarks/training.py --device {device} {training_args}", 300),
        ("training-compiled", f"benchmarks/training.py --device {device} {training_args} {COMPILED_ARGS}", 300),
    ]


class StepFailed(Exception):
    """A step's command failed; the message says how."""


def subprocess_env():
    """The environment of the commands run: this checkout's package first on the path, Python
    output unbuffered (a command stopped at its time limit leaves its log whole)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run_command(args, log, timeout, stdin_text=None, env=None):
    """Run a command with its output in a log; its whole process group is killed at the limit.

    Args:
        args: the command and its arguments.
        log: the file stdout and stderr go to.
        timeout: seconds.
        stdin_text: text typed into it, or None.
        env: extra environment variables.

    Returns:
        Its output (the log's text).

    Raises:
        StepFailed: it exited non-zero or ran past the limit (the log's end in the message).
    """
    full_env = subprocess_env()
    full_env.update(env or {})
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(a) for a in args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            cwd=ROOT,
            env=full_env,
            text=True,
            start_new_session=True,
        )
        try:
            proc.communicate(stdin_text, timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise StepFailed(f"timed out after {timeout:.0f}s: {' '.join(map(str, args))}\n{tail(log)}") from None
    if proc.returncode != 0:
        raise StepFailed(f"exit status {proc.returncode}: {' '.join(map(str, args))}\n{tail(log)}")
    return Path(log).read_text(errors="replace")


def tail(path, lines=25, width=300):
    """The last lines of a file, each cut to a width, for a failure's message."""
    text = Path(path).read_text(errors="replace") if Path(path).exists() else ""
    return "\n".join(line[:width] for line in text.splitlines()[-lines:])


def environment(context):
    """Step 1: what ran where.

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
        query = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
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
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    found["commit"] = commit.stdout.strip() if commit.returncode == 0 else None
    if found["fairseq"] is None or found["fairseq_entmax"] is None:
        raise StepFailed("fairseq or fairseq_entmax does not import: " + json.dumps(found))
    return found


def cuda_tests(context):
    """Step 2: tests/test_normalizers_cuda.py under pytest, outside this suite's conftest (the
    file needs only torch, numpy and pytest).

    Returns:
        The counts of outcomes, the failed tests, and the outcome of each no-host-sync test.
    """
    junit = context["work"] / "cuda-tests.xml"
    log = context["work"] / "cuda-tests.log"
    try:
        run_command(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"]
            + ["tests/test_normalizers_cuda.py", "--junitxml", junit, *context["size"]["pytest_args"]],
            log,
            context["timeout"],
            env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])},
        )
        failure = None
    except StepFailed as error:
        failure = error
    if not junit.exists():
        raise failure or StepFailed("pytest wrote no report")
    found = summarise_tests(read_junit(junit))
    if failure is not None:
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


def attention_sync(context):
    """Step 3, run in a process of its own (a CUDA error there cannot touch the other steps):
    see layer_step_synchronisations.

    Returns:
        {"<normalizer> <options> <dtype>": "no host sync" or the error}.
    """
    out = context["work"] / "attention-sync.json"
    try:
        run_command(
            [sys.executable, __file__, "--layer-sync-step", out, "--device", context["size"]["device"]],
            context["work"] / "attention-sync.log",
            context["timeout"],
        )
    finally:
        found = json.loads(out.read_text()) if out.exists() else None
    if found is None:
        raise StepFailed("the step wrote no results")
    if any(verdict not in ("no host sync", "ran (the CPU cannot check synchronisation)") for verdict in found.values()):
        raise StepFailed(json.dumps(found, indent=1))
    return found


def layer_step_synchronisations(device, out):
    """Forward and backward of the attention layer's normalizer step (the module
    SparseMultiheadAttention calls on its scores, fairseq_entmax.normalizers.build_normalizer:
    learned alpha's per-head alphas and clamp, top-k's per-row k) for every normalizer, in
    float32 and in float16 (fairseq's --fp16), after one warm-up call (a kernel's first launch
    may synchronise), under torch.cuda.set_sync_debug_mode("error"), which raises on any
    synchronising call. On the CPU the step runs on the sync-free path and nothing is checked.
    Writes {case: verdict} to out as each case ends.

    Args:
        device: "cuda" or "cpu".
        out: the JSON file written.
    """
    import torch

    from fairseq_entmax.normalizers import build_normalizer, sync_free

    cuda = device == "cuda"
    verdicts = {}
    heads, queries, keys = 4, 6, 20
    for dtype in (torch.float32, torch.float16):
        for normalizer, options in LAYER_NORMALIZERS:
            case = f"{normalizer} {json.dumps(options)} {str(dtype).replace('torch.', '')}"
            try:
                layer = build_normalizer(normalizer, heads, **options).to(device)
                generator = torch.Generator().manual_seed(0)
                scores = torch.randn(3 * heads, queries, keys, generator=generator) * 3
                scores[:heads, :, 15:] = float("-inf")  # padded keys
                scores[heads, 3] = float("-inf")  # a fully masked row
                scores = scores.to(device, dtype)
                upstream = torch.linspace(-1, 1, keys, device=device, dtype=dtype)

                def forward_backward(layer=layer, scores=scores, upstream=upstream):
                    x = scores.clone().requires_grad_()
                    (layer(x) * upstream).sum().backward()
                    return x.grad

                if cuda:
                    forward_backward()
                    torch.cuda.synchronize()
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        grad = forward_backward()
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                    torch.cuda.synchronize()
                    verdict = "no host sync"
                else:
                    with sync_free():
                        grad = forward_backward()
                    verdict = "ran (the CPU cannot check synchronisation)"
                if not torch.isfinite(grad).all():
                    verdict = "the gradient is not finite"
            except Exception as error:  # recorded, and the next case runs
                verdict = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            verdicts[case] = verdict
            Path(out).write_text(json.dumps(verdicts, indent=1) + "\n")


def normalizers_step(dtype):
    """Step 4 for one dtype: benchmarks/normalizers.py.

    Args:
        dtype: "float32", "bfloat16" or "float16".

    Returns:
        The step's function of the context, returning the benchmark's JSON.
    """

    def step(context):
        out = context["work"] / f"normalizers-{dtype}.json"
        run_command(
            [sys.executable, HERE / "normalizers.py", "--device", context["size"]["device"], "--dtype", dtype]
            + [*context["size"]["normalizer_args"], "--json", out],
            context["work"] / f"normalizers-{dtype}.log",
            context["timeout"],
        )
        return json.loads(out.read_text())

    return step


def round_trip(context):
    """Step 5: a small model trained on the given text (learned alpha-entmax), then
    fairseq-generate on its test sentences and fairseq-interactive on three typed ones.

    Returns:
        The last training loss, BLEU, the sentences translated by each command and a sample.
    """
    sys.path.insert(1, str(HERE))
    import training

    size, work = context["size"], context["work"] / "round-trip"
    deadline = time.time() + context["timeout"]
    cuda_args = ["--fp16"] if size["device"] == "cuda" else ["--cpu", "--num-workers", "0"]
    try:
        data_bin = training.make_data(context["data"], work, 1, size["round_trip_lines"], 32)
    except SystemExit as error:
        raise StepFailed(f"fairseq-preprocess failed: {error}") from None
    from fairseq_entmax import USER_DIR

    save_dir = work / "checkpoints"
    log = run_command(
        [BIN / "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "adaptively_sparse_transformer"]
        + [*size["round_trip_size"], "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.001"]
        + ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--criterion", "label_smoothed_cross_entropy"]
        + ["--label-smoothing", "0.1", "--max-tokens", "4096", "--max-update", str(size["round_trip_updates"])]
        + ["--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval", "1000", "--validate-interval", "1000"]
        + ["--log-format", "json"]
        + ["--log-interval", str(max(1, size["round_trip_updates"] // 5)), "--seed", "1", "--no-progress-bar"]
        + cuda_args,
        work / "train.log",
        deadline - time.time(),
    )
    losses = [float(json.loads(line[line.index("{") :])["loss"]) for line in log.splitlines() if "train_inner" in line]
    checkpoint = save_dir / "checkpoint_last.pt"
    # Outputs at most as long as the source and 10 tokens: a model this briefly trained may
    # otherwise repeat a word up to fairseq's default of 200 tokens.
    length = ["--max-len-a", "1", "--max-len-b", "10"]
    generated = run_command(
        [BIN / "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test"]
        + ["--beam", "5", "--batch-size", "16", "--required-batch-size-multiple", "1", *length, *cuda_args],
        work / "generate.log",
        deadline - time.time(),
    )
    typed = (work / "raw" / "test.de").read_text(encoding="utf-8").splitlines()[:3]
    interactive = run_command(
        [BIN / "fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "5"]
        + ["--source-lang", "de", "--target-lang", "en", *length, *cuda_args],
        work / "interactive.log",
        deadline - time.time(),
        stdin_text="\n".join(typed) + "\n",
    )
    hypotheses = re.findall(r"^H-\d+\t\S+\t(.*)$", generated, flags=re.M)
    typed_hypotheses = re.findall(r"^H-\d+\t\S+\t(.*)$", interactive, flags=re.M)
    bleu = re.search(r"BLEU4 = ([0-9.]+)", generated)
    found = {
        "train_updates": size["round_trip_updates"],
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


def training_step(name, extra_args):
    """Steps 6 and 7: benchmarks/training.py.

    Args:
        name: the step's name (its files are named after it).
        extra_args: arguments after the size's training_args.

    Returns:
        The step's function of the context, returning the benchmark's JSON.
    """

    def step(context):
        out = context["work"] / f"{name}.json"
        try:
            run_command(
                [sys.executable, HERE / "training.py", "--device", context["size"]["device"], "--data", context["data"]]
                + [*context["size"]["training_args"], *extra_args, "--work-dir", context["work"] / name, "--json", out],
                context["work"] / f"{name}.log",
                context["timeout"],
            )
        except StepFailed:
            # A setting finished before the failure is kept (training.py writes it as it ends).
            if out.exists():
                context["partial"] = json.loads(out.read_text())
            raise
        return json.loads(out.read_text())

    return step


STEP_FUNCTIONS = {
    "environment": environment,
    "cuda-tests": cuda_tests,
    "attention-sync": attention_sync,
    **{f"normalizers-{dtype}": normalizers_step(dtype) for dtype in DTYPES},
    "round-trip": round_trip,
    "training": training_step("training", []),
    "training-compiled": training_step("training-compiled", COMPILED_ARGS.split()),
}


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
    steps = step_list(size)
    deadline = time.time() + budget_s
    records = []
    for index, (name, about, longest) in enumerate(steps):
        record = {"step": name, "about": about}
        if only is not None and name not in only:
            records.append(dict(record, status="not run", seconds=0.0, error="not among --steps"))
            continue
        if name in size["skip"]:
            records.append(dict(record, status="skipped", seconds=0.0, error=size["skip"][name]))
            continue
        later = sum(
            1
            for later_name, _, _ in steps[index + 1 :]
            if (only is None or later_name in only) and later_name not in size["skip"]
        )
        timeout = min(longest, deadline - time.time() - RESERVE_S * later)
        context = {"size": size, "data": data, "work": work, "timeout": timeout}
        print(f"[gpu-check] {name}: {about} (limit {timeout:.0f}s)", flush=True)
        start = time.time()
        try:
            if timeout < 5:
                raise StepFailed("no time left in the budget")
            record.update(status="ok", result=STEP_FUNCTIONS[name](context))
        except Exception as error:  # every failure is recorded; the next step runs
            message = str(error) if isinstance(error, StepFailed) else traceback.format_exc()
            record.update(status="failed", error=message[-4000:])
            if "partial" in context:
                record["result"] = context["partial"]
        record["seconds"] = round(time.time() - start, 1)
        print(f"[gpu-check] {name}: {record['status']} in {record['seconds']:.0f}s", flush=True)
        records.append(record)
    return records


def markdown_report(report):
    """The report as Markdown: the steps, then each step's figures.

    Args:
        report: what gpu-check.json holds.

    Returns:
        The Markdown text.
    """
    env = next((r.get("result") or {} for r in report["steps"] if r["step"] == "environment"), {})
    lines = [
        f"# GPU check ({report['mode']})",
        "",
        f"{report['started']}; "
        + ", ".join(
            f"{label} {env.get(key) or '-'}"
            for label, key in [
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
        ),
        "",
        f"Verdict: {report['verdict']}",
        "",
        "| step | status | s | what |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['step']} | {r['status']} | {r['seconds']:.0f} | {r['about']}"
        + (f" ({r['error']})" if r["status"] in ("skipped", "not run") else "")
        + " |"
        for r in report["steps"]
    ]
    for record in report["steps"]:
        result = record.get("result")
        if record["status"] == "failed":
            lines += ["", f"## {record['step']}: failed", "", "```", record["error"].strip(), "```"]
        if not result:
            continue
        name = record["step"]
        if name == "cuda-tests":
            lines += ["", "## cuda-tests", "", f"outcomes: {json.dumps(result['counts'])}"]
            lines += [f"failed: {', '.join(result['failed']) or 'none'}"]
            lines += ["no host sync (set_sync_debug_mode('error')), each normalizer:"]
            lines += [f"- {normalizer}: {outcome}" for normalizer, outcome in result["no_host_sync"].items()]
        elif name == "attention-sync":
            lines += ["", "## attention-sync: the attention layer's normalizer step", ""]
            lines += [f"- {case}: {verdict}" for case, verdict in result.items()]
        elif name.startswith("normalizers-"):
            lines += ["", f"## {name}", "", result["about"], "", result["machine"], ""]
            lines += [
                "| shape | normalizer | ours ms | ours/softmax | ours/package | ours MiB | softmax MiB | max abs diff |"
            ]
            lines += ["|---|---|---|---|---|---|---|---|"]
            for row in result["rows"]:
                lines.append(
                    "| "
                    + " | ".join(
                        [
                            "x".join(map(str, row["shape"])),
                            row["normalizer"],
                            number(row["ours_ms"], ".2f"),
                            number(row["ours_over_softmax"], ".2f"),
                            number(row["ours_over_package"], ".2f"),
                            number(row["ours_mib"], ".1f"),
                            number(row["softmax_mib"], ".1f"),
                            number(row["max_abs_diff"], ".1e"),
                        ]
                    )
                    + " |"
                )
        elif name == "round-trip":
            lines += ["", "## round-trip", "", "```", json.dumps(result, indent=1, ensure_ascii=False), "```"]
        elif name.startswith("training"):
            for setting, figures in result["settings"].items():
                lines += ["", f"## {name}: {setting}", "", figures["about"], "", result["machine"], ""]
                lines += [
                    "| model | train words/s | ratio | peak memory MiB | ratio | generate sent/s | ratio |",
                    "|---|---|---|---|---|---|---|",
                ]
                for model, m in figures["models"].items():
                    lines.append(
                        f"| {model} | {number(m['train_words_per_s'], '.0f')} | "
                        f"{number(m['train_words_per_s_ratio'], '.2f')} | {number(m['peak_memory_mib'], '.0f')} | "
                        f"{number(m['peak_memory_ratio'], '.2f')} | {number(m['generate_sentences_per_s'], '.2f')} | "
                        f"{number(m['generate_sentences_per_s_ratio'], '.2f')} |"
                    )
                lines += ["", f"memory: {result['memory']}"]
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
    ]
    lines += [f"  {i}. {name}: {about}" for i, (name, about, _) in enumerate(step_list(size), 1)]
    lines.append("and write gpu-check.md and gpu-check.json. --cpu-tiny runs the same steps at tiny size on the CPU.")
    return "\n".join(lines)


def main():
    """The command line (see the top). Exit status: 0 every step passed, 1 a step failed,
    2 no CUDA device (or a usage error)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--budget-s", type=float, help="seconds for all the steps (default: 540; --cpu-tiny 900)")
    parser.add_argument("--steps", nargs="+", choices=list(STEP_FUNCTIONS), metavar="STEP", help="run only these steps")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--layer-sync-step", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.layer_sync_step:
        layer_step_synchronisations(args.device, args.layer_sync_step)
        return 0
    size = TINY if args.cpu_tiny else FULL
    import torch

    if not args.cpu_tiny and not torch.cuda.is_available():
        print(refusal(size), file=sys.stderr)
        return 2
    data_needed = args.steps is None or {"round-trip", "training"} & set(args.steps)
    if data_needed and not ((args.data / "train.de").exists() and (args.data / "train.en").exists()):
        parser.error(f"--data {args.data}: no train.de and train.en there (`make gpu-data` copies them)")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    records = run_steps(size, args.data.resolve(), work.resolve(), args.budget_s or size["budget_s"], args.steps)
    report = write_report(records, args.out, "cpu-tiny" if args.cpu_tiny else "cuda", started, work)
    print(markdown_report(report))
    print(f"[gpu-check] report: {args.out / 'gpu-check.md'}, {args.out / 'gpu-check.json'}; work dir: {work}")
    return 0 if report["verdict"] == "every step passed" else 1


if __name__ == "__main__":
    sys.exit(main())
