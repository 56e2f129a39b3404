"""On-policy distillation maths (`omni_rl.algos.distill`) on hand-worked values."""
import math

import pytest
import torch

from omni_rl.algos import DISTILL_LOSSES, StepLossInput, get_step_kernel
from omni_rl.algos.flow_sde import step_latents
from omni_rl.algos.distill import (
    DistillKLLoss,
    diffusion_distill_kl,
    direct_distill_loss,
    distill_advantages,
    full_vocab_reverse_kl,
    token_reverse_kl,
)


def test_diffusion_kl_equals_the_closed_form_on_hand_worked_values():
    # Sample 0, s = 0.5: squared differences (1-0)^2 = 1 and (2-0)^2 = 4, mean 2.5;
    #   KL = 2.5 / (2 * 0.5^2) = 5.0.
    # Sample 1, s = 0 (an ODE step): squared differences (0-3)^2 = 9 and (0+1)^2 = 1, mean 5;
    #   1/2 * 5 = 2.5.
    mean = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    teacher = torch.tensor([[0.0, 0.0], [3.0, -1.0]])
    kl = diffusion_distill_kl(mean, teacher, torch.tensor([0.5, 0.0]))
    assert kl.tolist() == [5.0, 2.5]


def test_diffusion_kl_is_the_gaussian_kl_per_dimension():
    torch.manual_seed(0)
    mean, teacher = torch.randn(3, 4, 5, 5), torch.randn(3, 4, 5, 5)
    std = torch.tensor([0.3, 0.7, 1.1])
    s = std.view(3, 1, 1, 1).expand_as(mean)
    reference = torch.distributions.kl_divergence(torch.distributions.Normal(mean, s),
                                                  torch.distributions.Normal(teacher, s)).flatten(1).mean(1)
    torch.testing.assert_close(diffusion_distill_kl(mean, teacher, std), reference)


@pytest.mark.parametrize("kernel", ["sde", "cps", "dance_sde", "ode"])
def test_teacher_equal_to_student_gives_zero_kl_and_zero_gradient(kernel):
    torch.manual_seed(1)
    x, x_next = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    velocity = torch.randn(2, 4, 3, 3, requires_grad=True)
    args = dict(sigma=torch.tensor([0.8, 0.6]), sigma_next=torch.tensor([0.7, 0.5]), sample=x,
                noise_level=torch.tensor([0.7, 0.0]), prev_sample=x_next)
    student = step_latents(get_step_kernel(kernel), model_output=velocity, **args)
    with torch.no_grad():
        teacher = step_latents(get_step_kernel(kernel), model_output=velocity.detach().clone(), **args)
    kl = diffusion_distill_kl(student.mean, teacher.mean, student.std)
    assert kl.tolist() == [0.0, 0.0]
    kl.sum().backward()
    assert velocity.grad.abs().max().item() == 0.0


def test_distill_kl_loss_is_the_masked_mean_of_the_step_kl():
    mean = torch.tensor([[1.0, 2.0], [0.0, 0.0], [1.0, 1.0]], requires_grad=True)
    teacher = torch.tensor([[0.0, 0.0], [3.0, -1.0], [0.0, 0.0]])
    zeros = torch.zeros(3)
    loss_fn = DISTILL_LOSSES.get("distill_kl")()
    assert isinstance(loss_fn, DistillKLLoss) and loss_fn.reads_teacher_mean
    inp = StepLossInput(log_prob=zeros, old_log_prob=zeros, advantages=zeros, mean=mean, teacher_mean=teacher,
                        std=torch.tensor([0.5, 0.0, 1.0]), mask=torch.tensor([1.0, 1.0, 0.0]))
    loss, metrics = loss_fn(inp)
    assert loss.item() == pytest.approx((5.0 + 2.5) / 2)  # the third entry is masked out
    assert metrics["distill_kl"].item() == pytest.approx(3.75)
    loss.backward()
    # d/dmean of mean_d (m - t)^2 / (2 s^2) / 2 entries = (m - t) / (D s^2) / 2: sample 0, D = 2, s^2 = 0.25.
    assert mean.grad[0].tolist() == pytest.approx([1.0, 2.0])
    assert mean.grad[2].tolist() == [0.0, 0.0]


