"""Layer and module kind of one tensor name, from the one structure model (merging/reading/structure.py).

The analysis frame takes every tensor's tower, layer, module, expert and role from `structure_of` over the whole
checkpoint; these helpers answer for a single name of a text model (the demo's probes, tests)."""
from __future__ import annotations

from merging.reading.structure import MODULE_ORDER, in_module_order, part_of, place_of

__all__ = ["MODULE_ORDER", "in_module_order", "layer_of", "module_of", "part_of"]


def layer_of(name: str) -> int:
    """Block index in a tensor name (within its tower), or -1 for tensors outside the blocks."""
    return place_of(name).layer


def module_of(name: str) -> str:
    """Module kind: q/k/v/qkv/kv/o, router, gate/up/gate_up/down, norm, embeddings, projector, lm_head, or other."""
    return place_of(name).module
