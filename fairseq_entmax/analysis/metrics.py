"""The paper's attention statistics, computed batch by batch with running sums.

Pure torch; knows nothing of fairseq. Attention weights come in fairseq's per-head layout
`(heads, batch, queries, keys)`. Masks say which positions are real:

- `query_mask` `(batch, queries)`: True for queries that are real tokens (not padding);
- `key_mask` broadcastable to `(batch, queries, keys)`: True for the keys the query may attend
  to (not padding, and for decoder self-attention not in the future).

Statistics are averaged over real queries; a query with no allowed key is skipped.
"""

import math

import torch


def head_js_divergence(weights):
    """Jensen-Shannon divergence between the heads' distributions, per query.

    JS = H(mean_h p_h) - mean_h H(p_h), with Shannon entropy in base `heads`, so 0 <= JS <= 1
    (0: all heads attend alike; 1: the heads attend to disjoint keys, each one-hot).

    Args:
        weights: attention weights `(heads, ..., keys)`, each row a distribution over keys.

    Returns:
        The JS divergence per query, a float64 tensor of shape `...` (all 0 for a single head,
        which has nothing to differ from).
    """
    num_heads = weights.size(0)
    p = weights.double()
    if num_heads == 1:
        return torch.zeros(p.shape[1:-1], dtype=torch.float64, device=p.device)
    # xlogy gives 0 * log 0 = 0, so zero weights (sparse attention, padding) add no entropy.
    entropy_of_mean = -torch.xlogy(p.mean(0), p.mean(0)).sum(-1)
    mean_entropy = -torch.xlogy(p, p).sum(-1).mean(0)
    return (entropy_of_mean - mean_entropy) / math.log(num_heads)


def keys_attended(weights, key_mask):
    """Number of allowed keys with nonzero weight, per head and query.

    Args:
        weights: attention weights `(heads, batch, queries, keys)`.
        key_mask: bool, broadcastable to `(batch, queries, keys)`: the keys each query may attend to.

    Returns:
        An integer tensor `(heads, batch, queries)`.
    """
    return ((weights > 0) & key_mask).sum(-1)


def offset_weight(weights, offset):
    """Weight each query puts on the key `offset` positions away.

    Args:
        weights: attention weights `(heads, batch, queries, keys)`, query i at key position i.
        offset: the key's position relative to the query's (-1: previous, +1: next token).

    Returns:
        A tensor `(heads, batch, queries)`; queries without such a key get 0 (see `offset_valid`).
    """
    num_queries, num_keys = weights.shape[-2:]
    query = torch.arange(num_queries, device=weights.device)
    key = query + offset
    inside = (key >= 0) & (key < num_keys)
    gathered = weights[..., query[inside], key[inside]]
    result = weights.new_zeros(weights.shape[:-1])
    result[..., query[inside]] = gathered
    return result


def offset_valid(query_mask, key_mask, offset):
    """Which queries have an allowed key `offset` positions away.

    Args:
        query_mask: bool `(batch, queries)`: the real queries.
        key_mask: bool, broadcastable to `(batch, queries, keys)`: the keys each query may attend to.
        offset: the key's position relative to the query's (-1: previous, +1: next token).

    Returns:
        A bool tensor `(batch, queries)`, False for padding queries.
    """
    batch, num_queries = query_mask.shape
    key_mask = key_mask.expand(batch, num_queries, key_mask.size(-1))
    query = torch.arange(num_queries, device=query_mask.device)
    key = query + offset
    inside = (key >= 0) & (key < key_mask.size(-1))
    valid = torch.zeros_like(query_mask)
    valid[:, query[inside]] = key_mask[:, query[inside], key[inside]]
    return valid & query_mask


def word_ids(tokens, continues):
    """Index of the word each subword piece belongs to. A word is a run of continuing pieces
    plus the piece that ends it.

    Args:
        tokens: token ids `(batch, length)`.
        continues: a bool tensor over the vocabulary: True for pieces that continue into the
            next one (subword-nmt's trailing '@@').

    Returns:
        An integer tensor `(batch, length)`: the words of a sentence numbered from 1.
    """
    continuing = continues[tokens]
    starts_word = torch.ones_like(continuing)
    starts_word[:, 1:] = ~continuing[:, :-1]
    return starts_word.long().cumsum(-1)


def same_word_other_pieces(tokens, continues, key_mask):
    """The allowed keys that are the other pieces of the query's word (self-attention).

    Args:
        tokens: token ids `(batch, length)`, both the queries and the keys.
        continues: a bool tensor over the vocabulary, as `word_ids` takes it.
        key_mask: bool, broadcastable to `(batch, queries, keys)`: the keys each query may attend to.

    Returns:
        A bool tensor `(batch, queries, keys)`.
    """
    ids = word_ids(tokens, continues)
    same = ids[:, :, None] == ids[:, None, :]
    same &= ~torch.eye(tokens.size(1), dtype=torch.bool, device=tokens.device)
    return same & key_mask


