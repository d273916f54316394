"""The adaptively_sparse_transformer model: fairseq's Transformer with sparse attention.

Registered under one model name with two families of architectures:
- adaptively_sparse_transformer*: learned alpha-entmax in all attention (Correia et al. 2019);
- explicit_sparse_transformer*: top-k softmax with k = 8 in all attention (Zhao et al. 2019).
Any normalizer can be chosen for all attention or per attention type with the options below.
"""
import argparse
import math

import torch

from fairseq.distributed import fsdp_wrap
from fairseq.logging import metrics
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from omegaconf import OmegaConf

from fairseq_entmax.modules import (
    ATTENTION_TYPES,
    SparseMultiheadAttention,
    SparseTransformerDecoderLayer,
    SparseTransformerEncoderLayer,
)
from fairseq_entmax.normalizers import NORMALIZER_NAMES

MODEL_NAME = "adaptively_sparse_transformer"


# ---------------------------------------------------------------------------------------
# Option parsing. The parsers raise argparse.ArgumentTypeError, so a bad value stops
# fairseq-train/-generate at argument parsing with "argument --OPTION: <message>".


def parse_alpha_init(text):
    """--alpha-init: 'random' (a ~ N(0, 1)) or the alpha every head starts at, in (1, 2]."""
    if str(text).strip().lower() == "random":
        return "random"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1.0 < value <= 2.0:
        raise argparse.ArgumentTypeError(
            f"allowed values are 'random' or a number in (1, 2], got {text!r}"
        )
    return value


def parse_alpha_clamp(text):
    """--alpha-clamp MIN,MAX with 1 <= MIN < MAX <= 2."""
    if isinstance(text, (tuple, list)):
        parts = list(text)
    else:
        parts = str(text).split(",")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        low = high = math.nan
    if not 1.0 <= low < high <= 2.0:
        raise argparse.ArgumentTypeError(
            f"expected MIN,MAX with 1 <= MIN < MAX <= 2 (default 1.01,2), got {text!r}"
        )
    return (low, high)


def parse_topk(text):
    """--topk K and --topk-min K: an integer >= 1."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or str(value) != str(text).strip():
        raise argparse.ArgumentTypeError(f"allowed values are integers >= 1, got {text!r}")
    return value


def parse_topk_fraction(text):
    """--topk-fraction F: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"allowed values are numbers in (0, 1], got {text!r}")
    return value


def add_sparse_attention_args(parser):
    """The model's own options (no defaults here: the architecture functions set them)."""
    names = ",".join(NORMALIZER_NAMES)
    parser.add_argument(
        "--attention-normalizer", choices=NORMALIZER_NAMES, metavar="{" + names + "}",
        help="normalizer of all attention (default: alpha_entmax for adaptively_sparse_*, "
        "topk for explicit_sparse_*)",
    )
    for attention_type, what in (
        ("encoder_self", "encoder self-attention"),
        ("decoder_self", "decoder self-attention"),
        ("cross", "encoder-decoder (cross) attention"),
    ):
        parser.add_argument(
            "--" + attention_type.replace("_", "-") + "-attention-normalizer",
            choices=NORMALIZER_NAMES, metavar="{" + names + "}",
            help=f"normalizer of the {what} (overrides --attention-normalizer)",
        )
    parser.add_argument(
        "--alpha-init", type=parse_alpha_init, metavar="{random,ALPHA}",
        help="learned alpha-entmax: initial alpha of every head, in (1, 2], or 'random' "
        "(alpha = 1 + sigmoid(a) with a ~ N(0, 1), as Correia et al.; default)",
    )
    parser.add_argument(
        "--alpha-clamp", type=parse_alpha_clamp, metavar="MIN,MAX",
        help="learned alpha-entmax: alpha is clamped to [MIN, MAX] (default 1.01,2)",
    )
    parser.add_argument(
        "--topk", type=parse_topk, metavar="K",
        help="top-k attention: keys kept per query (default 8)",
    )
    parser.add_argument(
        "--topk-fraction", type=parse_topk_fraction, metavar="F",
        help="top-k attention: keep max(--topk-min, ceil(F * n)) keys instead of a fixed "
        "--topk, n the number of keys the query sees (padding and future positions not "
        "counted); F in (0, 1]",
    )
    parser.add_argument(
        "--topk-min", type=parse_topk, metavar="K",
        help="top-k attention with --topk-fraction: keep at least K keys (default 1)",
    )
    parser.add_argument(
        "--compile-normalizers", action="store_true", default=None,
        help="run the attention normalizers through torch.compile(fullgraph=True, "
        "dynamic=True): fused kernels on a GPU; compiling takes minutes on a CPU, where it "
        "does not pay (see docs/fairseq.md)",
    )


def sparse_attention_defaults(args, normalizer):
    """Fill the options the user did not give. Works on argparse namespaces and on the
    OmegaConf configs that checkpoints hold. Only an absent (None) option takes its default: a
    value given as 0, e.g. through --model-overrides, is left for the validation to refuse."""
    defaults = {"attention_normalizer": normalizer, "alpha_init": "random", "alpha_clamp": (1.01, 2.0),
                "topk": 8, "topk_fraction": None, "topk_min": 1, "compile_normalizers": False}
    defaults.update((f"{attention_type}_attention_normalizer", None) for attention_type in ATTENTION_TYPES)
    for name, default in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)


