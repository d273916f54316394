"""The analysis statistics on constructed attention whose answers are known in closed form."""

import math

import pytest
import torch

from fairseq_entmax.analysis.metrics import HeadStatistics, head_js_divergence, word_ids


def shannon(p):
    """Shannon entropy in nats of a list of probabilities (0 log 0 = 0)."""
    return -sum(x * math.log(x) for x in p if x > 0)


def one_hot_rows(num_queries, num_keys, key_of_query):
    """(queries, keys) attention with all weight of query i on key key_of_query(i)."""
    weights = torch.zeros(num_queries, num_keys)
    for query in range(num_queries):
        weights[query, key_of_query(query)] = 1.0
    return weights


def all_real(batch, length):
    return torch.ones(batch, length, dtype=torch.bool)


# --- head diversity (JS) -------------------------------------------------------------------


def test_identical_heads_have_js_zero():
    p = torch.softmax(torch.randn(1, 2, 5, 7), dim=-1)
    weights = p.expand(6, 2, 5, 7)
    assert torch.allclose(head_js_divergence(weights), torch.zeros(2, 5, dtype=torch.float64), atol=1e-12)


def test_two_disjoint_one_hot_heads_have_js_one():
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # (heads=2, keys=3), one query
    # mean (1/2, 0, 1/2) has entropy log 2, each head entropy 0; base 2 -> 1
    assert head_js_divergence(weights).item() == pytest.approx(1.0, abs=1e-12)


def test_four_heads_in_two_disjoint_pairs_have_js_one_half():
    weights = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    # entropy of the mean (1/2, 1/2) is log 2, in base 4 that is 1/2
    assert head_js_divergence(weights).item() == pytest.approx(math.log(2) / math.log(4), abs=1e-12)


def test_js_of_overlapping_heads_matches_closed_form():
    heads = [[1.0, 0.0], [0.5, 0.5]]
    mean = [0.75, 0.25]
    expected = (shannon(mean) - (shannon(heads[0]) + shannon(heads[1])) / 2) / math.log(2)
    assert head_js_divergence(torch.tensor(heads)).item() == pytest.approx(expected, abs=1e-12)
    assert 0.3 < expected < 0.32  # about 0.311: a value strictly between the extremes


def test_js_is_between_zero_and_one_for_random_heads():
    torch.manual_seed(0)
    for heads in (2, 3, 8):
        logits = torch.randn(heads, 50, 9) * 4
        logits[..., 4:] = logits[..., 4:].masked_fill(torch.rand(heads, 50, 5) < 0.5, -float("inf"))  # exact zeros
        js = head_js_divergence(torch.softmax(logits, dim=-1))
        assert (js >= -1e-12).all() and (js <= 1 + 1e-12).all()


# --- density -------------------------------------------------------------------------------


def test_uniform_attention_has_density_one_and_js_zero_with_padding_excluded():
    lengths = [5, 3]  # second sentence padded at the end: 2 padding keys and queries
    query_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    key_mask = query_mask[:, None, :]
    weights = torch.zeros(4, 2, 5, 5)
    for b, n in enumerate(lengths):
        weights[:, b, :, :n] = 1.0 / n
    weights[:, 1, 3:, :] = 0.2  # padding queries: anything, must not count
    stats = HeadStatistics(4)
    stats.update(weights, query_mask, key_mask)
    assert stats.density_fraction() == pytest.approx([1.0] * 4)
    # each real query attends to all real keys of its sentence: 5 queries x 5 keys, 3 x 3
    assert stats.density_count() == pytest.approx([(5 * 5 + 3 * 3) / 8] * 4)
    assert stats.js() == pytest.approx(0.0, abs=1e-12)
    assert stats.queries == 8


def test_sparse_attention_density_counts_nonzero_keys():
    # head 0 attends to 2 of the 5 keys, head 1 to 1 key, head 2 to all 5
    weights = torch.zeros(3, 1, 4, 5)
    weights[0, ..., :2] = 0.5
    weights[1, ..., 3] = 1.0
    weights[2] = 0.2
    stats = HeadStatistics(3)
    stats.update(weights, all_real(1, 4), all_real(1, 5)[:, None, :])
    assert stats.density_fraction() == pytest.approx([2 / 5, 1 / 5, 1.0])
    assert stats.density_count() == pytest.approx([2.0, 1.0, 5.0])


