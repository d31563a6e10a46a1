"""Checks on every output chunk before it is written: finite values, and whether the merge changed anything
beyond rounding — for every float dtype a merge can write (F64, F32, F16, BF16, and the base's F8_E4M3 /
F8_E5M2 when it is written in its own dtype).

They run on the writer thread, over the bit patterns of the output dtype (the values that will be stored,
after rounding), with the numba kernels when present and numpy otherwise. Three things are tracked:

- a value that is not finite in the output dtype refuses the merge (F8_E4M3 has no infinity: torch's cast
  saturates at ±448, so for it the float32 values are checked against its range before the cast);
- `changed`: some stored value differs from the base's (±0 count as equal);
- `beyond_rounding`: some stored value differs from the base's by more than the float32 computation can
  leave as rounding: ROUNDING_STEPS · ε(float32) · (the chunk's largest |θ_base| + largest |τ|). Two agents that
  differ only in sign leave ~1e-7 of float32 rounding where the weights are ~1: such a merge changes nothing
  real, and is refused like a no-op. (For outputs coarser than float32 — BF16, F16, F8 — a change this small
  rounds away in the output dtype itself, and the merge is refused as "changes nothing".)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from merging.common.dtypes import ST_TO_TORCH
from merging.common.errors import RamStudioError
from merging.kernels import kernels_enabled
from merging.kernels import ready as kernels_ready

# dtype → (unsigned view, non-finite mask, magnitude mask): a value is not finite when (bits & mask) == mask
# (the exponent all ones; for F8_E4M3, which has no infinity, exponent and mantissa all ones: its NaN).
_BITS = {
    torch.bfloat16: (torch.uint16, 0x7F80, 0x7FFF),
    torch.float16: (torch.uint16, 0x7C00, 0x7FFF),
    torch.float32: (torch.uint32, 0x7F800000, 0x7FFFFFFF),
    torch.float64: (torch.uint64, 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF),
    torch.float8_e4m3fn: (torch.uint8, 0x7F, 0x7F),
    torch.float8_e5m2: (torch.uint8, 0x7C, 0x7F),
}
# The same widths as signed views, for torch's bit operations on a device.
_SIGNED = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64, torch.float8_e4m3fn: torch.int8, torch.float8_e5m2: torch.int8}
# Dtypes whose cast from float32 saturates instead of overflowing to infinity: checked before the cast.
SATURATING = {torch.float8_e4m3fn: float(torch.finfo(torch.float8_e4m3fn).max)}
N_FLAGS = 3  # `flags`: [not finite, changed, changed beyond rounding]
ROUNDING_STEPS = 4.0  # a change within this many float32 epsilons of the weights' scale is rounding
_EPS32 = float(torch.finfo(torch.float32).eps)


@dataclass
class OutputGuard:
    """Refuses a non-finite output value (naming tensor, index and the parameters to blame) and
    remembers whether any output value differs from the base, and whether any differs by more than rounding."""

    blame: str  # e.g. "lambda=1e+38, out_dtype F16"
    changed: bool = False
    beyond_rounding: bool = False
    _fused: bool = field(default_factory=kernels_enabled)

    def check(self, tensor: str, offset: int, out: torch.Tensor, base: torch.Tensor, tau_peak: float = 0.0) -> None:
        """`out` is the chunk as it will be stored, `base` the base's stored values of the same elements."""
        self.check_finite(tensor, offset, out)
        self.note_change(out, base, tau_peak)

    def check_range(self, tensor: str, offset: int, merged: torch.Tensor, target: torch.dtype) -> None:
        """Before casting float32 `merged` to a saturating `target` (F8_E4M3): refuse a value beyond its
        range, which the cast would silently clip to the largest value."""
        limit = SATURATING.get(target)
        if limit is None or merged.numel() == 0:
            return
        flat = merged.reshape(-1)
        over = ~(flat.abs() <= limit)  # NaN counts as out of range too
        if bool(over.any()):
            code = next((c for c, t in ST_TO_TORCH.items() if t == target), str(target))
            self._refuse(tensor, offset + int(over.nonzero()[0, 0]), f"is beyond ±{limit:g}, the range of {code}")

    def check_finite(self, tensor: str, offset: int, out: torch.Tensor) -> None:
        """Refuse a non-finite value of `out` (the chunk as it will be stored), naming where it is."""
        spec = _BITS.get(out.dtype)
        if spec is None or out.numel() == 0:
            return
        view, exp_mask, _ = spec
        bits = _np(out.reshape(-1).view(view))
        i = _first_nonfinite(bits, exp_mask, self._kernels(bits))
        if i >= 0:
            self._refuse(tensor, offset + i)

    def note_change(self, out: torch.Tensor, base: torch.Tensor, tau_peak: float = 0.0) -> None:
        """Remember whether `out` differs from `base`, and by more than rounding (`tau_peak`: the chunk's
        largest |τ| over the agents). Stops looking once a change beyond rounding was seen: cheap enough for
        the compute thread, which can then hand the input buffers back at once."""
        spec = _BITS.get(out.dtype)
        if self.beyond_rounding or spec is None or out.numel() == 0:
            return
        view, _, mag_mask = spec
        ref = base.reshape(-1).to(out.dtype) if base.dtype != out.dtype else base.reshape(-1)
        a, b = _np(out.reshape(-1).view(view)), _np(ref.view(view))
        if _values_differ(a, b, mag_mask, self._kernels(a)):
            self.changed = True
            self.beyond_rounding = _beyond_rounding(out.reshape(-1), base.reshape(-1), tau_peak)

    def _kernels(self, bits: np.ndarray | None = None) -> bool:
        if bits is not None and bits.dtype.itemsize == 1:  # the kernels are compiled for 16- to 64-bit words
            return False
        return self._fused and kernels_ready(("first_nonfinite", "values_differ"), "bf16")

    def flags(self, out: torch.Tensor, base: torch.Tensor, tau_peak: torch.Tensor | float = 0.0) -> torch.Tensor:
        """The same checks as torch operations on `out`'s device, without waiting for it: a bool tensor
        [some value is not finite, some value differs from `base`, some value differs by more than one step]
        (`base`: the base's values in `out`'s dtype; `tau_peak`: the chunk's largest |τ|, a tensor on the same
        device or a number). `check_flags` reads it once the chunk is on the host."""
        spec = _BITS.get(out.dtype)
        if spec is None or out.numel() == 0:
            return torch.zeros(N_FLAGS, dtype=torch.bool, device=out.device)
        _, exp_mask, mag_mask = spec
        a = out.reshape(-1).view(_SIGNED[out.dtype])
        b = base.reshape(-1).view(_SIGNED[out.dtype])
        bad = ((a & exp_mask) == exp_mask).any()
        differ = ((a != b) & (((a | b) & mag_mask) != 0)).any()
        o, r = out.reshape(-1).float(), base.reshape(-1).float()
        beyond = (o - r).abs().max() > _threshold(r.abs().max(), tau_peak)
        return torch.stack([bad, differ, differ & beyond])

    def check_flags(self, tensor: str, offset: int, flags: torch.Tensor, out: torch.Tensor) -> None:
        """Act on `flags` (from `flags`, on the host): name the first non-finite value of `out` (the
        chunk as stored, on the host), or note the change."""
        if bool(flags[0]):
            spec = _BITS[out.dtype]
            i = _first_nonfinite(_np(out.reshape(-1).view(spec[0])), spec[1], False)
            self._refuse(tensor, offset + max(i, 0))
        if bool(flags[1]):
            self.changed = True
        if bool(flags[2]):
            self.beyond_rounding = True

    def _refuse(self, tensor: str, index: int, what: str = "is not finite") -> None:
        raise RamStudioError(
            f"the merged value of tensor {tensor!r} at flat index {index:,} {what}, although "
            "every input is finite there.",
            f"The merge's scale factors ({self.blame}) push it out of range: use smaller values "
            "(or a wider output dtype).")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy()


