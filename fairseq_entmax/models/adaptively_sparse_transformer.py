"""The adaptively_sparse_transformer model: fairseq's Transformer with sparse attention.

Registered under one model name with two families of architectures:
- adaptively_sparse_transformer*: learned alpha-entmax in all attention (Correia et al. 2019);
- explicit_sparse_transformer*: top-k softmax with k = 8 in all attention (Zhao et al. 2019).
Any normalizer can be chosen for all attention or per attention type with the options of
fairseq_entmax/options.py. The output distribution is softmax, or the alpha-entmax the model was
trained for with the entmax_loss criterion (--loss-alpha, which fairseq saves with the model's
arguments in the checkpoint).
"""

import argparse

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
from fairseq.modules import MultiheadAttention
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from omegaconf import OmegaConf

from fairseq_entmax.losses import check_loss_alpha
from fairseq_entmax.modules import (
    SparseMultiheadAttention,
    SparseTransformerDecoderLayer,
    SparseTransformerEncoderLayer,
)
from fairseq_entmax.names import ALPHA_STATISTICS, alpha_head_metric_name, alpha_metric_name
from fairseq_entmax.normalizers import alpha_entmax
from fairseq_entmax.options import AttentionNormalizers, add_sparse_attention_args, sparse_attention_defaults

MODEL_NAME = "adaptively_sparse_transformer"


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
        return _wrap_layer(SparseTransformerEncoderLayer(cfg, cfg.attention_normalizers, return_fc=self.return_fc), cfg)


class SparseTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(SparseTransformerDecoderLayer(cfg, cfg.attention_normalizers, no_encoder_attn), cfg)


def attention_modules(model):
    """Every attention module of a fairseq Transformer encoder-decoder, this package's or
    fairseq's own, where it sits: the one walk over a model's attention.

    Args:
        model: a fairseq encoder-decoder whose encoder and decoder keep their layers in
            `layers` (fairseq's transformer, adaptively_sparse_transformer); a model without
            them has none.

    Yields:
        (attention_type, layer index, module) for every fairseq MultiheadAttention
        (SparseMultiheadAttention is one): encoder self-attention of each layer, then for
        each decoder layer its self-attention and its encoder-decoder attention.
    """
    # Indexing, not iterating: with --encoder/decoder-layerdrop the layers are a
    # LayerDropModuleList, whose iteration in training mode skips layers at random.
    encoder_layers = getattr(getattr(model, "encoder", None), "layers", ())
    decoder_layers = getattr(getattr(model, "decoder", None), "layers", ())
    for index in range(len(encoder_layers)):
        attention = getattr(encoder_layers[index], "self_attn", None)
        if isinstance(attention, MultiheadAttention):
            yield "encoder_self", index, attention
    for index in range(len(decoder_layers)):
        layer = decoder_layers[index]
        for attention_type, name in (("decoder_self", "self_attn"), ("cross", "encoder_attn")):
            attention = getattr(layer, name, None)
            if isinstance(attention, MultiheadAttention):
                yield attention_type, index, attention