def test_density_is_relative_to_the_keys_a_causal_query_may_see():
    # decoder self-attention: query i may see keys 0..i; uniform over them is fully dense
    length = 4
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    weights = (causal.float() / causal.sum(-1, keepdim=True))[None, None].expand(2, 1, length, length)
    stats = HeadStatistics(2)
    stats.update(weights, all_real(1, length), causal[None])
    assert stats.density_fraction() == pytest.approx([1.0, 1.0])
    assert stats.density_count() == pytest.approx([(1 + 2 + 3 + 4) / 4] * 2)


def test_running_sums_over_batches_equal_one_pass():
    torch.manual_seed(1)
    logits = torch.randn(4, 6, 7, 7) * 3
    logits[logits < -2] = -float("inf")
    logits[..., 0] = 0.0  # every row keeps at least one key
    weights = torch.softmax(logits, dim=-1)
    query_mask = torch.rand(6, 7) > 0.2
    key_mask = all_real(6, 7)[:, None, :]
    tokens = torch.randint(0, 5, (6, 7))
    continues = torch.tensor([False, True, False, True, False])
    questions = tokens == 4
    whole, parts = HeadStatistics(4), HeadStatistics(4)
    whole.update(weights, query_mask, key_mask, tokens, continues, question_keys=questions)
    for rows in (slice(0, 2), slice(2, 6)):
        parts.update(
            weights[:, rows], query_mask[rows], key_mask[rows], tokens[rows], continues, question_keys=questions[rows]
        )
    methods = ("density_fraction", "density_count", "previous_token", "next_token", "bpe_merging", "interrogation")
    for method in methods:
        assert getattr(parts, method)() == pytest.approx(getattr(whole, method)()), method
    assert parts.js() == pytest.approx(whole.js())


# --- positional heads ----------------------------------------------------------------------


def test_one_hot_previous_token_heads_have_positional_score_one():
    # source laid out as fairseq does: left padding (2 pads), then 5 real tokens
    real = torch.tensor([[False, False, True, True, True, True, True]])
    key_mask = real[:, None, :]
    previous = one_hot_rows(7, 7, lambda i: max(i - 1, 0))
    following = one_hot_rows(7, 7, lambda i: min(i + 1, 6))
    weights = torch.stack([previous, previous, following])[:, None]  # (3 heads, 1, 7, 7)
    weights[:2, 0, 2] = one_hot_rows(1, 7, lambda i: 2)  # first real token: no previous token
    stats = HeadStatistics(3)
    stats.update(weights, real, key_mask, tokens=torch.arange(7)[None])
    assert stats.previous_token() == pytest.approx([1.0, 1.0, 0.0])
    assert stats.next_token() == pytest.approx([0.0, 0.0, 1.0])
    assert stats.previous_queries == 4  # real queries with a real previous token
    assert stats.next_queries == 4


def test_causal_attention_has_no_next_token():
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    weights = one_hot_rows(5, 5, lambda i: max(i - 1, 0))[None, None]
    stats = HeadStatistics(1)
    stats.update(weights, all_real(1, 5), causal[None], tokens=torch.arange(5)[None])
    assert stats.previous_token() == pytest.approx([1.0])
    assert stats.next_token() == [None]


# --- BPE-merging heads ---------------------------------------------------------------------

SYMBOLS = ["<pad>", "ana@@", "ly@@", "sis", "the", "cat@@", "s", "</s>"]
CONTINUES = torch.tensor([s.endswith("@@") for s in SYMBOLS])


def ids(*symbols):
    return torch.tensor([[SYMBOLS.index(s) for s in symbols]])


def test_word_ids_group_subword_nmt_pieces():
    tokens = ids("the", "ana@@", "ly@@", "sis", "cat@@", "s", "</s>")
    assert word_ids(tokens, CONTINUES).tolist() == [[1, 2, 2, 2, 3, 3, 4]]


