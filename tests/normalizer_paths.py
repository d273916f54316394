"""The paths of the normalizers that tests run on the CPU, each as a context manager.

early_exit: the CPU's default. alpha_entmax there starts its threshold search from a lower
bound of tau in long rows and from -1 in short ones; early_exit_bounded starts from the bound
whatever the row length, so that small test rows reach it. sync_free: what GPUs and
torch.compile run.
"""

import contextlib
import sys
from unittest import mock

from fairseq_entmax.normalizers import sync_free


@contextlib.contextmanager
def early_exit_bounded():
    """The early-exit path with alpha_entmax's search always from the lower bound of tau."""
    module = sys.modules["fairseq_entmax.normalizers.alpha_entmax"]
    with mock.patch.object(module, "_BOUND_FROM_KEYS", 1):
        yield


PATHS = {"early_exit": contextlib.nullcontext, "early_exit_bounded": early_exit_bounded, "sync_free": sync_free}
