"""The attention functions registered with transformers' AttentionInterface, and their mask.

transformers calls the function of a model's `attn_implementation` from every attention module
that dispatches through `AttentionInterface`:

    output, weights = fn(module, query, key, value, attention_mask, dropout=..., scaling=..., **kwargs)

with query (batch, heads, queries, head_dim) and key, value (batch, key_value_heads, keys,
head_dim). Each function here adds T5's `position_bias`, masks with -inf (exact zeros for every
map) and normalises in float32 with a normalizer of fairseq_entmax.normalizers: in blocks that
never hold the score matrix (fairseq_entmax.attention) unless the weights are asked for, which
it then returns with the output.
"""

import contextlib

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from fairseq_entmax.attention import scaled_dot_product_attention
from fairseq_entmax.normalizers import NORMALIZER_NAMES, AttentionNormalizer, build_normalizer

# The attribute of an attention module that holds its normalizer (fairseq_entmax.huggingface.sparsify).
NORMALIZER_ATTRIBUTE = "attention_normalizer"

# The implementation sparsify gives a model: each attention module runs the normalizer it holds,
# and a module without one (an attention type sparsify left out) the plugin's softmax.
SPARSIFIED = "sparsified"

# Normalizers that need no state of their own, shared by the attention modules that were not
# sparsified: one per (name, heads), built on first use with build_normalizer's defaults.
_SHARED_NORMALIZERS = {}


# The functions every call here hands (module, weights) to while receiving_weights is active,
# innermost last: the calls then materialize the weights whatever the model asked, since some
# models (GPT-2) drop `output_attentions` before it reaches the attention function. A plain
# list, which torch.compile reads without a graph break (it cannot trace a ContextVar).
_weight_receivers = []


@contextlib.contextmanager
def receiving_weights(receive):
    """While active, every call of the attention functions here materializes its weights and
    calls `receive(module, weights)`, weights (batch, heads, queries, keys).

    Args:
        receive: a function of (attention module, weights).

    Yields:
        Nothing; the receiver is removed on exit.
    """
    _weight_receivers.append(receive)
    try:
        yield
    finally:
        _weight_receivers.remove(receive)


def sparse_attention_mask(*args, **kwargs):
    """The mask function registered with AttentionMaskInterface for every implementation here.

    transformers' sdpa mask: boolean (True where a query sees a key), or None where every query
    sees every key or where, without padding, the causal mask is left to the attention's
    `is_causal` (as sdpa does; sparse_attention_forward applies it).

    Args:
        *args, **kwargs: what transformers.masking_utils passes to a mask function.

    Returns:
        A boolean tensor (batch, 1, queries, keys), or None.
    """
    return sdpa_mask(*args, **kwargs)


def _active_normalizer(own):
    """The normalizer module that `own` runs: itself, or for a wrapper such as PEFT's
    modules_to_save (which keeps a trained copy per adapter beside the original), the copy of
    the active adapter, or the original while adapters are off. The blocked attention needs the
    module itself, not a wrapper that forwards calls to it."""
    if isinstance(own, AttentionNormalizer):
        return own
    copies, adapters = getattr(own, "modules_to_save", None), getattr(own, "active_adapters", None)
    if copies is not None and adapters and not getattr(own, "disable_adapters", False) and adapters[0] in copies:
        return copies[adapters[0]]
    return getattr(own, "original_module", own)


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
        return _active_normalizer(own)
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


def _additive(attention_mask):
    """A float mask with transformers' minimum (its "masked") as -inf, which the normalizers
    read as masked; a boolean mask as it is."""
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask.masked_fill(attention_mask <= torch.finfo(attention_mask.dtype).min, float("-inf"))


def _with_position_bias(attention_mask, position_bias):
    """T5's position bias and the mask as one additive mask (-inf where masked)."""
    if attention_mask is None:
        return position_bias
    if attention_mask.dtype == torch.bool:
        return position_bias.masked_fill(~attention_mask, float("-inf"))
    return position_bias + attention_mask


def _is_causal(module, query, attention_mask, kwargs):
    """Whether the call is causal with no mask, as transformers' sdpa attention decides it."""
    if attention_mask is not None or query.shape[2] == 1:
        return False
    is_causal = kwargs.get("is_causal")
    return bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)


