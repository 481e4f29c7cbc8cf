"""The worker on a CUDA device: pinned host buffers, and training against a live server.

Skipped where torch sees no CUDA device (CI has none); run on a GPU host with
``python -m pytest tests/integration/test_cuda_integ.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from psproto import blocks, codec
from psworker.binding import ModelBinding
from psworker.push_encoding import PushEncoder
from tests.integration.conftest import StartServer
from tests.integration.workers import start_train, train_command

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_a_cuda_model_crosses_through_pinned_buffers_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).cuda()
    binding = ModelBinding(model)
    assert binding.params.is_pinned() and binding.grads.is_pinned()
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    grads = binding.gather_grads()
    expected = torch.cat([p.grad.flatten().cpu() for p in model.parameters()])  # type: ignore[union-attr]
    assert torch.equal(grads, expected)
    binding.params.copy_(torch.arange(binding.layout.total_length, dtype=torch.float32))
    binding.scatter_params()
    assert torch.equal(torch.cat([p.detach().flatten().cpu() for p in model.parameters()]), binding.params)


def test_a_pageable_binding_gives_the_same_crossing() -> None:
    torch.manual_seed(0)
    model = nn.Linear(16, 4).cuda()
    model(torch.randn(3, 16, device="cuda")).sum().backward()
    pinned, pageable = ModelBinding(model), ModelBinding(model, pin=False)
    assert not pageable.grads.is_pinned()
    assert torch.equal(pinned.gather_grads(), pageable.gather_grads())


def _sent(chunks: object) -> list[tuple[int, int, bytes, bytes]]:
    return [(c.offset, c.dtype, bytes(c.data), bytes(c.scales)) for c in chunks]  # type: ignore[attr-defined]


def test_the_tensor_encode_on_the_gpu_gives_the_compiled_encodes_bits() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5 * 4096 + 7, generator=generator) * torch.logspace(-30, 30, 5 * 4096 + 7)
    x[4096 : 2 * 4096] = 0.0
    x[4096 + 5] = 1e-44  # a block of one subnormal: max / 127 underflows
    residual = torch.randn(x.numel(), generator=generator) * 1e-3
    expected_q, expected_scales, expected_residual = blocks.encode_with_feedback(x, residual.clone())
    q, scales, updated = blocks.encode_tensors(x.cuda(), residual.cuda(), feedback=True)
    assert updated is not None
    assert torch.equal(scales.cpu().view(torch.int32), expected_scales.view(torch.int32))
    assert int((q.cpu() != expected_q).sum()) == 0
    assert torch.equal(updated.cpu().view(torch.int32), expected_residual.view(torch.int32))


def test_an_update_on_the_gpu_is_encoded_there_with_the_host_encodes_bytes() -> None:
    length = 3 * codec.chunk_spans(10**7, codec.INT8_BLOCK)[0].stop + 4096 + 5
    host, device = PushEncoder(codec.INT8_BLOCK), PushEncoder(codec.INT8_BLOCK)
    generator = torch.Generator().manual_seed(0)
    for index in range(3):
        push = torch.randn(length, generator=generator) * (index + 1)
        assert _sent(device.chunks(0, push.cuda())) == _sent(host.chunks(0, push))
        on_gpu = device.residual(0)
        assert on_gpu is not None and on_gpu.is_cuda
        assert torch.equal(on_gpu.cpu(), host.residual(0))  # type: ignore[arg-type]
    bf16 = PushEncoder(codec.BFLOAT16)
    assert _sent(bf16.chunks(0, push.cuda())) == _sent(bf16.chunks(0, push))


def test_a_binding_that_pushes_on_the_gpu_gathers_there() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).cuda()
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    binding = ModelBinding(model, push_on_device=True)
    grads = binding.gradients_to_push()
    assert grads.is_cuda and torch.equal(grads.cpu(), binding.gather_grads())


@pytest.mark.parametrize(
    "wire", [{}, {"push_dtype": "int8", "pull_dtype": "bf16"}], ids=["fp32", "int8-encoded-on-gpu"]
)
def test_a_cuda_worker_trains_digits_against_a_live_server(
    start_psserver: StartServer, tmp_path: Path, wire: dict[str, str]
) -> None:
    address = start_psserver("asgd", lr=0.05)
    command = train_command(
        address,
        "gpu0",
        1000,
        log=tmp_path / "gpu0.jsonl",
        extra=["--device", "cuda"],
        settings={"train": {"client": wire, "eval_every": 200}},
    )
    process = start_train(command)
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["device"].startswith("cuda")
    assert summary["final_clock"] >= 1000
    assert summary["test_accuracy"] >= 0.90, summary
