"""Tiny random transformers models of the families the Hugging Face tests cover, built from
configs (no model hub), and padded batches with what each attention may see."""

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

VOCAB = 40
PAD = 0
# Token ids the batches draw from: no padding, no end of sentence.
FIRST_TOKEN = 3

# family -> (model class, config): 2 layers, widths of 16-32, and for Llama and Qwen2 grouped-
# query attention (4 query heads on 2 key/value heads). Dropout off, so that the tests compare
# deterministic models; the dropout test turns it on.
FAMILIES = {
    "marian": lambda: (
        MarianMTModel,
        MarianConfig(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=4,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=64,
            pad_token_id=PAD,
            eos_token_id=1,
            decoder_start_token_id=PAD,
            dropout=0.0,
            attention_dropout=0.0,
        ),
    ),
    "bert": lambda: (
        BertForMaskedLM,
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
            pad_token_id=PAD,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
    ),
    "llama": lambda: (
        LlamaForCausalLM,
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
            pad_token_id=PAD,
            bos_token_id=2,
            eos_token_id=1,
        ),
    ),
    "qwen2": lambda: (
        Qwen2ForCausalLM,
        Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
            pad_token_id=PAD,
            bos_token_id=2,
            eos_token_id=1,
        ),
    ),
    "t5": lambda: (
        T5ForConditionalGeneration,
        T5Config(
            vocab_size=VOCAB,
            d_model=16,
            d_kv=8,
            d_ff=32,
            num_layers=2,
            num_heads=2,
            relative_attention_num_buckets=8,
            pad_token_id=PAD,
            eos_token_id=1,
            decoder_start_token_id=PAD,
            dropout_rate=0.0,
        ),
    ),
}
ENCODER_DECODERS = ("marian", "t5")
DECODER_ONLY = ("llama", "qwen2")


def tiny_model(family, attn_implementation, seed=0, **config_overrides):
    """A tiny model of a family with random weights, in eval mode.

    Args:
        family: a key of FAMILIES.
        attn_implementation: the attention implementation it is built with.
        seed: the seed of its weights: models of one seed have the same weights.
        **config_overrides: config attributes to change.

    Returns:
        The model.
    """
    model_class, config = FAMILIES[family]()
    for name, value in config_overrides.items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    return model_class._from_config(config, attn_implementation=attn_implementation).eval()


def _padded(lengths, total, padding_side, generator):
    ids = torch.randint(FIRST_TOKEN, VOCAB, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        if padding_side == "right":
            mask[row, :length] = 1
        else:
            mask[row, total - length :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def tiny_batch(family, padding_side="right", seed=0):
    """A batch of two sentences, the second padded, on `padding_side`.

    Args:
        family: a key of FAMILIES.
        padding_side: "right" or "left".
        seed: the seed of the token ids.

    Returns:
        (inputs for the model's forward, key mask of each attention type): the mask is
        {"encoder": (batch, source length), "decoder": (batch, target length)} of 1 for real
        tokens, with "decoder" the only one for decoder-only models and "encoder" the only
        one for BERT.
    """
    generator = torch.Generator().manual_seed(seed)
    if family in ENCODER_DECODERS:
        source, source_mask = _padded([7, 4], 7, padding_side, generator)
        target, target_mask = _padded([6, 3], 6, padding_side, generator)
        inputs = {
            "input_ids": source,
            "attention_mask": source_mask,
            "decoder_input_ids": target,
            "decoder_attention_mask": target_mask,
        }
        return inputs, {"encoder": source_mask, "decoder": target_mask}
    ids, mask = _padded([7, 4], 7, padding_side, generator)
    return {"input_ids": ids, "attention_mask": mask}, {("decoder" if family in DECODER_ONLY else "encoder"): mask}


def seen_keys(family, masks):
    """What each attention's queries may see.

    Args:
        family: a key of FAMILIES.
        masks: the masks tiny_batch returns.

    Returns:
        {output name: (batch, 1, queries, keys) bool, True where the query may see the key}
        for each attention output of the model (encoder_attentions, decoder_attentions,
        cross_attentions, or attentions): padding and, in decoders, future keys unseen.
    """

    def padding(keys, queries):
        return (keys[:, None, None, :] == 1).expand(-1, 1, queries.shape[1], -1)

    def causal(keys):
        length = keys.shape[1]
        return padding(keys, keys) & torch.ones(length, length, dtype=torch.bool).tril()

    if family in ENCODER_DECODERS:
        source, target = masks["encoder"], masks["decoder"]
        return {
            "encoder_attentions": padding(source, source),
            "decoder_attentions": causal(target),
            "cross_attentions": padding(source, target),
        }
    if family in DECODER_ONLY:
        return {"attentions": causal(masks["decoder"])}
    return {"attentions": padding(masks["encoder"], masks["encoder"])}


def real_queries(family, masks):
    """(batch, length) bool: the positions of the model's output that are real tokens."""
    return (masks["decoder"] if "decoder" in masks else masks["encoder"]) == 1
