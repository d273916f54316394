"""Names shared by the normalizers, the fairseq layer, its training log, the analysis and the
examples: the normalizers, the attention types and the names of the alpha metrics the model
logs, each written here once. Imports neither torch nor fairseq."""

import re

# The normalizers, by the names that build_normalizer, --attention-normalizer and the examples'
# normalizers take (none needs quoting on a command line), in the order tables list them, each with
# the label tables and figures show for it.
NORMALIZER_LABELS = {
    "softmax": "softmax",
    "sparsemax": "sparsemax",
    "entmax15": "1.5-entmax",
    "alpha_entmax": "alpha-entmax (learned)",
    "topk": "top-k",
}
NORMALIZER_NAMES = tuple(NORMALIZER_LABELS)

# The three attention types of an encoder-decoder Transformer, in the order every table,
# figure and log lists them.
ATTENTION_TYPES = ("encoder_self", "decoder_self", "cross")

# How figures and help texts name each attention type.
ATTENTION_TITLES = {
    "encoder_self": "encoder self-attention",
    "decoder_self": "decoder self-attention",
    "cross": "encoder-decoder attention",
}

# The statistics over the heads of one attention type that every training log line carries.
ALPHA_STATISTICS = ("mean", "min", "max")

_ALPHA_METRIC = re.compile(
    r"^alpha_(" + "|".join(ATTENTION_TYPES) + r")_(?:(" + "|".join(ALPHA_STATISTICS) + r")|L(\d+)_H(\d+))$"
)


def alpha_metric_name(attention_type, statistic):
    """The training log's name of a statistic of the learned alphas of one attention type.

    Args:
        attention_type: one of ATTENTION_TYPES.
        statistic: one of ALPHA_STATISTICS, taken over all heads of all layers of that type.

    Returns:
        The metric name, e.g. "alpha_encoder_self_mean".
    """
    return f"alpha_{attention_type}_{statistic}"


def alpha_head_metric_name(attention_type, layer, head):
    """The training log's name of one head's learned alpha (logged with --tensorboard-logdir).

    Args:
        attention_type: one of ATTENTION_TYPES.
        layer: the layer, counted from 0.
        head: the head, counted from 0.

    Returns:
        The metric name, e.g. "alpha_encoder_self_L0_H3".
    """
    return f"alpha_{attention_type}_L{layer}_H{head}"


def parse_alpha_metric_name(name):
    """What an alpha metric name of the training log stands for.

    Args:
        name: a metric name, as alpha_metric_name or alpha_head_metric_name write it (or any
            other name).

    Returns:
        (attention_type, statistic, layer, head): statistic is one of ALPHA_STATISTICS, with
        layer and head None, or "head" with layer and head ints. None when `name` is not an
        alpha metric.
    """
    match = _ALPHA_METRIC.match(name)
    if match is None:
        return None
    attention_type, statistic, layer, head = match.groups()
    if statistic is None:
        return attention_type, "head", int(layer), int(head)
    return attention_type, statistic, None, None
