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

Where checkpoints are read: every fairseq path that loads a checkpoint (fairseq-train resuming
with --restore-file or checkpoint_last.pt, fairseq-generate, -interactive, -validate, the hub
interface's from_pretrained, fairseq-entmax-analyze) ends in a torch.load inside
fairseq.checkpoint_utils (load_checkpoint_to_cpu, also when a module imported that function by
name). That module's torch.load is made to ask for weights_only=True explicitly, so the
protection does not depend on torch's default (False before torch 2.6; turned off by
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1) nor on which function object a caller holds. The recipes'
checkpoint averaging reads with load_checkpoint_safely below.

How a refusal ends a command: fairseq's console scripts give no hook around their main, and
the plugin is loaded (by --user-dir) only once they run, so an uncaught UnsafeCheckpointError
is reported by a sys.excepthook that this repair installs: the message on stderr, no
traceback, exit status 2 (any other exception goes to the previous hook).
"""

import argparse
import os
import pickle
import re
import sys

import numpy as np
import torch

from fairseq_entmax.repairs.patching import Repair, Replacement

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


def load_checkpoint_safely(f, map_location="cpu", **kwargs):
    """torch.load(f) with the safe unpickler (weights_only=True, whatever torch's default or
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD say), the types fairseq checkpoints hold allowlisted.

    Args:
        f: a path or an open binary file, as torch.load takes it.
        map_location: where the tensors go, as torch.load takes it.
        **kwargs: torch.load's other arguments; a `weights_only` among them is ignored.

    Returns:
        What torch.load returns: for a fairseq checkpoint, its state dict.

    Raises:
        UnsafeCheckpointError: the checkpoint holds a pickled object outside the allowlist
            (the message names the file and the object); nothing of it was unpickled.
    """
    kwargs.pop("weights_only", None)
    try:
        # Only those not allowlisted already: leaving the context removes what it was given.
        allowed = torch.serialization.get_safe_globals()
        with torch.serialization.safe_globals([g for g in FAIRSEQ_CHECKPOINT_GLOBALS if g not in allowed]):
            return torch.load(f, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as error:
        # a path, or an open file (as fairseq passes it)
        name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", f)
        name = os.fspath(name) if isinstance(name, (str, os.PathLike)) else repr(name)
        raise UnsafeCheckpointError(_refusal_message(name, error)) from error


_REFUSAL_START = "Refusing to load checkpoint "


def refusal_in(output):
    """The refusal of a checkpoint that a command (fairseq-generate, ...) printed, so that a
    script running it can end with that line and status 2 as the command did.

    Args:
        output: the command's output, stdout and stderr.

    Returns:
        The refusal, one line without the command's "NAME: error: " before it; None when the
        output holds none.
    """
    found = re.search(rf"^(?:[^\s:]+: error: )?({re.escape(_REFUSAL_START)}.*)$", output, flags=re.MULTILINE)
    return found.group(1) if found else None


def _refusal_message(path, error):
    # torch words it "Unsupported global: GLOBAL x.y", or, for a module it blocks
    # outright (os, posix, subprocess, ...), "unsupported GLOBAL x.y whose module ...".
    found = re.search(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)", str(error))
    what = found.group(1) if found else "an object outside the allowlist"
    return (
        f"{_REFUSAL_START}{path}: it contains a pickled {what}, which is "
        "not a type fairseq checkpoints hold, and unpickling it could run code. It was "
        "not unpickled (torch.load weights_only=True). Use checkpoints written by "
        "fairseq-train; if you wrote this file yourself and trust it, allowlist the "
        "type with torch.serialization.add_safe_globals before loading."
    )


class _TorchLoadingSafely:
    """fairseq.checkpoint_utils' `torch`: the torch module, except that load is
    load_checkpoint_safely."""

    load = staticmethod(load_checkpoint_safely)

    def __getattr__(self, name):
        return getattr(torch, name)


def _exiting_on_refusal(previous_hook):
    def excepthook(kind, error, traceback):
        # the refusal itself, or an exception raised while handling it
        refusal, seen = error, set()
        while refusal is not None and not isinstance(refusal, UnsafeCheckpointError) and id(refusal) not in seen:
            seen.add(id(refusal))
            refusal = refusal.__cause__ or refusal.__context__
        if not isinstance(refusal, UnsafeCheckpointError):
            return previous_hook(kind, error, traceback)
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        print(f"{program}: error: {refusal}", file=sys.stderr, flush=True)
        sys.exit(2)

    return excepthook


_allowlist_before = []


def _allowlist_fairseq_checkpoints():
    # Also for torch.load calls of the user's own, as long as the plugin is loaded.
    _allowlist_before[:] = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


def _restore_allowlist():
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(_allowlist_before)


# Every checkpoint fairseq reads goes through load_checkpoint_safely (fairseq.checkpoint_utils'
# torch.load is the one it calls), and a refusal ends a command with its message and status 2.
REPAIR = Repair(
    "safe checkpoint loading",
    (
        Replacement("fairseq.checkpoint_utils", "torch", lambda torch_module: _TorchLoadingSafely()),
        Replacement("sys", "excepthook", _exiting_on_refusal),
    ),
    on_install=_allowlist_fairseq_checkpoints,
    on_uninstall=_restore_allowlist,
)
