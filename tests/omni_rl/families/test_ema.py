"""Tests for omni_rl.families.ema: the EMA step by hand (with its own decay and one given for a
step), the swap (the EMA inside, the very same weights after, also after an exception), the
state round trip and its checks."""
import pytest
import torch
from torch import nn

from omni_rl.families.ema import ParameterEMA


def linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def test_update_by_hand():
    layer = linear()
    ema = ParameterEMA(dict(layer.named_parameters()), decay=0.9)
    start = layer.weight.detach().clone()
    with torch.no_grad():
        layer.weight.add_(1.0)
    ema.update()
    # 0.9 * w0 + 0.1 * (w0 + 1) = w0 + 0.1
    torch.testing.assert_close(ema.shadow["weight"], start + 0.1)
    with torch.no_grad():
        layer.weight.add_(1.0)
    ema.update()
    # 0.9 * (w0 + 0.1) + 0.1 * (w0 + 2) = w0 + 0.29
    torch.testing.assert_close(ema.shadow["weight"], start + 0.29)
    torch.testing.assert_close(ema.shadow["bias"], layer.bias.detach())  # never moved


def test_update_with_a_decay_of_its_own():
    layer = linear()
    ema = ParameterEMA(dict(layer.named_parameters()), decay=0.9)
    start = layer.weight.detach().clone()
    with torch.no_grad():
        layer.weight.add_(1.0)
    ema.update(0.25)
    # 0.25 * w0 + 0.75 * (w0 + 1) = w0 + 0.75: this step's decay, not the EMA's 0.9
    torch.testing.assert_close(ema.shadow["weight"], start + 0.75)
    ema.update()
    # 0.9 * (w0 + 0.75) + 0.1 * (w0 + 1) = w0 + 0.775: the EMA's own decay again
    torch.testing.assert_close(ema.shadow["weight"], start + 0.775)
    with pytest.raises(ValueError, match=r"decay=1.0; expected in \[0, 1\)"):
        ema.update(1.0)

def test_swap_uses_the_ema_and_restores_the_same_tensors():
    layer = linear()
    ema = ParameterEMA(dict(layer.named_parameters()), decay=0.5)
    with torch.no_grad():
        layer.weight.mul_(3.0)
    ema.update()
    own = {n: (p.data, p.detach().clone()) for n, p in layer.named_parameters()}
    x = torch.randn(4, 3)
    with torch.no_grad(), ema.swapped_in():
        torch.testing.assert_close(layer.weight.detach(), ema.shadow["weight"])
        inside = layer(x)
    torch.testing.assert_close(inside, x @ ema.shadow["weight"].T + ema.shadow["bias"])
    for name, p in layer.named_parameters():
        assert p.data.data_ptr() == own[name][0].data_ptr()
        assert torch.equal(p.detach(), own[name][1])


def test_swap_restores_after_an_exception():
    layer = linear()
    ema = ParameterEMA(dict(layer.named_parameters()), decay=0.5)
    with torch.no_grad():
        layer.weight.add_(5.0)
    before = layer.weight.detach().clone()
    with pytest.raises(RuntimeError, match="boom"):
        with ema.swapped_in():
            assert not torch.equal(layer.weight.detach(), before)
            raise RuntimeError("boom")
    assert torch.equal(layer.weight.detach(), before)
    with ema.swapped_in():  # usable again: the flag was reset
        pass


def test_update_inside_the_swap_and_nesting_are_refused():
    layer = linear()
    ema = ParameterEMA(dict(layer.named_parameters()), decay=0.5)
    with ema.swapped_in():
        with pytest.raises(RuntimeError, match="inside swapped_in"):
            ema.update()
        with pytest.raises(RuntimeError, match="does not nest"):
            with ema.swapped_in():
                pass


def test_gradients_reach_the_weights_after_the_swap():
    layer = linear()
    ema = ParameterEMA(dict(layer.named_parameters()), decay=0.5)
    x = torch.randn(4, 3)
    with torch.no_grad(), ema.swapped_in():
        layer(x)
    layer(x).sum().backward()
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(2, 3))


def test_state_round_trip_and_checks():
    layer = linear()
    ema = ParameterEMA(dict(layer.named_parameters()), decay=0.9)
    state = {n: t + 1 for n, t in ema.state_dict().items()}
    ema.load_state_dict(state)
    torch.testing.assert_close(ema.shadow["weight"], layer.weight.detach() + 1)
    with pytest.raises(ValueError, match="missing"):
        ema.load_state_dict({"weight": state["weight"]})
    with pytest.raises(ValueError, match="'bias' has shape"):
        ema.load_state_dict({"weight": state["weight"], "bias": torch.zeros(5)})
    with pytest.raises(ValueError, match="decay=1.0"):
        ParameterEMA(dict(layer.named_parameters()), decay=1.0)
