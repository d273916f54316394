"""Building blocks of the command-line parsers (argparse `type=` functions) of the model's
options (options.py) and of the criterion (criterions/entmax_loss.py).

This module imports neither fairseq nor the model, so that the criterion can use it without
the model's options. Its functions raise argparse.ArgumentTypeError, which argparse reports as
"argument --OPTION: <message>".
"""

import argparse
import math


def parse_number_in_interval(text, low, high, *, low_open=False, high_open=False):
    """Parse a number in an interval, e.g. (0, 1] with low_open=True.

    Args:
        text: the number or its text.
        low, high: the interval's ends, written as given in the error message (0, not 0.0).
        low_open, high_open: whether the interval leaves out that end (closed by default).

    Returns:
        The number as a float.

    Raises:
        argparse.ArgumentTypeError: for text that is not a number in the interval (NaN and
            infinities included), saying what is allowed, e.g.
            "allowed values are numbers in (0, 1], got '1.5'".
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    above_low = low < value if low_open else low <= value
    below_high = value < high if high_open else value <= high
    if not (above_low and below_high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise argparse.ArgumentTypeError(f"allowed values are numbers in {interval}, got {text!r}")
    return value
