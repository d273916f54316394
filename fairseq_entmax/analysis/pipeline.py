"""analyze(): checkpoints in, analysis.json + CSV tables + PNG figures out."""
import logging
from pathlib import Path

from fairseq_entmax import USER_DIR
from fairseq_entmax.analysis.report import write_json, write_tables
from fairseq_entmax.analysis.runner import analyse_checkpoint, model_name

logger = logging.getLogger(__name__)


def analyze(
    paths, data, output_dir, subset="valid", user_dir=USER_DIR, names=None, train_logs=None,
    num_sentences=None, max_tokens=4000, batch_size=None, sentence_id=0, positional_threshold=0.9,
    bpe_threshold=0.5, device=None, figures=True, progress=True,
):
    """Analyse the attention of one or more fairseq checkpoints on `subset` of the data-bin `data`.

    paths: checkpoint files (several to compare models); names: a label per path (default: the
    checkpoint's directory); train_logs: per path, a training log file or tensorboard log
    directory to read alpha trajectories from, or None / "auto" for the --tensorboard-logdir /
    --log-file recorded in the checkpoint when it still exists. num_sentences: analyse only the first N sentences
    of the subset. sentence_id: the sentence whose per-head attention maps are drawn.
    Writes analysis.json, the CSV tables and the figures into output_dir and returns the
    analysis.json content.
    """
    paths = [str(p) for p in paths]
    if not paths:
        raise ValueError("give at least one checkpoint (--path)")
    for option, values in (("names", names), ("train_logs", train_logs)):
        if values is not None and len(values) != len(paths):
            raise ValueError(f"{option} has {len(values)} entries for {len(paths)} checkpoints: give one per --path")
    if names is not None and len(set(names)) != len(names):
        raise ValueError(f"model names must differ, got {names}")
    if not Path(data).is_dir():
        raise FileNotFoundError(f"data-bin directory {data} does not exist")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    models, maps = [], []
    for index, path in enumerate(paths):
        name = names[index] if names else model_name(path, {m["name"] for m in models})
        logger.info("analysing %s (%s) on subset %s", name, path, subset)
        result = analyse_checkpoint(
            path, data, subset=subset, user_dir=user_dir, name=name, num_sentences=num_sentences,
            max_tokens=max_tokens, batch_size=batch_size, sentence_id=sentence_id,
            train_log=train_logs[index] if train_logs and train_logs[index] != "auto" else None,
            positional_threshold=positional_threshold, bpe_threshold=bpe_threshold, device=device,
            progress=progress,
        )
        maps.append(result.pop("_attention_maps"))
        models.append(result)

    analysis = {
        "data": str(data), "subset": subset, "sentence_id": sentence_id,
        "positional_threshold": positional_threshold, "bpe_threshold": bpe_threshold,
        "models": models,
    }
    written = [write_json(analysis, output_dir)] + write_tables(models, output_dir)
    if figures:
        from fairseq_entmax.analysis.plots import write_figures

        written += write_figures(models, maps, output_dir)
    logger.info("wrote %d files to %s", len(written), output_dir)
    return analysis
