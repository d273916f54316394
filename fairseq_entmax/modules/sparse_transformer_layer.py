"""fairseq's Transformer encoder and decoder layers, built with SparseMultiheadAttention.

Only the attention factories fairseq provides for this are overridden; the layers'
forward passes are fairseq's.
"""

from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from fairseq_entmax.modules.sparse_multihead_attention import SparseMultiheadAttention


class SparseTransformerEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer, its self-attention's normalizer from `normalizers`
    (fairseq_entmax.options.AttentionNormalizers)."""

    def __init__(self, cfg, normalizers, return_fc=False):
        # Before fairseq's __init__, which builds the attention.
        self.normalizers = normalizers
        super().__init__(cfg, return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return SparseMultiheadAttention(
            embed_dim,
            cfg.encoder.attention_heads,
            attention_type="encoder_self",
            normalizer=self.normalizers.build("encoder_self", cfg.encoder.attention_heads),
            dropout=cfg.attention_dropout,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class SparseTransformerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer, its attentions' normalizers from `normalizers`
    (fairseq_entmax.options.AttentionNormalizers)."""

    def __init__(self, cfg, normalizers, no_encoder_attn=False):
        # Before fairseq's __init__, which builds the attentions.
        self.normalizers = normalizers
        super().__init__(cfg, no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return SparseMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            attention_type="decoder_self",
            normalizer=self.normalizers.build("decoder_self", cfg.decoder.attention_heads),
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return SparseMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            attention_type="cross",
            normalizer=self.normalizers.build("cross", cfg.decoder.attention_heads),
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )
