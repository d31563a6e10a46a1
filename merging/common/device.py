"""Device choice for the compute stage (`auto` is CUDA when present, else CPU), and the lanes that move
chunks to the device and results back.

On CUDA, copies in run on their own stream from pinned staging buffers, compute runs on the current
stream and copies out on a third, with events between them, so that the copy of one chunk overlaps the
compute of another; no step waits for the GPU except the writer, on the event of the chunk it writes.
On the CPU the same calls do nothing but hand the tensors through, so the code that uses them runs, and
is tested, without a GPU.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from merging.common.errors import RamStudioError

DEVICES = ("auto", "cpu", "cuda")
GPU_CHUNK_ELEMS = 1 << 26  # 64M elements per chunk on a GPU: fewer, larger copies and launches


def pick_device(name: str = "auto") -> torch.device:
    """Resolve 'auto' | 'cpu' | 'cuda' | 'cuda:N' to a torch device, with a clear error if CUDA is absent."""
    name = (name or "auto").lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RamStudioError("--device cuda was asked for but no CUDA GPU is available.",
                                 "Use --device auto or cpu.")
        return torch.device(name)
    raise RamStudioError(f"unknown device {name!r}.", f"Use one of {', '.join(DEVICES)}.")


def chunk_elems_for(device: torch.device, chunk_elems: int, default: int) -> int:
    """The chunk size to use: on a GPU the default grows to GPU_CHUNK_ELEMS (results do not depend on it)."""
    if device.type == "cuda" and chunk_elems == default:
        return max(chunk_elems, GPU_CHUNK_ELEMS)
    return chunk_elems


def gpu_style(device: torch.device) -> bool:
    """Whether passes run the way they run on a GPU: sums kept on the device and read once at the end,
    whole tensors assembled on the device for methods with passes. True on CUDA; on the CPU when
    $RAM_STUDIO_GPU_STYLE=1 (with RAM_STUDIO_KERNELS=torch), so that the tests run that code without a GPU."""
    return device.type == "cuda" or os.environ.get("RAM_STUDIO_GPU_STYLE") == "1"


def fits_on_device(device: torch.device, nbytes: int) -> bool:
    """Whether `nbytes` of working memory fit on the device now: on CUDA, within half of what is free;
    on the CPU (GPU-style runs in tests) within $RAM_STUDIO_ASSEMBLE_BYTES (default 64 MB)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return nbytes <= free // 2
    return nbytes <= int(os.environ.get("RAM_STUDIO_ASSEMBLE_BYTES", 64 << 20))


def to_compute(t: torch.Tensor, device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """Move a stored-dtype CPU tensor to the compute device and widen it to float32 there.

    A pinned source is copied without blocking (the caller keeps it alive until the copy is done)."""
    if device.type != "cpu":
        t = t.to(device, non_blocking=t.is_pinned())
    if out is not None:
        out.copy_(t.reshape(out.shape))
        return out
    return t.to(torch.float32)


class Lanes:
    """Copy-in, compute and copy-out for one device (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.copy_in = torch.cuda.Stream(device)
            self.copy_out = torch.cuda.Stream(device)

    def upload(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """`host` (stored dtype) widened to float32 on the device, and an event after which `host` may be
        reused (None: at once)."""
        if not self.cuda:
            return to_compute(host, self.device), None
        with torch.cuda.stream(self.copy_in):
            dev = host.to(self.device, non_blocking=host.is_pinned())
            done = torch.cuda.Event()
            done.record(self.copy_in)
        torch.cuda.current_stream(self.device).wait_event(done)
        dev.record_stream(torch.cuda.current_stream(self.device))
        return dev.to(torch.float32), done

    def download(self, dev: torch.Tensor, host: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        """`dev` on the host (into `host`, pinned, when given), and an event to wait for before reading it
        (None: it is ready)."""
        if not self.cuda:
            if host is None or dev.device.type == "cpu" and host.data_ptr() == dev.data_ptr():
                return dev, None
            host.copy_(dev)
            return host, None
        if host is None:
            host = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
        self.copy_out.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_out):
            host.copy_(dev, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.copy_out)
        dev.record_stream(self.copy_out)
        return host, done

    @staticmethod
    def wait(event: Any) -> None:
        if event is not None:
            event.synchronize()
