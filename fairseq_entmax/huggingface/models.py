"""Sparsifying a transformers model: a normalizer module per attention, recorded in its config.

`sparsify(model, name, **options)` finds the attention modules that dispatch through
transformers' AttentionInterface, gives each its own normalizer (build_normalizer), switches
the model's attn_implementation to `name` and records the choice in `model.config`, which
`save_pretrained` writes into config.json. `from_pretrained(model_class, path)` reads such a
model back: it adds the normalizers before transformers loads the weights, so the learned
alphas load with the rest.
"""

import contextlib
import dataclasses
import inspect
import os

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from fairseq_entmax.huggingface.attention import (
    ATTENTION_FUNCTIONS,
    NORMALIZER_ATTRIBUTE,
    SPARSIFIED,
    receiving_weights,
)
from fairseq_entmax.names import ALPHA_STATISTICS, ATTENTION_TYPES
from fairseq_entmax.normalizers import NORMALIZER_NAMES, AttentionNormalizer, build_normalizer
from fairseq_entmax.normalizers.config import NormalizerConfig, check_alpha_warmup_updates
from fairseq_entmax.normalizers.layers import LearnedAlphaEntmax

# The key of model.config (and config.json) that records what sparsify did.
CONFIG_KEY = "sparse_attention"

# What a sparsified model's config.json gives as its attn_implementation: no attention function
# has this name, so a plain Model.from_pretrained(path) or AutoModel*.from_pretrained(path), with
# or without this package imported, stops with transformers' "Specified attn_implementation=...
# is not supported" error quoting it, instead of building a softmax model that drops the alphas.
LOAD_HINT = (
    "sparsified by fairseq_entmax: import fairseq_entmax.huggingface as sparse_hf and load it with "
    "sparse_hf.from_pretrained(ModelClass, path)"
)

# The families the tests cover; any model whose attention dispatches through AttentionInterface works.
TESTED_FAMILIES = "Marian, BERT, Llama, Qwen2 and T5"

# Module names of cross-attention in transformers' models (an encoder-decoder's decoder).
_CROSS_ATTENTION_NAMES = ("encoder_attn", "EncDecAttention", "crossattention", "cross_attn", "cross_attention")

_dispatching_classes = {}


def _dispatches_through_interface(module_class):
    """Whether the forward of a module class calls transformers' attention functions by name."""
    if module_class not in _dispatching_classes:
        try:
            source = inspect.getsource(module_class.forward)
        except (OSError, TypeError):
            source = ""
        _dispatching_classes[module_class] = "ALL_ATTENTION_FUNCTIONS" in source
    return _dispatching_classes[module_class]


def _attention_type(path, module):
    if getattr(module, "is_causal", False):
        return "decoder_self"
    if path.rsplit(".", 1)[-1] in _CROSS_ATTENTION_NAMES or "Cross" in type(module).__name__:
        return "cross"
    if getattr(module, "is_decoder", False):
        return "cross"  # a decoder's attention that is not causal reads the encoder
    return "encoder_self"


def _num_heads(module):
    for name in ("num_heads", "num_attention_heads", "n_heads", "n_head"):
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    value = getattr(getattr(module, "config", None), "num_attention_heads", None)
    return value if isinstance(value, int) else None


def _unsupported(model, reason):
    return TypeError(
        f"{type(model).__name__}: {reason}. fairseq_entmax.huggingface supports models whose attention modules "
        f"call transformers' AttentionInterface (ALL_ATTENTION_FUNCTIONS), as {TESTED_FAMILIES} do; "
        "see https://huggingface.co/docs/transformers/en/attention_interface"
    )