def _materialized_attention(normalizer, module, query, key, value, mask, is_causal, dropout, scaling, softcap):
    """The scores, the normalizer, the weights times the values: returns the output and the
    (batch, heads, queries, keys) weights."""
    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key = torch.repeat_interleave(key, groups, dim=1)
        value = torch.repeat_interleave(value, groups, dim=1)
    # As the models' eager attention computes them; normalised in float32, as the fairseq layer does.
    scores = (torch.matmul(query, key.transpose(2, 3)) * scaling).float()
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    if is_causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    batch, heads, queries, keys = scores.shape
    weights = normalizer(scores.reshape(batch * heads, queries, keys)).view(batch, heads, queries, keys)
    weights = torch.nn.functional.dropout(weights.to(value.dtype), p=dropout, training=module.training)
    return torch.matmul(weights, value), weights


def _refuse_unsupported(name, module, attention_mask, kwargs):
    """Raise for what no function here computes: attention sinks, packed sequences without a mask."""
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError(
            f"attn_implementation={name!r}: {type(module).__name__} passes attention sinks (s_aux), "
            "which fairseq_entmax's normalizers do not support"
        )
    if attention_mask is None and kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError(
            f"attn_implementation={name!r}: {type(module).__name__} was called with packed sequences "
            "(cu_seq_lens_q) and no attention mask, which would let the sequences see each other: "
            "pass an attention_mask (padded batches) instead of packing"
        )


def sparse_attention_forward(
    name, module, query, key, value, attention_mask, dropout=0.0, scaling=None, position_bias=None, **kwargs
):
    """Attention with the normalizer `name` in place of the softmax.

    Unless the weights are asked for (`output_attentions=True`, or receiving_weights), or the
    call has one query (a generation step, where the score matrix is one row per head) or
    Gemma's soft-cap, it runs fairseq_entmax.attention.scaled_dot_product_attention, which never
    holds the score matrix; otherwise the scores, the normalizer and the weights are
    materialized, as eager attention does.

    Args:
        name: SPARSIFIED or one of NORMALIZER_NAMES.
        module: the attention module (its `is_causal`, `training` and, after sparsify, its
            normalizer).
        query: (batch, heads, queries, head_dim).
        key, value: (batch, key_value_heads, keys, head_dim); grouped-query attention shares
            each key/value head among heads / key_value_heads query heads.
        attention_mask: None, a boolean mask (True: seen) or an additive float mask (its minimum
            or -inf marking masked keys), broadcastable to (batch, heads, queries, keys) after
            cutting it to the keys. With none, a causal module with more than one query is causal,
            as in sdpa.
        dropout: the dropout probability on the weights, applied in training mode.
        scaling: the scores' scale (default head_dim ** -0.5).
        position_bias: T5's relative position bias, added to the scores.
        **kwargs: the model's other keywords: `softcap` caps the scores as Gemma's eager
            attention does, `output_attentions` asks for the weights, `is_causal` overrides the
            module's.

    Returns:
        (output (batch, queries, heads, head_dim), weights (batch, heads, queries, keys) or None
        when not materialized), the weights in the query's dtype, exactly 0 on masked keys and
        off the support.

    Raises:
        NotImplementedError: for attention sinks (`s_aux`), which no sparse map here defines.
        ValueError: for a call with neither mask nor causal flag but variable-length metadata
            (`cu_seq_lens_q`, transformers' packed sequences), whose boundaries these functions
            do not read; see also normalizer_of.
    """
    _refuse_unsupported(name, module, attention_mask, kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    is_causal = _is_causal(module, query, attention_mask, kwargs)
    mask = None if attention_mask is None else _additive(attention_mask[:, :, :, : key.shape[-2]])
    if position_bias is not None:
        mask = _with_position_bias(mask, position_bias[..., : key.shape[-2]])
        if is_causal:  # (a mask is given, so the causal part goes into it)
            future = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).triu(1)
            mask, is_causal = mask.masked_fill(future, float("-inf")), False
    normalizer = normalizer_of(module, name, query.shape[1])
    dropout = dropout if module.training else 0.0
    softcap = kwargs.get("softcap")
    receive = _weight_receivers[-1] if _weight_receivers else None
    if receive is not None or kwargs.get("output_attentions") or query.shape[2] == 1 or softcap is not None:
        output, weights = _materialized_attention(
            normalizer, module, query, key, value, mask, is_causal, dropout, scaling, softcap
        )
        if receive is not None:
            receive(module, weights)
    else:
        output = scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=scaling,
            enable_gqa=True,
            normalizer=normalizer,
        )
        weights = None
    return output.transpose(1, 2).contiguous(), weights


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
