"""The registry of normalizers: the one place that describes each of them.

Everything else reads this table: the fairseq options (--attention-normalizer and its
choices), SparseMultiheadAttention (what to pass the function, whether alpha is learned,
each head's alpha) and the analysis (the alpha of a head). Adding a normalizer is adding an
entry to NORMALIZERS (docs/normalizers.md, "Adding a normalizer").
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from fairseq_entmax.normalizers.alpha_entmax import alpha_entmax
from fairseq_entmax.normalizers.entmax15 import entmax15
from fairseq_entmax.normalizers.softmax import softmax
from fairseq_entmax.normalizers.sparsemax import sparsemax
from fairseq_entmax.normalizers.topk import topk_softmax

# The extra parameters a normalizer may take, and how it is then called:
#   None:    function(scores, dim=-1)
#   "alpha": function(scores, alpha, dim=-1, max_alpha=None), alpha one value per row (the
#            attention layer learns one per head and passes its clamp's maximum as max_alpha)
#   "k":     function(scores, k, dim=-1), k the number of entries kept per row
PARAMETERS = (None, "alpha", "k")


@dataclass(frozen=True)
class Normalizer:
    """One normalizer of the registry.

    Attributes:
        name: the name it is chosen by (--attention-normalizer NAME, get_normalizer(NAME)).
        function: the map from scores to probabilities, called as PARAMETERS says.
        parameter: its extra parameter, one of PARAMETERS.
        fixed_alpha: the alpha of the alpha-entmax it equals for every input (softmax 1,
            entmax15 1.5, sparsemax 2), which the analysis reports for each head; None when
            alpha is a parameter or when the map is no alpha-entmax (top-k).
    """

    name: str
    function: Callable
    parameter: Optional[str] = None
    fixed_alpha: Optional[float] = None

    def __post_init__(self):
        if self.parameter not in PARAMETERS:
            raise ValueError(f"normalizer {self.name!r}: parameter must be one of {PARAMETERS}, got {self.parameter!r}")
        if self.fixed_alpha is not None and self.parameter is not None:
            raise ValueError(
                f"normalizer {self.name!r}: a fixed alpha and a {self.parameter} parameter exclude each other"
            )

    @property
    def learns_alpha(self):
        """Whether alpha is a parameter, which the attention layer learns per head."""
        return self.parameter == "alpha"


NORMALIZERS = (
    Normalizer("softmax", softmax, fixed_alpha=1.0),
    Normalizer("sparsemax", sparsemax, fixed_alpha=2.0),
    Normalizer("entmax15", entmax15, fixed_alpha=1.5),
    Normalizer("alpha_entmax", alpha_entmax, parameter="alpha"),
    Normalizer("topk", topk_softmax, parameter="k"),
)
NORMALIZER_NAMES = tuple(normalizer.name for normalizer in NORMALIZERS)
_BY_NAME = {normalizer.name: normalizer for normalizer in NORMALIZERS}


def normalizer_entry(name):
    """The registry entry of a normalizer.

    Args:
        name: one of NORMALIZER_NAMES.

    Returns:
        Its Normalizer: name, function, extra parameter and fixed alpha.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown normalizer {name!r}; known normalizers: {', '.join(NORMALIZER_NAMES)}") from None


def get_normalizer(name):
    """The function of a normalizer.

    Args:
        name: one of NORMALIZER_NAMES.

    Returns:
        The function registered as `name`: softmax, sparsemax and entmax15 take
        (scores, dim=-1); alpha_entmax takes (scores, alpha, dim=-1, max_alpha=None);
        topk takes (scores, k, dim=-1).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    return normalizer_entry(name).function
