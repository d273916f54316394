"""The fairseq plugin: what `--user-dir` loads.

Importing this module registers the adaptively_sparse_transformer model and its architectures
and the entmax_loss criterion with fairseq, and installs the repairs of fairseq
(fairseq_entmax.repairs). fairseq imports it when it loads the user dir, through either folder:
- the package folder (`--user-dir $(dirname fairseq_entmax/__init__.py)`, in a fresh process,
  as the console scripts are): fairseq imports the package, then its models/, whose import
  loads this module;
- `fairseq_entmax.USER_DIR`, a folder of its own (fairseq_entmax_plugin), which also works in
  a Python process that imported fairseq_entmax before fairseq, where fairseq would take the
  package folder as imported already (the hub's from_pretrained(..., user_dir=USER_DIR),
  utils.import_user_module).

The package's own entry points that read checkpoints in their process (fairseq-entmax-analyze,
the benchmarks) call import_user_dir below instead of fairseq's import_user_module: they have
imported fairseq_entmax already, where fairseq skips the package folder.
"""

import os

import fairseq_entmax
from fairseq_entmax import repairs
from fairseq_entmax.criterions import entmax_loss  # noqa: F401 (registers the criterion)
from fairseq_entmax.models import adaptively_sparse_transformer  # noqa: F401 (registers the model)

repairs.install()


# The folders that name this plugin: the package's own and fairseq_entmax.USER_DIR.
_PLUGIN_FOLDERS = {
    os.path.realpath(os.path.dirname(fairseq_entmax.__file__)),
    os.path.realpath(fairseq_entmax.USER_DIR),
}


def import_user_dir(user_dir=None):
    """Load this plugin, and a fairseq --user-dir besides it, before any checkpoint is read.

    This module's import has registered the models and installed the repairs (the safe
    checkpoint loader among them) already; a user dir naming this plugin by either folder adds
    nothing, and any other (a plugin of the user's own) is imported as fairseq-train would.

    Args:
        user_dir: a --user-dir as given on the command line, or None.

    Raises:
        FileNotFoundError: `user_dir` names no folder.
    """
    if user_dir is None or os.path.realpath(user_dir) in _PLUGIN_FOLDERS:
        return
    if not os.path.isdir(user_dir):
        raise FileNotFoundError(f"--user-dir {user_dir}: no such folder; give the folder of a fairseq plugin")
    from argparse import Namespace

    from fairseq import utils

    utils.import_user_module(Namespace(user_dir=user_dir))
