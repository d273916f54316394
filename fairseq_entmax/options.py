"""The options of the fairseq layer: parsers, defaults and validation.

As fairseq keeps its command-line options in fairseq/options.py, apart from its models.
The model (models/adaptively_sparse_transformer.py) adds the sparse attention options to
fairseq's parser, its architectures fill their defaults, the model checks them once into an
AttentionNormalizers, and the layers build each attention's normalizer from that; the
entmax_loss criterion parses its own options with the same parsers. This module needs neither fairseq nor a model.

The parsers are the checks of fairseq_entmax.normalizers.config (NormalizerConfig's) raising
argparse.ArgumentTypeError, so a bad value stops fairseq-train/-generate at argument parsing
with "argument --OPTION: <message>".
"""

import argparse
import dataclasses

from fairseq_entmax.names import ATTENTION_TITLES, ATTENTION_TYPES
from fairseq_entmax.normalizers import NORMALIZER_NAMES, NormalizerConfig, build_normalizer
from fairseq_entmax.normalizers.config import DEFAULTS as NORMALIZER_DEFAULTS
from fairseq_entmax.normalizers.config import (
    NormalizerOptionError,
    check_alpha_clamp,
    check_alpha_init,
    check_alpha_warmup_updates,
    check_number_in_interval,
    check_topk,
    check_topk_fraction,
)

# The default of every option but --attention-normalizer, whose default is the architecture's:
# the normalizers' own (NormalizerConfig), and compilation off. Only an absent (None) option
# takes its default (see sparse_attention_defaults).
DEFAULTS = {**NORMALIZER_DEFAULTS, "compile_normalizers": False}


def _argument_type(check, name):
    """An argparse type from a check of fairseq_entmax.normalizers.config: its ValueError
    becomes argparse's error, "argument --OPTION: <what is allowed>"."""

    def parse(text):
        try:
            return check(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = parse.__qualname__ = name
    parse.__doc__ = f"argparse type of {check.__name__}: {check.__doc__.splitlines()[0]}"
    return parse


parse_alpha_init = _argument_type(check_alpha_init, "parse_alpha_init")
parse_alpha_clamp = _argument_type(check_alpha_clamp, "parse_alpha_clamp")
parse_alpha_warmup_updates = _argument_type(check_alpha_warmup_updates, "parse_alpha_warmup_updates")
parse_topk = _argument_type(check_topk, "parse_topk")
parse_topk_fraction = _argument_type(check_topk_fraction, "parse_topk_fraction")


def parse_number_in_interval(text, low, high, *, low_open=False, high_open=False):
    """check_number_in_interval as an argparse type (its arguments), raising
    argparse.ArgumentTypeError."""
    try:
        return check_number_in_interval(text, low, high, low_open=low_open, high_open=high_open)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def normalizer_option(attention_type):
    """The config attribute of one attention type's normalizer.

    Args:
        attention_type: one of ATTENTION_TYPES.

    Returns:
        e.g. "encoder_self_attention_normalizer" (the option --encoder-self-attention-normalizer).
    """
    return f"{attention_type}_attention_normalizer"


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
    --model-overrides, is left for AttentionNormalizers.from_args to refuse.

    Args:
        args: an argparse namespace, or the OmegaConf config a checkpoint holds.
        normalizer: the architecture's default --attention-normalizer.
    """
    defaults = {"attention_normalizer": normalizer, **DEFAULTS}
    defaults.update((normalizer_option(attention_type), None) for attention_type in ATTENTION_TYPES)
    for name, default in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)


@dataclasses.dataclass(frozen=True)
class AttentionNormalizers:
    """The normalizer of each attention type and the options they share, checked once when
    the model is built (from_args) and bound into every attention layer (build).

    Attributes:
        names: {attention_type: normalizer name} for every type of ATTENTION_TYPES.
        config: the NormalizerConfig every attention's normalizer shares.
        compile_function: whether the normalizers run through torch.compile.
    """

    names: dict
    config: NormalizerConfig
    compile_function: bool = False

    @classmethod
    def from_args(cls, args):
        """The choice a model config makes: the command line's, one built in Python, or a
        checkpoint's with --model-overrides, checked as the command-line parsers check it.

        Args:
            args: a namespace or config with every sparse attention option set
                (sparse_attention_defaults).

        Returns:
            An AttentionNormalizers.

        Raises:
            ValueError: naming the option and what is allowed, for an unknown normalizer, a
                bad value, and an --alpha-init outside --alpha-clamp.
        """
        for option in ["attention_normalizer"] + [normalizer_option(t) for t in ATTENTION_TYPES]:
            value = getattr(args, option)
            if value is not None and value not in NORMALIZER_NAMES:
                raise ValueError(
                    f"--{option.replace('_', '-')}: unknown normalizer {value!r}; "
                    f"allowed values: {', '.join(NORMALIZER_NAMES)}"
                )
        try:
            config = NormalizerConfig(**{option: getattr(args, option) for option in NormalizerConfig.option_names()})
        except NormalizerOptionError as error:
            message = f"invalid sparse attention option --{error.option.replace('_', '-')}: {error.reason}"
            if error.option == "alpha_init":
                message += (
                    ". (Loading a trained model with another clamp, e.g. through --model-overrides, override "
                    "alpha_init too, e.g. 'alpha_init': 'random': it only set the starting alphas, which the "
                    "checkpoint replaces.)"
                )
            raise ValueError(message) from None
        names = {t: getattr(args, normalizer_option(t)) or args.attention_normalizer for t in ATTENTION_TYPES}
        return cls(names, config, bool(args.compile_normalizers))

    def build(self, attention_type, num_heads):
        """The normalizer module of one attention.

        Args:
            attention_type: one of ATTENTION_TYPES.
            num_heads: the attention's heads.

        Returns:
            The AttentionNormalizer of the type's normalizer.
        """
        return build_normalizer(
            self.names[attention_type], num_heads, self.config, compile_function=self.compile_function
        )
