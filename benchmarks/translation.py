"""fairseq's Transformer with sparse attention against softmax, through the real commands:
training and generation speed side by side, where generation's time goes, and the peak memory
of long inputs.

    python -m benchmarks.translation training --data DIR --work-dir W    # fairseq-train, -generate
    python -m benchmarks.translation generation --data-bin W/bin ...    # sentences/s of checkpoints
    python -m benchmarks.translation breakdown W/bin --path CKPT ...     # the normalizers' share
    python -m benchmarks.translation long-inputs                         # memory at 1,024 tokens

`NAME --help` gives each one's options.
"""

import sys

from benchmarks.commands import run_measurement

MEASUREMENTS = {
    "training": ("training", "fairseq-train and fairseq-generate speed of every normalizer, side by side"),
    "generation": ("generation_speed", "fairseq-generate's sentences/s of trained models, side by side"),
    "breakdown": ("generation_breakdown", "the time fairseq-generate spends in the normalizers"),
    "long-inputs": ("long_inputs", "peak memory of a forward+backward on long inputs, against softmax"),
}

if __name__ == "__main__":
    sys.exit(run_measurement("translation", MEASUREMENTS))
