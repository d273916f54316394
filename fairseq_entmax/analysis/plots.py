"""PNG figures of the analysis (matplotlib, non-interactive Agg backend)."""

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fairseq_entmax.analysis.report import file_label  # noqa: E402
from fairseq_entmax.analysis.training_log import group_by_normalizer  # noqa: E402
from fairseq_entmax.names import ATTENTION_TITLES as TITLES  # noqa: E402
from fairseq_entmax.names import ATTENTION_TYPES  # noqa: E402
from fairseq_entmax.normalizers import LearnedAlphaEntmax  # noqa: E402

logger = logging.getLogger(__name__)

# Attention maps: exact zeros (sparse attention) white, any nonzero weight visibly blue.
_NONZERO_CMAP = matplotlib.colors.LinearSegmentedColormap.from_list(
    "nonzero_blues", plt.get_cmap("Blues")(np.linspace(0.15, 1.0, 256))
)
_NONZERO_CMAP.set_under("white")
_SMALLEST_SHOWN = 1e-12


def _types(models):
    return [t for t in ATTENTION_TYPES if any(t in m["normalizers"] for m in models)]


def _grid(rows, attention, key, layers, heads):
    """layers x heads array of rows[key] for one attention type (NaN where None)."""
    grid = np.full((layers, heads), np.nan)
    for row in rows:
        if row["attention"] == attention and row[key] is not None:
            grid[row["layer"], row["head"]] = row[key]
    return grid


def _shape(model, attention):
    rows = [r for r in model["density"] if r["attention"] == attention]
    return max(r["layer"] for r in rows) + 1, max(r["head"] for r in rows) + 1


