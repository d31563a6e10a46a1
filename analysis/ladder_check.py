"""The ε ladder a pass is asked for, checked before anything is opened: finite, ≥ 0, distinct, sorted, and at
most MAX_LADDER values (each ε adds a full set of per-tensor statistics: time and memory grow with it)."""
from __future__ import annotations

from typing import Sequence

from merging.common.errors import RamStudioError, printable

MAX_LADDER = 64  # ε values per pass: each costs a full set of per-tensor statistics (time and memory)


def validate_ladder(ladder: Sequence[float]) -> tuple[float, ...]:
    """ε values must be finite, ≥ 0 and distinct (at most MAX_LADDER of them); they are sorted."""
    if len(ladder) > MAX_LADDER:
        raise RamStudioError(f"the ε ladder has {len(ladder):,} values, more than {MAX_LADDER}: every ε adds a full "
                             "set of per-tensor statistics to the pass (time and memory grow with it).",
                             f"Give at most {MAX_LADDER} values of ε (the default ladder has 8).")
    try:
        values = sorted({float(e) for e in ladder})
    except (TypeError, ValueError):
        raise RamStudioError(f"cannot read the ε ladder {printable(str(ladder), 80)}.",
                             "Give numbers like 0,1e-6,1e-5.") from None
    if not values:
        raise RamStudioError("the ε ladder is empty.", "Give at least one ε, e.g. 1e-5.")
    if any(e < 0 or e != e or e == float("inf") for e in values):
        raise RamStudioError(f"invalid ε in {values}: each ε must be a finite number ≥ 0.", "E.g. 0,1e-6,1e-5.")
    return tuple(values)
