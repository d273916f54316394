"""Alpha trajectories over training, read from what fairseq-train wrote.

Two sources, as the fairseq layer logs them (names from fairseq_entmax.names):
- the training log (fairseq's log lines in `simple` or `json` format, e.g. from --log-file or
  a saved stdout): `alpha_<type>_mean`, `alpha_<type>_min`, `alpha_<type>_max` per logged step;
- a --tensorboard-logdir: the same plus per-head scalars `alpha_<type>_L<layer>_H<head>`.

Each trajectory is a dict {attention, statistic, layer, head, steps, values}: statistic is
"mean", "min", "max" or "head" (then layer and head are set, else they are None); steps are
num_updates.

The same sources give the validation learning curve (read_validation_curve): loss, nll_loss,
ppl and accuracy of each end-of-validation summary, per num_updates.
"""

import json
import logging
import re
from pathlib import Path

from fairseq_entmax.names import ALPHA_STATISTICS, ATTENTION_TYPES, parse_alpha_metric_name

logger = logging.getLogger(__name__)

# What fairseq's console logging puts before a message: "2024-01-01 12:00:00 | INFO | train_inner | ".
# Its --log-file gets the bare message, so the stats' kind is told from the message itself.
_LOGGING_PREFIX = re.compile(r"^.*?\| [A-Z]+ \| [\w.]+ \| ")
# simple format, every --log-interval updates: "epoch 001:     10 / 20 loss=3.2, ..., num_updates=10"
_SIMPLE_INNER = re.compile(r"^epoch \d+:\s+\d+ / \d+ (.*)$")
# Kinds of stats lines, most frequent first: one kind is enough, the others repeat the same alphas.
_TAGS = ("train_inner", "train", "valid")


def _payload(line):
    """(the message of a fairseq log line without the logging prefix, its stats when the
    message is a json object, else None)."""
    line = line.strip()
    prefix = _LOGGING_PREFIX.match(line)
    payload = line[prefix.end() :] if prefix else line
    if not payload.startswith("{"):
        return payload, None
    try:
        return payload, json.loads(payload)
    except json.JSONDecodeError:
        return payload, None


def stats_of_line(line):
    """The statistics of one fairseq log line. Reads the simple and the json format, with or
    without the logging prefix.

    Args:
        line: a line of fairseq-train's output or --log-file.

    Returns:
        (kind, {name: value as logged}), kind being train_inner (every --log-interval updates),
        train or valid (end of epoch); None for a line that holds no statistics.
    """
    payload, stats = _payload(line)
    if payload.startswith("{"):
        if stats is None:
            return None
        # end-of-epoch json lines prefix every key with train_ / valid_
        for tag in ("train", "valid"):
            if f"{tag}_num_updates" in stats:
                return tag, {k[len(tag) + 1 :] if k.startswith(tag + "_") else k: v for k, v in stats.items()}
        return "train_inner", stats
    inner = _SIMPLE_INNER.match(payload)
    if inner:
        return "train_inner", dict(re.findall(r"([\w./-]+)=([^,\s]+)", inner.group(1)))
    if payload.startswith("epoch ") and " | " in payload:  # "epoch 001 | loss 3.2 | ..." (end of epoch)
        parts = payload.split(" | ")[1:]
        tag = "valid" if parts and parts[0].startswith("valid on") else "train"
        return tag, {key: value for key, _, value in (part.strip().partition(" ") for part in parts)}
    return None


def _to_float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _collect(records):
    """records: iterable of (step, key, value) -> list of trajectories sorted by key."""
    series = {}
    for step, key, value in records:
        parsed = parse_alpha_metric_name(key)
        if parsed is None or value is None or step is None:
            continue
        series.setdefault(parsed, {})[step] = value  # a later line for the same step wins
    trajectories = []
    order = {name: i for i, name in enumerate(ATTENTION_TYPES + ALPHA_STATISTICS + ("head",))}
    for (attention, statistic, layer, head), points in sorted(
        series.items(),
        key=lambda item: (order[item[0][0]], order[item[0][1]], item[0][2] or 0, item[0][3] or 0),
    ):
        steps = sorted(points)
        trajectories.append(
            dict(
                attention=attention,
                statistic=statistic,
                layer=layer,
                head=head,
                steps=steps,
                values=[points[s] for s in steps],
            )
        )
    return trajectories


def read_log_file(path):
    """Alpha trajectories from a fairseq training log file.

    Args:
        path: the log (fairseq-train's output, simple, tqdm or json format); its train_inner,
            train and valid lines are read, the first of those that has alpha metrics wins.

    Returns:
        The trajectories (see the module's docstring), [] when no line has alpha metrics.
    """
    by_tag = {tag: [] for tag in _TAGS}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parsed = stats_of_line(line) if "alpha_" in line else None
            if parsed is None:
                continue
            tag, stats = parsed
            step = _to_float(stats.get("num_updates"))
            for key, value in stats.items():
                by_tag[tag].append((None if step is None else int(step), key, _to_float(value)))
    for tag in _TAGS:
        trajectories = _collect(by_tag[tag])
        if trajectories:
            return trajectories
    return []


