"""Capture the per-head attention weights of every fairseq MultiheadAttention in a model.

Works on any subclass of fairseq.modules.MultiheadAttention: fairseq_entmax's
SparseMultiheadAttention and plain fairseq attention alike. Nothing here knows how the
weights are computed; the attention modules, their type and layer are those the model lists
(fairseq_entmax.models.attention_modules).
"""

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fairseq_entmax.names import ATTENTION_TYPES


@dataclass
class AttentionSite:
    """One attention module of the model."""

    name: str
    attention: str  # one of ATTENTION_TYPES
    layer: int
    module: torch.nn.Module

    @property
    def num_heads(self):
        """The module's number of heads."""
        return self.module.num_heads

    def normalizer(self):
        """The module's normalizer.

        Returns:
            Its name (one of NORMALIZER_NAMES); "softmax" for modules that are not ours.
        """
        normalizer = getattr(self.module, "normalizer", None)
        return "softmax" if normalizer is None else normalizer.name

    def head_alpha(self):
        """Each head's alpha.

        Returns:
            A list of floats, one per head, from the module's head_alpha(); None for top-k,
            which has no alpha. Modules that are not ours are softmax: alpha 1.
        """
        normalizer = getattr(self.module, "normalizer", None)
        if normalizer is None:
            return [1.0] * self.num_heads
        alpha = normalizer.head_alpha()
        return None if alpha is None else [float(a) for a in alpha.detach().cpu()]


def attention_sites(model):
    """All attention modules of a fairseq encoder-decoder model.

    Args:
        model: a fairseq Transformer (this package's or fairseq's own).

    Returns:
        A list of AttentionSite, in (ATTENTION_TYPES, layer) order, named by the module's
        name in the model.

    Raises:
        ValueError: if the model has no attention modules where a fairseq Transformer has them.
    """
    from fairseq_entmax.models import attention_modules

    names = {id(module): name for name, module in model.named_modules()}
    sites = [
        AttentionSite(names[id(module)], attention, layer, module)
        for attention, layer, module in attention_modules(model)
    ]
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
    """While active, every forward of a site hands its per-head weights to `receive`.

    fairseq's MultiheadAttention hands self-attention without incremental state to PyTorch's
    F.multi_head_attention_forward, which can only return head-averaged weights. Setting
    `skip_embed_dim_check` (an attribute of every fairseq MultiheadAttention, used only to pick
    that path and to skip a dimension assert) sends it down fairseq's own path, which returns the
    weights of each head; the attention computed is the same.

    Args:
        sites: AttentionSite's, as attention_sites lists them.
        receive: called as `receive(site, weights)` after every forward of a site, with its
            weights `(heads, batch, queries, keys)`.

    Yields:
        Nothing: the capture lasts while the `with` block runs; hooks and flags are removed
        on exit.

    Raises:
        RuntimeError: a module returned no per-head weights.
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
