"""A target spread over several devices, as lm-eval's `hf` model takes it: `parallelize`, `device_map`,
`max_memory_per_gpu`, `max_cpu_memory` and `offload_folder`, turned into one `spot.targets.Placement`.

Every check runs before the weights load, on the checkpoint's model built without weights (the meta device):
each bad setting is one ValueError naming the fix, and nothing is written (the offload folder is only probed).
The map that loads is the one planned here (spot.targets.placement.plan), so `spot-eval placement` shows before
a run exactly what the run will load.

Under `accelerate launch` each of the N processes on a machine takes the GPUs k with k % N == its local rank,
as lm-eval's `hf` model does, so N processes of data parallel each spread their copy over their own GPUs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spot.targets.placement import STRATEGIES, Placement
from spot_eval.harness.settings import check_output_dir

if TYPE_CHECKING:
    import torch

    from spot.targets.checkpoint import Checkpoint

DeviceMap = str | tuple[tuple[str, str | int], ...]


@dataclass(frozen=True)
class Planned:
    """A placement checked and resolved to one module -> device map, with what each device would hold."""

    placement: Placement  # its device_map is the explicit map that loads
    bytes_by_device: tuple[tuple[str | int, int], ...]  # in the map's order of first use
    capacity: tuple[tuple[str | int, int], ...]  # the memory each device was given (strategies only)
    largest_layer: tuple[str, int]  # the largest module no map splits, and its bytes

    @property
    def devices(self) -> tuple[str | int, ...]:
        return tuple(device for device, _ in self.bytes_by_device)


def wanted(settings: object) -> bool:
    """Whether the settings ask for a spread target at all (else the target loads whole on `device`)."""
    return bool(settings.parallelize or settings.device_map)


def parse_device_map(value: str) -> DeviceMap:
    """A strategy name, `module:device` pairs joined by '+', or a JSON file holding {module: device}."""
    text = str(value).strip()
    if text in STRATEGIES:
        return text
    if text.endswith(".json"):
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"device_map={text}: no such file; give a JSON file of {{module: device}}, "
                             f"module:device pairs joined by +, or a strategy ({', '.join(STRATEGIES)})")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"device_map={text} is not JSON ({err.msg}, line {err.lineno}); write {{module: device}}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"device_map={text} holds a {type(raw).__name__}; write one object {{module: device}}")
        return tuple((str(k), _device(text, v)) for k, v in raw.items())
    pairs = []
    for part in text.split("+"):
        module, sep, device = part.partition(":")
        if not sep or not device:
            raise ValueError(f"device_map={text}: {part!r} is not module:device; give a strategy "
                             f"({', '.join(STRATEGIES)}), module:device pairs joined by + (model.layers.0:cpu+"
                             "model.layers.1:disk+...), or a JSON file")
        pairs.append((module.strip(), _device(text, device.strip())))
    return tuple(pairs)


def _device(text: str, value: object) -> str | int:
    """cpu, disk, a CUDA index, or cuda:N (as its index: accelerate's maps name GPUs by index)."""
    device = str(value).strip()
    if device in ("cpu", "disk"):
        return device
    index = device.removeprefix("cuda:")
    if index.isdigit():
        return int(index)
    raise ValueError(f"device_map={text}: device {device!r} is not cpu, disk, N or cuda:N")


def parse_size(name: str, value: object) -> int:
    """Bytes from accelerate's spelling (20GiB, 80GB, 512MB) or a number of bytes."""
    from accelerate.utils import convert_file_size_to_int

    text = str(value).strip()
    try:
        size = int(text) if text.isdigit() else convert_file_size_to_int(text)
    except (ValueError, TypeError):
        size = -1
    if size <= 0:
        raise ValueError(f"{name}={value!r} is not a size; write it as 20GiB, 80GB or 512MB")
    return size


def gpu_share(gpus: int, local_processes: int, local_rank: int) -> tuple[int, ...]:
    """The GPUs one of `local_processes` processes on a machine spreads its copy over: every local_processes-th
    one from its local rank (lm-eval's `hf` rule)."""
    if local_processes > gpus:
        raise ValueError(f"parallelize=true with {local_processes} processes on this machine and {gpus} GPU(s) visible: "
                         f"each process spreads its own copy over its own GPUs, so launch at most {gpus} "
                         f"(accelerate launch --num_processes {max(gpus, 1)}), or drop parallelize for one GPU each")
    return tuple(k for k in range(gpus) if k % local_processes == local_rank)


def _free_memory() -> dict[str | int, int]:
    """Free bytes of each visible GPU (by index) and of the CPU, as transformers' loading counts them."""
    from transformers.integrations.accelerate import get_max_memory

    return dict(get_max_memory())


def plan_placement(settings: object, device: str, checkpoint: Checkpoint, dtype: torch.dtype, gpus: int | None = None,
                   local: tuple[int, int] | None = None, free: dict[str | int, int] | None = None) -> Planned:
    """The placement `settings` (TargetSettings' or lm_eval's model_args of those names) ask for, checked and planned.

    device: the resolved device the run would use whole (cpu, or cuda:N). gpus: the GPUs to plan for (None: those
    visible). local: (processes on this machine, this one's local rank); None: LOCAL_WORLD_SIZE and LOCAL_RANK.
    free: the memory each device has free (None: measured here; `spot-eval placement` plans for other machines)."""
    import torch

    from spot.targets.checkpoint import empty_model
    from spot.targets.placement import largest_layer, plan, sizes

    on_gpu = str(device).startswith("cuda")
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if settings.parallelize and not on_gpu:
        raise ValueError("parallelize=true spreads the target over GPUs, and this run decodes on the CPU (device=cpu, "
                         "or auto where no GPU is usable); drop parallelize, or split the target between the CPU and "
                         "the disk with device_map=sequential,max_cpu_memory=SIZE,offload_folder=DIR")
    device_map = parse_device_map(settings.device_map) if settings.device_map else "auto"
    per_gpu = None if settings.max_memory_per_gpu is None else parse_size("max_memory_per_gpu", settings.max_memory_per_gpu)
    cpu = None if settings.max_cpu_memory is None else parse_size("max_cpu_memory", settings.max_cpu_memory)
    check_output_dir("offload_folder", settings.offload_folder)
    if isinstance(device_map, tuple):
        for module, where in device_map:
            if isinstance(where, int) and where >= gpus:
                seen = f"cuda:0 to cuda:{gpus - 1}" if gpus else "none"
                raise ValueError(f"device_map puts {module or 'the model'} on cuda:{where}, and {gpus} GPU(s) are "
                                 f"visible ({seen}); name a visible device, cpu or disk")
    model = empty_model(checkpoint, dtype)
    layer = largest_layer(model)
    capacity: dict[str | int, int] = {}
    if isinstance(device_map, str):  # a strategy fills the memory given to each device, in order
        if local is None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))
        share = gpu_share(gpus, *local) if (settings.parallelize or on_gpu) else ()
        if per_gpu is not None and share and per_gpu < layer[1]:
            raise ValueError(f"max_memory_per_gpu={settings.max_memory_per_gpu} holds no layer of this target: "
                             f"{layer[0]} alone takes {_gib(layer[1])} in {str(dtype).removeprefix('torch.')}; give "
                             f"at least {_gib(layer[1])} per GPU, or more GPUs")
        free = _free_memory() if free is None else free
        capacity = {k: per_gpu if per_gpu is not None else free.get(k, 0) for k in share}
        capacity["cpu"] = cpu if cpu is not None else free.get("cpu", 0)
    placed = plan(model, Placement(device_map, tuple(capacity.items()) or None, settings.offload_folder))
    if "disk" in placed.values() and settings.offload_folder is None:
        on_disk = [name or "the whole model" for name, where in placed.items() if where == "disk"]
        raise ValueError(f"this placement keeps {len(on_disk)} module(s) on disk ({', '.join(on_disk[:3])}"
                         f"{', ...' if len(on_disk) > 3 else ''}); give offload_folder=DIR for them, or more memory "
                         "(max_memory_per_gpu, max_cpu_memory, more GPUs)")
    used = sizes(model, placed)
    order = {d: i for i, d in enumerate(dict.fromkeys(placed.values()))}
    return Planned(Placement(tuple(placed.items()), None, settings.offload_folder),
                   tuple(sorted(used.items(), key=lambda item: order[item[0]])), tuple(capacity.items()), layer)


