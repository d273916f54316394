"""Run checkpoints over a subset with teacher forcing and collect the attention statistics.

Batches stream through the model one at a time; hooks reduce each attention module's weights to
running sums at once (metrics.HeadStatistics), so no attention matrix outlives its batch, except
the chosen sentence's, kept for its attention maps.
"""

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fairseq_entmax.analysis.capture import attention_sites, capture_attention
from fairseq_entmax.analysis.metrics import HeadStatistics
from fairseq_entmax.analysis.training_log import read_trajectories, read_validation_curve

logger = logging.getLogger(__name__)


def load_checkpoint(path, data, user_dir=None):
    """Load one checkpoint as fairseq-generate does, its task reading `data`.

    Args:
        path: the checkpoint file.
        data: the fairseq data-bin its model was trained on.
        user_dir: a fairseq --user-dir to import besides this plugin, which is always loaded
            (plugin.import_user_dir); None, this package's folder or USER_DIR: none.

    Returns:
        (model, cfg, task): the model (on the CPU, in training mode), the checkpoint's config
        and its task.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: the file is cut short, or its weights do not fit the model built with
            `data`'s dictionaries.
    """
    from fairseq import checkpoint_utils

    from fairseq_entmax.plugin import import_user_dir

    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    # Before the checkpoint is read: the plugin's repairs load it with weights_only on.
    import_user_dir(user_dir)
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(path)], arg_overrides={"data": str(data)}
        )
    except (OSError, EOFError, RuntimeError) as error:
        # A cut-short file (OSError, EOFError), or weights that do not fit the model built
        # with data's dictionaries (RuntimeError: size mismatch).
        raise ValueError(
            f"cannot load checkpoint {path} with data-bin {data}: {str(error).strip()[:500]}\n"
            f"Is the checkpoint complete, and is {data} the data-bin its model was trained on?"
        ) from error
    return models[0], cfg, task


def _first_sentences_in_batches(dataset, num_sentences, max_positions, max_tokens, batch_size):
    """Batches (lists of dataset indices) over the first `num_sentences` lines of the subset,
    grouped by length as fairseq does; sentences longer than the model accepts are skipped."""
    from fairseq.data import data_utils

    with data_utils.numpy_seed(1):
        order = dataset.ordered_indices()
    if num_sentences is not None:
        order = order[order < num_sentences]
    order, ignored = dataset.filter_indices_by_size(order, max_positions)
    if len(ignored):
        logger.warning(
            "skipping %d sentences longer than the model's maximum positions %s", len(ignored), max_positions
        )
    longest = max((int(dataset.num_tokens(i)) for i in order), default=0)
    if max_tokens is not None and longest > max_tokens:
        raise ValueError(
            f"a sentence of {longest} tokens does not fit in a batch of --max-tokens {max_tokens}: "
            f"give --max-tokens {longest} or more"
        )
    return dataset.batch_by_size(np.asarray(order, dtype=np.int64), max_tokens=max_tokens, max_sentences=batch_size)


def _continuation_table(dictionary):
    """Bool over the vocabulary: True for subword-nmt pieces that continue into the next ('@@')."""
    return torch.tensor([symbol.endswith("@@") for symbol in dictionary.symbols], dtype=torch.bool)


# The token of the interrogation heads: a dictionary entry that is exactly this (the paper's
# "?"; Moses tokenisation splits it off, so after BPE it is a whole token).
QUESTION_MARK = "?"


def _question_table(dictionary):
    """Bool over the vocabulary: True for the entry that is a question mark on its own."""
    return torch.tensor([symbol == QUESTION_MARK for symbol in dictionary.symbols], dtype=torch.bool)


def _batch_context(sample, pad, source_continues, target_continues):
    """Per attention type: (query_mask, key_mask, tokens, continues) for this batch."""
    src = sample["net_input"]["src_tokens"]
    prev = sample["net_input"]["prev_output_tokens"]
    src_real, tgt_real = src.ne(pad), prev.ne(pad)
    causal = torch.ones(prev.size(1), prev.size(1), dtype=torch.bool, device=prev.device).tril()
    return {
        "encoder_self": (src_real, src_real[:, None, :], src, source_continues),
        "decoder_self": (tgt_real, tgt_real[:, None, :] & causal, prev, target_continues),
        # source and target tokens differ: no previous/next token or word to speak of
        "cross": (tgt_real, src_real[:, None, :], None, None),
    }