def test_bpe_merging_score_is_mass_on_the_other_pieces_of_the_word():
    tokens = ids("the", "ana@@", "ly@@", "sis", "cat@@", "s", "</s>")
    words = [[0], [1, 2, 3], [1, 2, 3], [1, 2, 3], [4, 5], [4, 5], [6]]
    merging = torch.zeros(7, 7)
    for query, word in enumerate(words):
        others = [k for k in word if k != query] or [query]
        merging[query, others] = 1.0 / len(others)
    self_only = torch.eye(7)
    half = 0.5 * merging + 0.5 * self_only
    weights = torch.stack([merging, self_only, half])[:, None]
    stats = HeadStatistics(3)
    stats.update(weights, all_real(1, 7), all_real(1, 7)[:, None, :], tokens, CONTINUES)
    assert stats.bpe_merging() == pytest.approx([1.0, 0.0, 0.5])
    assert stats.merge_queries == 5  # the pieces of "ana@@ ly@@ sis" and "cat@@ s"


def test_bpe_merging_is_undefined_without_multi_piece_words():
    tokens = ids("the", "sis", "</s>")
    weights = torch.full((2, 1, 3, 3), 1 / 3)
    stats = HeadStatistics(2)
    stats.update(weights, all_real(1, 3), all_real(1, 3)[:, None, :], tokens, CONTINUES)
    assert stats.bpe_merging() == [None, None]


def test_wrong_weight_shape_is_refused_with_the_expected_layout():
    with pytest.raises(ValueError, match=r"\(heads=4, batch, queries, keys\)"):
        HeadStatistics(4).update(torch.ones(2, 1, 3, 3), all_real(1, 3), all_real(1, 3)[:, None, :])


# --- interrogation heads -------------------------------------------------------------------


def test_interrogation_score_is_the_mass_on_question_marks_over_sentences_that_have_one():
    # sentence 0: "wo ist das ? </s>", the question mark at key 3; sentence 1: no question mark,
    # two padding positions at the end
    query_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    key_mask = query_mask[:, None, :]
    questions = torch.zeros(2, 5, dtype=torch.bool)
    questions[0, 3] = True
    on_question = torch.zeros(2, 5, 5)
    on_question[0, :, 3] = 1.0
    on_question[1, :, 0] = 1.0  # nowhere to look: must not count
    uniform = key_mask.float().expand(2, 5, 5) / key_mask.sum(-1, keepdim=True)
    first_token = torch.zeros(2, 5, 5)
    first_token[:, :, 0] = 1.0
    half = 0.5 * on_question + 0.5 * first_token
    weights = torch.stack([on_question, uniform, first_token, half])
    stats = HeadStatistics(4)
    stats.update(weights, query_mask, key_mask, question_keys=questions)
    # the 5 queries of sentence 0: all, a fifth, none and half of their weight on "?"
    assert stats.interrogation() == pytest.approx([1.0, 0.2, 0.0, 0.5])
    assert stats.question_queries == 5


def test_a_causal_query_counts_only_once_it_can_see_the_question_mark():
    # decoder self-attention over "</s> wo ? ja": the question mark at position 2 is seen by
    # queries 2 and 3 only, to which uniform attention gives it a third and a quarter
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    weights = (causal.float() / causal.sum(-1, keepdim=True))[None, None]
    questions = torch.tensor([[False, False, True, False]])
    stats = HeadStatistics(1)
    stats.update(weights, all_real(1, 4), causal[None], question_keys=questions)
    assert stats.interrogation() == pytest.approx([(1 / 3 + 1 / 4) / 2])
    assert stats.question_queries == 2


def test_cross_attention_counts_question_marks_among_the_source_keys():
    # 3 target queries over 4 source keys, "?" the source's third token
    weights = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0]])[None, None]
    questions = torch.tensor([[False, False, True, False]])
    stats = HeadStatistics(1)
    stats.update(weights, all_real(1, 3), all_real(1, 4)[:, None, :], question_keys=questions)
    assert stats.interrogation() == pytest.approx([(1.0 + 0.5 + 0.0) / 3])


def test_interrogation_is_undefined_without_question_marks():
    weights = torch.full((2, 1, 3, 3), 1 / 3)
    stats = HeadStatistics(2)
    stats.update(weights, all_real(1, 3), all_real(1, 3)[:, None, :], question_keys=torch.zeros(1, 3, dtype=torch.bool))
    assert stats.interrogation() == [None, None]
    stats = HeadStatistics(2)
    stats.update(weights, all_real(1, 3), all_real(1, 3)[:, None, :])  # no question marks given
    assert stats.interrogation() == [None, None]
