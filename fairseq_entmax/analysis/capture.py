"""Capture the per-head attention weights of every fairseq MultiheadAttention in a model.

Works on any subclass of fairseq.modules.MultiheadAttention: fairseq_entmax's
SparseMultiheadAttention and plain fairseq attention alike. Nothing here knows how the
weights are computed; the attention type and layer come from the module's name.
"""
import inspect
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fairseq_entmax.modules.sparse_multihead_attention import ATTENTION_TYPES

# encoder.layers.3.self_attn, decoder.layers.0.encoder_attn; wrappers may add parts in between.
_MODULE_NAME = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(?:.*\.)?(self_attn|encoder_attn)$")


@dataclass
class AttentionSite:
    """One attention module of the model."""

    name: str
    attention: str  # one of ATTENTION_TYPES
    layer: int
    module: torch.nn.Module

    @property
    def num_heads(self):
        return self.module.num_heads

    def normalizer(self):
        """Normalizer name; modules that are not ours are softmax."""
        return getattr(self.module, "normalizer_name", "softmax")

    def head_alpha(self):
        """Each head's alpha as a list of floats, or None (top-k has no alpha).

        Modules that are not ours are softmax: alpha 1.
        """
        if not hasattr(self.module, "head_alpha"):
            return [1.0] * self.num_heads
        alpha = self.module.head_alpha()
        return None if alpha is None else [float(a) for a in alpha.detach().cpu()]


def attention_sites(model):
    """All attention modules of a fairseq encoder-decoder model, in (type, layer) order."""
    from fairseq.modules import MultiheadAttention

    sites = []
    for name, module in model.named_modules():
        match = _MODULE_NAME.match(name)
        if match is None or not isinstance(module, MultiheadAttention):
            continue
        side, layer, kind = match.groups()
        if side == "encoder":
            attention = "encoder_self"
        else:
            attention = "decoder_self" if kind == "self_attn" else "cross"
        sites.append(AttentionSite(name, attention, int(layer), module))
    if not sites:
        raise ValueError(
            "found no attention modules named encoder.layers.N.self_attn / decoder.layers.N.self_attn / "
            "decoder.layers.N.encoder_attn in the model: is it a fairseq Transformer?"
        )
    return sorted(sites, key=lambda s: (ATTENTION_TYPES.index(s.attention), s.layer))


def _request_head_weights(module, args, kwargs):
    """Forward pre-hook: make the module return per-head weights whatever its caller asked
    (fairseq's layers call self-attention with need_weights=False)."""
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    bound.arguments["need_weights"] = True
    bound.arguments["need_head_weights"] = True
    return bound.args, bound.kwargs


@contextmanager
def capture_attention(sites, receive):
    """While active, every forward of a site calls `receive(site, weights)` with its weights
    `(heads, batch, queries, keys)`.

    fairseq's MultiheadAttention hands self-attention without incremental state to PyTorch's
    F.multi_head_attention_forward, which can only return head-averaged weights. Setting
    `skip_embed_dim_check` (an attribute of every fairseq MultiheadAttention, used only to pick
    that path and to skip a dimension assert) sends it down fairseq's own path, which returns the
    weights of each head; the attention computed is the same.
    """
    handles, saved_flags = [], []

    def make_hook(site):
        def hook(module, args, kwargs, output):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None or weights.dim() != 4:
                raise RuntimeError(
                    f"{site.name} ({type(module).__name__}) returned no per-head attention weights "
                    f"although need_head_weights=True was requested (got "
                    f"{None if weights is None else tuple(weights.shape)})"
                )
            receive(site, weights)

        return hook

    try:
        for site in sites:
            module = site.module
            saved_flags.append((module, module.skip_embed_dim_check))
            module.skip_embed_dim_check = True
            handles.append(module.register_forward_pre_hook(_request_head_weights, with_kwargs=True))
            handles.append(module.register_forward_hook(make_hook(site), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in saved_flags:
            module.skip_embed_dim_check = flag
