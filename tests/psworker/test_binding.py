from __future__ import annotations

import pytest
import torch
from torch import nn

from psworker.binding import ModelBinding


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)  # frozen tensors are not part of the layout
    return model


def test_layout_lists_trainable_parameters_in_order() -> None:
    binding = ModelBinding(_model())
    assert [name for name, _ in binding.layout.specs] == ["0.weight", "2.weight", "2.bias"]
    assert binding.layout.total_length == 12 + 8 + 2


def test_gather_and_scatter_round_trip() -> None:
    model = _model()
    binding = ModelBinding(model)
    flat = binding.gather_params().clone()
    assert torch.equal(flat[:12], model[0].weight.detach().flatten())
    binding.params.copy_(torch.arange(22, dtype=torch.float32))
    binding.scatter_params()
    assert torch.equal(model[2].bias.detach(), torch.tensor([20.0, 21.0]))


def test_gather_grads_zeroes_missing_gradients() -> None:
    model = _model()
    binding = ModelBinding(model)
    binding.grads.fill_(7.0)
    model(torch.ones(1, 3)).sum().backward()
    grads = binding.gather_grads()
    assert torch.equal(grads[20:], torch.ones(2))
    model2 = _model()
    binding2 = ModelBinding(model2)
    binding2.grads.fill_(7.0)
    assert torch.equal(binding2.gather_grads(), torch.zeros(22))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_pinned_buffers_without_cuda_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="pinned host buffers need a CUDA device"):
        ModelBinding(_model(), pin=True)
    assert not ModelBinding(_model(), pin=False).params.is_pinned()
