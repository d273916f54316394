"""The GPU check: on a CUDA machine, in under 10 minutes and with no network, what only a GPU
can show, in one report: the tests marked `cuda` (agreement with the CPU, no host
synchronisation, fairseq-train --fp16 then -generate and -interactive on real text), then the
other benchmarks' --json runs.

Every step runs even when an earlier one failed; a failure is recorded in the report, and the
check then exits 1. Without a CUDA device it stops at once, exit status 2, saying what it would
have run. --cpu-tiny runs the same steps at tiny size on the CPU: no measurement, a check of
the check itself (tests/test_gpu_check.py).

The text (--data) is a folder with train.de and train.en, line-aligned: a few thousand lines
are enough. `make gpu-data` copies them from ../shared/data into .gpu-data/ (ignored by git).
Writes gpu-check.md and gpu-check.json into --out and prints the report:

    python -m benchmarks.gpu_check --data .gpu-data --out gpu-check-out

On a GPU machine without network, benchmarks/gpu_install.sh installs what the check needs from
wheels downloaded beforehand (`make gpu-wheels`).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / ".gpu-data"
# The environment variable that tells tests/test_fairseq_cuda.py where the text is.
DATA_VARIABLE = "GPU_CHECK_DATA"
# Seconds kept for each later step, so that no step starves the ones after it.
RESERVE_S = 20
BUDGET_S = {"cuda": 520, "cpu": 600}

# name: (what it runs, its time limit in seconds, whether it reads --data). In the command,
# {device}, {data}, {work} and {json} stand for the run's; each benchmark writes its --json.
TRAINING = "python -m benchmarks.translation training --device {device} --data {data}"
STEPS = {
    "cuda-tests": ("python -m pytest -m cuda tests", 150, True),
    **{
        f"normalizers-{dtype}": (
            f"python -m benchmarks.maps normalizers --device {{device}} --dtype {dtype}",
            60,
            False,
        )
        for dtype in ("float32", "bfloat16", "float16")
    },
    "training": (f"{TRAINING} --work-dir {{work}}", 150, True),
    "training-compiled": (f"{TRAINING} --work-dir {{work}} --compile --only-compiled", 150, True),
    "attention": ("python -m benchmarks.attention --device {device} --settings raw --causal causal", 100, False),
    "attention-clustered": ("python -m benchmarks.attention --device {device} --settings clustered", 90, False),
    "huggingface": ("python -m benchmarks.huggingface --device {device}", 80, False),
}
_TRAINING_ON_CUDA = ["--settings", "paper-size", "--fp16", "--rounds", "1", "--updates", "20", "--lines", "3900"]
_TRAINING_ON_CUDA += ["--models", "sparsemax", "entmax15", "alpha_entmax", "topk"]
# Each benchmark's arguments at each size: full on the GPU, tiny on the CPU.
SIZE_ARGS = {
    "cuda": {
        "normalizers": ["--rounds", "5"],
        "training": [*_TRAINING_ON_CUDA, "--gen-repeats", "1"],
        "training-compiled": [*_TRAINING_ON_CUDA, "--generate", "none"],
        "attention": ["--tokens", "4096", "16384"],
        "attention-clustered": ["--tokens", "4096", "16384", "--skip-materialized-above", "4096"],
        "huggingface": ["--rounds", "3"],
    },
    "cpu": {
        "normalizers": ["--rounds", "1", "--shapes", "16x8x8", "--threads", "1"],
        "training": ["--settings", "tiny", "--models", "topk", "--rounds", "1", "--generate", "none"]
        + ["--updates", "10", "--lines", "300"],
        "attention": ["--tokens", "64"],
        "huggingface": ["--size", "tiny", "--rounds", "1"],
    },
}
# The steps --cpu-tiny leaves out, and why.
TINY_SKIP = {"training-compiled": "Inductor's CPU build outlasts the check; tests/test_fairseq_compile.py compiles"}


def step_lines():
    """The steps as the help and the refusal list them: number, name, command, limit."""
    return [
        f"  {i}. {name}: {about.format(device='cuda', data='DATA', work='WORK')} (at most {limit} s)"
        for i, (name, (about, limit, _)) in enumerate(STEPS.items(), 1)
    ]


def step_command(name, device, data, work):
    """The command line of one step.

    Args: name: a key of STEPS; device: "cuda" or "cpu"; data: the text folder; work: the work folder; the
    step's JSON and logs go there.
    Returns: The argument list.
    """
    json_path = work / f"{name}.json"
    if name == "cuda-tests":
        return [sys.executable, "-m", "pytest", "-m", "cuda", "tests", "-q", "-rfE", "-p", "no:cacheprovider"] + [
            "--junitxml",
            str(work / "cuda-tests.xml"),
        ]
    # Split before the paths are put in, which may hold spaces.
    words = [word.format(device=device, data=data, work=work / name) for word in STEPS[name][0].split()[1:]]
    size_args = SIZE_ARGS[device].get(name) or SIZE_ARGS[device][name.split("-")[0]]
    return [sys.executable, *words, *size_args, "--json", str(json_path)]


def read_junit(path):
    """pytest's --junitxml report.

    Args: path: the XML file.
    Returns: {"counts": {outcome: tests}, "failed": the names of the failed tests}.
    """
    outcomes = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        children = {child.tag for child in case}
        outcome = next((tag for tag in ("failure", "error", "skipped") if tag in children), "passed")
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = {"failure": "failed"}.get(outcome, outcome)
    counts = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return {"counts": counts, "failed": sorted(name for name, o in outcomes.items() if o in ("failed", "error"))}


def run_step(name, device, data, work, timeout):
    """Run one step in a process of its own, its output in <work>/<name>.log.

    Returns: A record: {"step", "command", "status" ("ok" or "failed"), "seconds", "result" (the step's JSON,
    or the test counts), "output" (its last lines), "error" if it failed}.
    """
    command = step_command(name, device, data, work)
    record = {"step": name, "command": " ".join(command[1:]).replace(str(ROOT) + os.sep, "")}
    start = time.time()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env[DATA_VARIABLE] = str(data)
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
        output, status = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        output, status = f"{error.stdout or ''}{error.stderr or ''}\nran past its {timeout:.0f} s", "timeout"
    (work / f"{name}.log").write_text(output if isinstance(output, str) else output.decode(errors="replace"))
    record["seconds"] = round(time.time() - start, 1)
    result_file = work / ("cuda-tests.xml" if name == "cuda-tests" else f"{name}.json")
    if result_file.exists():
        record["result"] = read_junit(result_file) if name == "cuda-tests" else json.loads(result_file.read_text())
    record["output"] = "\n".join(str(output).splitlines()[-60:])
    record["status"] = "ok" if status == 0 else "failed"
    if status != 0:
        record["error"] = f"exit status {status}" if status != "timeout" else f"ran past its {timeout:.0f} s"
    return record


def run_steps(device, data, work, budget_s, only=None):
    """Every step (or those of only), each within what is left of the budget.

    Returns: The records, in STEPS' order; a step not run is recorded as "not run" with why.
    """
    skip = TINY_SKIP if device == "cpu" else {}
    chosen = [name for name in STEPS if (only is None or name in only) and name not in skip]
    deadline = time.time() + budget_s
    records = []
    for name in STEPS:
        if name not in chosen:
            why = skip.get(name, "not among --steps")
            records.append({"step": name, "status": "not run", "seconds": 0.0, "error": why})
            continue
        later = len(chosen) - chosen.index(name) - 1
        timeout = min(STEPS[name][1], deadline - time.time() - RESERVE_S * later)
        print(f"[gpu-check] {name} (limit {timeout:.0f} s)", flush=True)
        if timeout < 5:
            records.append({"step": name, "status": "failed", "seconds": 0.0, "error": "no time left in the budget"})
            continue
        records.append(run_step(name, device, data, work, timeout))
        print(f"[gpu-check] {name}: {records[-1]['status']} in {records[-1]['seconds']:.0f} s", flush=True)
    return records


def environment():
    """What ran where: versions, the GPU and the commit (None where unknown)."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
    for module in ("triton", "fairseq", "fairseq_entmax", "entmax", "transformers"):
        try:
            found[module] = getattr(__import__(module), "__version__", "installed")
        except Exception as error:  # any failure to import is what is reported
            found[module] = f"does not import: {type(error).__name__}: {error}"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    found["commit"] = commit.stdout.strip() or None
    return found