def sparse_attention_modules(model):
    """The SparseMultiheadAttention modules of a model, in the order of attention_modules.

    Args:
        model: a fairseq encoder-decoder (see attention_modules).

    Yields:
        (attention_type, layer index, SparseMultiheadAttention).
    """
    for attention_type, index, attention in attention_modules(model):
        if isinstance(attention, SparseMultiheadAttention):
            yield attention_type, index, attention


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
        self.output_alpha = output_alpha_of(args)

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
        # Checked once here, then bound into every layer (TransformerConfig.from_namespace
        # carries the attribute to them); on a copy, so that the caller's config stays plain data.
        normalizers = AttentionNormalizers.from_args(args)
        return super().build_model(argparse.Namespace(**vars(args), attention_normalizers=normalizers), task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SparseTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return SparseTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        """The output distribution: fairseq's softmax, or the alpha-entmax of output_alpha.

        Args:
            net_output: the decoder's output, scores first.
            log_probs: return log-probabilities (-inf where the entmax gives exactly 0).
            sample: unused (fairseq's signature).

        Returns:
            Probabilities or log-probabilities in float32, of the scores' shape.
        """
        if self.output_alpha == 1.0:
            return super().get_normalized_probs(net_output, log_probs, sample)
        probs = alpha_entmax(net_output[0].float(), self.output_alpha)
        return probs.log() if log_probs else probs

    def head_alphas(self):
        """The learned alphas.

        Returns:
            {attention_type: [(layer, tensor of each head's alpha), ...]} for the attention
            types whose alpha is learned.
        """
        alphas = {}
        for attention_type, layer, attention in sparse_attention_modules(self):
            if attention.normalizer.learns_alpha:
                alphas.setdefault(attention_type, []).append((layer, attention.normalizer.head_alpha().detach()))
        return alphas

    def set_num_updates(self, num_updates):
        super().set_num_updates(num_updates)
        self.log_learned_alphas()

    def log_learned_alphas(self):
        """Log the learned alphas to the active fairseq metrics aggregators: the training log
        lines and their JSON/TensorBoard records.

        Logs alpha_<type>_{mean,min,max} over the heads of each attention type, and with
        TensorBoard alpha_<type>_L<layer>_H<head> for every head (fairseq_entmax.names). fairseq
        calls set_num_updates before each training step, inside those aggregators, so a record
        shows the alphas the step started from.
        """
        per_type = self.head_alphas()
        if not per_type:
            return
        # One device-to-host copy for all heads of all attention.
        everything = torch.cat([alphas for layers in per_type.values() for _, alphas in layers])
        values = iter(everything.float().cpu().tolist())
        for attention_type, layers in per_type.items():
            per_layer = [(layer, [next(values) for _ in alphas]) for layer, alphas in layers]
            flat = [value for _, layer_values in per_layer for value in layer_values]
            summary = {"mean": sum(flat) / len(flat), "min": min(flat), "max": max(flat)}
            for statistic in ALPHA_STATISTICS:
                metrics.log_scalar(
                    alpha_metric_name(attention_type, statistic),
                    summary[statistic],
                    weight=0,
                    round=4,
                )
            if self.log_alpha_per_head:
                for layer, layer_values in per_layer:
                    for head, value in enumerate(layer_values):
                        metrics.log_scalar(
                            alpha_head_metric_name(attention_type, layer, head),
                            value,
                            weight=0,
                            round=4,
                            priority=1000,
                        )


def output_alpha_of(args):
    """The alpha of the output distribution a model built from `args` decodes with.

    Args:
        args: the model's arguments: fairseq keeps every command-line argument there, the
            criterion's included, and saves them in the checkpoint. `loss_alpha` is there when
            the model was trained with entmax_loss (or set with --model-overrides).

    Returns:
        loss_alpha as a float, or 1.0 (softmax) without it.

    Raises:
        ValueError: for a loss_alpha that is not a number >= 1.
    """
    alpha = getattr(args, "loss_alpha", None)
    return 1.0 if alpha is None else check_loss_alpha(alpha)


# ---------------------------------------------------------------------------------------
# Architectures: the attention defaults, then fairseq's Transformer sizes of the same suffix.


@register_model_architecture(MODEL_NAME, "adaptively_sparse_transformer")
def adaptively_sparse_transformer(args):
    sparse_attention_defaults(args, "alpha_entmax")
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "adaptively_sparse_transformer_iwslt_de_en")
def adaptively_sparse_transformer_iwslt_de_en(args):
    sparse_attention_defaults(args, "alpha_entmax")
    transformer_iwslt_de_en(args)


@register_model_architecture(MODEL_NAME, "adaptively_sparse_transformer_wmt_en_de")
def adaptively_sparse_transformer_wmt_en_de(args):
    sparse_attention_defaults(args, "alpha_entmax")
    transformer_wmt_en_de(args)


@register_model_architecture(MODEL_NAME, "adaptively_sparse_transformer_vaswani_wmt_en_de_big")
def adaptively_sparse_transformer_vaswani_wmt_en_de_big(args):
    sparse_attention_defaults(args, "alpha_entmax")
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture(MODEL_NAME, "explicit_sparse_transformer")
def explicit_sparse_transformer(args):
    sparse_attention_defaults(args, "topk")
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "explicit_sparse_transformer_iwslt_de_en")
def explicit_sparse_transformer_iwslt_de_en(args):
    sparse_attention_defaults(args, "topk")
    transformer_iwslt_de_en(args)


@register_model_architecture(MODEL_NAME, "explicit_sparse_transformer_wmt_en_de")
def explicit_sparse_transformer_wmt_en_de(args):
    sparse_attention_defaults(args, "topk")
    transformer_wmt_en_de(args)


@register_model_architecture(MODEL_NAME, "explicit_sparse_transformer_vaswani_wmt_en_de_big")
def explicit_sparse_transformer_vaswani_wmt_en_de_big(args):
    sparse_attention_defaults(args, "topk")
    transformer_vaswani_wmt_en_de_big(args)
