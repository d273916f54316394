"""fairseq's MultiheadAttention with the softmax replaced by any normalizer of the registry."""

import logging
import math

import torch
from fairseq.modules import MultiheadAttention
from torch import nn

from fairseq_entmax.names import ATTENTION_TYPES
from fairseq_entmax.normalizers import normalizer_entry

logger = logging.getLogger(__name__)

# Version of what this module stores beyond fairseq's MultiheadAttention: the learned
# `alpha_logit`. A checkpoint with alpha_logit but without the version key predates the key
# and is version 1; one with neither had no learned alpha in that module.
# Changing how alpha is stored means raising STATE_VERSION and adding, under the old
# version, a function that rewrites such a state dict in place (see upgrade_state_dict_named).
STATE_VERSION = 1
STATE_VERSION_KEY = "sparse_attention_version"
_STATE_UPGRADES = {}  # {version: fn(state_dict, prefix)} rewriting version into version + 1

# --alpha-init 2 would need an infinite logit; start just below 2 instead (1 + sigmoid(13.8)).
_MAX_SIGMOID = 1.0 - 1e-6


def alpha_logit_for(alpha):
    """The logit a with 1 + sigmoid(a) = alpha, for alpha in (1, 2] (2 gives 1.999999)."""
    p = min(alpha - 1.0, _MAX_SIGMOID)
    return math.log(p / (1.0 - p))


def keys_kept_per_query(scores, topk, topk_fraction, topk_min):
    """Number of keys top-k attention keeps per query: a fixed `topk`, or with `topk_fraction`
    F, max(topk_min, ceil(F * n)) for each query, n the number of keys it can see (scores
    not -inf: padding and future positions excluded). Counting what each query sees makes k
    the same in training and in incremental decoding, and independent of the batch's padding.
    """
    if topk_fraction is None:
        return topk
    visible = (scores > float("-inf")).sum(dim=-1, keepdim=True)
    # In float64, as math.ceil(F * n) would compute it.
    return torch.ceil(visible.double() * topk_fraction).long().clamp_(min=topk_min)


