"""Beam search over sparse output distributions: a repair of fairseq's SequenceGenerator.

A model trained with the entmax_loss criterion gives many next tokens probability exactly 0
(log-probability -inf). fairseq's beam search is written for softmax, where every
continuation has a finite score, and fails on a search that runs out of them:

- it only finalizes hypotheses whose score is finite, and a sentence counts as translated once
  it has --beam of them. With a sparse output distribution a sentence often has fewer finite
  hypotheses than the beam: the beam's other slots hold hypotheses of score -inf, which fairseq
  keeps extending until --max-len ...
- ... where it forces end-of-sentence, and a hypothesis to which the model gives that
  probability 0 is not finalized either: a sentence without a finite hypothesis at that step
  stops fairseq-generate, -interactive and the hub with `AssertionError: <max_len> < <max_len>`.

This repair wraps SequenceGenerator._generate, for generators whose
models include one with a sparse output distribution (model.output_alpha != 1; softmax models
are left to fairseq untouched). Each step of the search, a sentence none of whose hypotheses
has a continuation of nonzero probability (after fairseq's own constraints: pad, --max-len,
--min-len, prefixes) is at a dead end: the search over what the model deems possible is
complete. Its hypotheses are then ended with a placeholder score (DEAD_END_SCORE, finite and
below any real score), which lets fairseq finalize them and finish the sentence, and the
placeholders are taken out of the results. A sentence keeps the finite-probability hypotheses
its search found (possibly fewer than --nbest); one that found none gets a single hypothesis,
the best prefix that still had nonzero probability, ended by end-of-sentence, with score -inf
and a positional score of -inf for that end. No NaN appears and nothing crashes.

This covers fairseq's beam search (the default search of fairseq-generate, -interactive and the
hub, and of --eval-bleu); sampling and the other search strategies are fairseq's, unchanged.
"""

import functools
import math

import torch

from fairseq_entmax.repairs.patching import Repair, Replacement


def dead_end_score(dtype):
    """The placeholder score of a hypothesis at a dead end, in the search's dtype: finite (so
    that fairseq finalizes it), far below any sum of real log-probabilities, and far enough
    from the dtype's lowest value that adding scores to it does not overflow."""
    return torch.finfo(dtype).min / 4


def generates_sparse_outputs(generator):
    """Whether any model of a SequenceGenerator has a sparse output distribution.

    Args:
        generator: a fairseq SequenceGenerator (its models are in generator.model.models).

    Returns:
        True when one of them has an output_alpha other than 1 (see
        AdaptivelySparseTransformerModel.get_normalized_probs).
    """
    models = getattr(getattr(generator, "model", None), "models", ())
    return any(getattr(model, "output_alpha", 1.0) != 1.0 for model in models)


def _ending_dead_ends(generate):
    @functools.wraps(generate)
    def generate_ending_dead_ends(self, *args, **kwargs):
        if not generates_sparse_outputs(self):
            return generate(self, *args, **kwargs)
        search = self.search
        own_step = vars(search).get("step")
        search.step = functools.partial(_step_ending_dead_ends, search.step, self.eos)
        try:
            finalized = generate(self, *args, **kwargs)
        finally:
            if own_step is None:
                del search.step
            else:
                search.step = own_step
        return [[_cut_at_dead_end(hypothesis, self.eos) for hypothesis in hypotheses] for hypotheses in finalized]

    return generate_ending_dead_ends


def _without_placeholders(generate):
    @functools.wraps(generate)
    def generate_without_placeholders(self, *args, **kwargs):
        finalized = generate(self, *args, **kwargs)
        if not generates_sparse_outputs(self):
            return finalized
        length_penalty = self.len_penalty if self.normalize_scores else 0.0
        return [_finite_or_best_prefix(hypotheses, length_penalty) for hypotheses in finalized]

    return generate_without_placeholders


def _step_ending_dead_ends(step_function, eos, step, lprobs, scores, *args, **kwargs):
    """The search's step, after ending the hypotheses of the sentences at a dead end.

    lprobs (bsz, beam, vocab) are the step's log-probabilities after fairseq's constraints;
    scores (bsz, beam, step) is a view of the generator's cumulative scores. fairseq's beam
    search extends only the first hypothesis at step 0 (they are all the same).
    """
    if step == 0:
        dead = (lprobs[:, :1] == -math.inf).all(dim=-1)
    else:
        dead = (scores[:, :, step - 1] == -math.inf) | (lprobs == -math.inf).all(dim=-1)
    sentences = dead.all(dim=1).nonzero().squeeze(1)
    if sentences.numel():
        # Only end-of-sentence remains, at the placeholder score. A hypothesis whose score is
        # already -inf gets the placeholder score for its last token instead, so that the sum
        # stays finite, ranks below those of a finite prefix, and still marks where the
        # hypothesis took a token of probability 0.
        dead_end = dead_end_score(lprobs.dtype)
        lprobs[sentences] = -math.inf
        lprobs[sentences, :, eos] = dead_end
        if step > 0:
            previous = scores[sentences, :, step - 1]
            scores[sentences, :, step - 1] = previous.masked_fill(previous == -math.inf, dead_end)
    return step_function(step, lprobs, scores, *args, **kwargs)


def _cut_at_dead_end(hypothesis, eos):
    """A finalized hypothesis as is, or a placeholder cut before its first token of
    probability 0 (or its placeholder end) and ended there: end-of-sentence with a positional
    score of -inf, and score -inf."""
    positional = hypothesis["positional_scores"]
    unreal = ~torch.isfinite(positional) | (positional <= dead_end_score(positional.dtype) / 2)
    if not bool(unreal.any()):
        return hypothesis
    cut = int(unreal.nonzero()[0, 0])
    tokens = hypothesis["tokens"][: cut + 1].clone()
    tokens[cut] = eos
    positional = positional[: cut + 1].clone()
    positional[cut] = -math.inf
    attention = hypothesis["attention"]
    return dict(
        hypothesis,
        tokens=tokens,
        score=torch.full_like(hypothesis["score"], -math.inf),
        positional_scores=positional,
        attention=attention[:, : cut + 1] if attention.dim() == 2 else attention,
    )


def _finite_or_best_prefix(hypotheses, length_penalty):
    """A sentence's hypotheses of finite score; without any, the cut placeholder whose prefix
    scores best (normalised by length as fairseq normalises scores)."""
    finite = [hypothesis for hypothesis in hypotheses if bool(torch.isfinite(hypothesis["score"]))]
    if finite or not hypotheses:
        return finite

    def prefix_score(hypothesis):
        length = hypothesis["tokens"].numel()
        return float(hypothesis["positional_scores"][:-1].sum()) / length**length_penalty

    return [max(hypotheses, key=prefix_score)]


# Two layers: `_generate` ends the sentences at a dead end and cuts their placeholders to the
# best prefix of nonzero probability (each sentence keeps --beam hypotheses, as fairseq's
# SequenceGeneratorWithAlignment expects when it computes their alignments); `generate`, of
# both classes, then drops the placeholders where a sentence has finite hypotheses.
REPAIR = Repair(
    "beam search over sparse outputs",
    (
        Replacement("fairseq.sequence_generator.SequenceGenerator", "_generate", _ending_dead_ends),
        Replacement("fairseq.sequence_generator.SequenceGenerator", "generate", _without_placeholders),
        Replacement("fairseq.sequence_generator.SequenceGeneratorWithAlignment", "generate", _without_placeholders),
    ),
)
