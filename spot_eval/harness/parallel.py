"""Data parallel under `accelerate launch`: lm-eval's contract for a model that runs on several processes.

lm-eval 0.4.13 shards the requests by `lm.rank` / `lm.world_size`, pads the shorter ranks with copies of
their last request (`lm.all_gather` of the counts), and collects samples and metrics on rank 0 with
`lm.gather_object(..., dst=0)` and `lm.barrier()`. `Ranks` gives those over torch.distributed, set up by
accelerate (gloo on CPUs, NCCL on GPUs). The rank is the global process index: accelerate's
local_process_index is wrong across machines.

Launching N processes: `accelerate launch --num_processes N -m lm_eval` (or `--multi_gpu`), or
`torchrun --nproc_per_node N -m lm_eval`. On a machine without GPUs, accelerate 1.x's `--cpu` starts a
single process (several only through MPI); `--multi_gpu` starts N, which then talk over gloo.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ranks:
    rank: int  # the global process index
    world_size: int
    local_rank: int  # the process index on this machine: which GPU it takes

    @classmethod
    def from_environment(cls, device: str = "cpu") -> Ranks:
        """What `accelerate launch` (or torchrun) set; one process when WORLD_SIZE is absent or 1. Decoding
        on the CPU (`device`), the processes talk over gloo, else over NCCL."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return ONE_PROCESS
        from accelerate import PartialState

        state = PartialState(cpu=not device.startswith("cuda"))  # initialises the process group once per process
        return cls(state.process_index, state.num_processes, state.local_process_index)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[world_size, *tensor.shape]: every rank's tensor, in rank order."""
        if self.world_size == 1:
            return tensor[None]
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def gather_object(self, obj: object, dst: int = 0) -> list | None:
        """Every rank's `obj` in rank order on rank `dst`; None on the others."""
        if self.world_size == 1:
            return [obj]
        gathered = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()


ONE_PROCESS = Ranks(0, 1, 0)