class HeadStatistics:
    """Running sums for one attention module (one layer of one attention type)."""

    def __init__(self, num_heads):
        self.num_heads = num_heads
        zeros = lambda: torch.zeros(num_heads, dtype=torch.float64)  # noqa: E731
        self.queries = 0
        self.fraction_sum = zeros()
        self.count_sum = zeros()
        self.js_sum = 0.0
        self.previous_sum, self.previous_queries = zeros(), 0
        self.next_sum, self.next_queries = zeros(), 0
        self.merge_sum, self.merge_queries = zeros(), 0
        self.question_sum, self.question_queries = zeros(), 0

    def update(self, weights, query_mask, key_mask, tokens=None, continues=None, question_keys=None):
        """Add one batch to the running sums.

        Args:
            weights: the module's attention weights `(heads, batch, queries, keys)`.
            query_mask: bool `(batch, queries)`: the real queries.
            key_mask: bool, broadcastable to `(batch, queries, keys)`: the keys each query may
                attend to.
            tokens: token ids `(batch, length)`, for self-attention only: they name the keys,
                so that previous/next token and the current word make sense.
            continues: with tokens, the bool vocabulary tensor of `word_ids`; without it, no
                BPE-merging statistic is kept.
            question_keys: bool `(batch, keys)`: True for the keys that are question marks
                (any attention type, cross attention too); without it, no interrogation
                statistic is kept.

        Raises:
            ValueError: `weights` is not of shape `(num_heads, batch, queries, keys)`.
        """
        if weights.dim() != 4 or weights.size(0) != self.num_heads:
            raise ValueError(
                f"expected attention weights of shape (heads={self.num_heads}, batch, queries, keys), "
                f"got {tuple(weights.shape)}"
            )
        # computed where the weights are (GPU or CPU); only the per-head sums come to the CPU
        weights = weights.detach().float()
        device = weights.device
        query_mask, key_mask = query_mask.to(device), key_mask.to(device)
        allowed = key_mask.expand(weights.shape[1:]).sum(-1)  # (batch, queries)
        real = query_mask & (allowed > 0)
        n = int(real.sum())
        self.queries += n

        count = keys_attended(weights, key_mask).double()  # (heads, batch, queries)
        self.count_sum += count[:, real].sum(-1).cpu()
        self.fraction_sum += (count / allowed.clamp(min=1))[:, real].sum(-1).cpu()
        self.js_sum += float(head_js_divergence(weights)[real].sum())

        if question_keys is not None:
            # Only queries that may see a question mark count: a head cannot attend to one
            # that is not there (or, in decoder self-attention, not yet there).
            on_question = key_mask & question_keys.to(device)[:, None, :]
            valid = real & on_question.any(-1)
            mass = (weights * on_question).sum(-1)  # (heads, batch, queries)
            self.question_sum += mass[:, valid].double().sum(-1).cpu()
            self.question_queries += int(valid.sum())

        if tokens is None:
            return
        tokens = tokens.to(device)
        for offset, name in ((-1, "previous"), (1, "next")):
            valid = offset_valid(real, key_mask, offset)
            total = getattr(self, f"{name}_sum") + offset_weight(weights, offset)[:, valid].double().sum(-1).cpu()
            setattr(self, f"{name}_sum", total)
            setattr(self, f"{name}_queries", getattr(self, f"{name}_queries") + int(valid.sum()))

        if continues is not None:
            others = same_word_other_pieces(tokens, continues.to(device), key_mask)
            valid = real & others.any(-1)
            mass = (weights * others).sum(-1)  # (heads, batch, queries)
            self.merge_sum += mass[:, valid].double().sum(-1).cpu()
            self.merge_queries += int(valid.sum())

    @staticmethod
    def _mean(total, n):
        return (total / n).tolist() if n else [None] * len(total)

    def density_fraction(self):
        """Average fraction of allowed keys with nonzero weight, per head.

        Returns:
            A list of floats, one per head (None each when no query was seen).
        """
        return self._mean(self.fraction_sum, self.queries)

    def density_count(self):
        """Average number of keys with nonzero weight, per head.

        Returns:
            A list of floats, one per head (None each when no query was seen).
        """
        return self._mean(self.count_sum, self.queries)

    def js(self):
        """The layer's head diversity (`head_js_divergence`), averaged over queries.

        Returns:
            A float; None when no query was seen.
        """
        return self.js_sum / self.queries if self.queries else None

    def previous_token(self):
        """Average weight on the previous token, per head.

        Returns:
            A list of floats, one per head (None each when no query had a previous token).
        """
        return self._mean(self.previous_sum, self.previous_queries)

    def next_token(self):
        """Average weight on the next token, per head.

        Returns:
            A list of floats, one per head (None each when no query had a next token).
        """
        return self._mean(self.next_sum, self.next_queries)

    def bpe_merging(self):
        """Average weight on the other pieces of the query's word, per head, over queries
        inside words of two or more pieces.

        Returns:
            A list of floats, one per head (None each when there were no such queries).
        """
        return self._mean(self.merge_sum, self.merge_queries)

    def interrogation(self):
        """Average weight on the question-mark keys, per head, over the queries that may
        attend to at least one.

        Returns:
            A list of floats, one per head (None each when no query could see a question mark).
        """
        return self._mean(self.question_sum, self.question_queries)