def test_distill_kl_loss_without_a_teacher_mean_says_what_it_needs():
    zeros = torch.zeros(2)
    with pytest.raises(ValueError, match="teacher_mean"):
        DistillKLLoss()(StepLossInput(log_prob=zeros, old_log_prob=zeros, advantages=zeros, mean=torch.zeros(2, 3), std=1.0))


# Three sampled tokens: the student gives them 0.5, 0.25, 0.8 and the teacher 0.25, 0.5, 0.4, so
# k1 = log(0.5/0.25), log(0.25/0.5), log(0.8/0.4) = log 2, -log 2, log 2.
STUDENT = [0.5, 0.25, 0.8]
TEACHER = [0.25, 0.5, 0.4]
K1 = [math.log(2), -math.log(2), math.log(2)]


def test_token_estimators_equal_their_definitions_on_three_tokens():
    log_s, log_t = torch.tensor([STUDENT]).log(), torch.tensor([TEACHER]).log()
    assert token_reverse_kl(log_s, log_t)[0].tolist() == pytest.approx(K1)
    # Reward-style: the advantage of each token is -k1, 0 where masked.
    assert distill_advantages(log_s, log_t)[0].tolist() == pytest.approx([-k for k in K1])
    assert distill_advantages(log_s, log_t, torch.tensor([[1.0, 1.0, 0.0]]))[0].tolist() == pytest.approx(
        [-K1[0], -K1[1], 0.0])


def test_direct_loss_gradient_is_k1_times_the_score():
    logits = torch.tensor([[0.3, -0.2, 1.0]], requires_grad=True)
    # log pi_S(y_t) of the sampled tokens written as a function of free parameters, so the
    # gradient reaching them is (1/3) k1_t per token (the token mean of sg(k1) * log pi_S).
    log_s = torch.tensor([STUDENT]).log() + logits - logits.detach()
    loss, kl = direct_distill_loss(log_s, torch.tensor([TEACHER]).log())
    assert kl.item() == pytest.approx(sum(K1) / 3)
    assert loss.item() == pytest.approx(sum(k * math.log(p) for k, p in zip(K1, STUDENT)) / 3)
    loss.backward()
    assert logits.grad[0].tolist() == pytest.approx([k / 3 for k in K1])
    # Masked: the mean over the two kept tokens.
    _, kl = direct_distill_loss(torch.tensor([STUDENT]).log(), torch.tensor([TEACHER]).log(), torch.tensor([[1, 0, 1]]))
    assert kl.item() == pytest.approx((K1[0] + K1[2]) / 2)


def test_full_vocab_kl_chunked_equals_unchunked_and_the_definition():
    torch.manual_seed(2)
    logits = torch.randn(2, 7, 11, requires_grad=True)
    teacher = torch.randn(2, 7, 11)
    whole = full_vocab_reverse_kl(logits, teacher, chunk_size=10_000)
    chunked = full_vocab_reverse_kl(logits, teacher, chunk_size=3)  # 14 positions: chunks of 3, 3, 3, 3, 2
    reference = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=logits),
                                                  torch.distributions.Categorical(logits=teacher))
    assert whole.shape == (2, 7)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(whole, reference)
    (grad_whole,) = torch.autograd.grad(whole.sum(), logits)
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    torch.testing.assert_close(grad_chunked, grad_whole)
    # The same distribution: 0 everywhere.
    assert full_vocab_reverse_kl(teacher, teacher.clone(), chunk_size=4).abs().max().item() < 1e-6


def test_shape_mismatches_are_refused_naming_the_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        diffusion_distill_kl(torch.zeros(2, 3), torch.zeros(2, 4), 1.0)
    with pytest.raises(ValueError, match="one tokenizer"):
        full_vocab_reverse_kl(torch.zeros(3, 5), torch.zeros(3, 6))
    with pytest.raises(ValueError, match="same sampled tokens"):
        token_reverse_kl(torch.zeros(1, 3), torch.zeros(1, 2))
