"""DeviceBlockPush: a GPU worker's 8-bit push, encoded where the update lives.

The class runs torch operations on the update's device; here it runs on CPU tensors, where it must
send the bytes the host's compiled encode sends, push after push (the CUDA run of the same check is
in tests/integration/test_cuda_integ.py)."""

from __future__ import annotations

import pytest
import torch

from psproto import codec
from psproto.blocks import BLOCK
from psworker.binding import ModelBinding
from psworker.push_encoding import BlockPush, DeviceBlockPush, PushEncoder

SMALLEST_CHUNK = 64 * 1024
# Three chunks of the smallest size and a short fourth one.
LENGTH = 3 * codec.chunk_spans(10**7, codec.INT8_BLOCK, SMALLEST_CHUNK)[0].stop + BLOCK + 5


def _pushes(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randn(LENGTH, generator=generator) * (index + 1) for index in range(count)]


@pytest.mark.parametrize("feedback", [True, False])
def test_the_device_encode_sends_the_host_encodes_bytes_push_after_push(feedback: bool) -> None:
    host = PushEncoder(codec.INT8_BLOCK, error_feedback=feedback, chunk_bytes=SMALLEST_CHUNK)
    device = PushEncoder(codec.INT8_BLOCK, error_feedback=feedback, chunk_bytes=SMALLEST_CHUNK)
    for push in _pushes(4):
        expected = list(BlockPush(host, 0, push))
        sent = list(DeviceBlockPush(device, 0, push))
        assert len(sent) == len(expected) == 4
        assert [(c.offset, c.dtype, bytes(c.data), bytes(c.scales)) for c in sent] == [
            (c.offset, c.dtype, bytes(c.data), bytes(c.scales)) for c in expected
        ]
        if feedback:
            assert torch.equal(device.residual(0), host.residual(0))  # type: ignore[arg-type]
        else:
            assert device.residual(0) is None


def test_a_retry_resends_the_same_chunks_and_moves_the_residual_once() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK, chunk_bytes=SMALLEST_CHUNK)
    first, second = _pushes(2)
    list(DeviceBlockPush(encoder, 0, first))
    push = DeviceBlockPush(encoder, 0, second)
    moved = encoder.residual(0)
    assert list(push) == list(push)
    assert encoder.residual(0) is moved


def test_a_non_finite_push_or_a_reset_moves_no_residual() -> None:
    encoder = PushEncoder(codec.INT8_BLOCK, chunk_bytes=SMALLEST_CHUNK)
    first, second = _pushes(2)
    list(DeviceBlockPush(encoder, 0, first))
    kept = encoder.residual(0)
    poisoned = second.clone()
    poisoned[BLOCK + 1] = float("nan")
    sent = list(DeviceBlockPush(encoder, 0, poisoned))
    assert not torch.isfinite(torch.frombuffer(bytearray(sent[0].scales), dtype=torch.float32)).all()
    assert encoder.residual(0) is kept
    encoder.reset(0)
    assert encoder.residual(0) is None
    list(DeviceBlockPush(encoder, 0, second))
    assert encoder.residual(0) is not None


def test_a_cpu_binding_pushes_its_host_gradients_even_when_asked_to_push_on_the_device() -> None:
    model = torch.nn.Linear(4, 3)
    model(torch.ones(2, 4)).sum().backward()
    binding = ModelBinding(model, push_on_device=True)
    assert binding.device_grads is None
    grads = binding.gradients_to_push()
    assert grads is binding.grads
    weight, bias = model.weight.grad, model.bias.grad
    assert weight is not None and bias is not None
    assert torch.equal(grads, torch.cat([weight.flatten(), bias]))


def test_a_wrong_encode_place_is_refused_before_anything_is_built_or_connects() -> None:
    from psworker.task import Task
    from psworker.train import TrainConfig, train

    def never_built() -> torch.nn.Module:
        raise AssertionError("the model was built before the config was checked")

    task = Task("unbuilt", never_built, *(torch.zeros(1),) * 4)
    with pytest.raises(ValueError, match="encode_on 'gpu' is not one of device, host"):
        train(TrainConfig(["127.0.0.1:9"], encode_on="gpu"), task)
