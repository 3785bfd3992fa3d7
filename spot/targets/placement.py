"""Placement: a target's weights spread over several devices, or over the CPU and the disk, when one device does not
hold them. No placement code of our own: transformers' `from_pretrained(device_map=...)` dispatches the model with
accelerate's big-model hooks, which move each layer's inputs to the layer's device (and an offloaded layer's
weights in) before it runs. A split target's forward is therefore the same computation, layer by layer, as on one
device: where the kernels are the same (the CPU and disk offload, or GPUs of one kind) its logits are bit for bit
the same, so every decode and every lossless verdict is too.

A layer is never split across devices (`_no_split_modules` of each model class: a decoder layer is the unit the
exact layout's row-invariant kernels run whole), and the row-invariant linears are patched under the hooks, not
over them (spot.targets.rows).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Placement:
    """Where the weights go: transformers' `device_map`, `max_memory` and `offload_folder`.

    device_map: one of accelerate's strategies ("auto", "balanced", "balanced_low_0", "sequential"), or module
        name -> "cpu", "disk" or a CUDA index.
    max_memory: device ("cpu" or a CUDA index) -> the most the weights take there ("20GiB"); None: what is free.
    offload_folder: where weights the memory does not hold go (disk offload); needed where the map says "disk".
    """

    device_map: str | tuple[tuple[str, str | int], ...]
    max_memory: tuple[tuple[str | int, str], ...] | None = None
    offload_folder: str | None = None

    def kwargs(self) -> dict:
        """The keyword arguments of transformers' from_pretrained."""
        device_map = self.device_map if isinstance(self.device_map, str) else dict(self.device_map)
        out: dict = {"device_map": device_map}
        if self.max_memory is not None:
            out["max_memory"] = dict(self.max_memory)
        if self.offload_folder is not None:
            out["offload_folder"] = self.offload_folder
        return out


def execution_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: the device its token embedding runs on (a dispatched model's map; an offloaded
    embedding runs on the CPU), else where its parameters are."""
    placed = getattr(model, "hf_device_map", None)
    if placed:
        name = next(n for n, m in model.named_modules() if m is model.get_input_embeddings())
        owner = max((key for key in placed if key == "" or name == key or name.startswith(key + ".")), key=len)
        device = placed[owner]
        if device in ("cpu", "disk"):
            return torch.device("cpu")
        return torch.device(f"cuda:{device}") if isinstance(device, int) else torch.device(device)
    return next(model.parameters()).device


def weight_of(module: nn.Module, name: str = "weight") -> torch.Tensor:
    """A module's parameter, read in where disk offload keeps it on the meta device (accelerate's hook holds the
    offloaded weights' map): the input embedding a drafter projects tokens on, wherever it was placed."""
    tensor = getattr(module, name)
    if tensor.device.type != "meta":
        return tensor
    hook = getattr(module, "_hf_hook", None)
    weights = getattr(hook, "weights_map", None)
    if weights is None:
        raise RuntimeError(f"{type(module).__name__}.{name} is offloaded and no accelerate hook holds its weights")
    return weights[name].to(hook.execution_device or "cpu")


def patch_forward(module: nn.Module, forward: Callable) -> None:
    """`module` computes `forward(module, ...)` in place of its own forward. Under an accelerate hook (a dispatched or
    offloaded model; offload hooks each submodule) it goes beneath the hook, which still moves the inputs and the
    offloaded weights in first; replacing the module instead would drop its hook and leave its weights offloaded."""
    bound = types.MethodType(forward, module)
    if hasattr(module, "_hf_hook"):
        module._old_forward = bound
    else:
        module.forward = bound
