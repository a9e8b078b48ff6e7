"""One job over several processes: torchrun starts one process per GPU, on
one machine or several, and each synthesizes its own share of the lines.

Every process reads the same corpus and earlier manifest and so plans the
same; the processes then only need to agree on a few things: the run seed
(rank 0's), when earlier work may be overwritten, and, at the end, the rows
each one made, which rank 0 merges into the one manifest. Between those
points they never wait for each other.
"""
from __future__ import annotations

import contextlib
import heapq
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# Each process keeps its own rows, crash-safe, in a file named by
# PARTIAL_MANIFESTS until rank 0 merges them into manifest.jsonl; a later run
# of any size reads the ones a stopped run left behind.
from tts_cli.manifest import partial_manifest_name

# How long a process waits for the others at the end. The shares are balanced,
# so the wait is normally short; it runs out only when another process (or
# its machine) is gone without torchrun noticing, and by then this process's
# rows are already saved.
WAIT = timedelta(hours=1)


class GroupError(Exception):
    """The processes could not start or finish together; the message is one line."""


@dataclass(frozen=True)
class Group:
    """This process's place in a torchrun job."""
    rank: int         # 0 .. world-1, over all machines
    world: int        # processes in the job
    local_rank: int   # this process's number on its machine: its GPU

    @property
    def partial_manifest(self) -> str:
        return partial_manifest_name(self.rank, self.world)

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world}"


def from_environment(env: Mapping[str, str] = os.environ) -> Group | None:
    """The job torchrun describes in RANK, WORLD_SIZE and LOCAL_RANK; None for
    a process on its own (no torchrun, or torchrun with one process), which
    then runs exactly as tts-batch always does."""
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        return Group(rank=int(env["RANK"]), world=world, local_rank=int(env.get("LOCAL_RANK", "0")))
    except (KeyError, ValueError):
        raise GroupError(f"WORLD_SIZE={env.get('WORLD_SIZE')!r} but RANK={env.get('RANK')!r}: "
                         f"start several processes with torchrun, which sets both") from None


def device_for(group: Group, name: str | None) -> str | None:
    """One GPU per process: ``cuda``, or no --device on a CUDA machine, becomes
    cuda:LOCAL_RANK. A fixed cuda:N would put every process on one GPU."""
    if name is not None and name.startswith("cuda:"):
        raise GroupError(f"--device {name}: under torchrun each process takes the GPU of its "
                         f"LOCAL_RANK; pass --device cuda or leave --device out")
    if name == "cuda" or (name is None and torch.cuda.is_available()):
        return f"cuda:{group.local_rank}"
    return name


@contextlib.contextmanager
def joined(group: Group | None, device: str | None = None) -> Iterator[None]:
    """Join the job's process group for the block (nothing without a group),
    with ``device`` (this process's GPU, see device_for) as the current one.

    gloo, on the CPU, even when the work runs on GPUs: the processes exchange
    a seed and their manifest rows, never tensors, so NCCL would bring nothing,
    and with gloo a process whose peer died gets an error it can report
    (its rows already saved) instead of NCCL's watchdog aborting it."""
    if group is None:
        yield
        return
    _make_current(device)
    try:
        dist.init_process_group("gloo", timeout=WAIT)
    except (RuntimeError, ValueError) as e:
        raise GroupError(f"{group}: could not join the other processes ({_first_line(e)}); "
                         f"start the job with torchrun") from None
    try:
        yield
    finally:
        dist.destroy_process_group()


def _make_current(device: str | None) -> None:
    """CUDA graph capture, events and Triton launches run on the current GPU,
    which is GPU 0 unless set; a missing GPU is left for --device's own check."""
    if device is None or not device.startswith("cuda:") or not torch.cuda.is_available():
        return
    index = torch.device(device).index
    if index < torch.cuda.device_count():
        torch.cuda.set_device(index)


def agree_on_seed(seed: int) -> int:
    """Rank 0's run seed, on every rank: a seed drawn at random differs per process."""
    value = torch.tensor([seed], dtype=torch.long)
    _collective(dist.broadcast, value, src=0)
    return int(value.item())


def from_first(item):
    """Rank 0's ``item`` (any picklable value, say a path it chose) on every rank."""
    items = [item]
    _collective(dist.broadcast_object_list, items, src=0)
    return items[0]


def barrier() -> None:
    _collective(dist.barrier)


def gather_to_first(group: Group, item):
    """Every rank's ``item`` in rank order on rank 0; None elsewhere."""
    items = [None] * group.world if group.rank == 0 else None
    _collective(dist.gather_object, item, items, dst=0)
    return items


def share(sizes: list[int], world: int) -> list[int]:
    """The rank that makes each item: longest first, each to the rank with
    the fewest symbols so far (ties: the lower rank). A pure function of the
    sizes, so every rank computes the same deal without talking."""
    owners = [0] * len(sizes)
    load = [(0, rank) for rank in range(world)]   # a heap of (symbols so far, rank)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        total, rank = heapq.heappop(load)
        owners[i] = rank
        heapq.heappush(load, (total + sizes[i], rank))
    return owners


def _collective(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except RuntimeError as e:   # torch's DistError is one; a peer that died closes the connection
        raise GroupError(f"another process of this job stopped ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    """The gist of torch's message: gloo's start with a source location and
    go on with advice ("[.../pair.cc:553] Connection closed by peer [addr]:port.
    This is typically caused by...")."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0])
    return first.split(". ")[0].rstrip(".")