class SparseMultiheadAttention(MultiheadAttention):
    """Multi-head attention whose attention weights come from `normalizer_name`.

    Everything but the normalizer is fairseq's MultiheadAttention: projections, masks,
    incremental state, beam reordering, dropout and the returned weights, which are the
    (possibly sparse) probabilities the values are averaged with.

    The normalizer's registry entry (fairseq_entmax.normalizers.registry) is
    `self.normalizer`. Learned alpha (normalizer "alpha_entmax"): one parameter
    `alpha_logit` per head, alpha = clamp(1 + sigmoid(alpha_logit), *alpha_clamp),
    initialised from N(0, 1) (alpha_init="random", as Correia et al. did) or so that every
    head starts at alpha_init. With alpha_warmup_updates N > 0, the alpha a head uses is
    1 + min(1, t / N) * (alpha - 1) at update t (fairseq's set_num_updates): softmax at update
    0, its learned alpha from update N on.

    compile_normalizer: run the normalizer through torch.compile(fullgraph=True,
    dynamic=True) (one graph for every batch shape; see docs/fairseq.md for when it pays).
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        *,
        attention_type,
        normalizer_name,
        alpha_init="random",
        alpha_clamp=(1.01, 2.0),
        alpha_warmup_updates=0,
        topk=8,
        topk_fraction=None,
        topk_min=1,
        compile_normalizer=False,
        **multihead_attention_kwargs,
    ):
        if attention_type not in ATTENTION_TYPES:
            raise ValueError(f"attention_type must be one of {', '.join(ATTENTION_TYPES)}, got {attention_type!r}")
        normalizer = normalizer_entry(normalizer_name)
        if multihead_attention_kwargs.get("xformers_att_config") is not None:
            raise ValueError(
                "xformers attention computes its own softmax and would bypass "
                f"{normalizer_name}: do not combine --*-xformers-att-config with fairseq_entmax"
            )
        super().__init__(embed_dim, num_heads, **multihead_attention_kwargs)
        # fairseq sends calls without incremental state to PyTorch's fused
        # F.multi_head_attention_forward, whose softmax cannot be replaced. This flag is
        # fairseq's own switch that keeps every call on its Python path (the path that
        # honours before_softmax, which forward() builds on).
        self._set_skip_embed_dim_check()
        self.attention_type = attention_type
        self.normalizer_name = normalizer_name
        self.normalizer = normalizer
        self.alpha_clamp = (float(alpha_clamp[0]), float(alpha_clamp[1]))
        self.alpha_warmup_updates = alpha_warmup_updates
        # How far each head's alpha is from 1 towards its learned alpha (set_num_updates).
        self.alpha_warmup_fraction = 1.0
        self.topk = topk
        self.topk_fraction = topk_fraction
        self.topk_min = topk_min
        function = normalizer.function
        if compile_normalizer:
            function = torch.compile(function, fullgraph=True, dynamic=True)
        self._normalizer_function = function
        self.compile_normalizer = compile_normalizer
        # The call is chosen once, by the kind of the normalizer's extra parameter. A plain
        # function of the module, not a closure or bound method: those would tie a deep copy
        # of the module (fairseq's --ema) to the original's alpha.
        self._normalize = _NORMALIZE_CALLS[normalizer.parameter]
        self.alpha_init = alpha_init
        if normalizer.learns_alpha:
            if alpha_init == "random":
                initial = torch.randn(num_heads)
            else:
                initial = torch.full((num_heads,), alpha_logit_for(float(alpha_init)))
            self.alpha_logit = nn.Parameter(initial)
            # Written into every checkpoint with alpha_logit (see STATE_VERSION).
            self.register_buffer(STATE_VERSION_KEY, torch.tensor([STATE_VERSION]))
        else:
            self.alpha_logit = None

    def extra_repr(self):
        text = f"attention_type={self.attention_type}, normalizer={self.normalizer_name}"
        if self.alpha_logit is not None:
            text += f", alpha_clamp={self.alpha_clamp}"
            if self.alpha_warmup_updates:
                text += f", alpha_warmup_updates={self.alpha_warmup_updates}"
        if self.compile_normalizer:
            text += ", compiled"
        if self.normalizer.parameter == "k":
            text += (
                f", topk={self.topk}"
                if self.topk_fraction is None
                else f", topk_fraction={self.topk_fraction}, topk_min={self.topk_min}"
            )
        return text

    def set_num_updates(self, num_updates):
        """Follow fairseq's update count (called before each training step, and with the
        checkpoint's count when a model is loaded): the alpha warm-up's progress.

        Args:
            num_updates: the number of updates done.
        """
        if self.alpha_warmup_updates:
            self.alpha_warmup_fraction = min(1.0, num_updates / self.alpha_warmup_updates)

    def head_alpha(self):
        """Each head's current alpha, the one its attention uses.

        Returns:
            A float tensor of shape (num_heads,): the learned, clamped 1 + sigmoid(alpha_logit)
            (during an alpha warm-up, that far from 1) or the normalizer's fixed alpha
            (softmax 1, entmax15 1.5, sparsemax 2); None for a normalizer that is no
            alpha-entmax (top-k).
        """
        if self.alpha_logit is not None:
            alpha = self._learned_alpha()
            if self.alpha_warmup_fraction < 1.0:
                alpha = 1.0 + self.alpha_warmup_fraction * (alpha - 1.0)
            return alpha
        if self.normalizer.fixed_alpha is None:
            return None
        return torch.full(
            (self.num_heads,),
            self.normalizer.fixed_alpha,
            device=self.q_proj.weight.device,
        )

    def _learned_alpha(self):
        low, high = self.alpha_clamp
        return torch.clamp(1.0 + torch.sigmoid(self.alpha_logit.float()), low, high)

    def normalize(self, scores):
        """Attention probabilities from attention scores.

        Args:
            scores: float tensor of shape (batch * heads, queries, keys), -inf where a key
                is masked.

        Returns:
            The probabilities, of the same shape, each row summing to 1 (0 for a fully
            masked row).
        """
        return self._normalize(self, scores)

    def upgrade_state_dict_named(self, state_dict, name):
        """Bring what this module stores in a state dict to the current STATE_VERSION, or,
        from a checkpoint without a learned alpha here, start the alpha from alpha_init.

        fairseq calls this on every module before a model loads a state dict (fine-tuning
        with --finetune-from-model or --restore-file, resuming, generation, the hub). Modules
        without a learned alpha store nothing of their own (their keys are those of
        fairseq's MultiheadAttention) and are left as fairseq leaves them. A state dict that
        holds neither `alpha_logit` nor the version key for this module comes from a model
        without learned alpha here (fairseq's transformer, or this package's softmax, entmax15,
        sparsemax or top-k): this module's own initial alpha_logit, drawn from alpha_init, is
        put in, and logged, so that the strict load that follows checks every other key.

        Args:
            state_dict: the model's state dict, changed in place.
            name: this module's name in the model, e.g. "encoder.layers.0.self_attn".

        Raises:
            ValueError: if the state dict was written by a newer version of this package.
        """
        super().upgrade_state_dict_named(state_dict, name)
        if self.alpha_logit is None:
            return
        prefix = f"{name}." if name else ""
        key = prefix + STATE_VERSION_KEY
        alpha_key = prefix + "alpha_logit"
        if key not in state_dict and alpha_key not in state_dict:
            state_dict[alpha_key] = self.alpha_logit.detach().clone()
            state_dict[key] = torch.tensor([STATE_VERSION])
            logger.info(
                "%s: not in the checkpoint (trained without learned alpha), so its %d heads start "
                "from --alpha-init %s: alpha %s",
                alpha_key,
                self.num_heads,
                self.alpha_init,
                ", ".join(f"{alpha:.7g}" for alpha in self._learned_alpha().tolist()),
            )
            return
        version = int(state_dict[key].reshape(-1)[0]) if key in state_dict else 1
        if version > STATE_VERSION:
            raise ValueError(
                f"{key} is {version}: the checkpoint was saved by a newer fairseq-entmax, which "
                f"stores its attention differently (this one reads up to version {STATE_VERSION}); "
                f"upgrade fairseq-entmax to load it"
            )
        for old_version in range(version, STATE_VERSION):
            _STATE_UPGRADES[old_version](state_dict, prefix)
        state_dict[key] = torch.tensor([STATE_VERSION])

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
        weights_float = self.normalize(scores.float())
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


def _normalize_plain(attention, scores):
    return attention._normalizer_function(scores, dim=-1)


def _normalize_with_alpha(attention, scores):
    per_head = scores.view(-1, attention.num_heads, scores.size(1), scores.size(2))
    alpha = attention.head_alpha().view(1, attention.num_heads, 1, 1)
    # The clamp bounds alpha: the sync-free path (GPUs, torch.compile) takes the search for
    # alpha <= 2 from it instead of reading alpha's values.
    return attention._normalizer_function(per_head, alpha, dim=-1, max_alpha=attention.alpha_clamp[1]).view_as(scores)


def _normalize_with_k(attention, scores):
    k = keys_kept_per_query(scores, attention.topk, attention.topk_fraction, attention.topk_min)
    return attention._normalizer_function(scores, k, dim=-1)


# How the module calls a normalizer, by its extra parameter (Normalizer.parameter).
_NORMALIZE_CALLS = {None: _normalize_plain, "alpha": _normalize_with_alpha, "k": _normalize_with_k}
