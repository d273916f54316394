"""The options of the normalizer modules, their defaults and their checks, in one place.

`NormalizerConfig` holds the options `build_normalizer` takes, with their defaults, and checks
them once, when it is made. The fairseq options (fairseq_entmax.options) and the Hugging Face
`sparsify` read their defaults and their checks from here; each check says what is allowed in
words the command line and Python both read ("allowed values are integers >= 1, got 0").
"""

import dataclasses
import math


def check_number_in_interval(value, low, high, *, low_open=False, high_open=False):
    """A number in an interval, e.g. (0, 1] with low_open=True.

    Args:
        value: the number or its text.
        low, high: the interval's ends, written as given in the error message (0, not 0.0).
        low_open, high_open: whether the interval leaves out that end (closed by default).

    Returns:
        The number as a float.

    Raises:
        ValueError: for anything that is not a number in the interval (NaN and infinities
            included), saying what is allowed, e.g. "allowed values are numbers in (0, 1], got '1.5'".
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    above_low = low < number if low_open else low <= number
    below_high = number < high if high_open else number <= high
    if not (above_low and below_high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"allowed values are numbers in {interval}, got {value!r}")
    return number


def check_integer(value, minimum):
    """An integer of at least `minimum`, given as an int or its text (not 2.5, not "2.0").

    Raises:
        ValueError: for anything else, saying what is allowed.
    """
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = minimum - 1
    if number < minimum or str(number) != str(value).strip():
        raise ValueError(f"allowed values are integers >= {minimum}, got {value!r}")
    return number


def check_alpha_init(value):
    """Learned alpha-entmax's initial alpha: "random" (alpha = 1 + sigmoid(a), a ~ N(0, 1)) or
    the alpha every head starts at, a number in (1, 2] (or its text).

    Returns:
        "random" or the alpha as a float.

    Raises:
        ValueError: for anything else, saying what is allowed.
    """
    if str(value).strip().lower() == "random":
        return "random"
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 1.0 < number <= 2.0:
        raise ValueError(f"allowed values are 'random' or a number in (1, 2], got {value!r}")
    return number


def check_alpha_clamp(value):
    """Learned alpha-entmax's clamp: "MIN,MAX", or a (MIN, MAX) pair as a checkpoint's config
    holds it, with 1 <= MIN < MAX <= 2.

    Returns:
        (MIN, MAX) as floats.

    Raises:
        ValueError: for anything else, saying what is allowed.
    """
    parts = list(value) if isinstance(value, (tuple, list)) else str(value).split(",")
    try:
        low, high = (float(part) for part in parts)
    except (TypeError, ValueError):
        low = high = math.nan
    if not 1.0 <= low < high <= 2.0:
        raise ValueError(f"expected MIN,MAX with 1 <= MIN < MAX <= 2 (default 1.01,2), got {value!r}")
    return (low, high)


def check_alpha_warmup_updates(value):
    """The updates of learned alpha's warm-up from softmax: an integer >= 0."""
    return check_integer(value, minimum=0)


def check_topk(value):
    """Top-k's k, or its minimum with a fraction: an integer >= 1."""
    return check_integer(value, minimum=1)


def check_topk_fraction(value):
    """Top-k's fraction of the visible keys: None (a fixed k) or a number in (0, 1]."""
    return None if value is None else check_number_in_interval(value, 0, 1, low_open=True)


class NormalizerOptionError(ValueError):
    """A bad option value of NormalizerConfig: "OPTION: what is allowed, got VALUE".

    Attributes:
        option: the option's name (alpha_init, ...), for callers that name it their own way
            (fairseq's --alpha-init).
        reason: what is wrong, without the option's name.
    """

    def __init__(self, option, reason):
        super().__init__(f"{option}: {reason}")
        self.option = option
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class NormalizerConfig:
    """The options of the normalizer modules, checked and normalised when made.

    Attributes:
        alpha_init: learned alpha-entmax's initial alpha, "random" or a number in (1, 2]
            inside alpha_clamp.
        alpha_clamp: (MIN, MAX), 1 <= MIN < MAX <= 2: the range of the learned alphas.
        alpha_warmup_updates: updates over which each head's alpha rises from 1 (softmax) to
            its learned alpha; 0 for none.
        topk: top-k's keys per query.
        topk_fraction: top-k keeps max(topk_min, ceil(fraction * visible keys)) instead of
            topk; None for a fixed k.
        topk_min: top-k's minimum with a fraction.

    Raises:
        NormalizerOptionError (a ValueError): naming the option and what is allowed, for a bad
            value, and for a numeric alpha_init outside alpha_clamp (a head there would sit at
            the bound, where the clamp passes no gradient, and never learn its alpha).
        TypeError: for an option it does not have.
    """

    alpha_init: object = "random"
    alpha_clamp: tuple = (1.01, 2.0)
    alpha_warmup_updates: int = 0
    topk: int = 8
    topk_fraction: object = None
    topk_min: int = 1

    def __post_init__(self):
        for name, check in CHECKS.items():
            try:
                object.__setattr__(self, name, check(getattr(self, name)))
            except ValueError as error:
                raise NormalizerOptionError(name, str(error)) from None
        low, high = self.alpha_clamp
        if self.alpha_init != "random" and not low <= self.alpha_init <= high:
            raise NormalizerOptionError(
                "alpha_init",
                f"{self.alpha_init} is outside alpha_clamp ({low}, {high}): every head would stay at the bound "
                f"and never learn its alpha; choose an alpha_init in [{low}, {high}]",
            )

    @classmethod
    def option_names(cls):
        """The options' names, in their order: alpha_init, alpha_clamp, ..."""
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_options(cls, options):
        """The config of {option: value} for some of the options (the rest take their defaults).

        Raises:
            ValueError: as the constructor does.
            TypeError: for an option it does not have, listing the known ones.
        """
        unknown = sorted(set(options) - set(cls.option_names()))
        if unknown:
            raise TypeError(f"unknown option {', '.join(unknown)}; known options: {', '.join(cls.option_names())}")
        return cls(**options)


# Each option's check, in the order of the fields.
CHECKS = {
    "alpha_init": check_alpha_init,
    "alpha_clamp": check_alpha_clamp,
    "alpha_warmup_updates": check_alpha_warmup_updates,
    "topk": check_topk,
    "topk_fraction": check_topk_fraction,
    "topk_min": check_topk,
}
# The defaults, written once (in the fields above).
DEFAULTS = {field.name: field.default for field in dataclasses.fields(NormalizerConfig)}
