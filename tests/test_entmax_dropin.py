"""fairseq_entmax.entmax, the drop-in for the entmax package: what the package's own test suite
(tests/test_entmax_package_suite.py) does not check.

The package's names and signatures; agreement with the installed package (1.3) on random inputs,
values and gradients, for every function; alpha < 1 against a float64 bisection written here; and
the normalizers' properties through the drop-in's API: -inf masks and rows of -inf only (no NaN),
half precision, gradcheck.
"""

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.autograd import gradcheck

from fairseq_entmax import entmax as dropin
from fairseq_entmax.entmax import activations, losses, root_finding

try:
    import entmax
except ImportError:
    entmax = None
requires_entmax = pytest.mark.requires(
    entmax is not None, "the entmax package (test extra, `make setup`) is not installed"
)


def _scores(shape, seed, dtype=torch.float64, scale=2.0):
    torch.manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64).mul_(scale).to(dtype)


def _value_and_grads(fn, x, *params):
    """fn(x, *params), and the gradients of <fn, upstream> w.r.t. x and the tensor params."""
    x = x.detach().clone().requires_grad_()
    params = [
        p.detach().clone().requires_grad_() if torch.is_tensor(p) and p.is_floating_point() else p for p in params
    ]
    out = fn(x, *params)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(out.dtype)
    inputs = [x] + [p for p in params if torch.is_tensor(p) and p.requires_grad]
    return [out.detach()] + list(torch.autograd.grad(out, inputs, upstream))


def _assert_same(mine, reference, atol):
    for ours, theirs in zip(mine, reference):
        torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)


def _below_one_reference(z, alpha, iterations=200):
    """alpha-entmax for alpha < 1 along the last dim, by float64 bisection on c in [1, d^b]
    (b = 1 - alpha): p_i = (c + b w_i)^(-1/b) with w = max(z) - z, sum(p) = 1."""
    z = z.double()
    b = 1.0 - alpha
    w = z.max(dim=-1, keepdim=True).values - z
    lo = torch.ones_like(w[..., :1])
    hi = torch.full_like(lo, z.shape[-1] ** b)
    for _ in range(iterations):
        c = (lo + hi) / 2
        above = ((c + b * w) ** (-1.0 / b)).sum(dim=-1, keepdim=True) > 1
        lo, hi = torch.where(above, c, lo), torch.where(above, hi, c)
    p = ((lo + hi) / 2 + b * w) ** (-1.0 / b)
    return p / p.sum(dim=-1, keepdim=True)


# -- the package's interface ----------------------------------------------------------------------

PACKAGE_NAMES = {
    "activations": ["sparsemax", "entmax15", "Sparsemax", "Entmax15"],
    "root_finding": [
        "entmax_bisect",
        "sparsemax_bisect",
        "normmax_bisect",
        "budget_bisect",
        "EntmaxBisect",
        "SparsemaxBisect",
        "NormmaxBisect",
        "BudgetBisect",
    ],
    "losses": [
        "sparsemax_loss",
        "entmax15_loss",
        "sparsemax_bisect_loss",
        "entmax_bisect_loss",
        "normmax_bisect_loss",
        "SparsemaxLoss",
        "Entmax15Loss",
        "SparsemaxBisectLoss",
        "EntmaxBisectLoss",
        "NormmaxBisectLoss",
    ],
}


def _parameters(obj):
    return list(inspect.signature(obj).parameters.items())


@requires_entmax
@pytest.mark.parametrize("module", sorted(PACKAGE_NAMES))
def test_names_and_signatures_are_the_packages(module):
    """Every public name of the package's three modules, with its parameters in the same order and
    with the same defaults; master's return_support_size (not in 1.3) where master has it."""
    package_module = getattr(entmax, module)
    for name in PACKAGE_NAMES[module]:
        assert getattr(dropin, name) is getattr(getattr(dropin, module), name)
        theirs = _parameters(getattr(package_module, name))
        ours = _parameters(getattr(dropin, name))
        assert [(n, p.default) for n, p in ours[: len(theirs)]] == [(n, p.default) for n, p in theirs], name
        assert [n for n, _ in ours[len(theirs) :]] in ([], ["return_support_size"]), name
    for name in ("sparsemax", "entmax15", "Sparsemax", "Entmax15", "sparsemax_loss", "entmax15_loss"):
        if hasattr(dropin, name) and name in PACKAGE_NAMES[module]:
            assert "return_support_size" in dict(_parameters(getattr(dropin, name))), name
    assert callable(activations._sparsemax_threshold_and_support)
    assert callable(activations._entmax_threshold_and_support)


