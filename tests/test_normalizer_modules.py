"""The normalizer modules (fairseq_entmax.normalizers.layers): one factory, modules that call
their function on the scores, own their learned alphas and survive a deep copy (fairseq's
--ema) as independent copies."""

import copy
import math
import shlex

import pytest
import torch

from fairseq_entmax.names import NORMALIZER_LABELS
from fairseq_entmax.normalizers import (
    NORMALIZER_NAMES,
    LearnedAlphaEntmax,
    NormalizerConfig,
    alpha_entmax,
    build_normalizer,
    entmax15,
    softmax,
    sparsemax,
    topk_softmax,
)

HEADS = 4


def scores(batch=2, queries=3, keys=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(batch * HEADS, queries, keys, generator=generator)
    values[:, :, -2:] = float("-inf")  # padding
    return values


@pytest.mark.parametrize(
    "name, function, alpha",
    [("softmax", softmax, 1.0), ("entmax15", entmax15, 1.5), ("sparsemax", sparsemax, 2.0)],
)
def test_fixed_alpha_modules_call_their_function_and_report_their_alpha(name, function, alpha):
    normalizer = build_normalizer(name, HEADS)
    x = scores()
    assert normalizer.name == name and not normalizer.learns_alpha
    torch.testing.assert_close(normalizer(x), function(x, dim=-1), rtol=0, atol=0)
    assert torch.equal(normalizer.head_alpha(), torch.full((HEADS,), alpha))
    assert list(normalizer.state_dict()) == []  # nothing stored: a fairseq attention's keys


def test_learned_alpha_uses_one_alpha_per_head():
    normalizer = build_normalizer("alpha_entmax", HEADS, alpha_init="random")
    x = scores()
    alpha = (1 + torch.sigmoid(normalizer.alpha_logit.detach())).clamp(1.01, 2.0)
    expected = alpha_entmax(x.view(-1, HEADS, 3, 7), alpha.view(1, HEADS, 1, 1), dim=-1).view_as(x)
    torch.testing.assert_close(normalizer(x).detach(), expected, rtol=0, atol=0)
    assert list(normalizer.state_dict()) == ["alpha_logit", "warmup_fraction"]
    normalizer(x).sum().backward()
    assert normalizer.alpha_logit.grad is not None and normalizer.alpha_logit.grad.shape == (HEADS,)


def test_learned_alpha_starts_at_alpha_init_and_warms_up_from_softmax():
    normalizer = build_normalizer("alpha_entmax", HEADS, alpha_init=1.5, alpha_warmup_updates=10)
    torch.testing.assert_close(normalizer.learned_alpha().detach(), torch.full((HEADS,), 1.5))
    normalizer.set_num_updates(0)
    assert torch.equal(normalizer.head_alpha().detach(), torch.ones(HEADS))
    normalizer.set_num_updates(5)
    torch.testing.assert_close(normalizer.head_alpha().detach(), torch.full((HEADS,), 1.25))
    normalizer.set_num_updates(20)
    torch.testing.assert_close(normalizer.head_alpha().detach(), torch.full((HEADS,), 1.5))


def test_the_warm_up_position_travels_with_the_state_dict():
    """A state dict saved mid-warm-up gives the loaded module the same alphas, with no update
    count to restore (a PEFT adapter, torch.save); one saved without the position (before it was
    kept) loads and keeps the position set_num_updates gave."""
    trained = build_normalizer("alpha_entmax", HEADS, alpha_init="random", alpha_warmup_updates=10)
    trained.set_num_updates(4)
    state = trained.state_dict()
    assert state["warmup_fraction"].dtype == torch.float32
    loaded = build_normalizer("alpha_entmax", HEADS, alpha_init=1.5, alpha_warmup_updates=10)
    loaded.set_num_updates(0)
    loaded.load_state_dict(state)
    assert torch.equal(loaded.head_alpha(), trained.head_alpha())
    assert not torch.equal(loaded.head_alpha(), trained.learned_alpha())

    older = build_normalizer("alpha_entmax", HEADS, alpha_init=1.5, alpha_warmup_updates=10)
    older.set_num_updates(5)
    older.load_state_dict({"alpha_logit": state["alpha_logit"]})
    assert torch.equal(older.head_alpha(), torch.lerp(torch.ones(HEADS), trained.learned_alpha(), 0.5))


def test_topk_keeps_k_or_a_fraction_of_the_visible_keys():
    x = scores()
    fixed = build_normalizer("topk", HEADS, topk=2)
    torch.testing.assert_close(fixed(x), topk_softmax(x, 2, dim=-1), rtol=0, atol=0)
    assert fixed.head_alpha() is None
    # 5 visible keys: ceil(0.5 * 5) = 3 kept, at least the minimum of 4.
    assert (build_normalizer("topk", HEADS, topk_fraction=0.5)(x) > 0).sum(-1).eq(3).all()
    assert (build_normalizer("topk", HEADS, topk_fraction=0.5, topk_min=4)(x) > 0).sum(-1).eq(4).all()


def test_a_deep_copy_follows_its_own_alphas():
    """fairseq's --ema keeps a deep copy of the model: its normalizers must use the copy's
    alpha_logit, not the original's."""
    original = build_normalizer("alpha_entmax", HEADS, alpha_init=1.2)
    copied = copy.deepcopy(original)
    with torch.no_grad():
        original.alpha_logit.fill_(10.0)  # alpha 2 in the original
    x = scores()
    assert not torch.equal(original(x), copied(x))
    expected = alpha_entmax(x.view(-1, HEADS, 3, 7), torch.full((1, HEADS, 1, 1), 1.2), dim=-1).view_as(x)
    torch.testing.assert_close(copied(x).detach(), expected, atol=1e-6, rtol=0)


def test_every_name_builds_its_normalizer_and_is_a_plain_command_line_word():
    for name in NORMALIZER_NAMES:
        assert build_normalizer(name, HEADS).name == name
        assert shlex.quote(name) == name  # `--attention-normalizer NAME`, `--models NAME` unquoted
    assert len(set(NORMALIZER_LABELS.values())) == len(NORMALIZER_NAMES)


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as error:
        build_normalizer("entmax", HEADS)
    for name in NORMALIZER_NAMES:
        assert name in str(error.value)


def test_alpha_init_two_starts_just_below_two():
    normalizer = build_normalizer("alpha_entmax", HEADS, alpha_init=2.0)
    assert isinstance(normalizer, LearnedAlphaEntmax)
    assert math.isfinite(float(normalizer.alpha_logit.detach()[0]))
    torch.testing.assert_close(normalizer.learned_alpha().detach(), torch.full((HEADS,), 2.0), atol=2e-6, rtol=0)


def test_learned_alpha_loads_its_alphas_or_keeps_its_init_when_the_state_has_none(caplog):
    """A state dict with alpha_logit loads it; one without (a model trained without learned alpha
    here) keeps the alphas drawn from --alpha-init, says so in the log, and a strict load still
    refuses an unexpected key."""
    trained = build_normalizer("alpha_entmax", HEADS, alpha_init="random")
    loaded = torch.nn.ModuleDict({"normalizer": build_normalizer("alpha_entmax", HEADS, alpha_init=1.5)})
    loaded.load_state_dict({"normalizer.alpha_logit": trained.alpha_logit.detach()})
    assert torch.equal(loaded["normalizer"].alpha_logit.detach(), trained.alpha_logit.detach())

    fresh = torch.nn.ModuleDict({"normalizer": build_normalizer("alpha_entmax", HEADS, alpha_init=1.5)})
    with caplog.at_level("INFO", logger="fairseq_entmax.normalizers.layers"):
        fresh.load_state_dict({})
    torch.testing.assert_close(fresh["normalizer"].learned_alpha().detach(), torch.full((HEADS,), 1.5))
    assert caplog.messages == [
        "normalizer.alpha_logit: not in the checkpoint (trained without learned alpha), so its 4 heads start "
        "from --alpha-init 1.5: alpha 1.5, 1.5, 1.5, 1.5"
    ]
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fresh.load_state_dict({"normalizer.other": torch.zeros(1)})


@pytest.mark.parametrize(
    "name, options, error, message",
    [
        (
            "alpha_entmax",
            {"alpha_init": 7},
            ValueError,
            r"alpha_init: allowed values are 'random' or a number in \(1, 2\]",
        ),
        ("alpha_entmax", {"alpha_clamp": (1.5, 1.2)}, ValueError, "alpha_clamp: expected MIN,MAX with 1 <= MIN < MAX"),
        ("alpha_entmax", {"alpha_init": 1.9, "alpha_clamp": (1.01, 1.5)}, ValueError, "outside alpha_clamp"),
        (
            "alpha_entmax",
            {"alpha_warmup_updates": 2.5},
            ValueError,
            "alpha_warmup_updates: allowed values are integers",
        ),
        ("topk", {"topk": 0}, ValueError, "topk: allowed values are integers >= 1, got 0"),
        ("topk", {"topk_fraction": 1.5}, ValueError, r"topk_fraction: allowed values are numbers in \(0, 1\]"),
        # An option is checked whichever map is built, so a typo is never silently ignored.
        ("softmax", {"topk_min": 0}, ValueError, "topk_min: allowed values are integers >= 1"),
        ("entmax15", {"alpha": 1.5}, TypeError, "unknown option alpha; known options: alpha_init, alpha_clamp"),
    ],
)
def test_bad_options_are_refused_naming_the_option_and_what_is_allowed(name, options, error, message):
    with pytest.raises(error, match=message):
        build_normalizer(name, HEADS, **options)


def test_the_config_normalises_what_the_command_line_and_a_checkpoint_give():
    """Text as fairseq's parser passes it, a list as a loaded config holds it: the same options."""
    given = NormalizerConfig(alpha_init="1.5", alpha_clamp="1.1,1.8", alpha_warmup_updates="10", topk="3")
    loaded = NormalizerConfig(alpha_init=1.5, alpha_clamp=[1.1, 1.8], alpha_warmup_updates=10, topk=3)
    assert given == loaded and given.alpha_clamp == (1.1, 1.8) and isinstance(given.alpha_warmup_updates, int)
    assert NormalizerConfig(alpha_init="Random").alpha_init == "random"
    module = build_normalizer("alpha_entmax", HEADS, alpha_init="1.5", alpha_clamp="1.1,1.8")
    assert module.clamp == (1.1, 1.8) and torch.allclose(module.head_alpha(), torch.full((HEADS,), 1.5))


def test_a_config_built_once_gives_the_modules_its_options():
    """A model checks its options once into a NormalizerConfig and builds every attention's
    normalizer from it: the same module as from the options themselves; options beside a
    config are refused, since the config holds them all."""
    config = NormalizerConfig(alpha_init=1.3, alpha_clamp=(1.1, 1.9), topk=3)
    learned = build_normalizer("alpha_entmax", HEADS, config)
    assert learned.clamp == (1.1, 1.9)
    torch.testing.assert_close(learned.head_alpha().detach(), torch.full((HEADS,), 1.3))
    x = scores()
    from_options = build_normalizer("topk", HEADS, topk=3)
    torch.testing.assert_close(build_normalizer("topk", HEADS, config)(x), from_options(x), rtol=0, atol=0)
    with pytest.raises(TypeError, match="given with a config"):
        build_normalizer("topk", HEADS, config, topk=4)
