"""Shared input handling for the normalizers: validation, dtype, masked rows."""
import torch

# Half-precision inputs are normalised in float32 (exponents, powers and cumulative sums
# lose too much in 16 bits) and the result is cast back to the input dtype.
_UPCAST = (torch.float16, torch.bfloat16)


def check_scores(scores, dim, name):
    """Raise a clear error unless `scores` is a floating tensor and `dim` one of its dims."""
    if not torch.is_tensor(scores):
        raise TypeError(f"{name}: scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(
            f"{name}: scores must be a floating point tensor (float16, bfloat16, float32 "
            f"or float64), got {scores.dtype}; convert with scores.float()"
        )
    if scores.dim() == 0:
        raise ValueError(f"{name}: scores must have at least one dimension, got a scalar")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(
            f"{name}: dim={dim} is out of range for scores of shape {tuple(scores.shape)} "
            f"(allowed: {-scores.dim()} to {scores.dim() - 1})"
        )


def compute_dtype(dtype):
    """The dtype the computation runs in for inputs of `dtype`."""
    return torch.float32 if dtype in _UPCAST else dtype


def shift_by_row_max(x):
    """Subtract each row's maximum along the last dim (so the maximum becomes 0).

    Returns (shifted, valid) where `valid` (keepdim, bool) is False for rows that are
    entirely -inf (fully masked): they are replaced by rows of zeros so that no NaN
    appears, and the caller gives such rows zero weight.
    """
    row_max = x.amax(dim=-1, keepdim=True)
    valid = row_max > float("-inf")
    shifted = x - row_max
    if not bool(valid.all()):
        shifted.masked_fill_(~valid, 0.0)
    return shifted, valid