def _question_keys(sample, source_questions, target_questions):
    """Per attention type: bool (batch, keys), True for the keys that are question marks (the
    keys of cross attention are source tokens)."""
    src = sample["net_input"]["src_tokens"]
    prev = sample["net_input"]["prev_output_tokens"]
    on_source = source_questions[src]
    return {"encoder_self": on_source, "decoder_self": target_questions[prev], "cross": on_source}


def model_name(path, taken):
    """A short label for a checkpoint.

    Args:
        path: the checkpoint file.
        taken: the labels already given (a container).

    Returns:
        Its directory's name, plus "/<file name>" unless it is checkpoint_best or
        checkpoint_last, with "-2", "-3", ... added when that is in `taken`.
    """
    path = Path(path)
    name = path.parent.name or path.stem
    if path.stem not in ("checkpoint_best", "checkpoint_last"):
        name = f"{name}/{path.stem}" if name else path.stem
    base, i = name, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


@dataclass
class _Vocabulary:
    """The dictionaries of the model's task and their per-entry tables, on the device."""

    source: object  # fairseq Dictionary
    target: object
    source_continues: torch.Tensor
    target_continues: torch.Tensor
    source_questions: torch.Tensor
    target_questions: torch.Tensor

    @classmethod
    def of(cls, task, device):
        """The vocabulary of a fairseq translation task.

        Args:
            task: the task of the checkpoint (its source and target dictionaries).
            device: where the tables go (that of the model).

        Returns:
            A _Vocabulary.
        """
        source, target = task.source_dictionary, task.target_dictionary
        return cls(
            source,
            target,
            _continuation_table(source).to(device),
            _continuation_table(target).to(device),
            _question_table(source).to(device),
            _question_table(target).to(device),
        )

    @property
    def pad(self):
        """The padding index, that of the source dictionary (fairseq's dictionaries share it)."""
        return self.source.pad()


class _AttentionCollector:
    """What capture_attention hands each site's weights to: the running statistics of every
    head, and the chosen sentence's attention maps.

    `start_batch(sample)` before each forward pass sets the batch's masks and tokens; calling
    the collector with (site, weights) then adds that site's weights.

    Attributes:
        statistics: {(attention type, layer): HeadStatistics}.
        maps: {"sentence_id": the chosen sentence's id once seen, else None; and once seen,
            "source_tokens", "target_tokens" and per (attention type, layer) its weights
            (heads, queries, keys) as a numpy array}.
    """

    def __init__(self, sites, vocabulary, sentence_id):
        self.statistics = {(s.attention, s.layer): HeadStatistics(s.num_heads) for s in sites}
        self.maps = {"sentence_id": None}
        self._vocabulary = vocabulary
        self._sentence_id = sentence_id
        self._context = self._questions = self._chosen = None

    def start_batch(self, sample):
        """Take the masks, tokens and question keys of the batch the model is to run on, and
        the chosen sentence's tokens if it is in it."""
        vocabulary = self._vocabulary
        pad = vocabulary.pad
        self._context = _batch_context(sample, pad, vocabulary.source_continues, vocabulary.target_continues)
        self._questions = _question_keys(sample, vocabulary.source_questions, vocabulary.target_questions)
        ids = sample["id"].tolist()
        self._chosen = ids.index(self._sentence_id) if self._sentence_id in ids else None
        if self._chosen is not None:
            src = sample["net_input"]["src_tokens"][self._chosen]
            prev = sample["net_input"]["prev_output_tokens"][self._chosen]
            self.maps["sentence_id"] = self._sentence_id
            self.maps["source_tokens"] = [vocabulary.source[int(t)] for t in src[src.ne(pad)]]
            self.maps["target_tokens"] = [vocabulary.target[int(t)] for t in prev[prev.ne(pad)]]

    def __call__(self, site, weights):
        query_mask, key_mask, tokens, continues = self._context[site.attention]
        expected = (query_mask.size(0), query_mask.size(1), key_mask.size(-1))
        if tuple(weights.shape[1:]) != expected:
            raise RuntimeError(
                f"{site.name} returned weights of shape {tuple(weights.shape)}, expected "
                f"(heads, batch, queries, keys) = (*, {expected[0]}, {expected[1]}, {expected[2]})"
            )
        self.statistics[(site.attention, site.layer)].update(
            weights, query_mask, key_mask, tokens, continues, question_keys=self._questions[site.attention]
        )
        if self._chosen is not None:
            queries = query_mask[self._chosen].nonzero().squeeze(-1)
            keys = key_mask.expand(expected)[self._chosen].any(0).nonzero().squeeze(-1)
            chosen = weights[:, self._chosen][:, queries][:, :, keys]
            self.maps[(site.attention, site.layer)] = chosen.float().cpu().numpy()