def validate_sparse_attention_args(args):
    """The same checks as the command-line parsers, for configs built in Python."""
    for name in ["attention_normalizer"] + [f"{t}_attention_normalizer" for t in ATTENTION_TYPES]:
        value = getattr(args, name)
        if value is not None and value not in NORMALIZER_NAMES:
            raise ValueError(
                f"--{name.replace('_', '-')}: unknown normalizer {value!r}; "
                f"allowed values: {', '.join(NORMALIZER_NAMES)}"
            )
    try:
        args.alpha_init = parse_alpha_init(args.alpha_init)
        args.alpha_clamp = parse_alpha_clamp(args.alpha_clamp)
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


# ---------------------------------------------------------------------------------------
# Encoder, decoder, model.


def _wrap_layer(layer, cfg):
    """fairseq's activation checkpointing and FSDP wrapping of a layer, as in
    TransformerEncoderBase.build_encoder_layer / TransformerDecoderBase.build_decoder_layer."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class SparseTransformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return _wrap_layer(SparseTransformerEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class SparseTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(SparseTransformerDecoderLayer(cfg, no_encoder_attn), cfg)


def sparse_attention_modules(model):
    """(attention_type, layer index, SparseMultiheadAttention) for every attention of a
    model, encoder layers first, in layer order."""
    # Indexing, not iterating: with --encoder/decoder-layerdrop the layers are a
    # LayerDropModuleList, whose iteration in training mode skips layers at random.
    encoder_layers, decoder_layers = model.encoder.layers, model.decoder.layers
    for index in range(len(encoder_layers)):
        attention = getattr(encoder_layers[index], "self_attn", None)
        if isinstance(attention, SparseMultiheadAttention):
            yield attention.attention_type, index, attention
    for index in range(len(decoder_layers)):
        layer = decoder_layers[index]
        for attention in (getattr(layer, "self_attn", None), getattr(layer, "encoder_attn", None)):
            if isinstance(attention, SparseMultiheadAttention):
                yield attention.attention_type, index, attention


@register_model(MODEL_NAME)
class AdaptivelySparseTransformerModel(TransformerModel):
    """fairseq's TransformerModel whose attention normalizers are chosen per attention type.

    With softmax everywhere it computes what fairseq's `transformer` computes and has the
    same parameters; learned alpha-entmax adds one `alpha_logit` per head and attention.
    """

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        # Per-head alphas go to the training log only with TensorBoard, where they are plotted.
        self.log_alpha_per_head = bool(getattr(args, "tensorboard_logdir", None))

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_sparse_attention_args(parser)

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            # Checkpoints hold the options as an OmegaConf config, from which fairseq's
            # TransformerConfig.from_namespace copies only its own fields; a namespace
            # keeps ours on the config the layers read.
            args = argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        sparse_attention_defaults(args, normalizer="alpha_entmax")
        validate_sparse_attention_args(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SparseTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return SparseTransformerDecoder(
            cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention
        )

    def head_alphas(self):
        """{attention_type: [(layer, tensor of each head's alpha)]} for the attention types
        whose alpha is learned."""
        alphas = {}
        for attention_type, layer, attention in sparse_attention_modules(self):
            if attention.alpha_logit is not None:
                alphas.setdefault(attention_type, []).append((layer, attention.head_alpha().detach()))
        return alphas

    def set_num_updates(self, num_updates):
        super().set_num_updates(num_updates)
        self.log_learned_alphas()

    def log_learned_alphas(self):
        """Log alpha_<type>_{mean,min,max} (and alpha_<type>_L<layer>_H<head> with
        TensorBoard) to the active fairseq metrics aggregators: the training log lines and
        their JSON/TensorBoard records. fairseq calls set_num_updates before each training
        step, inside those aggregators, so a record shows the alphas the step started from."""
        per_type = self.head_alphas()
        if not per_type:
            return
        # One device-to-host copy for all heads of all attention.
        everything = torch.cat([alphas for layers in per_type.values() for _, alphas in layers])
        values = iter(everything.float().cpu().tolist())
        for attention_type, layers in per_type.items():
            per_layer = [(layer, [next(values) for _ in alphas]) for layer, alphas in layers]
            flat = [value for _, layer_values in per_layer for value in layer_values]
            metrics.log_scalar(f"alpha_{attention_type}_mean", sum(flat) / len(flat), weight=0, round=4)
            metrics.log_scalar(f"alpha_{attention_type}_min", min(flat), weight=0, round=4)
            metrics.log_scalar(f"alpha_{attention_type}_max", max(flat), weight=0, round=4)
            if self.log_alpha_per_head:
                for layer, layer_values in per_layer:
                    for head, value in enumerate(layer_values):
                        metrics.log_scalar(
                            f"alpha_{attention_type}_L{layer}_H{head}", value, weight=0,
                            round=4, priority=1000,
                        )


# ---------------------------------------------------------------------------------------
# Architectures: the attention defaults, then fairseq's Transformer sizes.


def _register(arch_name, normalizer, transformer_architecture):
    @register_model_architecture(MODEL_NAME, arch_name)
    def architecture(args):
        sparse_attention_defaults(args, normalizer)
        transformer_architecture(args)

    architecture.__name__ = arch_name
    architecture.__doc__ = (
        f"{transformer_architecture.__name__} sizes, {normalizer} attention by default."
    )
    return architecture


for _suffix, _transformer_architecture in (
    ("", base_architecture),
    ("_iwslt_de_en", transformer_iwslt_de_en),
    ("_wmt_en_de", transformer_wmt_en_de),
    ("_vaswani_wmt_en_de_big", transformer_vaswani_wmt_en_de_big),
):
    _register("adaptively_sparse_transformer" + _suffix, "alpha_entmax", _transformer_architecture)
    _register("explicit_sparse_transformer" + _suffix, "topk", _transformer_architecture)
