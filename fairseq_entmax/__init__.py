"""fairseq-entmax: sparse attention for fairseq's Transformer.

Importing the package imports nothing else: `fairseq_entmax.normalizers` needs torch alone.
The fairseq plugin (the models, the entmax_loss criterion and the repairs of fairseq; see
fairseq_entmax.plugin) takes effect when fairseq loads it as its user dir: `--user-dir` on the
command line, `user_dir=` in the hub's from_pretrained, fairseq.utils.import_user_module.
"""

import os

__version__ = "0.1.0"

# What fairseq's --user-dir (or from_pretrained's user_dir) is given from Python: a folder that
# only loads the plugin, so it works also where fairseq_entmax was imported first. The package
# folder itself works too, as the first import of the package (the console scripts).
USER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fairseq_entmax_plugin")
