"""The normalizers as torch modules: one per attention, called on its scores.

`build_normalizer(name, num_heads, config)` is the one factory: it knows every normalizer by
name and binds its function once (compiled with torch.compile when asked). The module owns
what the normalizer learns (the per-head alpha logits of learned alpha-entmax, their clamp and
warm-up) and its own parameters (top-k's k, fraction and minimum), so an attention layer only
calls it:

    normalizer = build_normalizer("alpha_entmax", num_heads=8, alpha_init="random")
    weights = normalizer(scores)   # scores: (batch * heads, queries, keys), -inf where masked

Like the functions, these modules import torch only.
"""

import logging
import math

import torch
from torch import nn

from fairseq_entmax.names import NORMALIZER_NAMES
from fairseq_entmax.normalizers.alpha_entmax import alpha_entmax
from fairseq_entmax.normalizers.config import NormalizerConfig
from fairseq_entmax.normalizers.entmax15 import entmax15
from fairseq_entmax.normalizers.softmax import softmax
from fairseq_entmax.normalizers.sparsemax import sparsemax
from fairseq_entmax.normalizers.topk import topk_softmax

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = NormalizerConfig()

# --alpha-init 2 would need an infinite logit; start just below 2 instead (1 + sigmoid(13.8)).
_MAX_SIGMOID = 1.0 - 1e-6


def alpha_logit_for(alpha):
    """The logit a with 1 + sigmoid(a) = alpha.

    Args:
        alpha: a number in (1, 2] (2 gives 1.999999).

    Returns:
        The logit, a float.
    """
    p = min(alpha - 1.0, _MAX_SIGMOID)
    return math.log(p / (1.0 - p))


class AttentionNormalizer(nn.Module):
    """What every normalizer module has: its name, its number of heads, whether it learns
    alpha, and its bound function.

    Attributes:
        name: the name build_normalizer knows it by.
        num_heads: the heads of the attention it serves.
        compiled: whether its function runs through torch.compile.
    """

    name = None
    learns_alpha = False

    def __init__(self, function, num_heads, compile_function=False):
        super().__init__()
        self.num_heads = num_heads
        self.compiled = compile_function
        # One graph for every batch shape (dynamic=True); fullgraph: a graph break is an error.
        self.function = torch.compile(function, fullgraph=True, dynamic=True) if compile_function else function

    def head_alpha(self):
        """Each head's alpha.

        Returns:
            A float tensor of shape (num_heads,), or None for a normalizer that is no
            alpha-entmax (top-k).
        """
        return None

    def set_num_updates(self, num_updates):
        """Follow fairseq's update count (a no-op but for learned alpha's warm-up).

        Args:
            num_updates: the number of updates done.
        """

    def extra_repr(self):
        return f"num_heads={self.num_heads}" + (", compiled" if self.compiled else "")


class FixedAlphaEntmax(AttentionNormalizer):
    """softmax (alpha 1), entmax15 (alpha 1.5) or sparsemax (alpha 2): no parameters."""

    def __init__(self, name, function, alpha, num_heads, compile_function=False):
        super().__init__(function, num_heads, compile_function)
        self.name = name
        # Not saved: the module stores nothing, so its state dict is fairseq's attention's.
        self.register_buffer("fixed_alpha", torch.full((num_heads,), alpha), persistent=False)

    def head_alpha(self):
        return self.fixed_alpha

    def forward(self, scores):
        """Args: scores (batch * heads, queries, keys). Returns: the weights, of that shape."""
        return self.function(scores, dim=-1)


class TopK(AttentionNormalizer):
    """Top-k softmax: a fixed k per query, or with `fraction` F, max(minimum, ceil(F * n)) for
    each query, n the number of keys it can see (scores not -inf: padding and future
    positions excluded). Counting what each query sees makes k the same in training and in
    incremental decoding, and independent of the batch's padding. `config` gives k (topk),
    F (topk_fraction) and the minimum (topk_min)."""

    name = "topk"

    def __init__(self, num_heads, config=DEFAULT_CONFIG, compile_function=False):
        super().__init__(topk_softmax, num_heads, compile_function)
        self.k = config.topk
        self.fraction = config.topk_fraction
        self.minimum = config.topk_min

    def keys_kept(self, scores):
        """The number of keys kept per query.

        Args:
            scores: (batch * heads, queries, keys).

        Returns:
            The int k, or with a fraction a long tensor of shape (batch * heads, queries, 1).
        """
        if self.fraction is None:
            return self.k
        visible = (scores > float("-inf")).sum(dim=-1, keepdim=True)
        # In float64, as math.ceil(F * n) would compute it.
        return torch.ceil(visible.double() * self.fraction).long().clamp_(min=self.minimum)

    def forward(self, scores):
        """Args: scores (batch * heads, queries, keys). Returns: the weights, of that shape."""
        return self.function(scores, self.keys_kept(scores), dim=-1)

    def extra_repr(self):
        kept = f"k={self.k}" if self.fraction is None else f"fraction={self.fraction}, minimum={self.minimum}"
        return f"{super().extra_repr()}, {kept}"


