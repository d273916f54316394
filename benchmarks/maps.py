"""The maps: the attention normalizers, the output losses and the entmax drop-in, each side by
side with its reference in one run, and this tree's normalizers against another commit's.

    python -m benchmarks.maps normalizers --rounds 5 --threads 1   # time and memory per shape
    python -m benchmarks.maps losses                               # the Fenchel-Young losses
    python -m benchmarks.maps dropin                               # against the entmax package
    python -m benchmarks.maps against REF --max-ratio 1.10         # make bench-compare REF=...
    python -m benchmarks.maps in-model --path CKPT --against REF   # inside a trained model

`NAME --help` gives each one's options.
"""

import sys

from benchmarks.commands import run_measurement

MEASUREMENTS = {
    "normalizers": ("normalizers", "forward+backward time and peak memory of the attention normalizers"),
    "losses": ("output_loss", "forward+backward time and peak memory of the output layer's losses"),
    "dropin": ("entmax_dropin", "fairseq_entmax.entmax against the entmax package"),
    "against": ("compare_revisions", "the normalizers of this tree against those of a commit REF"),
    "in-model": ("normalizers_in_model", "the normalizers against a commit's, inside a trained model"),
}

if __name__ == "__main__":
    sys.exit(run_measurement("maps", MEASUREMENTS))
