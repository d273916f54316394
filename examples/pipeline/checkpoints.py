"""The checkpoint of a finished run to evaluate: the last, the best, or the average of the
last n (checkpoints are read through fairseq_entmax's safe loader)."""

import re
from pathlib import Path

from .tools import PipelineError, log


def _checkpoint_order(path):
    """Sort key of fairseq's checkpoint names: checkpoint{epoch}.pt, checkpoint_{epoch}_{update}.pt."""
    numbers = [int(n) for n in re.findall(r"\d+", path.stem)]
    return numbers[-1] if numbers else -1


def _load(path):
    """A checkpoint's state, read with torch's safe unpickler and the allowlist of fairseq's
    checkpoint types: a checkpoint holding anything else raises PipelineError (the refusal's
    line, exit status 2) and nothing of it runs."""
    from fairseq_entmax.repairs.checkpoint_safety import UnsafeCheckpointError, load_checkpoint_safely

    try:
        return load_checkpoint_safely(path, map_location="cpu")
    except UnsafeCheckpointError as error:
        raise PipelineError(str(error)) from error


def _num_updates(path):
    return _load(path)["optimizer_history"][-1]["num_updates"]


def last_checkpoints(save_dir, n):
    """The most recent states of a run: its numbered checkpoints (update-interval ones if
    there are any), plus checkpoint_last.pt when training stopped (at --max-update) after the
    last numbered one was written, which is the usual case.

    Args:
        save_dir: the run's --save-dir.
        n: how many states.

    Returns:
        The paths of the last n of those states (fewer if the run has fewer), oldest first.
    """
    save_dir = Path(save_dir)
    by_update = sorted(save_dir.glob("checkpoint_*_*.pt"), key=_checkpoint_order)
    by_epoch = sorted(
        (p for p in save_dir.glob("checkpoint*.pt") if re.fullmatch(r"checkpoint\d+", p.stem)), key=_checkpoint_order
    )
    numbered = by_update or by_epoch
    last = save_dir / "checkpoint_last.pt"
    if last.exists() and (not numbered or _num_updates(last) > _num_updates(numbered[-1])):
        numbered = numbered + [last]
    return numbered[-n:]


def average_checkpoints(paths, out_path):
    """Average the model parameters of several checkpoints of one run (fairseq's
    scripts/average_checkpoints.py is not installed by pip). Everything but the parameters
    (config, optimizer history) is taken from the last checkpoint.

    Args:
        paths: the checkpoints, the last one last.
        out_path: where the averaged checkpoint is written.

    Raises:
        PipelineError: a checkpoint holds a pickled object outside fairseq's checkpoint types
            (nothing of it ran).
    """
    from fairseq import checkpoint_utils

    summed, last = None, None
    for path in paths:
        state = _load(path)
        params = state["model"]
        if summed is None:
            summed = {k: v.double() if v.is_floating_point() else v for k, v in params.items()}
        else:
            for k, v in params.items():
                if v.is_floating_point():
                    summed[k] = summed[k] + v.double()
        last = state
    for k, v in last["model"].items():
        last["model"][k] = (summed[k] / len(paths)).to(v.dtype) if v.is_floating_point() else v
    checkpoint_utils.torch_persistent_save(last, str(out_path))


def averaged_checkpoint(save_dir, n, label):
    """The average of the last states of a finished run (made once).

    Args:
        save_dir: the run's --save-dir.
        n: how many states to average (last_checkpoints).
        label: the run's name in progress lines.

    Returns:
        The path of checkpoint_avg{n}.pt; checkpoint_last.pt's when the run has a single
        state to average.
    """
    save_dir = Path(save_dir)
    out = save_dir / f"checkpoint_avg{n}.pt"
    if out.exists():
        return out
    paths = last_checkpoints(save_dir, n)
    if len(paths) < 2:
        log(f"{label}: a single checkpoint, nothing to average: using checkpoint_last.pt")
        return save_dir / "checkpoint_last.pt"
    log(f"{label}: averaging {', '.join(p.name for p in paths)}")
    average_checkpoints(paths, out)
    return out


def select_checkpoint(save_dir, select, n, label):
    """The checkpoint of a finished run to evaluate.

    Args:
        save_dir: the run's --save-dir.
        select: "last" (checkpoint_last.pt), "best" (checkpoint_best.pt: the best validation
            metric fairseq saw, see TrainSettings.best_metric) or "average" (the parameters
            of the last n checkpoints averaged).
        n: with "average", how many checkpoints.
        label: the run's name in progress lines.

    Returns:
        The checkpoint's path.

    Raises:
        PipelineError: `select` is none of the three.
    """
    save_dir = Path(save_dir)
    if select == "average":
        return averaged_checkpoint(save_dir, n, label)
    if select not in ("last", "best"):
        raise PipelineError(f"unknown checkpoint selection {select!r}: last, best or average")
    return save_dir / f"checkpoint_{select}.pt"
