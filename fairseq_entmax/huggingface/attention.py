"""The attention functions registered with transformers' AttentionInterface, and their mask.

transformers calls the function of a model's `attn_implementation` from every attention module
that dispatches through `AttentionInterface`:

    output, weights = fn(module, query, key, value, attention_mask, dropout=..., scaling=..., **kwargs)

with query (batch, heads, queries, head_dim) and key, value (batch, key_value_heads, keys,
head_dim). Each function here computes the scores as the models' eager attention does, adds
T5's `position_bias`, masks with -inf (exact zeros for every map), normalises in float32 with a
normalizer of fairseq_entmax.normalizers, and returns the output and the weights.
"""

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from fairseq_entmax.normalizers import NORMALIZER_NAMES, build_normalizer

# The attribute of an attention module that holds its normalizer (fairseq_entmax.huggingface.sparsify).
NORMALIZER_ATTRIBUTE = "attention_normalizer"

# The implementation sparsify gives a model: each attention module runs the normalizer it holds,
# and a module without one (an attention type sparsify left out) the plugin's softmax.
SPARSIFIED = "sparsified"

# Normalizers that need no state of their own, shared by the attention modules that were not
# sparsified: one per (name, heads), built on first use with build_normalizer's defaults.
_SHARED_NORMALIZERS = {}


def sparse_attention_mask(*args, **kwargs):
    """The mask function registered with AttentionMaskInterface for every implementation here.

    transformers' boolean mask (True where a query sees a key), always built: sdpa's mask
    function leaves the causal mask out where sdpa's own `is_causal` would apply it, which these
    functions do not have.

    Args:
        *args, **kwargs: what transformers.masking_utils passes to a mask function.

    Returns:
        A boolean tensor (batch, 1, queries, keys), or None where every query sees every key.
    """
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def normalizer_of(module, name, num_heads):
    """The normalizer that the attention function `name` uses for one attention module.

    The module's own normalizer is the one source of truth: the implementation's name only
    chooses the map of the modules sparsify gave none.

    Args:
        module: the attention module transformers passes to the function.
        name: the attention implementation, SPARSIFIED or one of NORMALIZER_NAMES.
        num_heads: the query heads of this call.

    Returns:
        The module's own normalizer (from sparsify), else a shared one of that name with
        build_normalizer's default options (softmax for SPARSIFIED).

    Raises:
        ValueError: for "alpha_entmax" on a module that sparsify did not give a normalizer
            (its learned alphas live on the module), and for a normalizer built for another
            number of heads.
    """
    own = getattr(module, NORMALIZER_ATTRIBUTE, None)
    if own is not None:
        if own.num_heads != num_heads:
            raise ValueError(
                f"{type(module).__name__}: its normalizer is built for {own.num_heads} heads, "
                f"the attention has {num_heads}"
            )
        return own
    if name == "alpha_entmax":
        raise ValueError(
            "attn_implementation='alpha_entmax' learns one alpha per head, kept on each attention module: "
            "give the model its alphas with fairseq_entmax.huggingface.sparsify(model, 'alpha_entmax', ...) "
            "or load a sparsified model with fairseq_entmax.huggingface.from_pretrained(ModelClass, path)"
        )
    if name == SPARSIFIED:
        name = "softmax"
    key = (name, num_heads)
    if key not in _SHARED_NORMALIZERS:
        _SHARED_NORMALIZERS[key] = build_normalizer(name, num_heads)
    return _SHARED_NORMALIZERS[key]


def _masked_scores(scores, attention_mask):
    """The scores with masked keys at -inf: a boolean mask is True where a key is seen; a float
    mask is additive, its minimum (transformers' "masked") or -inf marking masked keys."""
    if attention_mask.dtype == torch.bool:
        return scores.masked_fill(~attention_mask, float("-inf"))
    masked = attention_mask <= torch.finfo(attention_mask.dtype).min
    return (scores + attention_mask.masked_fill(masked, 0.0).float()).masked_fill(masked, float("-inf"))


def sparse_attention_forward(
    name, module, query, key, value, attention_mask, dropout=0.0, scaling=None, position_bias=None, **kwargs
):
    """Attention with the normalizer `name` in place of the softmax.

    Args:
        name: SPARSIFIED or one of NORMALIZER_NAMES.
        module: the attention module (its `num_key_value_groups`, `training` and, after
            sparsify, its normalizer).
        query: (batch, heads, queries, head_dim).
        key, value: (batch, key_value_heads, keys, head_dim); grouped-query attention repeats
            each key/value head for heads / key_value_heads query heads.
        attention_mask: None, a boolean mask (True: seen) or an additive float mask,
            broadcastable to (batch, heads, queries, keys) after cutting it to the keys.
        dropout: the dropout probability on the weights, applied in training mode.
        scaling: the scores' scale (default head_dim ** -0.5).
        position_bias: T5's relative position bias, added to the scores.
        **kwargs: the model's other keywords; `softcap` caps the scores as Gemma's eager
            attention does.

    Returns:
        (output (batch, queries, heads, head_dim), weights (batch, heads, queries, keys)), the
        weights in the query's dtype, exactly 0 on masked keys and off the support.

    Raises:
        NotImplementedError: for attention sinks (`s_aux`), which no sparse map here defines.
        ValueError: see normalizer_of.
    """
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError(
            f"attn_implementation={name!r}: {type(module).__name__} passes attention sinks (s_aux), "
            "which fairseq_entmax's normalizers do not support"
        )
    batch, heads, queries, head_dim = query.shape
    if key.shape[1] != heads:
        groups = getattr(module, "num_key_value_groups", heads // key.shape[1])
        key = torch.repeat_interleave(key, groups, dim=1)
        value = torch.repeat_interleave(value, groups, dim=1)
    if scaling is None:
        scaling = head_dim**-0.5
    # As the models' eager attention computes them; normalised in float32, as the fairseq layer does.
    scores = (torch.matmul(query, key.transpose(2, 3)) * scaling).float()
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if position_bias is not None:
        scores = scores + position_bias[..., : key.shape[-2]].float()
    if attention_mask is not None:
        scores = _masked_scores(scores, attention_mask[:, :, :, : key.shape[-2]])
    normalizer = normalizer_of(module, name, heads)
    keys = scores.shape[-1]
    weights = normalizer(scores.reshape(batch * heads, queries, keys)).view(batch, heads, queries, keys)
    weights = torch.nn.functional.dropout(weights.to(value.dtype), p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def _attention_function(name):
    def attention(module, query, key, value, attention_mask, **kwargs):
        return sparse_attention_forward(name, module, query, key, value, attention_mask, **kwargs)

    attention.__name__ = attention.__qualname__ = f"{name}_attention_forward"
    attention.__doc__ = f"transformers' attention function {name!r}: sparse_attention_forward with {name!r}."
    return attention


# Every normalizer as an attention implementation, and SPARSIFIED: name -> function.
ATTENTION_FUNCTIONS = {name: _attention_function(name) for name in (*NORMALIZER_NAMES, SPARSIFIED)}


def register_attention_functions():
    """Register every function of ATTENTION_FUNCTIONS with AttentionInterface, each with
    sparse_attention_mask in AttentionMaskInterface (without one, transformers gives an
    unknown implementation no mask at all)."""
    for name, function in ATTENTION_FUNCTIONS.items():
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, sparse_attention_mask)