def read_tensorboard(logdir):
    """Alpha trajectories from a fairseq --tensorboard-logdir.

    Args:
        logdir: the --tensorboard-logdir; its train_inner, train and valid runs are read, the
            first that has alpha metrics wins.

    Returns:
        The trajectories (see the module's docstring), [] when no run has alpha metrics.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = Path(logdir)
    for tag in _TAGS:
        run_dir = logdir / tag
        if not run_dir.is_dir():
            continue
        accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        accumulator.Reload()
        records = [
            (event.step, key, float(event.value))
            for key in accumulator.Tags().get("scalars", [])
            if parse_alpha_metric_name(key) is not None
            for event in accumulator.Scalars(key)
        ]
        trajectories = _collect(records)
        if trajectories:
            return trajectories
    return []


def read_trajectories(path):
    """Alpha trajectories from a log file or a tensorboard log directory.

    Args:
        path: a fairseq training log file, or a --tensorboard-logdir.

    Returns:
        The trajectories (see the module's docstring), [] when the log has none (a model
        without learned alpha logs none).

    Raises:
        FileNotFoundError: `path` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training log {path} does not exist")
    trajectories = read_tensorboard(path) if path.is_dir() else read_log_file(path)
    if not trajectories:
        logger.info("no alpha_<type>_* values in %s (a model without learned alpha logs none)", path)
    return trajectories


# What a validation summary holds that the learning curve keeps, in this order.
CURVE_METRICS = ("loss", "nll_loss", "ppl", "accuracy")
# simple/tqdm format: "epoch 001 | valid on 'valid' subset | loss 5.1 | ... | num_updates 500 | ..."
_SIMPLE_VALID = re.compile(r"^epoch \d+ \| valid on '([^']*)' subset \| (.*)$")


def _validation_stats(line, subset):
    """The stats of an end-of-validation line of `subset`, keys without the json format's
    "<subset>_" prefix; None for other lines (and other subsets)."""
    payload, stats = _payload(line)
    if payload.startswith("{"):
        tag = subset + "_"
        if not isinstance(stats, dict) or tag + "num_updates" not in stats:
            return None
        return {k[len(tag) :]: v for k, v in stats.items() if k.startswith(tag)}
    match = _SIMPLE_VALID.match(payload)
    if match is None or match.group(1) != subset:
        return None
    return {key: value for key, _, value in (part.strip().partition(" ") for part in match.group(2).split(" | "))}


def _curve(points):
    """{num_updates: {metric: value}} -> the curve dict, sorted by num_updates."""
    steps = sorted(points)
    curve = {"num_updates": steps}
    for metric in CURVE_METRICS:
        if any(metric in points[step] for step in steps):
            # a metric missing at some step (a log format change mid-run) reads None there
            curve[metric] = [points[step].get(metric) for step in steps]
    return curve if steps else {}


def _read_validation_file(path, subset):
    points = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "num_updates" not in line:
                continue
            stats = _validation_stats(line, subset)
            step = None if stats is None else _to_float(stats.get("num_updates"))
            if step is None:
                continue
            values = {m: _to_float(stats[m]) for m in CURVE_METRICS if m in stats}
            # a resumed run repeats validations: the later line for the same step wins
            points[int(step)] = {m: v for m, v in values.items() if v is not None}
    return points


def _read_validation_tensorboard(logdir, subset):
    """The `subset` run of a --tensorboard-logdir: fairseq writes each validation's scalars
    (loss, nll_loss, ppl, accuracy, ...) there with step num_updates."""
    run_dir = Path(logdir) / subset
    if not run_dir.is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    points = {}
    scalars = accumulator.Tags().get("scalars", [])
    for metric in CURVE_METRICS:
        if metric not in scalars:
            continue
        # events in the order written: a resumed run's repeated step overwrites the earlier one
        for event in sorted(accumulator.Scalars(metric), key=lambda e: e.wall_time):
            points.setdefault(int(event.step), {})[metric] = float(event.value)
    return points


def read_validation_curve(path, subset="valid"):
    """Validation learning curve from a fairseq training log.

    Args:
        path: a fairseq training log file (simple, tqdm or json format, with or without the
            logging prefix) or a --tensorboard-logdir (its `subset` run is read).
        subset: the validation subset.

    Returns:
        {"num_updates": [...], "loss": [...], "nll_loss": [...], "ppl": [...], "accuracy":
        [...]}, sorted by num_updates, a metric's key present only when the log has it
        (accuracy needs the criterion's --report-accuracy); a later validation of the same
        num_updates (a resumed run) replaces the earlier one. {} when the log has no
        validation of `subset`.

    Raises:
        FileNotFoundError: `path` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training log {path} does not exist")
    points = _read_validation_tensorboard(path, subset) if path.is_dir() else _read_validation_file(path, subset)
    return _curve(points)


_SEED_SUFFIX = re.compile(r"[-_]seed\d+$")


def normalizer_name(name):
    """The normalizer a model's runs share.

    Args:
        name: a model's name.

    Returns:
        The name without a trailing -seed<N> or _seed<N> (the name itself if that leaves nothing).
    """
    return _SEED_SUFFIX.sub("", name) or name


def group_by_normalizer(named_curves):
    """The validation curves of several runs, grouped by normalizer.

    Args:
        named_curves: (name, curve) pairs, each curve as read_validation_curve returns it.

    Returns:
        {normalizer_name(name): [curve, ...]}, normalizers in order of first appearance; empty
        curves (no validation logged) are left out.
    """
    groups = {}
    for name, curve in named_curves:
        if curve and curve.get("num_updates"):
            groups.setdefault(normalizer_name(name), []).append(curve)
    return groups
