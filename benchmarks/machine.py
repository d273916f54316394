"""The machine a benchmark ran on, as its report names it."""

import os
import platform
import re
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
