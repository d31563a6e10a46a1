"""An agent's tensors read in the base's layout, from headers alone: the same weights under another family layout.

Two layouts of one model are recognised (facts: docs/models.md,
transformers 5's conversion mappings):
- legacy ↔ prefixed vision-language names (`model.layers.*`, `visual.*`, `language_model.model.*`,
  `vision_tower.*` ↔ `model.language_model.*`, `model.visual.*`, `model.vision_tower.*`, …): a rename, found
  through the canonical names of merging/reading/structure.py;
- per-expert ↔ fused MoE experts: `…experts.E.{gate,up,down}_proj.weight` (Mixtral: `block_sparse_moe.experts.E.
  w1/w3/w2`) ↔ `…experts.gate_up_proj [E, 2I, H]` (per expert the gate rows, then the up rows) and
  `…experts.down_proj [E, H, I]`, stacked along the expert axis as transformers' MergeModulelist(dim=0) +
  Concatenate(dim=1) do for the families in FUSED_EXPERT_TYPES (no transpose).

A `Source` says where each element of a base tensor lies in the agent: runs of consecutive elements
(`Block`s) of the agent's own tensors, so a chunk of rows is read piece by piece and nothing is materialised.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from merging.reading.structure import canonical, section_prefix, split_section

Headers = Mapping[str, tuple[str, tuple[int, ...]]]  # name -> (safetensors dtype code, shape)

# Model types whose fused experts transformers 5 builds from the per-expert tensors by stacking along the
# expert axis and concatenating gate then up along dim 1, with no transpose (its "mixtral" and "qwen2_moe"
# conversions); fused tensors of other types (e.g. qwen3_vl_moe, gpt-oss, llama4 store [E, H, 2I]) are not mapped.
FUSED_EXPERT_TYPES = frozenset({
    "mixtral", "minimax", "qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3", "olmoe", "flex_olmo",
    "glm4_moe", "dots1", "ernie4_5_moe", "hunyuan_v1_moe"})
_PROJ = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
_PER_EXPERT = re.compile(r"(?P<prefix>.*)\.experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight")
_FUSED = re.compile(r"(?P<prefix>.*)\.experts\.(?P<proj>gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?")


@dataclass(frozen=True)
class Block:
    """Elements [start, start + count) of the base-layout tensor are elements [source_start, source_start +
    count) of the agent's tensor `source` (flat, row-major)."""

    start: int
    source: str
    source_start: int
    count: int


@dataclass(frozen=True)
class Source:
    """How one base tensor is read from an agent: its dtype and shape there and the blocks that make it."""

    kind: str  # renamed | experts
    dtype: str
    shape: tuple[int, ...]
    blocks: tuple[Block, ...]


@dataclass
class LayoutMap:
    """An agent read in the base's layout: base tensor name → Source, the agent tensors read that way, a line
    per kind of mapping (`notes`) and why what still differs was not mapped (`problems`)."""

    sources: dict[str, Source]
    consumed: frozenset[str]
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def view(self, agent: Headers) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The agent's tensors as the base names them: mapped ones under the base's names, the rest as stored."""
        out = {name: (s.dtype, s.shape) for name, s in self.sources.items()}
        out.update({n: v for n, v in agent.items() if n not in self.consumed})
        return out


@dataclass(frozen=True)
class _Unit:
    """One expert's projection inside a tensor: (tensor, first element, elements, shape, dtype)."""

    name: str
    start: int
    count: int
    shape: tuple[int, ...]
    dtype: str


def _expert_units(name: str, dtype: str, shape: tuple[int, ...], fused_ok: bool) -> list[tuple[tuple, _Unit]] | None:
    """The (key, unit) pairs of an expert tensor in its own element order, or None for any other tensor. A key
    is (section, layer prefix, expert, projection), the same for one weight in either layout."""
    section, rest = split_section(name)
    m = _PER_EXPERT.fullmatch(rest)
    if m and len(shape) == 2:
        key = (section, m["prefix"], int(m["e"]), _PROJ[m["proj"]])
        return [(key, _Unit(name, 0, math.prod(shape), shape, dtype))]
    m = _FUSED.fullmatch(rest)
    if not (m and fused_ok and len(shape) == 3):
        return None
    experts, rows, cols = shape
    proj = m["proj"]
    if proj == "gate_up_proj":
        if rows % 2:
            return None
        half = rows // 2
        units = []
        for e in range(experts):
            for k, p in enumerate(("gate", "up")):
                units.append(((section, m["prefix"], e, p),
                              _Unit(name, (e * rows + k * half) * cols, half * cols, (half, cols), dtype)))
        return units
    p = _PROJ[proj]
    return [((section, m["prefix"], e, p), _Unit(name, e * rows * cols, rows * cols, (rows, cols), dtype))
            for e in range(experts)]


def _unique_canonical(names) -> dict[str, str]:
    """canonical name → name, for canonical names only one tensor has (an ambiguous one maps nothing)."""
    count = Counter(canonical(n) for n in names)
    return {canonical(n): n for n in names if count[canonical(n)] == 1}


def _model_type(config: Mapping | None) -> str:
    kind = (config or {}).get("model_type")
    return kind if isinstance(kind, str) else ""