def attention_modules(model):
    """The attention modules of a model that dispatch through AttentionInterface.

    Args:
        model: a transformers PreTrainedModel.

    Returns:
        A list of (attention_type, layer, path, module, num_heads) in the model's module
        order: attention_type one of fairseq_entmax.names.ATTENTION_TYPES (encoder
        self-attention, decoder self-attention, an encoder-decoder's cross-attention), layer
        counted from 0 within its type, path the module's name in the model.

    Raises:
        TypeError: for a model none of whose attention dispatches through AttentionInterface,
            or one with an attention class that computes its own (naming it), or whose number of
            heads cannot be read; the message says what is supported.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    found = []
    others = []
    for path, module in model.named_modules():
        if isinstance(module, AttentionNormalizer):
            continue
        if _dispatches_through_interface(type(module)):
            found.append((path, module))
        elif "Attention" in type(module).__name__ and not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            others.append((path, module))
    # An attention class that only wraps a dispatching one (BERT's BertAttention, T5's T5LayerSelfAttention).
    wrappers = {path for path, _ in others if any(inner.startswith(path + ".") for inner, _ in found)}
    computing_their_own = sorted({type(m).__name__ for path, m in others if path not in wrappers})
    if computing_their_own:
        names = ", ".join(computing_their_own)
        verb = "does" if len(computing_their_own) == 1 else "do"
        raise _unsupported(model, f"its attention {names} {verb} not go through AttentionInterface")
    if not found:
        raise _unsupported(model, "none of its modules goes through AttentionInterface")
    rows = []
    layers = dict.fromkeys(ATTENTION_TYPES, 0)
    for path, module in found:
        heads = _num_heads(module)
        if heads is None:
            raise _unsupported(model, f"the number of heads of its {type(module).__name__} ({path}) is not readable")
        attention_type = _attention_type(path, module)
        rows.append((attention_type, layers[attention_type], path, module, heads))
        layers[attention_type] += 1
    return rows


def check_options(name, options):
    """The full, checked options of sparsify.

    Args:
        name: the normalizer of every attention type, one of NORMALIZER_NAMES, or
            {attention_type: normalizer} for some of fairseq_entmax.names.ATTENTION_TYPES.
        options: {option: value} for some of NormalizerConfig's options (the rest take its defaults).

    Returns:
        (record, config): the record {"normalizer": name, option: value for every option},
        the values normalised (alpha_clamp a list), as sparsify writes it into the model's
        config; the NormalizerConfig every normalizer is built with.

    Raises:
        ValueError: for an unknown normalizer or attention type (listing the known ones), a bad
            value (naming the option and what is allowed), or a numeric alpha_init outside alpha_clamp.
        TypeError: for an unknown option, listing the known ones, or a name that is neither a
            string nor a dict.
    """
    if isinstance(name, dict):
        unknown_types = sorted(set(name) - set(ATTENTION_TYPES))
        if unknown_types:
            raise ValueError(
                f"unknown attention type {', '.join(map(repr, unknown_types))}; "
                f"known attention types: {', '.join(ATTENTION_TYPES)}"
            )
        names = list(name.values())
        name = {attention_type: name[attention_type] for attention_type in ATTENTION_TYPES if attention_type in name}
    elif isinstance(name, str):
        names = [name]
    else:
        raise TypeError(f"expected a normalizer name or {{attention_type: name}}, got {type(name).__name__}")
    for each in names:
        if each not in NORMALIZER_NAMES:
            raise ValueError(f"unknown normalizer {each!r}; known normalizers: {', '.join(NORMALIZER_NAMES)}")
    config = NormalizerConfig.from_options(options)
    record = {"normalizer": name, **dataclasses.asdict(config)}
    record["alpha_clamp"] = list(record["alpha_clamp"])  # as config.json gives it back
    return record, config


class Float32AlphaEntmax(LearnedAlphaEntmax):
    """Learned alpha-entmax whose alpha logits stay float32 when the model is cast
    (`model.to(torch.bfloat16)`, `.half()`): in bfloat16 the small updates of fine-tuning round
    away, and torch.amp.GradScaler refuses to unscale float16 gradients. The map computes in
    float32 anyway."""

    float32_tensors = (*LearnedAlphaEntmax.float32_tensors, "alpha_logit")


def _build_normalizer(name, heads, config):
    if name == "alpha_entmax":
        return Float32AlphaEntmax(heads, config)
    return build_normalizer(name, heads, config)


def _normalizer_name(record, attention_type):
    """The normalizer a record gives an attention type, or None for one it leaves softmax."""
    chosen = record["normalizer"]
    return chosen if isinstance(chosen, str) else chosen.get(attention_type)


def _build_normalizers(modules, record, config):
    """One normalizer per module of attention_modules, None where the record names none."""
    normalizers = []
    for attention_type, _, _, module, heads in modules:
        name = _normalizer_name(record, attention_type)
        if name is None:
            normalizers.append(None)
            continue
        normalizer = _build_normalizer(name, heads, config)
        parameter = next(module.parameters(), None)
        if parameter is not None:
            # On the attention's device (also under device_map); the dtype stays float32.
            normalizer.to(device=parameter.device)
        normalizers.append(normalizer)
    return normalizers


# The attribute of a sparsified model that lists its (attention_type, layer, attention module)
# with a normalizer, set when the normalizers are attached: the per-step calls (set_num_updates,
# the statistics the callback logs) read it instead of walking and inspecting every module.
_SPARSE_MODULES_ATTRIBUTE = "_sparse_attention_modules"


def _attach(model, modules, normalizers, record):
    sparse = [
        (attention_type, layer, module)
        for (attention_type, layer, _, module, _), normalizer in zip(modules, normalizers)
        if normalizer is not None
    ]
    setattr(model, _SPARSE_MODULES_ATTRIBUTE, sparse)
    for (_, _, _, module, _), normalizer in zip(modules, normalizers):
        if normalizer is not None:
            setattr(module, NORMALIZER_ATTRIBUTE, normalizer)
        elif hasattr(module, NORMALIZER_ATTRIBUTE):  # an earlier sparsify's, for a type now left softmax
            delattr(module, NORMALIZER_ATTRIBUTE)
    setattr(model.config, CONFIG_KEY, dict(record))
    # Written into config.json by save_pretrained; transformers reads it back as the
    # implementation to load with (see LOAD_HINT). In memory the model runs config._attn_implementation.
    model.config.attn_implementation = LOAD_HINT
    set_num_updates(model, record.get("num_updates", 0))


def sparsify(model, name, **options):
    """Give the attention modules of a model their own normalizers, in place.

    Args:
        model: a transformers PreTrainedModel whose attention dispatches through
            AttentionInterface, pretrained or new; an earlier sparsify's normalizers are replaced.
        name: one of fairseq_entmax.normalizers.NORMALIZER_NAMES for every attention, or
            {attention_type: name} per type of fairseq_entmax.names.ATTENTION_TYPES
            ({"encoder_self": "entmax15", "decoder_self": "alpha_entmax", "cross": "softmax"}):
            the modules of a type it leaves out get no normalizer and run softmax.
        **options: build_normalizer's options: alpha_init ("random" or a number in (1, 2]),
            alpha_clamp ((MIN, MAX), 1 <= MIN < MAX <= 2), alpha_warmup_updates (N >= 0: each
            head's alpha rises from 1 at update 0 to its learned alpha at update N; follow the
            updates with AlphaWarmupCallback or set_num_updates), topk (k >= 1), topk_fraction
            (F in (0, 1]) and topk_min (>= 1); the options another normalizer has are ignored.

    Returns:
        The model, whose attn_implementation is now SPARSIFIED (each module runs the
        normalizer it holds) and whose config records {"normalizer": name, every option,
        "num_updates"} under CONFIG_KEY. For "alpha_entmax", each attention module holds
        `attention_normalizer.alpha_logit`, one learned logit per head, a parameter of the
        model (float32 whatever the model's dtype, on the attention's device).

    Raises:
        ValueError, TypeError: for an unknown name or option, a bad option value (see
            check_options), or a model that is not supported (see attention_modules). The model is
            left unchanged.
    """
    record, config = check_options(name, options)
    modules = attention_modules(model)
    normalizers = _build_normalizers(modules, record, config)
    model.set_attn_implementation(SPARSIFIED)
    _attach(model, modules, normalizers, record)
    return model


def sparse_attention_record(config):
    """What sparsify recorded in a config.

    Args:
        config: a transformers PretrainedConfig.

    Returns:
        (record, NormalizerConfig) as check_options gives them, the record with its
        num_updates; None for a model sparsify did not touch.

    Raises:
        ValueError: for a record that sparsify would not have written.
    """
    stored = getattr(config, CONFIG_KEY, None)
    if stored is None:
        return None
    if not isinstance(stored, dict) or "normalizer" not in stored:
        raise ValueError(f"config.{CONFIG_KEY} is not a record of sparsify: {stored!r}")
    options = {key: value for key, value in stored.items() if key not in ("normalizer", "num_updates")}
    record, normalizer_config = check_options(stored["normalizer"], options)
    try:
        record["num_updates"] = check_alpha_warmup_updates(stored.get("num_updates", 0))
    except ValueError as error:
        raise ValueError(f"config.{CONFIG_KEY} num_updates: {error}") from None
    return record, normalizer_config


def _concrete_class(model_class, config):
    """The model class itself, or the class an Auto class (AutoModelForSeq2SeqLM, ...) picks for config."""
    if getattr(model_class, "_model_mapping", None) is None:
        return model_class
    from transformers.models.auto.auto_factory import _get_model_class

    return _get_model_class(config, model_class._model_mapping)


def from_pretrained(model_class, path, **kwargs):
    """Load a model that sparsify changed and save_pretrained wrote: the same normalizers, the
    same learned alphas, the same warm-up position.

    Args:
        model_class: the transformers model class to load (MarianMTModel, an Auto class, ...).
        path: the directory save_pretrained wrote (or a model id of the hub, which transformers fetches).
        **kwargs: model_class.from_pretrained's other arguments (dtype, device_map, ...), but
            not attn_implementation, which the saved config fixes.

    Returns:
        The model, of model_class (or the class the Auto class picks), in eval mode.

    Raises:
        OSError: for a path that is neither a directory with a readable config.json nor a model
            transformers can fetch.
        ValueError: for a model that sparsify did not save (say how to load and sparsify one), an
            attn_implementation other than the recorded one, and saved weights that lack the
            learned alphas.
        TypeError: for a model class that is not supported (see attention_modules).
    """
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as error:
        if os.path.isdir(path):
            raise OSError(f"{path}: cannot read its config.json ({error})") from error
        raise OSError(
            f"{path}: not a directory written by save_pretrained, nor a model transformers can fetch ({error})"
        ) from error
    found = sparse_attention_record(config)
    if found is None:
        raise ValueError(
            f"{path}: not a model that fairseq_entmax.huggingface.sparsify changed (its config has no "
            f"{CONFIG_KEY!r}); load it with {model_class.__name__}.from_pretrained(path) and call sparsify(model, name)"
        )
    record, normalizer_config = found
    requested = kwargs.pop("attn_implementation", SPARSIFIED)
    if requested != SPARSIFIED:
        raise ValueError(
            f"{path} was sparsified with {record['normalizer']!r}; attn_implementation={requested!r} would drop it "
            f"(load it, then call sparsify(model, {requested!r}))"
        )
    output_loading_info = kwargs.pop("output_loading_info", False)
    concrete = _concrete_class(model_class, config)

    def __init__(self, config, *args, **init_kwargs):
        concrete.__init__(self, config, *args, **init_kwargs)
        modules = attention_modules(self)
        _attach(self, modules, _build_normalizers(modules, record, normalizer_config), record)

    # A subclass that adds the normalizers as the model is built, before transformers loads
    # the weights into it; the loaded model is then given back its own class.
    loading = type(concrete.__name__, (concrete,), {"__init__": __init__, "__module__": concrete.__module__})
    loading.__qualname__ = concrete.__qualname__
    model, info = loading.from_pretrained(path, attn_implementation=SPARSIFIED, output_loading_info=True, **kwargs)
    model.__class__ = concrete
    # A model saved before the warm-up position was kept lacks only that: set_num_updates gives it.
    lacking = [
        key
        for key in info["missing_keys"]
        if f".{NORMALIZER_ATTRIBUTE}." in f".{key}" and not key.endswith(".warmup_fraction")
    ]
    if lacking:
        raise ValueError(f"{path}: its weights lack {', '.join(lacking)}, which sparsify's model saves")
    # The non-learned normalizers store nothing: built again on the loaded model's device.
    modules = attention_modules(model)
    fresh = _build_normalizers(modules, record, normalizer_config)
    normalizers = [
        getattr(module, NORMALIZER_ATTRIBUTE) if new is not None and new.learns_alpha else new
        for (_, _, _, module, _), new in zip(modules, fresh)
    ]
    _attach(model, modules, normalizers, record)
    return (model, info) if output_loading_info else model


def _sparse_modules(model):
    """(attention_type, layer, normalizer) of each sparsified attention; none for another model.

    The normalizer is read from its module at each call: peft's modules_to_save puts a wrapper
    in its place, whose attributes are those of the copy it trains. The list itself is read
    through wrappers that forward attributes (peft's PeftModel)."""
    for attention_type, layer, module in getattr(model, _SPARSE_MODULES_ATTRIBUTE, []):
        yield attention_type, layer, getattr(module, NORMALIZER_ATTRIBUTE)


def set_num_updates(model, num_updates):
    """Tell a sparsified model how many optimizer steps training has done: learned
    alpha-entmax's warm-up follows it. Call it before the first step and after each one in a
    custom training loop (AlphaWarmupCallback does it for transformers' Trainer).

    Args:
        model: a model sparsify changed (any other model is left as it is).
        num_updates: the optimizer steps done, an integer >= 0; recorded in the config, so
            that save_pretrained keeps the warm-up position.

    Raises:
        ValueError: for a num_updates that is not an integer >= 0.
    """
    try:
        num_updates = check_alpha_warmup_updates(num_updates)
    except ValueError as error:
        raise ValueError(f"num_updates: {error}") from None
    record = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    if record is None:
        return
    for _, _, normalizer in _sparse_modules(model):
        normalizer.set_num_updates(num_updates)
    record["num_updates"] = num_updates


def alpha_table(model):
    """Each head's alpha, as the model uses it now (with the warm-up, if any).

    Args:
        model: a transformers model.

    Returns:
        A list of {"attention_type", "layer", "head", "normalizer", "alpha"} rows, one per
        head of every sparsified attention whose normalizer is an alpha-entmax (all but top-k),
        in the order of attention_modules; empty for a model sparsify did not change.
    """
    rows = []
    for attention_type, layer, normalizer in _sparse_modules(model):
        alphas = normalizer.head_alpha()
        if alphas is None:
            continue
        for head, alpha in enumerate(alphas.detach().float().cpu().tolist()):
            rows.append(
                {
                    "attention_type": attention_type,
                    "layer": layer,
                    "head": head,
                    "normalizer": normalizer.name,
                    "alpha": alpha,
                }
            )
    return rows


def learned_alpha_statistics(model):
    """The mean, min and max of the learned alphas over the heads of each attention type, as
    the fairseq layer logs them.

    Args:
        model: a transformers model.

    Returns:
        {attention_type: {"mean": ..., "min": ..., "max": ...}} for the attention types whose
        alphas are learned (empty without any).
    """
    per_type = {}
    for attention_type, _, normalizer in _sparse_modules(model):
        if normalizer.learns_alpha:
            per_type.setdefault(attention_type, []).append(normalizer.head_alpha().detach().float())
    if not per_type:
        return {}
    # Every statistic of every type computed on the device, then read back in one transfer.
    rows = torch.stack(
        [torch.stack([values.mean(), values.min(), values.max()]) for values in map(torch.cat, per_type.values())]
    )
    return {
        attention_type: dict(zip(ALPHA_STATISTICS, row)) for attention_type, row in zip(per_type, rows.cpu().tolist())
    }


@contextlib.contextmanager
def capture_attention_weights(model):
    """Collect the attention weights of every call of a model's attention functions, whatever
    the model's forward does with `output_attentions` (GPT-2's drops it).

        with sparse_hf.capture_attention_weights(model) as captured:
            model(**inputs)
        weights = captured[0]["weights"]   # (batch, heads, queries, keys)

    Args:
        model: a transformers model running one of this package's attention implementations
            (sparsify, from_pretrained, or attn_implementation=NAME), or a PEFT model of one.

    Yields:
        A list that each attention call appends a row to, in call order: {"attention_type",
        "layer", "weights"}, the type and layer as attention_modules gives them, the weights
        as the call computed them (in the model's dtype, exactly 0 on masked keys and off the
        support, attached to the graph). A generation step adds one row per layer.

    Raises:
        ValueError: for a model that runs another attention implementation, whose weights
            these functions never see.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    implementation = getattr(base.config, "_attn_implementation", None)
    if implementation not in ATTENTION_FUNCTIONS:
        raise ValueError(
            f"{type(base).__name__} runs attn_implementation={implementation!r}, not one of fairseq_entmax's "
            f"({', '.join(ATTENTION_FUNCTIONS)}): sparsify it first, or ask its forward for output_attentions=True"
        )
    sites = {id(module): (attention_type, layer) for attention_type, layer, _, module, _ in attention_modules(base)}
    captured = []

    def receive(module, weights):
        site = sites.get(id(module))
        if site is not None:  # another model run inside the block is not this one's
            captured.append({"attention_type": site[0], "layer": site[1], "weights": weights})

    with receiving_weights(receive):
        yield captured
