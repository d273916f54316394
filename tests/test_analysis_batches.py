"""The per-batch masks and subword words the analysis derives from fairseq's own batches
(left-padded source, right-padded decoder input starting with </s>), checked with attention
built to score exactly 1 on them, and the question marks it finds in fairseq's dictionaries."""

import pytest
import torch
from fairseq.data import Dictionary, LanguagePairDataset

from fairseq_entmax.analysis.metrics import HeadStatistics
from fairseq_entmax.analysis.runner import _batch_context, _continuation_table, _question_table

pytestmark = pytest.mark.usefixtures("fairseq_plugin")

SOURCES = ["the ana@@ ly@@ sis", "cat@@ s sleep"]
TARGETS = ["die ana@@ ly@@ se", "kat@@ zen schla@@ fen gern"]


def fairseq_batch():
    dictionary = Dictionary()
    for line in SOURCES + TARGETS:
        for word in line.split():
            dictionary.add_symbol(word)
    encode = lambda line: dictionary.encode_line(line, add_if_not_exist=False)  # noqa: E731
    src, tgt = [encode(s) for s in SOURCES], [encode(t) for t in TARGETS]
    dataset = LanguagePairDataset(src, [len(s) for s in src], dictionary, tgt, [len(t) for t in tgt], dictionary)
    return dictionary, dataset.collater([dataset[i] for i in range(len(SOURCES))])


def attention_on(target_keys):
    """(1 head, batch, queries, keys) attention, uniform over target_keys (queries x keys bool);
    queries without a target key attend to themselves."""
    fallback = torch.eye(target_keys.size(-1), dtype=torch.bool).expand_as(target_keys)
    keys = torch.where(target_keys.any(-1, keepdim=True), target_keys, fallback)
    return (keys.float() / keys.sum(-1, keepdim=True))[None]


def test_word_pieces_and_positions_line_up_with_fairseqs_padding():
    dictionary, sample = fairseq_batch()
    continues = _continuation_table(dictionary)
    context = _batch_context(sample, dictionary.pad(), continues, continues)
    src = sample["net_input"]["src_tokens"]
    assert src[:, 0].eq(dictionary.pad()).any()  # the source really is left-padded

    for attention in ("encoder_self", "decoder_self"):
        query_mask, key_mask, tokens, word_continues = context[attention]
        batch, length = tokens.shape
        key_mask = key_mask.expand(batch, length, length)
        # the other pieces of each token's word, among the allowed keys, by hand from the strings
        symbols = [[dictionary[t] for t in row] for row in tokens.tolist()]
        other_pieces = torch.zeros(batch, length, length, dtype=torch.bool)
        for b, row in enumerate(symbols):
            words, current = [], []
            for i, symbol in enumerate(row):
                current.append(i)
                if not symbol.endswith("@@"):
                    words.append(current)
                    current = []
            for word in words:
                for i in word:
                    for j in word:
                        other_pieces[b, i, j] = i != j and bool(key_mask[b, i, j])
        previous = torch.zeros(batch, length, length, dtype=torch.bool)
        previous[:, torch.arange(1, length), torch.arange(length - 1)] = True
        previous &= key_mask & query_mask[:, :, None]

        stats = HeadStatistics(1)
        stats.update(attention_on(other_pieces), query_mask, key_mask, tokens, word_continues)
        assert stats.bpe_merging() == [1.0], attention
        assert stats.merge_queries == int(other_pieces.any(-1)[query_mask].sum()) > 0

        stats = HeadStatistics(1)
        stats.update(attention_on(previous), query_mask, key_mask, tokens, word_continues)
        assert stats.previous_token() == [1.0], attention
        # every real query but each sentence's first real token has a previous token
        assert stats.previous_queries == int(query_mask.sum()) - batch
        assert stats.density_count()[0] >= 1.0


def test_decoder_masks_are_causal_and_queries_exclude_padding():
    dictionary, sample = fairseq_batch()
    continues = _continuation_table(dictionary)
    context = _batch_context(sample, dictionary.pad(), continues, continues)
    prev = sample["net_input"]["prev_output_tokens"]
    query_mask, key_mask, _, _ = context["decoder_self"]
    assert query_mask.tolist() == prev.ne(dictionary.pad()).tolist()
    length = prev.size(1)
    allowed = key_mask.expand(prev.size(0), length, length)
    assert not torch.triu(allowed, diagonal=1).any()  # nothing in the future
    cross_queries, cross_keys, cross_tokens, _ = context["cross"]
    assert cross_queries.tolist() == query_mask.tolist() and cross_tokens is None
    assert cross_keys[:, 0].tolist() == sample["net_input"]["src_tokens"].ne(dictionary.pad()).tolist()


def test_question_marks_are_the_dictionary_entries_that_are_exactly_a_question_mark():
    dictionary = Dictionary()
    for symbol in ("wo", "?", "?@@", "¿", "was?", "ist"):
        dictionary.add_symbol(symbol)
    table = _question_table(dictionary)
    assert [dictionary[i] for i in table.nonzero().flatten().tolist()] == ["?"]
    assert len(table) == len(dictionary)
