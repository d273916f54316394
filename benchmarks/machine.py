"""What a benchmark's report says of its run: the machine, the date, the commit and the command."""

import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch


def describe(device="cpu"):
    """The machine, for a benchmark's report.

    Args: device: "cpu" or "cuda", or a torch.device (on cuda the GPU is named too).
    Returns: The CPU's model, its logical CPUs, torch's version and threads, and the GPU where it applies, a
    str.
    """
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = re.findall(r"model name\s*:\s*(.*)", cpuinfo.read_text())
        cpu = names[0] if names else cpu
    text = f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if torch.device(device).type == "cuda":
        text += f", GPU {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}"
    return text


def run_record(device="cpu", machine=None, command=None):
    """The run's record, printed one "key: value" line each, for the report and its JSON.

    Args: device: what describe() names; machine: the machine's description, when it says more than
    describe() (None: describe(device)); command: the command line (None: sys.argv's).
    Returns: {"machine", "date", "commit", "command"}: the commit is this checkout's, with "+changes" when the
    working tree differs from it, or None outside a git checkout or without git.
    """
    git = ["git", "-C", str(Path(__file__).resolve().parents[1])]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        if commit and subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True).returncode:
            commit += "+changes"
    except FileNotFoundError:  # no git on this machine
        commit = None
    record = {
        "machine": machine or describe(device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit or None,
        "command": command or " ".join(sys.argv),
    }
    for key, value in record.items():
        print(f"{key}: {value}", flush=True)
    return record
