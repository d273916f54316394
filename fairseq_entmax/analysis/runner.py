"""Run checkpoints over a subset with teacher forcing and collect the attention statistics.

Batches stream through the model one at a time; hooks reduce each attention module's weights to
running sums at once (metrics.HeadStatistics), so no attention matrix outlives its batch, except
the chosen sentence's, kept for its attention maps.
"""

import logging
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


def analyse_checkpoint(path, data, options, name=None, train_log=None):
    """Analyse one checkpoint.

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
    from fairseq.logging import progress_bar

    subset, sentence_id = options.subset, options.sentence_id
    model, cfg, task = load_checkpoint(path, data, options.user_dir)
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device).eval()
    sites = attention_sites(model)
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    pad = src_dict.pad()
    source_continues = _continuation_table(src_dict).to(device)
    target_continues = _continuation_table(tgt_dict).to(device)
    source_questions = _question_table(src_dict).to(device)
    target_questions = _question_table(tgt_dict).to(device)

    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    batches = _first_sentences_in_batches(
        dataset,
        options.num_sentences,
        max_positions,
        options.max_tokens,
        options.batch_size,
    )
    if len(batches) == 0:
        raise ValueError(f"subset {subset!r} of {data} gives no sentences to analyse")

    statistics = {(s.attention, s.layer): HeadStatistics(s.num_heads) for s in sites}
    maps = {"sentence_id": None}
    state = {}

    def receive(site, weights):
        query_mask, key_mask, tokens, continues = state["context"][site.attention]
        expected = (query_mask.size(0), query_mask.size(1), key_mask.size(-1))
        if tuple(weights.shape[1:]) != expected:
            raise RuntimeError(
                f"{site.name} returned weights of shape {tuple(weights.shape)}, expected "
                f"(heads, batch, queries, keys) = (*, {expected[0]}, {expected[1]}, {expected[2]})"
            )
        statistics[(site.attention, site.layer)].update(
            weights, query_mask, key_mask, tokens, continues, question_keys=state["questions"][site.attention]
        )
        if state["chosen"] is not None:
            row = state["chosen"]
            queries = query_mask[row].nonzero().squeeze(-1)
            keys = key_mask.expand(expected)[row].any(0).nonzero().squeeze(-1)
            maps[(site.attention, site.layer)] = weights[:, row][:, queries][:, :, keys].float().cpu().numpy()

    n_sentences = 0
    label = name or str(path)
    # fairseq's progress bar: tqdm on a terminal, a log line every tenth of the batches otherwise
    bar = progress_bar.progress_bar(
        batches,
        log_format=None if options.progress else "none",
        log_interval=max(1, len(batches) // 10),
        prefix=f"analysing {label}",
        default_log_format="tqdm",
    )
    with torch.no_grad(), capture_attention(sites, receive):
        for batch_indices in bar:
            sample = dataset.collater([dataset[i] for i in batch_indices])
            if device.type == "cuda":
                sample = utils.move_to_cuda(sample, device=device)
            net_input = sample["net_input"]
            state["context"] = _batch_context(sample, pad, source_continues, target_continues)
            state["questions"] = _question_keys(sample, source_questions, target_questions)
            ids = sample["id"].tolist()
            state["chosen"] = ids.index(sentence_id) if sentence_id in ids else None
            if state["chosen"] is not None:
                row = state["chosen"]
                src = net_input["src_tokens"][row]
                prev = net_input["prev_output_tokens"][row]
                maps["sentence_id"] = sentence_id
                maps["source_tokens"] = [src_dict[int(t)] for t in src[src.ne(pad)]]
                maps["target_tokens"] = [tgt_dict[int(t)] for t in prev[prev.ne(pad)]]
            model(**net_input)
            n_sentences += len(ids)
            bar.log({"sentences": n_sentences})

    if sentence_id is not None and maps["sentence_id"] is None:
        logger.warning(
            "sentence %d is not among the %d analysed sentences: no attention maps drawn", sentence_id, n_sentences
        )
    result = _summarise(
        sites, statistics, options.positional_threshold, options.bpe_threshold, options.interrogation_threshold
    )
    result = {"path": str(path), "name": label, "subset": subset, "sentences": n_sentences, **result}
    result["alpha_trajectories"], result["training_log"] = _trajectories(cfg, train_log)
    result["validation_curve"] = _validation_curve(cfg, train_log)
    result["_attention_maps"] = maps
    return result


def _trajectories(cfg, train_log):
    """Alpha trajectories from `train_log`, else from what the checkpoint says it logged to."""
    candidates = (
        [train_log]
        if train_log
        else [
            cfg.common.get("tensorboard_logdir"),
            cfg.common.get("log_file"),
        ]
    )
    for candidate in candidates:
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
    candidates = (
        [train_log]
        if train_log
        else [
            cfg.common.get("tensorboard_logdir"),
            cfg.common.get("log_file"),
        ]
    )
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            curve = read_validation_curve(candidate, subset)
            if curve:
                return curve
    return None


def _summarise(sites, statistics, positional_threshold, bpe_threshold, interrogation_threshold):
    normalizers, alpha, density, js, positional, positional_heads, merging, merging_heads = (
        {},
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
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