def markdown_report(report):
    """The report as Markdown: the environment, a table of the steps, then what each printed."""
    lines = [f"# GPU check ({report['mode']})", "", report["started"] + "; "]
    lines[-1] += ", ".join(f"{key} {value}" for key, value in report["environment"].items())
    lines += ["", f"Verdict: {report['verdict']}", "", "| step | status | s | command |", "|---|---|---|---|"]
    for record in report["steps"]:
        what = record.get("command") or record.get("error", "")
        lines.append(f"| {record['step']} | {record['status']} | {record['seconds']:.0f} | {what} |")
    for record in report["steps"]:
        if "output" in record:
            title = f"## {record['step']}" + (f": {record['error']}" if record["status"] == "failed" else "")
            lines += ["", title, "", "```", record["output"].strip(), "```"]
    return "\n".join(lines) + "\n"


def build_parser():
    """The command line; its help lists the steps."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__ + "\nThe steps, at full size:\n" + "\n".join(step_lines()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with train.de and train.en")
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-check-out", help="where the report is written")
    parser.add_argument("--cpu-tiny", action="store_true", help="every step at tiny size on the CPU (no measurement)")
    parser.add_argument("--budget-s", type=float, help="seconds for all the steps (default: 520; --cpu-tiny 600)")
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), metavar="STEP", help="run only these steps")
    return parser


def main(argv=None):
    """The command line (see the top). Exit status: 0 every step passed, 1 a step failed, 2 no CUDA device or no
    text.
    """
    import torch

    args = build_parser().parse_args(argv)
    device = "cpu" if args.cpu_tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device was found (torch.cuda.is_available() is False); nothing was run.",
            file=sys.stderr,
        )
        print("On a CUDA machine it would run, in under 10 minutes:", *step_lines(), sep="\n", file=sys.stderr)
        print("--cpu-tiny runs the same steps at tiny size on the CPU.", file=sys.stderr)
        return 2
    reads_data = any(STEPS[name][2] for name in args.steps or STEPS)
    if reads_data and not all((args.data / name).exists() for name in ("train.de", "train.en")):
        print(
            f"gpu_check: error: --data {args.data}: no train.de and train.en there (`make gpu-data`)", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    work.mkdir(exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    records = run_steps(device, args.data.resolve(), work.resolve(), args.budget_s or BUDGET_S[device], args.steps)
    failed = [r["step"] for r in records if r["status"] == "failed"]
    report = {
        "mode": "cpu-tiny" if args.cpu_tiny else "cuda",
        "started": started,
        "environment": environment(),
        "verdict": "every step passed" if not failed else "failed: " + ", ".join(failed),
        "steps": records,
    }
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (args.out / "gpu-check.md").write_text(markdown_report(report))
    print(markdown_report(report))
    print(f"[gpu-check] report: {args.out / 'gpu-check.md'}, {args.out / 'gpu-check.json'}; logs: {work}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
