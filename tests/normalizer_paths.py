"""The paths of the normalizers that tests run on the CPU, each as a context manager.

early_exit: the CPU's default. alpha_entmax there computes on the selected entries of a
block (the candidates of the support) when the rows are long, the candidates few and torch
runs several threads, and on whole rows otherwise; early_exit_selected forces the selection
whatever the row length, share and threads, so that small test rows reach it. sync_free:
what GPUs and torch.compile run.
"""

import contextlib
import math
import sys
from unittest import mock

from fairseq_entmax.normalizers import sync_free


@contextlib.contextmanager
def early_exit_selected():
    """The early-exit path with alpha_entmax always on selected entries."""
    module = sys.modules["fairseq_entmax.normalizers.alpha_entmax"]
    with (
        mock.patch.object(module, "_CANDIDATE_SHARE", math.inf),
        mock.patch.object(module, "_SELECT_FROM_KEYS", 1),
        mock.patch.object(module, "_SELECT_FROM_THREADS", 1),
    ):
        yield


PATHS = {"early_exit": contextlib.nullcontext, "early_exit_selected": early_exit_selected, "sync_free": sync_free}