def _heatmap(ax, fig, grid, title, vmin, vmax, colorbar_label):
    """layers x heads heatmap; cells without a value (NaN) are grey and read n/a."""
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("lightgrey")
    image = ax.imshow(np.ma.masked_invalid(grid), vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    if grid.size <= 128:  # values are readable only in small grids
        for (layer, head), value in np.ndenumerate(grid):
            missing = np.isnan(value)
            bright = not missing and (value - vmin) / (vmax - vmin) > 0.6
            ax.text(
                head,
                layer,
                "n/a" if missing else f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="k" if missing or bright else "w",
            )
    fig.colorbar(image, ax=ax, label=colorbar_label)


def _save(fig, path):
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def alpha_heatmap(model, output_dir):
    """One heatmap of alpha (layers x heads) per attention type, in one figure.

    Args:
        model: one model's entry of analysis.json (report.py's schema, docs/analysis.md).
        output_dir: where the figure is written.

    Returns:
        The path of alpha_heatmap_<model>.png, or None when no head has an alpha (top-k).
    """
    types = [t for t in _types([model]) if any(r["alpha"] is not None for r in model["alpha"] if r["attention"] == t)]
    if not types:
        return None
    fig, axes = plt.subplots(1, len(types), figsize=(4.5 * len(types), 3.5), squeeze=False, layout="constrained")
    for ax, attention in zip(axes[0], types):
        layers, heads = _shape(model, attention)
        grid = _grid(model["alpha"], attention, "alpha", layers, heads)
        _heatmap(ax, fig, grid, f"{TITLES[attention]}\n({model['normalizers'][attention]})", 1.0, 2.0, "alpha")
    fig.suptitle(f"{model['name']}: alpha per head (1 = softmax, 2 = sparsemax)")
    return _save(fig, Path(output_dir) / f"alpha_heatmap_{file_label(model['name'])}.png")


def alpha_histogram(models, output_dir):
    """Distribution of the learned alphas per attention type (the paper's histogram); models with
    a fixed alpha are drawn as vertical lines.

    Args:
        models: the models' entries of analysis.json.
        output_dir: where alpha_histogram.png is written.

    Returns:
        The path of the figure, or None when no model has an alpha.
    """
    types = [
        t
        for t in _types(models)
        if any(r["alpha"] is not None for m in models for r in m["alpha"] if r["attention"] == t)
    ]
    if not types:
        return None
    fig, axes = plt.subplots(1, len(types), figsize=(4.5 * len(types), 3.5), squeeze=False, layout="constrained")
    bins = np.linspace(1.0, 2.0, 21)
    for ax, attention in zip(axes[0], types):
        for index, model in enumerate(models):
            alphas = [r["alpha"] for r in model["alpha"] if r["attention"] == attention and r["alpha"] is not None]
            if not alphas:
                continue
            color = f"C{index}"
            if model["normalizers"][attention] == LearnedAlphaEntmax.name:
                ax.hist(alphas, bins=bins, alpha=0.6, color=color, label=f"{model['name']} (learned)")
            else:
                ax.axvline(
                    alphas[0],
                    color=color,
                    linestyle="--",
                    label=f"{model['name']} ({model['normalizers'][attention]}, alpha={alphas[0]:g})",
                )
        ax.set_title(TITLES[attention])
        ax.set_xlabel("alpha")
        ax.set_ylabel("number of heads")
        ax.set_xlim(0.95, 2.05)
        ax.legend(fontsize=7)
    fig.suptitle("Learned alpha per attention type")
    return _save(fig, Path(output_dir) / "alpha_histogram.png")


def alpha_trajectories(model, output_dir):
    """alpha over training per attention type: every head if the log has them, else the mean
    with the min-max band.

    Args:
        model: one model's entry of analysis.json (report.py's schema, docs/analysis.md).
        output_dir: where the figure is written.

    Returns:
        The path of alpha_trajectories_<model>.png, or None when the model's log has no alpha.
    """
    trajectories = model["alpha_trajectories"]
    types = [t for t in ATTENTION_TYPES if any(tr["attention"] == t for tr in trajectories)]
    if not types:
        return None
    fig, axes = plt.subplots(1, len(types), figsize=(4.5 * len(types), 3.5), squeeze=False, layout="constrained")
    for ax, attention in zip(axes[0], types):
        own = [tr for tr in trajectories if tr["attention"] == attention]
        per_head = [tr for tr in own if tr["statistic"] == "head"]
        if per_head:
            layers = max(tr["layer"] for tr in per_head) + 1
            colors = plt.cm.viridis(np.linspace(0, 0.9, layers))
            labelled = set()
            for tr in per_head:
                label = None if tr["layer"] in labelled else f"layer {tr['layer']}"
                labelled.add(tr["layer"])
                ax.plot(tr["steps"], tr["values"], color=colors[tr["layer"]], linewidth=0.8, label=label)
        else:
            by_statistic = {tr["statistic"]: tr for tr in own}
            if "mean" in by_statistic:
                mean = by_statistic["mean"]
                ax.plot(mean["steps"], mean["values"], color="C0", label="mean over heads")
            if "min" in by_statistic and "max" in by_statistic:
                low, high = by_statistic["min"], by_statistic["max"]
                steps = sorted(set(low["steps"]) & set(high["steps"]))
                low_at, high_at = dict(zip(low["steps"], low["values"])), dict(zip(high["steps"], high["values"]))
                ax.fill_between(
                    steps,
                    [low_at[s] for s in steps],
                    [high_at[s] for s in steps],
                    color="C0",
                    alpha=0.25,
                    label="min to max over heads",
                )
        ax.set_title(TITLES[attention])
        ax.set_xlabel("updates")
        ax.set_ylabel("alpha")
        ax.legend(fontsize=7)
    fig.suptitle(f"{model['name']}: alpha during training")
    return _save(fig, Path(output_dir) / f"alpha_trajectories_{file_label(model['name'])}.png")


def _grouped_bars(ax, models, attention, key, rows_key):
    width = 0.8 / len(models)
    for index, model in enumerate(models):
        rows = [r for r in model[rows_key] if r["attention"] == attention]
        layers = [r["layer"] for r in rows]
        values = [np.nan if r[key] is None else r[key] for r in rows]
        ax.bar(
            np.array(layers) + (index - (len(models) - 1) / 2) * width,
            values,
            width,
            label=f"{model['name']} ({model['normalizers'].get(attention, '?')})",
            color=f"C{index}",
        )
    ax.set_xlabel("layer")
    ax.set_xticks(sorted({r["layer"] for m in models for r in m[rows_key] if r["attention"] == attention}))


def density_layers(models, output_dir):
    """Per layer: average fraction (top) and number (bottom) of keys with nonzero weight,
    models side by side.

    Args:
        models: the models' entries of analysis.json (docs/analysis.md).
        output_dir: where the figure is written.

    Returns:
        The path of density_layers.png.
    """
    types = _types(models)
    fig, axes = plt.subplots(2, len(types), figsize=(4.5 * len(types), 6.5), squeeze=False, layout="constrained")
    for column, attention in enumerate(types):
        for row, (key, label) in enumerate(
            (("fraction", "fraction of keys attended"), ("count", "number of keys attended"))
        ):
            ax = axes[row][column]
            _grouped_bars(ax, models, attention, key, "density_layers")
            ax.set_title(TITLES[attention])
            ax.set_ylabel(label)
            if key == "fraction":
                ax.set_ylim(0, 1.05)
            ax.legend(fontsize=7)
    fig.suptitle("Attention density per layer (nonzero weights, padding excluded)")
    return _save(fig, Path(output_dir) / "density_layers.png")


def density_heads(model, output_dir):
    """Per head: average fraction of keys with nonzero weight, one heatmap per attention type.

    Args:
        model: one model's entry of analysis.json (report.py's schema, docs/analysis.md).
        output_dir: where the figure is written.

    Returns:
        The path of density_heads_<model>.png.
    """
    types = _types([model])
    fig, axes = plt.subplots(1, len(types), figsize=(4.5 * len(types), 3.5), squeeze=False, layout="constrained")
    for ax, attention in zip(axes[0], types):
        layers, heads = _shape(model, attention)
        grid = _grid(model["density"], attention, "fraction", layers, heads)
        _heatmap(
            ax,
            fig,
            grid,
            f"{TITLES[attention]}\n({model['normalizers'][attention]})",
            0.0,
            1.0,
            "fraction of keys attended",
        )
    fig.suptitle(f"{model['name']}: attention density per head")
    return _save(fig, Path(output_dir) / f"density_heads_{file_label(model['name'])}.png")


def js_layers(models, output_dir):
    """Head diversity (Jensen-Shannon divergence between heads) per layer, models side by side.

    Args:
        models: the models' entries of analysis.json (docs/analysis.md).
        output_dir: where the figure is written.

    Returns:
        The path of js_layers.png.
    """
    types = _types(models)
    fig, axes = plt.subplots(1, len(types), figsize=(4.5 * len(types), 3.5), squeeze=False, layout="constrained")
    for ax, attention in zip(axes[0], types):
        _grouped_bars(ax, models, attention, "js", "js")
        ax.set_title(TITLES[attention])
        ax.set_ylabel("JS divergence between heads")
        ax.set_ylim(0, 1.0)
        ax.legend(fontsize=7)
    fig.suptitle("Head diversity per layer (0: heads alike, 1: disjoint)")
    return _save(fig, Path(output_dir) / "js_layers.png")


def specialisation(model, output_dir):
    """Per head of the self-attentions: weight on the previous token, on the next token, and
    on the other pieces of the current word.

    Args:
        model: one model's entry of analysis.json (report.py's schema, docs/analysis.md).
        output_dir: where the figure is written.

    Returns:
        The path of specialisation_<model>.png, or None when the model has no self-attention.
    """
    types = [t for t in ("encoder_self", "decoder_self") if t in model["normalizers"]]
    if not types:
        return None
    scores = (
        ("previous", "positional", "weight on previous token"),
        ("next", "positional", "weight on next token"),
        ("mass", "bpe_merging", "weight on other pieces of the word"),
    )
    fig, axes = plt.subplots(
        len(types), len(scores), figsize=(4.5 * len(scores), 3.5 * len(types)), squeeze=False, layout="constrained"
    )
    for row, attention in enumerate(types):
        layers, heads = _shape(model, attention)
        for column, (key, rows_key, label) in enumerate(scores):
            grid = _grid(model[rows_key], attention, key, layers, heads)
            _heatmap(axes[row][column], fig, grid, f"{TITLES[attention]}:\n{label}", 0.0, 1.0, "average weight")
    fig.suptitle(f"{model['name']}: positional and BPE-merging heads (n/a: no such key, e.g. the future)")
    return _save(fig, Path(output_dir) / f"specialisation_{file_label(model['name'])}.png")


def attention_maps(model, maps, output_dir):
    """Each head's attention for the chosen sentence, one figure per attention type and layer.

    Args:
        model: one model's entry of analysis.json (docs/analysis.md).
        maps: the model's attention maps, as analyze_checkpoint returns them: "sentence_id"
            (None: no maps), "source_tokens", "target_tokens", and per (attention type, layer)
            an array of weights (heads, queries, keys).
        output_dir: where the figures are written.

    Returns:
        The paths of the attention_map_<model>_<type>_L<layer>.png written (a list, empty
        without a sentence).
    """
    if maps.get("sentence_id") is None:
        return []
    tokens = {
        "encoder_self": (maps["source_tokens"], maps["source_tokens"]),
        "decoder_self": (maps["target_tokens"], maps["target_tokens"]),
        "cross": (maps["target_tokens"], maps["source_tokens"]),
    }
    written = []
    for (attention, layer), weights in sorted(
        ((k, v) for k, v in maps.items() if isinstance(k, tuple)),
        key=lambda item: (ATTENTION_TYPES.index(item[0][0]), item[0][1]),
    ):
        query_tokens, key_tokens = tokens[attention]
        heads = weights.shape[0]
        columns = min(4, heads)
        rows = -(-heads // columns)
        size = 1.2 + 0.2 * max(len(query_tokens), len(key_tokens))
        fig, axes = plt.subplots(
            rows, columns, figsize=(columns * size + 1.5, rows * size + 0.8), squeeze=False, layout="constrained"
        )
        for head in range(rows * columns):
            ax = axes[head // columns][head % columns]
            if head >= heads:
                ax.axis("off")
                continue
            image = ax.imshow(weights[head], vmin=_SMALLEST_SHOWN, vmax=1.0, cmap=_NONZERO_CMAP)
            ax.set_title(f"head {head}", fontsize=9)
            # The heads share their tokens: only the outer panels have ticks and name them, which
            # is also what keeps drawing fast (the layout measures every tick).
            last_row = head + columns >= heads
            if last_row:
                ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=7)
            else:
                ax.set_xticks([])
            if head % columns == 0:
                ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=7)
            else:
                ax.set_yticks([])
            if last_row:
                ax.set_xlabel("key", fontsize=8)
            if head % columns == 0:
                ax.set_ylabel("query", fontsize=8)
        fig.colorbar(image, ax=axes.ravel().tolist(), label="attention weight (white: exactly 0)", shrink=0.8)
        fig.suptitle(
            f"{model['name']}: {TITLES[attention]}, layer {layer} "
            f"({model['normalizers'][attention]}), sentence {maps['sentence_id']}"
        )
        path = Path(output_dir) / f"attention_map_{file_label(model['name'])}_{attention}_L{layer}.png"
        written.append(_save(fig, path))
    return written


CURVE_LABELS = {
    "loss": "validation loss",
    "nll_loss": "validation NLL loss",
    "ppl": "validation perplexity",
    "accuracy": "validation accuracy",
}
LEARNING_CURVES_FIGSIZE, LEARNING_CURVES_DPI = (8, 3.5), 100  # an 800 x 350 pixel PNG


def mean_over_runs(runs, metric):
    """A metric averaged over runs, at the num_updates every run has a value for.

    Args:
        runs: validation curves, as read_validation_curve returns them.
        metric: a key of those curves ("loss", "ppl", "accuracy", ...).

    Returns:
        (steps, mean, low, high): lists, low and high the min and max over the runs; four
        empty lists when the runs share no step with a value.
    """
    per_run = [{s: v for s, v in zip(run["num_updates"], run.get(metric) or []) if v is not None} for run in runs]
    steps = sorted(set.intersection(*(set(points) for points in per_run))) if per_run else []
    if not steps:
        return [], [], [], []
    values = np.array([[points[s] for s in steps] for points in per_run], dtype=float)
    return steps, values.mean(0).tolist(), values.min(0).tolist(), values.max(0).tolist()


def plot_learning_curves(curves, path, metric="ppl"):
    """Validation learning curves. Per label, the mean over its runs at the num_updates all of
    them have, with the min-max band when there are several; `metric` in the first panel,
    accuracy in a second one when logged.

    Args:
        curves: {label (model or normalizer): list of curves, one per run or seed, as
            read_validation_curve returns them}.
        path: the PNG to write (8 x 3.5 inches at 100 dpi).
        metric: the first panel's metric (default perplexity, on a log axis).

    Returns:
        `path`, or None (nothing written) when no curve has `metric`.
    """
    panels = [metric] + (
        ["accuracy"]
        if metric != "accuracy" and any(run.get("accuracy") for runs in curves.values() for run in runs)
        else []
    )
    if not any(run.get(metric) for runs in curves.values() for run in runs):
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=LEARNING_CURVES_FIGSIZE, squeeze=False, layout="constrained")
    for ax, panel in zip(axes[0], panels):
        for index, (label, runs) in enumerate(curves.items()):
            steps, mean, low, high = mean_over_runs(runs, panel)
            color = f"C{index % 10}"
            if not steps:
                # Runs that validated at different updates have no mean: each is drawn on its
                # own, in the normalizer's colour, so that no normalizer is missing from the figure.
                name = label + (f" ({len(runs)} runs, each drawn)" if len(runs) > 1 else "")
                for run in runs:
                    points = [(s, v) for s, v in zip(run["num_updates"], run.get(panel) or []) if v is not None]
                    if points:
                        ax.plot(*zip(*points), color=color, linewidth=0.8, label=name)
                        name = None  # one legend entry per normalizer
                continue
            runs_note = f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
            ax.plot(steps, mean, color=color, marker="." if len(steps) < 30 else None, label=label + runs_note)
            if len(runs) > 1:
                ax.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
        if panel == "ppl":
            ax.set_yscale("log")
            # plain numbers (20, 30) on the ticks, not 2x10^1; minor ticks labelled on short ranges
            ax.yaxis.set_major_formatter(matplotlib.ticker.LogFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(minor_thresholds=(2, 0.5)))
        ax.set_xlabel("updates")
        ax.set_ylabel(CURVE_LABELS.get(panel, panel))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    title = "Validation learning curves"
    if any(len(runs) > 1 for runs in curves.values()):
        title += " (band: min to max over runs)"
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=LEARNING_CURVES_DPI)
    plt.close(fig)
    return path