def _run_batches(model, dataset, batches, sites, collector, device, progress, label):
    """Run the model with teacher forcing over `batches`, every site's weights going to
    `collector`.

    Args:
        model: the model, in eval mode on `device`.
        dataset: the subset's fairseq dataset.
        batches: lists of dataset indices (_first_sentences_in_batches).
        sites: the model's AttentionSite's.
        collector: the _AttentionCollector.
        device: the torch device.
        progress: show fairseq's progress bar (else nothing).
        label: the model's label in the progress bar.

    Returns:
        The number of sentences run.
    """
    from fairseq import utils
    from fairseq.logging import progress_bar

    # fairseq's progress bar: tqdm on a terminal, a log line every tenth of the batches otherwise
    bar = progress_bar.progress_bar(
        batches,
        log_format=None if progress else "none",
        log_interval=max(1, len(batches) // 10),
        prefix=f"analyzing {label}",
        default_log_format="tqdm",
    )
    sentences = 0
    with torch.no_grad(), capture_attention(sites, collector):
        for batch_indices in bar:
            sample = dataset.collater([dataset[i] for i in batch_indices])
            if device.type == "cuda":
                sample = utils.move_to_cuda(sample, device=device)
            collector.start_batch(sample)
            model(**sample["net_input"])
            sentences += len(sample["id"])
            bar.log({"sentences": sentences})
    return sentences


def analyze_checkpoint(path, data, options, name=None, train_log=None):
    """Analyze one checkpoint.

    Args:
        path: the checkpoint file.
        data: the fairseq data-bin its model was trained on.
        options: the AnalysisOptions (subset, batches, thresholds, device, ...).
        name: the model's label in the results (default: `path`).
        train_log: a training log file or tensorboard log directory to read alpha
            trajectories and the validation curve from; None: the --tensorboard-logdir or
            --log-file the checkpoint recorded, if it still exists.

    Returns:
        The checkpoint's entry of analysis.json, plus under the key "_attention_maps" the
        chosen sentence's attention (for the figures; not serialised).
    """
    from fairseq import utils

    model, cfg, task = load_checkpoint(path, data, options.user_dir)
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device).eval()
    sites = attention_sites(model)
    task.load_dataset(options.subset)
    dataset = task.dataset(options.subset)
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    batches = _first_sentences_in_batches(
        dataset, options.num_sentences, max_positions, options.max_tokens, options.batch_size
    )
    if len(batches) == 0:
        raise ValueError(f"subset {options.subset!r} of {data} gives no sentences to analyze")

    label = name or str(path)
    collector = _AttentionCollector(sites, _Vocabulary.of(task, device), options.sentence_id)
    sentences = _run_batches(model, dataset, batches, sites, collector, device, options.progress, label)
    if options.sentence_id is not None and collector.maps["sentence_id"] is None:
        logger.warning(
            "sentence %d is not among the %d analyzed sentences: no attention maps drawn",
            options.sentence_id,
            sentences,
        )
    summary = _summarise(
        sites,
        collector.statistics,
        options.positional_threshold,
        options.bpe_threshold,
        options.interrogation_threshold,
    )
    result = {"path": str(path), "name": label, "subset": options.subset, "sentences": sentences, **summary}
    result["alpha_trajectories"], result["training_log"] = _trajectories(cfg, train_log)
    result["validation_curve"] = _validation_curve(cfg, train_log)
    result["_attention_maps"] = collector.maps
    return result