def _threshold(base_peak, tau_peak):
    """The largest change float32 rounding can leave where the weights are at most `base_peak` + `tau_peak`."""
    return ROUNDING_STEPS * _EPS32 * (base_peak + tau_peak)


def _beyond_rounding(out: torch.Tensor, base: torch.Tensor, tau_peak: float) -> bool:
    """Whether some value of `out` (stored dtype) differs from `base` (stored values) by more than rounding.
    In blocks: small temporaries, and it stops at the first block that decides."""
    base_peak = 0.0
    for start in range(0, base.numel(), _BLOCK):
        base_peak = max(base_peak, float(base[start:start + _BLOCK].float().abs().max()))
    limit = _threshold(base_peak, float(tau_peak))
    for start in range(0, out.numel(), _BLOCK):
        stop = start + _BLOCK
        if float((out[start:stop].float() - base[start:stop].float()).abs().max()) > limit:
            return True
    return False


_BLOCK = 1 << 20


def _first_nonfinite(bits: np.ndarray, exp_mask: int, fused: bool) -> int:
    if fused:
        from merging.kernels import cpu

        return int(cpu.first_nonfinite(bits, bits.dtype.type(exp_mask)))
    hit = np.flatnonzero((bits & bits.dtype.type(exp_mask)) == exp_mask)
    return int(hit[0]) if hit.size else -1


def _values_differ(a: np.ndarray, b: np.ndarray, mag_mask: int, fused: bool) -> bool:
    if fused:
        from merging.kernels import cpu

        return bool(cpu.values_differ(a, b, a.dtype.type(mag_mask)))
    m = a.dtype.type(mag_mask)
    return bool(np.any((a != b) & (((a & m) != 0) | ((b & m) != 0))))
