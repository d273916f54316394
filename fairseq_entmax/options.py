"""The options of the fairseq layer: parsers, defaults and validation.

As fairseq keeps its command-line options in fairseq/options.py, apart from its models.
The model (models/adaptively_sparse_transformer.py) adds the sparse attention options to
fairseq's parser, its architectures fill their defaults, and the layers build each attention's
normalizer from them (build_attention_normalizer); the entmax_loss criterion parses its own
options with the same parsers. This module needs neither fairseq nor a model.

The parsers raise argparse.ArgumentTypeError, so a bad value stops fairseq-train/-generate at
argument parsing with "argument --OPTION: <message>".
"""

import argparse
import math

from fairseq_entmax.names import ATTENTION_TITLES, ATTENTION_TYPES
from fairseq_entmax.normalizers import NORMALIZER_NAMES, build_normalizer

# The default of every option but --attention-normalizer, whose default is the architecture's.
# Only an absent (None) option takes its default (see sparse_attention_defaults).
DEFAULTS = {
    "alpha_init": "random",
    "alpha_clamp": (1.01, 2.0),
    "alpha_warmup_updates": 0,
    "topk": 8,
    "topk_fraction": None,
    "topk_min": 1,
    "compile_normalizers": False,
}


def parse_number_in_interval(text, low, high, *, low_open=False, high_open=False):
    """Parse a number in an interval, e.g. (0, 1] with low_open=True.

    Args:
        text: the number or its text.
        low, high: the interval's ends, written as given in the error message (0, not 0.0).
        low_open, high_open: whether the interval leaves out that end (closed by default).

    Returns:
        The number as a float.

    Raises:
        argparse.ArgumentTypeError: for text that is not a number in the interval (NaN and
            infinities included), saying what is allowed, e.g.
            "allowed values are numbers in (0, 1], got '1.5'".
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    above_low = low < value if low_open else low <= value
    below_high = value < high if high_open else value <= high
    if not (above_low and below_high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise argparse.ArgumentTypeError(f"allowed values are numbers in {interval}, got {text!r}")
    return value


def normalizer_option(attention_type):
    """The config attribute of one attention type's normalizer.

    Args:
        attention_type: one of ATTENTION_TYPES.

    Returns:
        e.g. "encoder_self_attention_normalizer" (the option --encoder-self-attention-normalizer).
    """
    return f"{attention_type}_attention_normalizer"


def parse_alpha_init(text):
    """Parse --alpha-init.

    Args:
        text: "random" (alpha = 1 + sigmoid(a) with a ~ N(0, 1)) or the alpha every head
            starts at, a number in (1, 2] (a number or its text).

    Returns:
        "random" or the alpha as a float.

    Raises:
        argparse.ArgumentTypeError: for anything else, saying what is allowed.
    """
    if str(text).strip().lower() == "random":
        return "random"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1.0 < value <= 2.0:
        raise argparse.ArgumentTypeError(f"allowed values are 'random' or a number in (1, 2], got {text!r}")
    return value


def parse_alpha_clamp(text):
    """Parse --alpha-clamp.

    Args:
        text: "MIN,MAX", or a (MIN, MAX) pair as a checkpoint's config holds it, with
            1 <= MIN < MAX <= 2.

    Returns:
        (MIN, MAX) as floats.

    Raises:
        argparse.ArgumentTypeError: for anything else, saying what is allowed.
    """
    if isinstance(text, (tuple, list)):
        parts = list(text)
    else:
        parts = str(text).split(",")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        low = high = math.nan
    if not 1.0 <= low < high <= 2.0:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX with 1 <= MIN < MAX <= 2 (default 1.01,2), got {text!r}")
    return (low, high)


def parse_alpha_warmup_updates(text):
    """Parse --alpha-warmup-updates.

    Args:
        text: an integer >= 0 (an int or its text).

    Returns:
        The integer.

    Raises:
        argparse.ArgumentTypeError: for anything else, saying what is allowed.
    """
    return _parse_integer(text, minimum=0)


def parse_topk(text):
    """Parse --topk and --topk-min.

    Args:
        text: an integer >= 1 (an int or its text).

    Returns:
        The integer.

    Raises:
        argparse.ArgumentTypeError: for anything else, saying what is allowed.
    """
    return _parse_integer(text, minimum=1)


def _parse_integer(text, minimum):
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = minimum - 1
    if value < minimum or str(value) != str(text).strip():
        raise argparse.ArgumentTypeError(f"allowed values are integers >= {minimum}, got {text!r}")
    return value


def parse_topk_fraction(text):
    """Parse --topk-fraction.

    Args:
        text: a number in (0, 1] (a number or its text).

    Returns:
        The number as a float.

    Raises:
        argparse.ArgumentTypeError: for anything else, saying what is allowed.
    """
    return parse_number_in_interval(text, 0, 1, low_open=True)


def add_sparse_attention_args(parser):
    """Add the sparse attention options to a parser (fairseq's, through the model's add_args).

    No option gets a default here: an absent option stays None, and the architecture
    functions fill it (sparse_attention_defaults), so that an architecture can choose its own
    --attention-normalizer.

    Args:
        parser: an argparse.ArgumentParser (or argument group).
    """
    names = ",".join(NORMALIZER_NAMES)
    parser.add_argument(
        "--attention-normalizer",
        choices=NORMALIZER_NAMES,
        metavar="{" + names + "}",
        help="normalizer of all attention (default: alpha_entmax for adaptively_sparse_*, topk for explicit_sparse_*)",
    )
    for attention_type in ATTENTION_TYPES:
        parser.add_argument(
            "--" + normalizer_option(attention_type).replace("_", "-"),
            choices=NORMALIZER_NAMES,
            metavar="{" + names + "}",
            help=f"normalizer of the {ATTENTION_TITLES[attention_type]} (overrides --attention-normalizer)",
        )
    parser.add_argument(
        "--alpha-init",
        type=parse_alpha_init,
        metavar="{random,ALPHA}",
        help="learned alpha-entmax: initial alpha of every head, in (1, 2], or 'random' "
        "(alpha = 1 + sigmoid(a) with a ~ N(0, 1), as Correia et al.; default)",
    )
    parser.add_argument(
        "--alpha-clamp",
        type=parse_alpha_clamp,
        metavar="MIN,MAX",
        help="learned alpha-entmax: alpha is clamped to [MIN, MAX] (default 1.01,2)",
    )
    parser.add_argument(
        "--alpha-warmup-updates",
        type=parse_alpha_warmup_updates,
        metavar="N",
        help="learned alpha-entmax: each head's alpha rises linearly from 1 (softmax) at update 0 "
        "to its learned alpha at update N, e.g. to fine-tune a softmax model (default 0: no warm-up)",
    )
    parser.add_argument(
        "--topk",
        type=parse_topk,
        metavar="K",
        help="top-k attention: keys kept per query (default 8)",
    )
    parser.add_argument(
        "--topk-fraction",
        type=parse_topk_fraction,
        metavar="F",
        help="top-k attention: keep max(--topk-min, ceil(F * n)) keys instead of a fixed "
        "--topk, n the number of keys the query sees (padding and future positions not "
        "counted); F in (0, 1]",
    )
    parser.add_argument(
        "--topk-min",
        type=parse_topk,
        metavar="K",
        help="top-k attention with --topk-fraction: keep at least K keys (default 1)",
    )
    parser.add_argument(
        "--compile-normalizers",
        action="store_true",
        default=None,
        help="run the attention normalizers through torch.compile(fullgraph=True, "
        "dynamic=True): fused kernels on a GPU; compiling takes minutes on a CPU, where it "
        "does not pay (see docs/fairseq.md)",
    )


def sparse_attention_defaults(args, normalizer):
    """Fill the sparse attention options the user did not give, in place.

    Only an absent (None) option takes its default: a value given as 0, e.g. through
    --model-overrides, is left for validate_sparse_attention_args to refuse.

    Args:
        args: an argparse namespace, or the OmegaConf config a checkpoint holds.
        normalizer: the architecture's default --attention-normalizer.
    """
    defaults = {"attention_normalizer": normalizer, **DEFAULTS}
    defaults.update((normalizer_option(attention_type), None) for attention_type in ATTENTION_TYPES)
    for name, default in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)


def validate_sparse_attention_args(args):
    """The checks of the command-line parsers, for configs built in Python or loaded from a
    checkpoint (with --model-overrides); normalises the values in place as the parsers would.

    Args:
        args: a namespace or config with every sparse attention option set
            (sparse_attention_defaults).

    Raises:
        ValueError: naming the option and what is allowed, for a bad value, and for an
            --alpha-init outside --alpha-clamp.
    """
    for name in ["attention_normalizer"] + [normalizer_option(t) for t in ATTENTION_TYPES]:
        value = getattr(args, name)
        if value is not None and value not in NORMALIZER_NAMES:
            raise ValueError(
                f"--{name.replace('_', '-')}: unknown normalizer {value!r}; "
                f"allowed values: {', '.join(NORMALIZER_NAMES)}"
            )
    try:
        args.alpha_init = parse_alpha_init(args.alpha_init)
        args.alpha_clamp = parse_alpha_clamp(args.alpha_clamp)
        args.alpha_warmup_updates = parse_alpha_warmup_updates(args.alpha_warmup_updates)
        args.topk = parse_topk(args.topk)
        args.topk_min = parse_topk(args.topk_min)
        if args.topk_fraction is not None:
            args.topk_fraction = parse_topk_fraction(args.topk_fraction)
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"invalid sparse attention option: {error}") from None
    low, high = args.alpha_clamp
    if args.alpha_init != "random" and not low <= args.alpha_init <= high:
        # Outside the clamp, alpha is the bound and the clamp passes no gradient: every head
        # would keep that alpha for the whole training.
        raise ValueError(
            f"--alpha-init {args.alpha_init} is outside --alpha-clamp {low},{high}: every head "
            f"would start at the bound and never learn its alpha; choose an --alpha-init in "
            f"[{low}, {high}]. (Loading a trained model with another clamp, e.g. through "
            f"--model-overrides, override alpha_init too, e.g. 'alpha_init': 'random': it only "
            f"set the starting alphas, which the checkpoint replaces.)"
        )


def build_attention_normalizer(cfg, attention_type, num_heads):
    """The normalizer module of one attention, from the model's options.

    Args:
        cfg: the model config, with the options set (by the model's options and its
            architecture's defaults) and validated (validate_sparse_attention_args).
        attention_type: one of ATTENTION_TYPES.
        num_heads: the attention's heads.

    Returns:
        The AttentionNormalizer of the type's own normalizer, else of --attention-normalizer.
    """
    name = getattr(cfg, normalizer_option(attention_type), None) or cfg.attention_normalizer
    return build_normalizer(
        name,
        num_heads,
        alpha_init=cfg.alpha_init,
        alpha_clamp=cfg.alpha_clamp,
        alpha_warmup_updates=cfg.alpha_warmup_updates,
        topk=cfg.topk,
        topk_fraction=cfg.topk_fraction,
        topk_min=cfg.topk_min,
        compile_function=cfg.compile_normalizers,
    )
