"""fairseq's MultiheadAttention with the softmax replaced by a normalizer module."""

import torch
from fairseq.modules import MultiheadAttention

from fairseq_entmax.attention import scaled_dot_product_attention
from fairseq_entmax.names import ATTENTION_TYPES

# Version of what this module stores beyond fairseq's MultiheadAttention, written beside the
# learned alphas (the only parameters of a normalizer):
# 1: `alpha_logit` on the attention module (a checkpoint with alpha_logit but without the
#    version key predates the key and is version 1);
# 2: `normalizer.alpha_logit`, on the normalizer module.
# Changing how the normalizer is stored means raising STATE_VERSION and adding, under the old
# version, a function that rewrites such a state dict in place (upgrade_state_dict_named).
STATE_VERSION = 2
STATE_VERSION_KEY = "sparse_attention_version"


def _alpha_logit_onto_the_normalizer(state_dict, prefix):
    state_dict[prefix + "normalizer.alpha_logit"] = state_dict.pop(prefix + "alpha_logit")


_STATE_UPGRADES = {1: _alpha_logit_onto_the_normalizer}  # {version: rewrite into version + 1}


class SparseMultiheadAttention(MultiheadAttention):
    """Multi-head attention whose attention weights come from `normalizer`.

    Everything but the normalizer is fairseq's MultiheadAttention: projections, masks,
    incremental state, beam reordering, dropout and the returned weights, which are the
    (possibly sparse) probabilities the values are averaged with. A call that needs no weights
    and has no incremental state (training, and the encoder in generation) runs
    fairseq_entmax.attention, which never holds the score matrix; the others run fairseq's
    Python path up to the scores, then the normalizer.

    Args:
        embed_dim, num_heads: as fairseq's MultiheadAttention.
        attention_type: one of ATTENTION_TYPES, for the logs and the analysis.
        normalizer: the AttentionNormalizer of this attention
            (fairseq_entmax.normalizers.build_normalizer), for num_heads heads.
        **multihead_attention_kwargs: fairseq's MultiheadAttention's other arguments.
    """

    def __init__(self, embed_dim, num_heads, *, attention_type, normalizer, **multihead_attention_kwargs):
        if attention_type not in ATTENTION_TYPES:
            raise ValueError(f"attention_type must be one of {', '.join(ATTENTION_TYPES)}, got {attention_type!r}")
        if normalizer.num_heads != num_heads:
            raise ValueError(f"the normalizer is built for {normalizer.num_heads} heads, the attention has {num_heads}")
        if multihead_attention_kwargs.get("xformers_att_config") is not None:
            raise ValueError(
                "xformers attention computes its own softmax and would bypass "
                f"{normalizer.name}: do not combine --*-xformers-att-config with fairseq_entmax"
            )
        super().__init__(embed_dim, num_heads, **multihead_attention_kwargs)
        # fairseq sends calls without incremental state to PyTorch's fused
        # F.multi_head_attention_forward, whose softmax cannot be replaced. This flag is
        # fairseq's own switch that keeps every call on its Python path (the path that
        # honours before_softmax, which forward() builds on).
        self._set_skip_embed_dim_check()
        self.attention_type = attention_type
        self.normalizer = normalizer
        if normalizer.learns_alpha:
            # Written into every checkpoint with the learned alphas (see STATE_VERSION).
            self.register_buffer(STATE_VERSION_KEY, torch.tensor([STATE_VERSION]))

    def extra_repr(self):
        return f"attention_type={self.attention_type}, normalizer={self.normalizer.name}"

    def set_num_updates(self, num_updates):
        """Follow fairseq's update count (called before each training step, and with the
        checkpoint's count when a model is loaded): the normalizer's warm-up, if any.

        Args:
            num_updates: the number of updates done.
        """
        self.normalizer.set_num_updates(num_updates)

    def upgrade_state_dict_named(self, state_dict, name):
        """Bring what this module stores in a state dict to the current STATE_VERSION.

        fairseq calls this on every module before a model loads a state dict (fine-tuning
        with --finetune-from-model or --restore-file, resuming, generation, the hub). Modules
        whose normalizer learns nothing store nothing of their own (their keys are those of
        fairseq's MultiheadAttention) and are left as fairseq leaves them. A state dict
        without the version key here is of version 1 if it holds this module's own
        alpha_logit, and of the current layout otherwise: fairseq's EMA restores parameters
        alone, and a model trained without learned alpha here stores nothing of the
        normalizer, which then keeps its initial alphas (LearnedAlphaEntmax's load).

        Args:
            state_dict: the model's state dict, changed in place.
            name: this module's name in the model, e.g. "encoder.layers.0.self_attn".

        Raises:
            ValueError: if the state dict was written by a newer version of this package.
        """
        super().upgrade_state_dict_named(state_dict, name)
        if not self.normalizer.learns_alpha:
            return
        prefix = f"{name}." if name else ""
        key = prefix + STATE_VERSION_KEY
        if key in state_dict:
            version = int(state_dict[key].reshape(-1)[0])
        elif prefix + "alpha_logit" in state_dict:
            version = 1  # written before the version key existed
        else:
            version = STATE_VERSION
        if version > STATE_VERSION:
            raise ValueError(
                f"{key} is {version}: the checkpoint was saved by a newer fairseq-entmax, which "
                f"stores its attention differently (this one reads up to version {STATE_VERSION}); "
                f"upgrade fairseq-entmax to load it"
            )
        for old_version in range(version, STATE_VERSION):
            _STATE_UPGRADES[old_version](state_dict, prefix)
        state_dict[key] = torch.tensor([STATE_VERSION])

    def _blocked_forward(self, query, key, value, key_padding_mask, attn_mask):
        """The attention output through fairseq_entmax.attention, which never holds the
        (batch x heads, queries, keys) scores: fairseq's projections, masks and dropout, with the
        normalizer, for a call that needs no weights and has no incremental state."""
        tgt_len, bsz, _ = query.size()
        if self.self_attention:
            key = value = query
        elif self.encoder_decoder_attention:
            value = key

        def per_head(states, projection):  # (length, batch, embed) -> (batch, heads, length, head_dim)
            return projection(states).view(states.size(0), bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

        mask = attn_mask
        if key_padding_mask is not None:
            seen = ~key_padding_mask.to(torch.bool).view(bsz, 1, 1, -1)
            mask = seen if attn_mask is None else attn_mask.masked_fill(~seen, float("-inf"))
        dropout = self.dropout_module
        attn = scaled_dot_product_attention(
            per_head(query, self.q_proj),
            per_head(key, self.k_proj),
            per_head(value, self.v_proj),
            attn_mask=mask,
            dropout_p=dropout.p if self.training or dropout.apply_during_inference else 0.0,
            scale=self.scaling,
            normalizer=self.normalizer,
        )
        return self.out_proj(attn.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim))

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=True,
        static_kv=False,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
    ):
        if need_head_weights:
            need_weights = True
        tgt_len, bsz, embed_dim = query.size()
        assert embed_dim == self.embed_dim, f"query dim {embed_dim} != {self.embed_dim}"
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # fairseq's Python path adds attn_mask to the scores, so a boolean mask (True:
            # not allowed, as PyTorch's attention reads one) would add 1 where it hides.
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=attn_mask.device).masked_fill_(
                attn_mask, float("-inf")
            )
        blocked = not (need_weights or before_softmax or static_kv or self.add_zero_attn)
        if blocked and incremental_state is None and self.bias_k is None:
            return self._blocked_forward(query, key, value, key_padding_mask, attn_mask), None
        # fairseq's own code up to the softmax: projections, incremental state, bias_kv,
        # zero_attn, attention mask (additive) and key padding (-inf).
        scores, v = super().forward(
            query,
            key,
            value,
            key_padding_mask=key_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            static_kv=static_kv,
            attn_mask=attn_mask,
            before_softmax=True,
        )
        if before_softmax:
            return scores, v
        src_len = scores.size(-1)
        weights_float = self.normalizer(scores.float())
        weights = weights_float.type_as(scores)
        probs = self.dropout_module(weights)

        kv_bsz = v.size(0) // self.num_heads
        if self.encoder_decoder_attention and bsz != kv_bsz:
            # fairseq's beamable cross attention: keys/values are stored once per sentence,
            # not once per beam hypothesis.
            attn = torch.einsum(
                "bxhts,bhsd->bxhtd",
                probs.view((kv_bsz, -1, self.num_heads) + probs.size()[1:]),
                v.view((kv_bsz, self.num_heads) + v.size()[1:]),
            )
            attn = attn.reshape((-1,) + attn.size()[-2:])
        else:
            attn = torch.bmm(probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim)
        attn = self.out_proj(attn)

        returned_weights = None
        if need_weights:
            returned_weights = weights_float.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                returned_weights = returned_weights.mean(dim=0)
        return attn, returned_weights