@pytest.mark.slow  # a fresh Python imports torch
def test_importing_the_dropin_imports_no_fairseq():
    code = "import sys\nfrom fairseq_entmax import entmax\nprint(sorted({m.split('.')[0] for m in sys.modules}))"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert "torch" in loaded and "fairseq" not in loaded


def test_the_dropin_imports_only_torch_and_this_packages_core():
    """So that it loads without fairseq: its modules import the standard library, torch,
    fairseq_entmax.normalizers and .losses (the torch-only core) and each other (checked on
    their source)."""
    allowed = ("torch", "fairseq_entmax.normalizers", "fairseq_entmax.losses", "fairseq_entmax.entmax")
    standard = {"collections.abc", "functools", "inspect", "math", "numbers", "typing"}
    for path in Path(dropin.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module + ("." + node.names[0].name if node.module == "fairseq_entmax" else "")]
            else:
                continue
            for name in names:
                assert name in standard or name.startswith(allowed), f"{path.name} imports {name}"


# -- agreement with the installed package ---------------------------------------------------------

SHAPES_AND_DIMS = [((5, 7), -1), ((3, 4, 9), 1), ((6, 33), 0)]


def _per_row_alpha(shape, dim, low, high, seed):
    alpha_shape = list(shape)
    alpha_shape[dim] = 1
    return low + (high - low) * torch.rand(
        alpha_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


MAPS = {
    "sparsemax": (lambda m, x, dim: m.sparsemax(x, dim=dim), ()),
    "sparsemax k=2": (lambda m, x, dim: m.sparsemax(x, dim=dim, k=2), ()),
    "entmax15": (lambda m, x, dim: m.entmax15(x, dim=dim), ()),
    "entmax15 k=2": (lambda m, x, dim: m.entmax15(x, dim=dim, k=2), ()),
    "Sparsemax": (lambda m, x, dim: m.Sparsemax(dim=dim, k=3)(x), ()),
    "Entmax15": (lambda m, x, dim: m.Entmax15(dim=dim, k=3)(x), ()),
    "sparsemax_bisect": (lambda m, x, dim: m.sparsemax_bisect(x, dim=dim), ()),
    "SparsemaxBisect": (lambda m, x, dim: m.SparsemaxBisect(dim=dim)(x), ()),
    "entmax_bisect 0.5": (lambda m, x, dim: m.entmax_bisect(x, 0.5, dim=dim), ()),
    "entmax_bisect 1.25": (lambda m, x, dim: m.entmax_bisect(x, 1.25, dim=dim), ()),
    "entmax_bisect 2.5": (lambda m, x, dim: m.entmax_bisect(x, 2.5, dim=dim), ()),
    "EntmaxBisect 1.75": (lambda m, x, dim: m.EntmaxBisect(1.75, dim=dim)(x), ()),
    "normmax_bisect 2": (lambda m, x, dim: m.normmax_bisect(x, 2, dim=dim), ()),
    "normmax_bisect 1.5": (lambda m, x, dim: m.normmax_bisect(x, 1.5, dim=dim), ()),
    "NormmaxBisect 4": (lambda m, x, dim: m.NormmaxBisect(4.0, dim=dim)(x), ()),
    "budget_bisect 2": (lambda m, x, dim: m.budget_bisect(x, 2, dim=dim), ()),
    "BudgetBisect 3.5": (lambda m, x, dim: m.BudgetBisect(3.5, dim=dim)(x), ()),
}


@requires_entmax
@pytest.mark.parametrize("shape, dim", SHAPES_AND_DIMS, ids=str)
@pytest.mark.parametrize("name", sorted(MAPS))
def test_maps_agree_with_the_package(name, shape, dim):
    """Values and gradients in float64 (the package's 50 bisection steps are exact there)."""
    fn, _ = MAPS[name]
    for seed in range(2):
        x = _scores(shape, seed)
        mine = _value_and_grads(lambda x: fn(dropin, x, dim), x)
        reference = _value_and_grads(lambda x: fn(entmax, x, dim), x)
        _assert_same(mine, reference, atol=1e-9)


@requires_entmax
@pytest.mark.parametrize("shape, dim", SHAPES_AND_DIMS, ids=str)
@pytest.mark.parametrize("low, high", [(0.1, 0.9), (0.05, 2.6), (1.1, 3.0)], ids=["below 1", "both sides", "above 1"])
def test_entmax_bisect_with_alpha_per_row_agrees_with_the_package(shape, dim, low, high):
    """Values and gradients w.r.t. the scores and alpha."""
    x = _scores(shape, 3)
    alpha = _per_row_alpha(shape, dim, low, high, seed=4)
    mine = _value_and_grads(lambda x, a: dropin.entmax_bisect(x, a, dim=dim), x, alpha)
    reference = _value_and_grads(lambda x, a: entmax.entmax_bisect(x, a, dim=dim), x, alpha)
    _assert_same(mine, reference, atol=1e-8)


@requires_entmax
def test_normmax_and_budget_with_parameters_per_row_agree_with_the_package():
    x = _scores((6, 9), 5)
    alpha = torch.linspace(1.2, 6.0, 6, dtype=torch.float64).unsqueeze(1)
    budget = torch.linspace(0.5, 5.0, 6, dtype=torch.float64).unsqueeze(1)
    # (the parameters as constants: neither package differentiates w.r.t. them)
    for ours, theirs in (
        (lambda x: dropin.normmax_bisect(x, alpha), lambda x: entmax.normmax_bisect(x, alpha)),
        (lambda x: dropin.budget_bisect(x, budget), lambda x: entmax.budget_bisect(x, budget)),
    ):
        _assert_same(_value_and_grads(ours, x), _value_and_grads(theirs, x), atol=1e-9)


@requires_entmax
@pytest.mark.parametrize("which", ["sparsemax", "entmax"])
def test_threshold_functions_agree_with_the_package(which):
    name = f"_{which}_threshold_and_support"
    for dim in (0, 1, 2):
        x = _scores((3, 4, 5), dim)
        tau, support = getattr(activations, name)(x, dim=dim, k=2)
        tau_ref, support_ref = getattr(entmax.activations, name)(x, dim=dim)
        torch.testing.assert_close(tau, tau_ref, atol=1e-12, rtol=0)
        assert torch.equal(support, support_ref)


def _package_support(p, dim):
    return (p > 0).sum(dim=dim, keepdim=True)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_return_support_size_counts_the_nonzeros(name):
    """master's return_support_size: (P, support), support int64 with 1 along dim."""
    x = _scores((4, 3, 12), 6)
    p, support = getattr(dropin, name)(x, dim=1, return_support_size=True)
    assert support.dtype == torch.int64 and torch.equal(support, _package_support(p, 1))
    module = getattr(dropin, name.capitalize() if name == "sparsemax" else "Entmax15")
    p2, support2 = module(dim=1, return_support_size=True)(x)
    assert torch.equal(p2, p) and torch.equal(support2, support)


LOSSES = {
    "SparsemaxLoss": {},
    "Entmax15Loss": {},
    "SparsemaxBisectLoss": {},
    "EntmaxBisectLoss": {},
    "EntmaxBisectLoss 0.5": {"alpha": 0.5},
    "EntmaxBisectLoss 2.5": {"alpha": 2.5},
    "NormmaxBisectLoss": {},
    "NormmaxBisectLoss 3": {"alpha": 3.0},
}


@requires_entmax
@pytest.mark.parametrize("reduction", ["none", "sum", "elementwise_mean"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_agree_with_the_package(name, reduction):
    """Loss modules, with and without an ignored index, values and gradients in float64; and the
    functional form of each."""
    cls = name.split()[0]
    kwargs = LOSSES[name]
    x = _scores((9, 11), 8)
    target = torch.randint(0, 11, (9,), generator=torch.Generator().manual_seed(9))
    for ignore_index in (-100, int(target[0])):
        mine = _value_and_grads(
            getattr(dropin, cls)(ignore_index=ignore_index, reduction=reduction, **kwargs), x, target
        )
        reference = _value_and_grads(
            getattr(entmax, cls)(ignore_index=ignore_index, reduction=reduction, **kwargs), x, target
        )
        _assert_same(mine, reference, atol=1e-9)
    functional = {
        "SparsemaxLoss": "sparsemax_loss",
        "Entmax15Loss": "entmax15_loss",
        "SparsemaxBisectLoss": "sparsemax_bisect_loss",
        "EntmaxBisectLoss": "entmax_bisect_loss",
        "NormmaxBisectLoss": "normmax_bisect_loss",
    }[cls]
    args = tuple(kwargs.values())
    mine = _value_and_grads(lambda x: getattr(dropin, functional)(x, target, *args), x)
    reference = _value_and_grads(lambda x: getattr(entmax, functional)(x, target, *args), x)
    _assert_same(mine, reference, atol=1e-9)


def test_loss_support_and_ignored_rows():
    x = _scores((8, 10), 10)
    target = torch.arange(8)
    loss, support = dropin.SparsemaxLoss(ignore_index=3, reduction="none", return_support_size=True)(x, target)
    assert loss[3] == 0 and torch.equal(support, _package_support(dropin.sparsemax(x), -1))
    mean = dropin.Entmax15Loss(ignore_index=3)(x, target)
    torch.testing.assert_close(mean, dropin.Entmax15Loss(reduction="sum", ignore_index=3)(x, target) / 7)
    # A negative ignore_index is honoured too, and a mean over no row is 0, not NaN.
    everything_ignored = dropin.EntmaxBisectLoss(ignore_index=-1)(x, torch.full((8,), -1))
    assert everything_ignored.item() == 0.0


# -- alpha < 1 against a float64 reference --------------------------------------------------------


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-13), (torch.float32, 1e-6)], ids=str)
@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.75, 0.99, 0.9999])
def test_alpha_below_one_matches_a_float64_bisection(alpha, dtype, atol):
    """(The reference loses about 1e-16 / (1 - alpha) near 1, to rounding in c + b w.)"""
    atol = max(atol, 1e-16 / (1 - alpha))
    x = _scores((40, 97), 11, dtype=dtype, scale=3.0)
    p = dropin.entmax_bisect(x, alpha)
    assert p.dtype == dtype and (p > 0).all()
    torch.testing.assert_close(p.double(), _below_one_reference(x, alpha), atol=atol, rtol=0)
    torch.testing.assert_close(p.double().sum(-1), torch.ones(40, dtype=torch.float64), atol=atol * 10, rtol=0)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
