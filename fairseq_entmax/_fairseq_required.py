"""The one place that says how to get fairseq when the fairseq layer is imported without it."""

import importlib.util

INSTALL_HINT = (
    "fairseq is not installed. The fairseq layer of fairseq-entmax (fairseq_entmax.modules, "
    "fairseq_entmax.models, --user-dir fairseq_entmax) needs it. On Python 3.11, 3.12 or 3.13 install "
    "it with `make setup` (`make setup PYTHON=python3.12` for another Python), or by hand: "
    "`pip install --no-build-isolation --no-deps fairseq-fixed==0.12.3.1` "
    "after `pip install torch cython numpy setuptools wheel hydra-core==1.3.2 omegaconf==2.3.0 "
    "bitarray regex sacrebleu tqdm cffi scikit-learn`. fairseq_entmax.normalizers works without it."
)


def require_fairseq():
    """Raise an ImportError that says how to install fairseq when it is missing."""
    if importlib.util.find_spec("fairseq") is None:
        raise ImportError(INSTALL_HINT)
