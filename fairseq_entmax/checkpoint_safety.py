"""Loading fairseq checkpoints with torch's safe unpickler (torch.load(weights_only=True)).

torch >= 2.6 loads with weights_only=True by default, and fairseq does not ask otherwise,
so fairseq-generate, -interactive, -validate and resuming fairseq-train fail on the few
non-tensor types a fairseq checkpoint holds. Allowlisting exactly those types keeps the
safe unpickler on: a checkpoint carrying anything else (for example a payload that would
run code when unpickled) is refused, with an error that says so instead of torch's advice
to turn the protection off.

What fairseq checkpoints hold besides tensors, dicts, lists and numbers:
- argparse.Namespace: the training arguments (cfg.model and legacy "args");
- numpy arrays: the metrics state in extra_state, e.g. the BLEU n-gram counts that
  --eval-bleu logs as numpy arrays (the array, its dtype and numpy's array rebuilder).
"""
import argparse
import pickle
import re

import numpy as np
import torch

# numpy's function that rebuilds a pickled array: numpy._core.multiarray._reconstruct in
# numpy 2, numpy.core.multiarray._reconstruct in numpy 1, the name a checkpoint saved under
# numpy 1 refers to.
_NUMPY_ARRAY_REBUILDER = np.ndarray.__reduce__(np.zeros(0))[0]
_NUMPY_1_ARRAY_REBUILDER_NAME = "numpy.core.multiarray._reconstruct"

FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,
    np.ndarray,
    np.dtype,
    _NUMPY_ARRAY_REBUILDER,
    (_NUMPY_ARRAY_REBUILDER, _NUMPY_1_ARRAY_REBUILDER_NAME),
    # numpy >= 1.25 pickles a dtype through its class; these are the dtypes of the
    # arrays fairseq's metrics hold (counts and sums).
    *(type(np.dtype(t)) for t in (np.bool_, np.int32, np.int64, np.float32, np.float64)),
]


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds a pickled object outside the allowlist; nothing of it was run."""


def allow_fairseq_checkpoints():
    """Allowlist the types fairseq checkpoints hold and make fairseq's checkpoint loader
    report refused checkpoints clearly. Called when fairseq_entmax is imported, which
    `--user-dir fairseq_entmax` does before any checkpoint is loaded."""
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
    from fairseq import checkpoint_utils

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_fairseq_entmax_safe", False):
        checkpoint_utils.load_checkpoint_to_cpu = _refusing_unsafe(
            checkpoint_utils.load_checkpoint_to_cpu
        )


def _refusing_unsafe(load_checkpoint_to_cpu):
    def load_checkpoint_to_cpu_safely(path, *args, **kwargs):
        try:
            return load_checkpoint_to_cpu(path, *args, **kwargs)
        except pickle.UnpicklingError as error:
            # torch words it "Unsupported global: GLOBAL x.y", or, for a module it blocks
            # outright (os, posix, subprocess, ...), "unsupported GLOBAL x.y whose module ...".
            found = re.search(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)", str(error))
            what = found.group(1) if found else "an object outside the allowlist"
            raise UnsafeCheckpointError(
                f"Refusing to load checkpoint {path}: it contains a pickled {what}, which is "
                "not a type fairseq checkpoints hold, and unpickling it could run code. It was "
                "not unpickled (torch.load weights_only=True). Use checkpoints written by "
                "fairseq-train; if you wrote this file yourself and trust it, allowlist the "
                "type with torch.serialization.add_safe_globals before loading."
            ) from error

    load_checkpoint_to_cpu_safely._fairseq_entmax_safe = True
    return load_checkpoint_to_cpu_safely