def map_layout(base: Headers, agent: Headers, base_config: Mapping | None = None,
               agent_config: Mapping | None = None) -> LayoutMap | None:
    """How to read `agent` in `base`'s layout, or None when there is nothing to map (the same names, or no
    difference these rules explain). Only base tensors the agent lacks by name are mapped."""
    missing = [n for n in base if n not in agent]
    if not missing:
        return None
    kinds = {_model_type(base_config), _model_type(agent_config)} - {""}
    fused_ok = bool(kinds) and kinds <= FUSED_EXPERT_TYPES
    sources: dict[str, Source] = {}
    free = {n for n in agent if n not in base}  # agent names no base tensor takes as they are
    by_canonical = _unique_canonical(free)
    base_canonical = _unique_canonical(base)
    problems: list[str] = []
    agent_units: dict[tuple, _Unit] = {}
    for n in free:
        dtype, shape = agent[n]
        for key, unit in _expert_units(n, dtype, shape, fused_ok) or []:
            agent_units[key] = unit
    for name in missing:
        dtype, shape = base[name]
        c = canonical(name)
        other = by_canonical.get(c) if base_canonical.get(c) == name else None
        if other is not None:
            a_dtype, a_shape = agent[other]
            sources[name] = Source("renamed", a_dtype, a_shape, (Block(0, other, 0, math.prod(a_shape)),))
            continue
        src = _from_experts(name, dtype, shape, fused_ok, agent_units)
        if src is not None:
            sources[name] = src
    sources = _whole_sources_only(sources, agent, problems)
    if not fused_ok and any(_FUSED.fullmatch(split_section(n)[1]) for n in missing + sorted(free) if n not in sources):
        problems.append(_fused_problem(kinds))
    if not sources:
        return LayoutMap({}, frozenset(), [], problems) if problems else None
    consumed = frozenset(b.source for s in sources.values() for b in s.blocks)
    return LayoutMap(sources, consumed, _notes(sources, consumed), problems)


def _from_experts(name: str, dtype: str, shape: tuple[int, ...], fused_ok: bool,
                  agent_units: dict[tuple, _Unit]) -> Source | None:
    """A base expert tensor assembled from the agent's expert units (another layout), or None."""
    wanted = _expert_units(name, dtype, shape, fused_ok)
    if not wanted:
        return None
    blocks: list[Block] = []
    pos = 0
    dtypes = set()
    for key, unit in wanted:
        got = agent_units.get(key)
        if got is None or got.shape != unit.shape:
            return None
        dtypes.add(got.dtype)
        last = blocks[-1] if blocks else None
        if last is not None and last.source == got.name and last.source_start + last.count == got.start:
            blocks[-1] = Block(last.start, last.source, last.source_start, last.count + got.count)
        else:
            blocks.append(Block(pos, got.name, got.start, got.count))
        pos += got.count
    if len(dtypes) != 1:
        return None
    return Source("experts", dtypes.pop(), shape, tuple(blocks))


def _whole_sources_only(sources: dict[str, Source], agent: Headers, problems: list[str]) -> dict[str, Source]:
    """Keep only mappings whose agent tensors are read whole: an agent tensor part of which no base tensor
    takes (e.g. more experts than the base) is not mapped at all, so its extra weights show as a mismatch."""
    used: Counter[str] = Counter()
    for s in sources.values():
        for b in s.blocks:
            used[b.source] += b.count
    partial = {n for n, c in used.items() if c != math.prod(agent[n][1])}
    if partial:
        problems.append(f"{len(partial)} agent tensors would be read only in part (e.g. {sorted(partial)[0]!r}): "
                        "the agent has weights the base has no place for, such as more experts")
    return {n: s for n, s in sources.items() if not any(b.source in partial for b in s.blocks)}


def _fused_problem(kinds: set[str]) -> str:
    kind = ", ".join(sorted(kinds)) or "unknown"
    return (f"its MoE experts are fused differently from the base's, and fused experts of model type {kind} are "
            f"not mapped: RAM Studio reads fused and per-expert experts as each other for "
            f"{', '.join(sorted(FUSED_EXPERT_TYPES))} (stacked along the expert axis with no transpose, as "
            "transformers 5 stores them); re-save the agent with the base's transformers class (save_pretrained)")


def _rename_pair(agent_name: str, base_name: str) -> tuple[str, str]:
    """How a renamed tensor's names differ, as two patterns ("model.language_model.*", "model.*")."""
    a, b = section_prefix(agent_name), section_prefix(base_name)
    if a != b:
        return f"{a}*", f"{b}*"
    pair = ("*.mlp.*", "*.block_sparse_moe.*")  # the only other canonical difference (Mixtral's MoE block)
    return pair if ".block_sparse_moe." in base_name else pair[::-1]


def _notes(sources: dict[str, Source], consumed: frozenset[str]) -> list[str]:
    """One line per kind of mapping, with counts, as `inspect` shows it."""
    notes = []
    pairs: Counter[tuple[str, str]] = Counter()
    for name, s in sources.items():
        if s.kind == "renamed":
            pairs[_rename_pair(s.blocks[0].source, name)] += 1
    for (a, b), n in sorted(pairs.items(), key=lambda kv: -kv[1]):
        notes.append(f"{n} tensor{'s' if n != 1 else ''} named {a} read as the base's {b} (the same weights under "
                     "another naming of this family)")
    experts = {n: s for n, s in sources.items() if s.kind == "experts"}
    if experts:
        from_agent = {b.source for s in experts.values() for b in s.blocks}
        fused_base = sum(1 for s in experts.values() if len(s.shape) == 3)
        if fused_base:
            notes.append(f"{fused_base} fused expert tensors of the base assembled from {len(from_agent)} per-expert "
                         "tensors of the agent (stacked along the expert axis; gate_up = gate rows, then up rows)")
        if len(experts) - fused_base:
            notes.append(f"{len(experts) - fused_base} per-expert tensors of the base read as slices of "
                         f"{len(from_agent)} fused expert tensors of the agent ([E, 2I, H] gate_up: gate rows, then up "
                         "rows; [E, H, I] down)")
    return notes
