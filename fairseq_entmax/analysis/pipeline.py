"""analyze(): checkpoints in, analysis.json + CSV tables + PNG figures out."""

import dataclasses
import logging
from pathlib import Path

from fairseq_entmax.analysis.options import AnalysisOptions
from fairseq_entmax.analysis.report import file_label, write_json, write_tables
from fairseq_entmax.analysis.runner import analyze_checkpoint, model_name

logger = logging.getLogger(__name__)

# The files the last analysis wrote into its output directory, one per line: a later
# analysis into the same directory removes those it does not write again (figures of models
# no longer analyzed), and nothing else.
MANIFEST = "written_files.txt"


def analyze(paths, data, output_dir, *, options=None, names=None, train_logs=None, **option_values):
    """Analyze the attention of one or more fairseq checkpoints on a subset of a data-bin.

    Args:
        paths: checkpoint files (several to compare models).
        data: the fairseq data-bin the models were trained on.
        output_dir: where analysis.json, the CSV tables and the figures are written.
        options: an AnalysisOptions (subset, num_sentences, max_tokens, batch_size,
            sentence_id, thresholds, device, figures, progress, user_dir); default: the
            defaults, with option_values.
        names: a label per path (default: the checkpoint's directory).
        train_logs: per path, a training log file or tensorboard log directory to read alpha
            trajectories and the validation learning curve from, or None / "auto" for the
            --tensorboard-logdir / --log-file recorded in the checkpoint when it still exists
            (learning_curves.png averages the models whose names differ only by a
            -seed<N>/_seed<N> ending).
        **option_values: AnalysisOptions attributes, e.g. subset="valid", num_sentences=1000,
            replacing those of `options`.

    Returns:
        The content of analysis.json, as a dict.

    Raises:
        FileNotFoundError, ValueError: for a bad input, before the first model is loaded
            (see _check_inputs), or for a checkpoint that cannot be loaded.
    """
    options = dataclasses.replace(options or AnalysisOptions(), **option_values)
    subset = options.subset
    paths = [str(p) for p in paths]
    _check_inputs(paths, data, subset, names, train_logs)
    if names is None:
        names = []
        for path in paths:
            names.append(model_name(path, set(names)))
    labels = [file_label(name) for name in names]
    if len(set(labels)) != len(labels):
        raise ValueError(
            f"model names {names} give the same figure file names ({labels}): "
            "give each --path a --name that differs in letters or digits"
        )
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    models, maps = [], []
    for index, path in enumerate(paths):
        name = names[index]
        logger.info("analyzing %s (%s) on subset %s", name, path, subset)
        result = analyze_checkpoint(
            path,
            data,
            options,
            name=name,
            train_log=train_logs[index] if train_logs and train_logs[index] != "auto" else None,
        )
        maps.append(result.pop("_attention_maps"))
        models.append(result)

    analysis = {
        "data": str(data),
        "subset": subset,
        "sentence_id": options.sentence_id,
        "positional_threshold": options.positional_threshold,
        "bpe_threshold": options.bpe_threshold,
        "interrogation_threshold": options.interrogation_threshold,
        "models": models,
    }
    written = [write_json(analysis, output_dir)] + write_tables(models, output_dir)
    if options.figures:
        from fairseq_entmax.analysis.plots import write_figures

        written += write_figures(models, maps, output_dir)
    _remove_stale_outputs(output_dir, written)
    logger.info("wrote %d files to %s", len(written), output_dir)
    return analysis


def _check_inputs(paths, data, subset, names, train_logs):
    """Every input of analyze(), checked before the first model is loaded: a mistake in the
    last --path or --train-log should not cost the analysis of the models before it."""
    if not paths:
        raise ValueError("give at least one checkpoint (--path)")
    for option, values in (("--name", names), ("--train-log", train_logs)):
        if values is not None and len(values) != len(paths):
            raise ValueError(f"{len(values)} {option} for {len(paths)} checkpoints: give one {option} per --path")
    if names is not None and len(set(names)) != len(names):
        raise ValueError(f"model names must differ, got {names}")
    data = Path(data)
    if not data.is_dir():
        raise FileNotFoundError(f"data-bin directory {data} does not exist")
    if not list(data.glob("dict.*.txt")):
        raise ValueError(
            f"{data} is not a fairseq data-bin (it has no dict.<lang>.txt): give the --destdir "
            "of the fairseq-preprocess run the models were trained with"
        )
    if not list(data.glob(f"{subset}.*.idx")):
        subsets = sorted({p.name.split(".")[0] for p in data.glob("*.idx")})
        raise ValueError(
            f"{data} has no subset {subset!r} ({subset}.*.idx); it has {subsets}: choose one with --subset"
        )
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
    for train_log in train_logs or []:
        if train_log not in (None, "auto") and not Path(train_log).exists():
            raise FileNotFoundError(f"training log {train_log} does not exist")


def _remove_stale_outputs(output_dir, written):
    """Remove what the previous analysis into output_dir wrote and this one did not; record
    what this one wrote."""
    manifest = output_dir / MANIFEST
    current = {Path(path).name for path in written}
    if manifest.exists():
        for name in set(manifest.read_text().split()) - current:
            (output_dir / name).unlink(missing_ok=True)
    manifest.write_text("".join(f"{name}\n" for name in sorted(current)))
