"""Checks on every output chunk before it is written: finite values, and whether the merge changed anything.

They run on the writer thread, over the bit patterns of the output dtype (the values that will be
stored, after rounding), with the numba kernels when present and numpy otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import RamStudioError
from .kernels import kernels_enabled
from .kernels import ready as kernels_ready

# dtype → (signed view for torch's bit operations, exponent mask, magnitude mask); the masks are positive
_SIGNED = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}
# dtype → (unsigned view, exponent mask, magnitude mask)
_BITS = {
    torch.bfloat16: (torch.uint16, 0x7F80, 0x7FFF),
    torch.float16: (torch.uint16, 0x7C00, 0x7FFF),
    torch.float32: (torch.uint32, 0x7F800000, 0x7FFFFFFF),
    torch.float64: (torch.uint64, 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF),
}


@dataclass
class OutputGuard:
    """Refuses a non-finite output value (naming tensor, index and the parameters to blame) and
    remembers whether any output value differs from the base."""

    blame: str  # e.g. "lambda=1e+38, out_dtype F16"
    changed: bool = False
    _fused: bool = field(default_factory=kernels_enabled)

    def check(self, tensor: str, offset: int, out: torch.Tensor, base: torch.Tensor) -> None:
        """`out` is the chunk as it will be stored, `base` the base's stored values of the same elements."""
        self.check_finite(tensor, offset, out)
        self.note_change(out, base)

    def check_finite(self, tensor: str, offset: int, out: torch.Tensor) -> None:
        """Refuse a non-finite value of `out` (the chunk as it will be stored), naming where it is."""
        spec = _BITS.get(out.dtype)
        if spec is None or out.numel() == 0:
            return
        view, exp_mask, _ = spec
        i = _first_nonfinite(_np(out.reshape(-1).view(view)), exp_mask, self._kernels())
        if i >= 0:
            self._refuse(tensor, offset + i)

    def note_change(self, out: torch.Tensor, base: torch.Tensor) -> None:
        """Remember whether `out` differs from `base` (stops looking once a difference was seen: cheap
        enough for the compute thread, which can then hand the input buffers back at once)."""
        spec = _BITS.get(out.dtype)
        if self.changed or spec is None or out.numel() == 0:
            return
        view, _, mag_mask = spec
        ref = base.reshape(-1).to(out.dtype) if base.dtype != out.dtype else base.reshape(-1)
        self.changed = _values_differ(_np(out.reshape(-1).view(view)), _np(ref.view(view)), mag_mask,
                                      self._kernels())

    def _kernels(self) -> bool:
        return self._fused and kernels_ready(("first_nonfinite", "values_differ"), "bf16")


    def flags(self, out: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """The same two checks as torch operations on `out`'s device, without waiting for it: a bool
        tensor [some value is not finite, some value differs from `base`] (`base`: the base's values in
        `out`'s dtype). `check_flags` reads it once the chunk is on the host."""
        spec = _BITS.get(out.dtype)
        if spec is None or out.numel() == 0:
            return torch.zeros(2, dtype=torch.bool, device=out.device)
        _, exp_mask, mag_mask = spec
        a = out.reshape(-1).view(_SIGNED[out.dtype])
        b = base.reshape(-1).view(_SIGNED[out.dtype])
        bad = ((a & exp_mask) == exp_mask).any()
        differ = ((a != b) & (((a | b) & mag_mask) != 0)).any()
        return torch.stack([bad, differ])

    def check_flags(self, tensor: str, offset: int, flags: torch.Tensor, out: torch.Tensor) -> None:
        """Act on `flags` (from `flags`, on the host): name the first non-finite value of `out` (the
        chunk as stored, on the host), or note the change."""
        if bool(flags[0]):
            spec = _BITS[out.dtype]
            i = _first_nonfinite(_np(out.reshape(-1).view(spec[0])), spec[1], False)
            self._refuse(tensor, offset + max(i, 0))
        if bool(flags[1]):
            self.changed = True

    def _refuse(self, tensor: str, index: int) -> None:
        raise RamStudioError(
            f"the merged value of tensor {tensor!r} at flat index {index:,} is not finite, although "
            "every input is finite there.",
            f"The merge's scale factors ({self.blame}) push it out of range: use smaller values "
            "(or a wider output dtype).")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy()


def _first_nonfinite(bits: np.ndarray, exp_mask: int, fused: bool) -> int:
    if fused:
        from .kernels import cpu

        return int(cpu.first_nonfinite(bits, bits.dtype.type(exp_mask)))
    hit = np.flatnonzero((bits & bits.dtype.type(exp_mask)) == exp_mask)
    return int(hit[0]) if hit.size else -1


def _values_differ(a: np.ndarray, b: np.ndarray, mag_mask: int, fused: bool) -> bool:
    if fused:
        from .kernels import cpu

        return bool(cpu.values_differ(a, b, a.dtype.type(mag_mask)))
    m = a.dtype.type(mag_mask)
    return bool(np.any((a != b) & (((a & m) != 0) | ((b & m) != 0))))
