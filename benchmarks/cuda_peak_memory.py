"""Run a fairseq command in this process and write the peak GPU memory torch allocated during
the whole run.

fairseq's trainer resets CUDA's peak statistics after every update (it logs each update's
peak as gb_free, rounded to 0.1 GB), so torch.cuda.max_memory_allocated at the end covers the
last update only. Here each reset first records the peak it is about to clear; the largest of
those and of the peak at exit is written, as JSON {"peak_allocated_bytes": N}, when the
process ends (also when the command fails or exits early).

    python -m benchmarks.cuda_peak_memory OUT.json fairseq_cli.train DATA-BIN [fairseq-train options]

python -m benchmarks.translation training runs fairseq-train this way on a GPU.
"""

import atexit
import importlib
import json
import sys
from pathlib import Path

import torch


def main():
    """The command line (see the top)."""
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} OUT.json MODULE [ARGS...] (MODULE: e.g. fairseq_cli.train)")
    out, module, *arguments = sys.argv[1:]
    peak = {"bytes": 0}
    reset = torch.cuda.reset_peak_memory_stats

    def record():
        if torch.cuda.is_initialized():
            peak["bytes"] = max(peak["bytes"], torch.cuda.max_memory_allocated())

    def record_then_reset(device=None):
        record()
        reset(device)

    # fairseq calls torch.cuda.reset_peak_memory_stats() through the module's attribute.
    torch.cuda.reset_peak_memory_stats = record_then_reset

    def write():
        record()
        Path(out).write_text(json.dumps({"peak_allocated_bytes": peak["bytes"]}) + "\n")

    atexit.register(write)
    # As the console script would see its command line.
    sys.argv = [module, *arguments]
    importlib.import_module(module).cli_main()


if __name__ == "__main__":
    main()