def test_alpha_below_one_gradients_match_finite_differences_of_the_reference(alpha):
    x = _scores((4, 15), 12)
    upstream = _scores((4, 15), 13)
    alpha_t = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    scores = x.clone().requires_grad_()
    (dropin.entmax_bisect(scores, alpha_t) * upstream).sum().backward()
    step = 1e-5

    def loss(z, a):
        return (_below_one_reference(z, a) * upstream).sum()

    d_alpha = (loss(x, alpha + step) - loss(x, alpha - step)) / (2 * step)
    torch.testing.assert_close(alpha_t.grad, d_alpha, atol=1e-7, rtol=1e-6)
    bump = torch.zeros_like(x)
    bump[1, 4] = step
    d_score = (loss(x + bump, alpha) - loss(x - bump, alpha)) / (2 * step)
    torch.testing.assert_close(scores.grad[1, 4], d_score, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("dtype, step, atol", [(torch.float64, 1e-7, 1e-5), (torch.float32, 1e-4, 2e-3)], ids=str)
def test_alpha_is_continuous_across_one(dtype, step, atol):
    """Just below 1 (this drop-in's search), at 1 and just above (alpha_entmax), the values and
    both gradients agree to a few times the step: the general form of the alpha gradient would be
    off by rounding / step^2 there."""
    x = _scores((5, 30), 14, dtype=dtype)
    below, at_one, above = (
        _value_and_grads(lambda x, a: dropin.entmax_bisect(x, a), x, torch.tensor(alpha, dtype=dtype))
        for alpha in (1 - step, 1.0, 1 + step)
    )
    _assert_same(below, at_one, atol=atol)
    _assert_same(above, at_one, atol=atol)


def test_alpha_gradient_is_the_slope_of_the_values_across_one():
    x = _scores((5, 30), 14)
    step = 1e-3
    below, above = (
        _value_and_grads(lambda x, a: dropin.entmax_bisect(x, a), x, torch.tensor(alpha, dtype=torch.float64))
        for alpha in (1 - step, 1 + step)
    )
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    slope = ((above[0] - below[0]) * upstream).sum() / (2 * step)
    torch.testing.assert_close((below[2] + above[2]) / 2, slope, atol=1e-5, rtol=0)


# -- the normalizers' properties through the drop-in ----------------------------------------------

DROPIN_MAPS = {
    "sparsemax": lambda x, dim=-1: dropin.sparsemax(x, dim),
    "entmax15": lambda x, dim=-1: dropin.entmax15(x, dim),
    "sparsemax_bisect": lambda x, dim=-1: dropin.sparsemax_bisect(x, dim),
    "entmax_bisect 0.4": lambda x, dim=-1: dropin.entmax_bisect(x, 0.4, dim),
    "entmax_bisect 1": lambda x, dim=-1: dropin.entmax_bisect(x, 1.0, dim),
    "entmax_bisect 1.3": lambda x, dim=-1: dropin.entmax_bisect(x, 1.3, dim),
    "entmax_bisect 2.5": lambda x, dim=-1: dropin.entmax_bisect(x, 2.5, dim),
    "normmax_bisect 2": lambda x, dim=-1: dropin.normmax_bisect(x, 2, dim),
    "normmax_bisect 5": lambda x, dim=-1: dropin.normmax_bisect(x, 5.0, dim),
    "budget_bisect 2": lambda x, dim=-1: dropin.budget_bisect(x, 2, dim),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(DROPIN_MAPS))
def test_masked_scores_are_dropped_and_masked_rows_are_zero(name, dtype):
    """-inf scores get weight and gradient 0, exactly as if they were not there; a row of -inf
    only gives zeros and zero gradient. No NaN anywhere, in every dtype."""
    fn = DROPIN_MAPS[name]
    x = _scores((4, 9), 15, dtype=dtype)
    x[:, 5:] = float("-inf")
    x[3] = float("-inf")
    scores = x.clone().requires_grad_()
    p = fn(scores)
    upstream = _scores((4, 9), 16, dtype=dtype)
    (p * upstream).sum().backward()
    assert p.dtype == dtype and not torch.isnan(p).any() and not torch.isnan(scores.grad).any()
    assert p[:, 5:].eq(0).all() and p[3].eq(0).all() and scores.grad[:, 5:].eq(0).all() and scores.grad[3].eq(0).all()
    kept = x[:3, :5].clone().requires_grad_()
    q = fn(kept)
    (q * upstream[:3, :5]).sum().backward()
    atol = 1e-6 if dtype in (torch.float32, torch.float64) else 1e-2
    torch.testing.assert_close(p[:3, :5].float(), q.float(), atol=atol, rtol=0)
    torch.testing.assert_close(scores.grad[:3, :5].float(), kept.grad.float(), atol=atol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(DROPIN_MAPS))
def test_half_precision_is_computed_in_float32(name, dtype):
    """Very negative half-precision scores (the package's NaN case) give the float32 result."""
    fn = DROPIN_MAPS[name]
    x = _scores((3, 16), 17, dtype=torch.float32, scale=3.0)
    x[:, ::4] = torch.finfo(dtype).min
    half = x.to(dtype)
    p = fn(half)
    assert p.dtype == dtype and not torch.isnan(p).any()
    torch.testing.assert_close(p.float(), fn(half.float()), atol=2e-2, rtol=0)


@pytest.mark.parametrize("name", sorted(DROPIN_MAPS))
def test_a_nan_score_gives_nan_in_its_row_only(name):
    x = _scores((3, 7), 18)
    x[1, 2] = float("nan")
    p = DROPIN_MAPS[name](x)
    assert torch.isnan(p[1]).all() and not torch.isnan(p[[0, 2]]).any()


@pytest.mark.parametrize(
    "name", ["entmax_bisect 0.4", "entmax_bisect 2.5", "normmax_bisect 2", "normmax_bisect 5", "budget_bisect 2"]
)
def test_gradcheck_with_masked_scores_along_any_dim(name):
    """The maps this drop-in computes itself (the others are the normalizers', checked there)."""
    x = _scores((3, 6, 2), 19)
    x[0, 4:, 1] = float("-inf")
    for dim in (1, -1):
        gradcheck(lambda z, dim=dim: DROPIN_MAPS[name](z, dim), (x.clone().requires_grad_(),), eps=1e-6, atol=1e-6)


def test_gradcheck_alpha_below_one_and_across_it():
    x = _scores((4, 6), 20)
    x[2, 4:] = float("-inf")
    for alpha in (torch.tensor([[0.2], [0.6], [0.95], [0.999]]), torch.tensor([[0.3], [1.0], [1.4], [2.6]])):
        gradcheck(dropin.entmax_bisect, (x.clone().requires_grad_(), alpha.double().requires_grad_()), eps=1e-6)


@pytest.mark.parametrize("name", ["SparsemaxLoss", "Entmax15Loss", "EntmaxBisectLoss", "NormmaxBisectLoss"])
def test_losses_with_masked_scores_have_no_nan(name):
    """The package's losses give NaN on -inf scores; here a masked score adds nothing (the loss
    and gradient are those without it), and a masked target has loss +inf."""
    x = _scores((5, 8), 21)
    target = torch.tensor([0, 1, 2, 3, 6])
    x[:, 6:] = float("-inf")
    scores = x.clone().requires_grad_()
    loss = getattr(dropin, name)(reduction="none")(scores, target)
    loss[:4].sum().backward()
    assert torch.isfinite(loss[:4]).all() and loss[4] == float("inf")
    kept = x[:4, :6].clone().requires_grad_()
    expected = getattr(dropin, name)(reduction="none")(kept, target[:4])
    expected.sum().backward()
    torch.testing.assert_close(loss[:4], expected)
    torch.testing.assert_close(scores.grad[:4, :6], kept.grad)
    assert scores.grad[:, 6:].eq(0).all()


def test_normmax_below_one_is_the_argmax_and_budget_saturates():
    """alpha <= 1: the norm is concave and 1 at every vertex, the maximum is the one-hot argmax;
    a budget of at least the number of finite scores gives them all 1."""
    x = _scores((4, 7), 22)
    for alpha in (0.5, 1.0, torch.full((4, 1), 0.7, dtype=torch.float64)):
        p = dropin.normmax_bisect(x, alpha)
        assert torch.equal(p, torch.nn.functional.one_hot(x.argmax(-1), 7).double())
    x[:, 5:] = float("-inf")
    p = dropin.budget_bisect(x, 6.0)
    assert p[:, :5].eq(1).all() and p[:, 5:].eq(0).all()


def test_bad_alpha_is_refused():
    x = _scores((2, 3), 23)
    with pytest.raises(ValueError, match="alpha"):
        dropin.entmax_bisect(x, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        dropin.entmax_bisect(x, torch.tensor([[1.5], [-1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="does not fit"):
        dropin.entmax_bisect(x, torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="reduction"):
        dropin.SparsemaxLoss(reduction="average")


def test_a_learned_alpha_is_a_parameter_of_the_module():
    alpha = torch.nn.Parameter(torch.tensor(1.3))
    module = root_finding.EntmaxBisect(alpha=alpha)
    assert list(module.parameters()) == [alpha]
    module(_scores((2, 5), 24, dtype=torch.float32)).square().sum().backward()
    assert alpha.grad is not None and torch.isfinite(alpha.grad)
    assert losses.EntmaxBisectLoss().alpha == 1.5
