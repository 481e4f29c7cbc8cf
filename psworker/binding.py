"""A PyTorch module's trainable parameters bound to one flat host buffer per direction.

Gradients are gathered into ``grads`` and parameters scattered from ``params`` through
views of preallocated flat tensors, so a push or pull never allocates a model-sized
buffer. On CUDA both buffers are pinned and the copies are non-blocking. With
``push_on_device`` the gradients a push sends are gathered into a flat buffer on the model's
device instead, for an encode there (psworker.push_encoding: only 8-bit values cross to the host).
"""

from __future__ import annotations

import torch
from torch import nn

from psproto.layout import Layout


class ModelBinding:
    def __init__(
        self, model: nn.Module, num_shards: int = 1, pin: bool | None = None, push_on_device: bool = False
    ) -> None:
        """``pin``: page-lock the host buffers (default: when the model is on CUDA, where it lets the
        copies run without a staging copy; ``False`` keeps pageable buffers, for comparison).
        ``push_on_device``: :meth:`gradients_to_push` stays on a GPU model's device (no effect on CPU)."""
        self.model = model
        self.named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not self.named:
            raise ValueError("the model has no trainable parameters")
        self.layout = Layout.from_named_shapes(((name, tuple(p.shape)) for name, p in self.named), num_shards)
        self.device = self.named[0][1].device
        pin = self.device.type == "cuda" if pin is None else pin
        if pin and not torch.cuda.is_available():
            raise ValueError("pinned host buffers need a CUDA device, and torch sees none; leave pin unset")
        total = self.layout.total_length
        self.params = torch.zeros(total, pin_memory=pin)
        self.grads = torch.zeros(total, pin_memory=pin)
        self._param_views = [self.params[s.offset : s.end].view(s.shape) for s in self.layout.slots]
        self._grad_views = [self.grads[s.offset : s.end].view(s.shape) for s in self.layout.slots]
        self.device_grads: torch.Tensor | None = None
        self._device_grad_views: list[torch.Tensor] = []
        if push_on_device and self.device.type != "cpu":
            self.device_grads = torch.zeros(total, device=self.device)
            self._device_grad_views = [self.device_grads[s.offset : s.end].view(s.shape) for s in self.layout.slots]

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def gather_params(self) -> torch.Tensor:
        """Copy the model's parameters into ``params`` and return it."""
        for (_, p), view in zip(self.named, self._param_views, strict=True):
            view.copy_(p, non_blocking=True)
        self._synchronize()
        return self.params

    def _copy_grads(self, views: list[torch.Tensor]) -> None:
        """The model's gradients (zero where missing) into ``views``, one per parameter."""
        for (_, p), view in zip(self.named, views, strict=True):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad, non_blocking=True)

    @torch.no_grad()
    def gather_grads(self) -> torch.Tensor:
        """Copy the model's gradients (zero where missing) into ``grads`` and return it."""
        self._copy_grads(self._grad_views)
        self._synchronize()
        return self.grads

    @torch.no_grad()
    def gradients_to_push(self) -> torch.Tensor:
        """The gradients as one flat tensor for a push: ``device_grads`` (gathered on the device, no
        crossing; the encode that follows runs on the same stream) with ``push_on_device`` on a GPU,
        else :meth:`gather_grads`."""
        if self.device_grads is None:
            return self.gather_grads()
        self._copy_grads(self._device_grad_views)  # on the device: no synchronise needed
        return self.device_grads

    @torch.no_grad()
    def scatter_params(self) -> None:
        """Copy ``params`` into the model's parameters."""
        for (_, p), view in zip(self.named, self._param_views, strict=True):
            p.copy_(view, non_blocking=True)
        self._synchronize()
