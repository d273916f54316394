"""The attention analysis of trained models (fairseq-entmax-analyze): density and learned
alphas per attention type, figures on disk."""

import json
from collections import defaultdict
from pathlib import Path

from fairseq_entmax import USER_DIR

from .markers import done_with_same_settings, fingerprint, mark_done
from .runner import command_step
from .tools import bin_dir, log, run_logged

# The kinds of specialised heads analysis.json lists, as "<kind>_heads".
SPECIALISED_HEADS = ("positional", "bpe_merging", "interrogation")


def _heads_listed(model, kind):
    """How many heads analysis.json lists as `kind` (a positional head once, whichever its
    directions); None when the analysis has no such list (made before it was added)."""
    listed = model.get(f"{kind}_heads")
    if listed is None:
        return None
    return len({(r["attention"], r["layer"], r["head"]) for r in listed})


def analyze_command(data_bin, checkpoints, subset, out_dir, num_sentences=None):
    """The fairseq-entmax-analyze command.

    Args:
        data_bin: the data-bin the models were trained on.
        checkpoints: {label: checkpoint path}.
        subset: the subset to run the models over.
        out_dir: where the analysis is written.
        num_sentences: analyze only that many sentences (None: all).

    Returns:
        The command, a list of str.
    """
    args = [
        bin_dir() / "fairseq-entmax-analyze",
        data_bin,
        "--user-dir",
        USER_DIR,
        "--subset",
        subset,
        "--output-dir",
        out_dir,
    ]
    for label, path in checkpoints.items():
        args += ["--path", path, "--name", label]
    if num_sentences:
        args += ["--num-sentences", num_sentences]
    return [str(a) for a in args]


def analyze(data_bin, checkpoints, subset, out_dir, log_path, num_sentences=None, threads=None):
    """Run fairseq-entmax-analyze over the checkpoints (skipped when done with exactly these,
    unchanged), its figures and tables written to out_dir.

    Args:
        data_bin: the data-bin the models were trained on.
        checkpoints: {label: checkpoint path}.
        subset: the subset to run the models over.
        out_dir: where the analysis is written.
        log_path: the command's log, appended to.
        num_sentences: analyze only that many sentences (None: all).
        threads: CPU threads of fairseq-entmax-analyze (None: torch's choice).

    Returns:
        {label: {"density": {type: mean fraction}, "alpha": {type: (mean, min, max)}, "js":
        {type: head diversity, mean over layers}, "specialised_heads": {"positional",
        "bpe_merging", "interrogation": number of heads listed}}}, the alpha of types without
        one left out, a kind of head the analysis did not report None; None when
        fairseq-entmax-analyze is not installed.

    Raises:
        ToolError: the analysis failed.
    """
    command = bin_dir() / "fairseq-entmax-analyze"
    if not command.exists():
        log("fairseq-entmax-analyze is not installed: no attention density, alphas or figures")
        return None
    out_dir = Path(out_dir)
    report, marker = out_dir / "analysis.json", out_dir / "analysis.done"
    # Reuse an earlier analysis only if it was made of exactly these checkpoints, unchanged.
    made_with = {
        "subset": subset,
        "num_sentences": num_sentences,
        "models": {label: fingerprint(path) for label, path in checkpoints.items()},
    }
    if not (report.exists() and done_with_same_settings(marker, made_with)):
        report.unlink(missing_ok=True)
    if not report.exists():
        log(f"analyzing attention of {len(checkpoints)} models on {subset} (fairseq-entmax-analyze)")
        args = analyze_command(data_bin, checkpoints, subset, out_dir, num_sentences)
        run_logged(args, log_path, threads=threads)
        mark_done(marker, settings=made_with)
    models = {m["name"]: m for m in json.loads(report.read_text())["models"]}
    summary = {}
    for label in checkpoints:
        model = models[label]
        density, alphas, js = defaultdict(list), defaultdict(list), defaultdict(list)
        for row in model["density"]:
            density[row["attention"]].append(row["fraction"])
        for row in model["alpha"]:
            if row["alpha"] is not None:
                alphas[row["attention"]].append(row["alpha"])
        for row in model["js"]:
            if row["js"] is not None:
                js[row["attention"]].append(row["js"])
        summary[label] = {
            "density": {t: sum(v) / len(v) for t, v in density.items()},
            "alpha": {t: (sum(v) / len(v), min(v), max(v)) for t, v in alphas.items()},
            "js": {t: sum(v) / len(v) for t, v in js.items()},
            "specialised_heads": {kind: _heads_listed(model, kind) for kind in SPECIALISED_HEADS},
        }
    return summary


def analysis_step(data_bin, checkpoints, subset, out_dir, log_path, then, num_sentences=None, threads=None):
    """The analysis as a runner Step: its command, run by `analyze`.

    Args:
        data_bin: the data-bin the models were trained on.
        checkpoints: {label: checkpoint path}.
        subset: the subset to run the models over.
        out_dir: where the analysis is written.
        log_path: the command's log, appended to.
        then: called with analyze's result, e.g. to add it to the result rows.
        num_sentences: analyze only that many sentences (None: all).
        threads: CPU threads of fairseq-entmax-analyze (None: torch's choice).

    Returns:
        A Step.
    """
    command = analyze_command(data_bin, checkpoints, subset, out_dir, num_sentences)
    return command_step(
        command, lambda: then(analyze(data_bin, checkpoints, subset, out_dir, log_path, num_sentences, threads))
    )