def learning_curves(models, output_dir):
    """Learning curves of the models whose training log has validations, the runs of a normalizer
    (names that differ only by a -seed<N>/_seed<N> ending) averaged.

    Args:
        models: the models' entries of analysis.json (docs/analysis.md).
        output_dir: where the figure is written.

    Returns:
        The path of learning_curves.png, or None when no model's log has validations.
    """
    groups = group_by_normalizer((m["name"], m.get("validation_curve")) for m in models)
    if not groups:
        return None
    logger.info(
        "learning curves: %s",
        ", ".join(f"{label} ({len(runs)} run{'s' * (len(runs) > 1)})" for label, runs in groups.items()),
    )
    return plot_learning_curves(groups, Path(output_dir) / "learning_curves.png")


def write_figures(models, maps_per_model, output_dir):
    """All figures of the analysis.

    Args:
        models: the models' entries of analysis.json (docs/analysis.md).
        maps_per_model: each model's attention maps (see attention_maps), in the same order.
        output_dir: where the figures are written.

    Returns:
        The paths written, a list.
    """
    written = [
        alpha_histogram(models, output_dir),
        density_layers(models, output_dir),
        js_layers(models, output_dir),
        learning_curves(models, output_dir),
    ]
    for model, maps in zip(models, maps_per_model):
        written += [
            alpha_heatmap(model, output_dir),
            alpha_trajectories(model, output_dir),
            density_heads(model, output_dir),
            specialisation(model, output_dir),
        ]
        written += attention_maps(model, maps, output_dir)
    return [p for p in written if p is not None]