def _training_logs(cfg, train_log):
    """Where to read the training log: `train_log` if given, else the --tensorboard-logdir and
    the --log-file the checkpoint recorded (each may be None)."""
    return [train_log] if train_log else [cfg.common.get("tensorboard_logdir"), cfg.common.get("log_file")]


def _trajectories(cfg, train_log):
    """Alpha trajectories from `train_log`, else from what the checkpoint says it logged to."""
    for candidate in _training_logs(cfg, train_log):
        if candidate and Path(candidate).exists():
            trajectories = read_trajectories(candidate)
            if trajectories or train_log:
                return trajectories, str(candidate)
    if train_log:
        raise FileNotFoundError(f"training log {train_log} does not exist")
    return [], None


def _validation_curve(cfg, train_log):
    """The validation learning curve (of the run's first --valid-subset) from `train_log`, else
    from the --tensorboard-logdir or --log-file the checkpoint recorded; None if none has one."""
    subset = (cfg.dataset.get("valid_subset") or "valid").split(",")[0]
    for candidate in _training_logs(cfg, train_log):
        if candidate and Path(candidate).exists():
            curve = read_validation_curve(candidate, subset)
            if curve:
                return curve
    return None


def _summarise(sites, statistics, positional_threshold, bpe_threshold, interrogation_threshold):
    """The per-head results of analysis.json from the statistics of every site, with the heads
    whose previous/next-token weight, BPE-merging mass or question-mark mass reaches its threshold."""
    normalizers, alpha, density, js = {}, [], [], []
    positional, positional_heads, merging, merging_heads = [], [], [], []
    interrogation, interrogation_heads = [], []
    for site in sites:
        key = dict(attention=site.attention, layer=site.layer)
        stats = statistics[(site.attention, site.layer)]
        normalizers.setdefault(site.attention, site.normalizer())
        alphas = site.head_alpha() or [None] * site.num_heads
        fractions, counts = stats.density_fraction(), stats.density_count()
        for head in range(site.num_heads):
            alpha.append(dict(key, head=head, alpha=alphas[head]))
            density.append(dict(key, head=head, fraction=fractions[head], count=counts[head]))
        js.append(dict(key, js=stats.js()))
        on_questions = stats.interrogation()
        for head in range(site.num_heads):
            interrogation.append(dict(key, head=head, mass=on_questions[head]))
            if on_questions[head] is not None and on_questions[head] >= interrogation_threshold:
                interrogation_heads.append(dict(key, head=head, mass=on_questions[head]))
        if site.attention == "cross":
            continue
        previous, following, merge = stats.previous_token(), stats.next_token(), stats.bpe_merging()
        for head in range(site.num_heads):
            positional.append(dict(key, head=head, previous=previous[head], next=following[head]))
            for direction, weight in (("previous", previous[head]), ("next", following[head])):
                if weight is not None and weight >= positional_threshold:
                    positional_heads.append(dict(key, head=head, direction=direction, weight=weight))
            merging.append(dict(key, head=head, mass=merge[head]))
            if merge[head] is not None and merge[head] >= bpe_threshold:
                merging_heads.append(dict(key, head=head, mass=merge[head]))
    return dict(
        normalizers=normalizers,
        alpha=alpha,
        density=density,
        density_layers=_aggregate(density, ("attention", "layer")),
        density_types=_aggregate(density, ("attention",)),
        js=js,
        positional=positional,
        positional_heads=positional_heads,
        bpe_merging=merging,
        bpe_merging_heads=merging_heads,
        interrogation=interrogation,
        interrogation_heads=interrogation_heads,
    )


def _aggregate(density, keys):
    """Mean fraction and count of the per-head density rows grouped by `keys`."""
    groups = {}
    for row in density:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    out = []
    for group_key, rows in groups.items():
        fractions = [r["fraction"] for r in rows if r["fraction"] is not None]
        counts = [r["count"] for r in rows if r["count"] is not None]
        out.append(
            dict(
                zip(keys, group_key),
                fraction=float(np.mean(fractions)) if fractions else None,
                count=float(np.mean(counts)) if counts else None,
            )
        )
    return out
