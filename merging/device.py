"""Device choice for the compute stage: `auto` is CUDA when present, else CPU."""
from __future__ import annotations

import torch

from .errors import RamStudioError

DEVICES = ("auto", "cpu", "cuda")


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


def to_compute(t: torch.Tensor, device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """Move a stored-dtype CPU tensor to the compute device as float32 (pinned, non-blocking on CUDA)."""
    if device.type == "cuda":
        t = t.pin_memory().to(device, non_blocking=True)
    if out is not None:
        out.copy_(t.reshape(out.shape))
        return out
    return t.to(torch.float32)