def device_names(model: object, device: object) -> list[str]:
    """The devices a loaded target's weights are on, by name (cuda:N, cpu, disk): those of its device map where it
    was spread, else its one device."""
    placed = getattr(model, "hf_device_map", None)
    if not placed:
        return [str(device)]
    return [f"cuda:{d}" if isinstance(d, int) else str(d) for d in dict.fromkeys(placed.values())]


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**28 else f"{size / 2**20:.1f} MiB"


def describe(planned: Planned) -> list[str]:
    """The plan in lines: what each device holds (and of how much), and whether the target fits its devices'
    memory or spills to the CPU and the disk."""
    total = sum(size for _, size in planned.bytes_by_device)
    capacity = dict(planned.capacity)
    lines = []
    for device, size in planned.bytes_by_device:
        name = f"cuda:{device}" if isinstance(device, int) else device
        modules = sum(1 for _, where in planned.placement.device_map if where == device)
        room = f" of {_gib(capacity[device])}" if device in capacity else ""
        lines.append(f"  {name:<8} {_gib(size):>12}{room} ({size / total:.0%} of the weights, {modules} module(s))")
    name, size = planned.largest_layer
    lines.append(f"  largest layer kept whole: {name}, {_gib(size)}")
    spilled = [d for d in planned.devices if d in ("cpu", "disk")]
    if any(isinstance(d, int) for d in planned.devices) and spilled:
        lines.append(f"  the GPUs given do not hold it all: part runs from {' and '.join(spilled)} (each forward "
                     "reads it in: slow)")
    return lines