class LearnedAlphaEntmax(AttentionNormalizer):
    """alpha-entmax with one learned alpha per head (Correia et al. 2019).

    alpha = clamp(1 + sigmoid(alpha_logit), *alpha_clamp), alpha_logit initialised from N(0, 1)
    (alpha_init="random", as the authors did) or so that every head starts at alpha_init, the
    options of `config`. With alpha_warmup_updates N > 0, a head uses 1 + min(1, t / N) *
    (alpha - 1) at update t: softmax at update 0, its learned alpha from update N on.
    """

    name = "alpha_entmax"
    learns_alpha = True

    def __init__(self, num_heads, config=DEFAULT_CONFIG, compile_function=False):
        super().__init__(alpha_entmax, num_heads, compile_function)
        init = self.init = config.alpha_init
        self.clamp = config.alpha_clamp
        self.warmup_updates = config.alpha_warmup_updates
        # How far each head's alpha is from 1 towards its learned alpha (set_num_updates): a
        # tensor, so that torch.compile reads its value instead of specialising on each. Saved
        # with the alphas, so that a state dict without the update count (a PEFT adapter, a
        # model loaded for generation) keeps the warm-up position.
        self.register_buffer("warmup_fraction", torch.ones(()))
        if init == "random":
            initial = torch.randn(num_heads)
        else:
            initial = torch.full((num_heads,), alpha_logit_for(float(init)))
        self.alpha_logit = nn.Parameter(initial)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        """nn.Module's load, except that a state dict without alpha_logit here (that of a model
        trained without learned alpha: fairseq's transformer, fine-tuned with
        --finetune-from-model or --restore-file) keeps the alphas drawn from `init`, and says so
        in the log, and one without warmup_fraction (saved before it was kept) keeps the
        position set_num_updates gives: a strict load still checks every other key.

        Args:
            state_dict, prefix, local_metadata, strict, unexpected_keys, error_msgs: as
                nn.Module._load_from_state_dict takes them.
            missing_keys: the keys the load lacks; this module's alpha_logit and
                warmup_fraction are not among them.
        """
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if prefix + "warmup_fraction" in missing_keys:
            missing_keys.remove(prefix + "warmup_fraction")
        key = prefix + "alpha_logit"
        if key in missing_keys:
            missing_keys.remove(key)
            logger.info(
                "%s: not in the checkpoint (trained without learned alpha), so its %d heads start "
                "from --alpha-init %s: alpha %s",
                key,
                self.num_heads,
                self.init,
                ", ".join(f"{alpha:.7g}" for alpha in self.learned_alpha().tolist()),
            )

    # The tensors that stay float32 when the module is cast (.half(), .to(torch.bfloat16)).
    float32_tensors = ("warmup_fraction",)

    def _apply(self, fn, recurse=True):
        """nn.Module's, except that the tensors of float32_tensors (and their gradients) stay float32."""
        super()._apply(fn, recurse)
        for name in self.float32_tensors:
            tensor = getattr(self, name)
            if tensor.dtype != torch.float32:
                tensor.data = tensor.data.float()
                if tensor.grad is not None:
                    tensor.grad = tensor.grad.float()
        return self

    def set_num_updates(self, num_updates):
        if self.warmup_updates:
            self.warmup_fraction.fill_(min(1.0, num_updates / self.warmup_updates))

    def learned_alpha(self):
        """The clamped 1 + sigmoid(alpha_logit) of each head, before any warm-up."""
        low, high = self.clamp
        return torch.clamp(1.0 + torch.sigmoid(self.alpha_logit.float()), low, high)

    def head_alpha(self):
        alpha = self.learned_alpha()
        if self.warmup_updates:
            # lerp is exact at both ends: 1 at the start, the learned alpha once warmed up.
            alpha = torch.lerp(torch.ones_like(alpha), alpha, self.warmup_fraction)
        return alpha

    def forward(self, scores):
        """Args: scores (batch * heads, queries, keys). Returns: the weights, of that shape."""
        per_head = scores.view(-1, self.num_heads, scores.size(1), scores.size(2))
        alpha = self.head_alpha().view(1, self.num_heads, 1, 1)
        # The clamp bounds alpha: the sync-free path (GPUs, torch.compile) takes the search for
        # alpha <= 2 from it instead of reading alpha's values.
        return self.function(per_head, alpha, dim=-1, max_alpha=self.clamp[1]).view_as(scores)

    def extra_repr(self):
        text = f"{super().extra_repr()}, clamp={self.clamp}"
        return text + (f", warmup_updates={self.warmup_updates}" if self.warmup_updates else "")


_FIXED_ALPHA = {"softmax": (softmax, 1.0), "entmax15": (entmax15, 1.5), "sparsemax": (sparsemax, 2.0)}


def build_normalizer(name, num_heads, config=None, *, compile_function=False, **options):
    """The normalizer module of one attention.

    Args:
        name: one of NORMALIZER_NAMES.
        num_heads: the attention's heads.
        config: a NormalizerConfig, checked once by its maker and shared by the attentions of
            a model; or None, for one made of `options`.
        compile_function: run the normalizer's function through torch.compile.
        **options: without config, NormalizerConfig's options (learned alpha-entmax's
            alpha_init, alpha_clamp and alpha_warmup_updates, top-k's topk, topk_fraction and
            topk_min), checked there; the maps that do not read an option ignore it.

    Returns:
        An AttentionNormalizer.

    Raises:
        ValueError: for an unknown name, listing the known ones, and for a bad option value,
            naming the option and what is allowed.
        TypeError: for an unknown option, listing the known ones, and for both a config and
            options.
    """
    if name not in NORMALIZER_NAMES:
        raise ValueError(f"unknown normalizer {name!r}; known normalizers: {', '.join(NORMALIZER_NAMES)}")
    if config is None:
        config = NormalizerConfig.from_options(options)
    elif options:
        raise TypeError(f"build_normalizer: options {sorted(options)} given with a config, which holds them all")
    if name in _FIXED_ALPHA:
        function, alpha = _FIXED_ALPHA[name]
        return FixedAlphaEntmax(name, function, alpha, num_heads, compile_function)
    if name == "alpha_entmax":
        return LearnedAlphaEntmax(num_heads, config, compile_function)
    return TopK(num_heads, config, compile_function)
