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
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's automatic maps


@dataclass(frozen=True)
class Placement:
    """Where the weights go: transformers' `device_map`, `max_memory` and `offload_folder`.

    device_map: one of accelerate's STRATEGIES, or module name -> "cpu", "disk" or a CUDA index (`plan` resolves a
        strategy into such a map before the weights load, so that what loads is what was shown and checked).
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


def plan(model: PreTrainedModel, placement: Placement) -> dict[str, str | int]:
    """The module -> device map that loading `model`'s weights under `placement` uses: a strategy resolved by
    transformers' own rule (the one its from_pretrained applies: whole `_no_split_modules`, tied weights together,
    filled in the order of `max_memory`'s devices), or a given map checked to name modules of the model, to cover
    every weight, and to keep tied weights on one device.

    Raises:
        ValueError: naming the module that does not exist, the weights no entry covers, or the tied pair split."""
    if isinstance(placement.device_map, str):
        from transformers.integrations.accelerate import _get_device_map

        max_memory = None if placement.max_memory is None else dict(placement.max_memory)
        return dict(_get_device_map(model, placement.device_map, max_memory, None))
    device_map = dict(placement.device_map)
    modules = dict(model.named_modules())
    unknown = [name for name in device_map if name not in modules]
    if unknown:
        tops = ", ".join(name for name, _ in model.named_children())
        raise ValueError(f"device_map names {', '.join(unknown)}, which {type(model).__name__} does not have; its modules "
                         f"are named from its top level ({tops}) down, as in model.layers.0")
    uncovered = [name for name, _ in model.named_parameters() if _owner(device_map, name) is None]
    if uncovered:
        shown = sorted({_outermost_uncovered(device_map, name) for name in uncovered})
        raise ValueError(f"device_map places no device for {', '.join(shown[:6])}{', ...' if len(shown) > 6 else ''}; "
                         "give every module a device (or name a strategy: auto, balanced, sequential)")
    for tied, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():  # not tied yet on meta
        devices = {device_map[_owner(device_map, name)] for name in (tied, source)}
        if len(devices) > 1:
            raise ValueError(f"device_map puts the tied weights {tied} and {source} on different devices "
                             f"({', '.join(sorted(map(str, devices)))}); they are one tensor: give their modules one device")
    return device_map


def _owner(device_map: dict, name: str) -> str | None:
    """The entry of `device_map` that places parameter `name`: the longest module name it sits under."""
    owners = [key for key in device_map if key == "" or name == key or name.startswith(key + ".")]
    return max(owners, key=len) if owners else None


def _outermost_uncovered(device_map: dict, name: str) -> str:
    """The shortest module name above parameter `name` that no entry of `device_map` reaches into."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if not any(key == prefix or key.startswith(prefix + ".") for key in device_map):
            return prefix
    return ".".join(parts[:-1]) or name


def sizes(model: PreTrainedModel, device_map: dict[str, str | int]) -> dict[str | int, int]:
    """Bytes of weights (and buffers) each device of `device_map` holds."""
    from transformers.integrations.accelerate import compute_module_sizes

    by_module, _ = compute_module_sizes(model, only_modules=False)
    out: dict[str | int, int] = {}
    for name, device in device_map.items():
        out[device] = out.get(device, 0) + by_module[name]
    return out


def largest_layer(model: PreTrainedModel) -> tuple[str, int]:
    """The largest module a device map never splits (`_no_split_modules`), and its bytes: the least one device
    must hold to hold any layer."""
    from transformers.integrations.accelerate import compute_module_sizes

    by_module, _ = compute_module_sizes(model)
    kinds = set(model._no_split_modules or ())
    whole = [(name, by_module[name]) for name, module in model.named_modules() if type(module).__name__ in kinds]
    return max(whole, key=lambda item: item[1])


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
