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
"""

from fairseq_entmax import repairs
from fairseq_entmax.criterions import entmax_loss  # noqa: F401 (registers the criterion)
from fairseq_entmax.models import adaptively_sparse_transformer  # noqa: F401 (registers the model)

repairs.install()
