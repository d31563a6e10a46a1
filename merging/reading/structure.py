"""The structure of a checkpoint, from its tensor names: for every tensor its tower (language, vision, audio,
other), its layer within that tower, its module kind and, in a mixture of experts, its expert (an index, or
"fused" for the 3-D tensors that stack every expert) and its role (routed expert, shared expert, router).

One model, used by the analysis (its frame's grouping columns), the charts, `inspect` and the layout mapping
(merging/reading/layout.py), which recognises the same weights under another family layout through the same
canonical names. Rules cover the families transformers 5 ships for text, MoE and vision-language models (Llama,
Mistral, Qwen2/2.5/3, Gemma 1-3, Qwen3-MoE, Mixtral, Qwen2-MoE, DeepSeek-V2/V3 style MLA and shared experts,
Qwen2-VL/2.5-VL, LLaVA-style towers and projectors). A name no rule knows keeps the fallback layer rule and the
module kind "other", and is listed in `Structure.unknown` — never grouped with a known kind.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import numpy as np

TOWERS = ("language", "vision", "audio", "other")
ROLES = ("expert", "shared_expert", "router")
FUSED = "fused"

# Where each section of a checkpoint starts (longest prefixes first): the canonical section name replaces the
# prefix, so that the legacy and the prefixed names of one vision-language model give the same canonical name.
_SECTIONS = [
    ("model.language_model.", "language"), ("language_model.model.", "language"), ("model.text_model.", "language"),
    ("language_model.lm_head.", "head"), ("lm_head.", "head"),
    ("model.visual.", "vision"), ("visual.", "vision"),
    ("model.vision_tower.vision_model.", "vision"), ("vision_tower.vision_model.", "vision"),
    ("model.vision_tower.", "vision"), ("vision_tower.", "vision"), ("model.vision_model.", "vision"),
    ("model.multi_modal_projector.", "projector"), ("multi_modal_projector.", "projector"),
    ("model.connector.", "projector"),
    ("model.audio_tower.", "audio"), ("audio_tower.", "audio"),
    ("model.", "language"),
]
_SECTION_TOWER = {"language": "language", "head": "language", "vision": "vision", "audio": "audio"}
_SECTION_RE = re.compile("|".join(re.escape(p) for p, _ in _SECTIONS))  # first match wins, as in the list
_SECTION_OF = dict(_SECTIONS)

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_PROJ = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down",
         "gate_up_proj": "gate_up"}
_PROJ_NAMES = "|".join(_PROJ)
_EXPERT = re.compile(rf"(?:^|\.)experts\.(\d+)\.({_PROJ_NAMES})\.")
_FUSED_EXPERT = re.compile(rf"(?:^|\.)experts\.({_PROJ_NAMES})(?:_bias|_blocks|_scales)?(?:\.weight|\.bias)?$")
_SHARED = re.compile(rf"(?:^|\.)shared_experts?\.({_PROJ_NAMES})\.")
_ROUTER = re.compile(r"(?:^|\.)(?:(?:mlp|moe|block_sparse_moe|feed_forward)\.gate|shared_expert_gate|router)"
                     r"\.(?:weight|bias|e_score_correction_bias)$")
# Module kinds of everything outside the experts, first match wins (attention, MLP, norms, embeddings, heads).
_KINDS = [
    ("embeddings", re.compile(r"(?:^|\.)(?:embed_tokens|wte|wpe|word_embeddings|position_embeddings?|patch_embed"
                              r"|patch_embedding|class_embedding)(?:\.|$)")),
    ("q", re.compile(r"\.(?:q_proj|query|q_a_proj|q_b_proj)\.")),
    ("k", re.compile(r"\.(?:k_proj|key)\.")),
    ("v", re.compile(r"\.(?:v_proj|value)\.")),
    ("qkv", re.compile(r"\.(?:qkv|qkv_proj|query_key_value|c_attn|W_pack|Wqkv)\.")),
    ("kv", re.compile(r"\.(?:kv_a_proj_with_mqa|kv_b_proj|kv_proj)\.")),
    ("o", re.compile(r"\.(?:o_proj|dense|out_proj)\.|\.(?:attn|attention)\.(?:proj|c_proj)\.")),
    ("gate_up", re.compile(r"\.gate_up_proj\.")),
    ("gate", re.compile(r"\.(?:gate_proj|w1)\.")),
    ("up", re.compile(r"\.(?:up_proj|w3|fc1|c_fc|dense_h_to_4h)\.")),
    ("down", re.compile(r"\.(?:down_proj|w2|fc2|dense_4h_to_h)\.|\.mlp\.c_proj\.")),
    ("norm", re.compile(r"(?:norm|ln_\w+|layernorm|layer_norm)[^.]*\.(?:weight|bias)$")),
]
# The one order of module kinds every table, chart and heatmap uses: the attention block, then the MoE block
# (router, routed experts, shared expert), the dense MLP, norms, and what lies outside the blocks.
MODULE_ORDER = ["embeddings", "q", "k", "v", "qkv", "kv", "o", "router",
                "expert gate", "expert up", "expert gate_up", "expert down",
                "shared gate", "shared up", "shared gate_up", "shared down",
                "gate", "up", "gate_up", "down", "norm", "projector", "lm_head", "other"]
_ROLE_WORD = {"expert": "expert", "shared_expert": "shared"}


@dataclass(frozen=True, slots=True)
class Place:
    """Where one tensor sits: tower, layer in that tower (−1 outside its blocks), module kind, expert ("" for
    none, "fused", or the index as text) and MoE role ("" for none, expert, shared_expert, router)."""

    tower: str
    layer: int
    module: str
    expert: str = ""
    role: str = ""

    @property
    def part(self) -> str:
        """The module kind with its MoE role, as charts group it: "q", "router", "expert gate", "shared down"."""
        return part_of(self.module, self.role)


def part_of(module: str, role: str) -> str:
    """A module kind qualified by its MoE role ("expert gate", "shared down"; a router is "router")."""
    word = _ROLE_WORD.get(role)
    return f"{word} {module}" if word else module


def in_module_order(kinds: Iterable) -> list[str]:
    """The distinct module kinds (or role-qualified parts) of `kinds` in model order (MODULE_ORDER; unknown
    kinds last, alphabetically): the one order every table, chart and heatmap uses."""
    rank = {m: i for i, m in enumerate(MODULE_ORDER)}
    return sorted({str(k) for k in kinds}, key=lambda k: (rank.get(k, len(rank)), k))


@lru_cache(maxsize=65536)
def split_section(name: str) -> tuple[str, str]:
    """(section, rest): the canonical section of a tensor name ("language", "head", "vision", "projector",
    "audio", or "" when no known prefix matches) and the name after that prefix, with Mixtral's legacy
    `block_sparse_moe` written `mlp` as transformers 5 names it in memory."""
    m = _SECTION_RE.match(name)
    section, rest = (_SECTION_OF[m.group()], name[m.end():]) if m else ("", name)
    return section, rest.replace(".block_sparse_moe.", ".mlp.")


def section_prefix(name: str) -> str:
    """The literal prefix of a name's section ("model.language_model.", "visual.", …; "" when none matches)."""
    return next((prefix for prefix, _sec in _SECTIONS if name.startswith(prefix)), "")


def canonical(name: str) -> str:
    """One name for one weight whatever the layout's prefix (legacy or prefixed vision-language names)."""
    section, rest = split_section(name)
    return f"{section}:{rest}"


def _module(section: str, rest: str) -> tuple[str, str, str]:
    """(module, expert, role) of the part of a name after its section prefix."""
    m = _EXPERT.search(rest)
    if m:
        return _PROJ[m.group(2)], str(int(m.group(1))), "expert"
    return _kind(section, _NUMBER.sub("0", rest))  # layer numbers never change the kind: one lookup per pattern


_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole dot-separated number (a layer's, a block's), not fc1's 1


@lru_cache(maxsize=4096)
def _kind(section: str, rest: str) -> tuple[str, str, str]:
    """(module, expert, role) of a name outside the per-expert tensors (its numbered components zeroed: one cache
    entry per pattern)."""
    m = _FUSED_EXPERT.search(rest)
    if m:
        return _PROJ[m.group(1)], FUSED, "expert"
    m = _SHARED.search(rest)
    if m:
        return _PROJ[m.group(1)], "", "shared_expert"
    if _ROUTER.search(rest):
        return "router", "", "router"
    if section == "head" or rest in ("output.weight", "lm_head.weight"):
        return "lm_head", "", ""
    for kind, pattern in _KINDS:
        if pattern.search("." + rest):
            return kind, "", ""
    if section == "projector" or (section == "vision" and rest.startswith("merger.")):
        return "projector", "", ""
    return "other", "", ""


def place_of(name: str, towers: frozenset[str] = frozenset({"language"})) -> Place:
    """The place of one tensor; `towers` are the towers the checkpoint has (a projector belongs to its only
    non-language tower; a name outside every known section is language in a text model, "other" beside
    vision or audio towers)."""
    return _place(*split_section(name), towers)


def _place(section: str, rest: str, towers: frozenset[str]) -> Place:
    """The place of a name split by `split_section`."""
    tower = _SECTION_TOWER.get(section)
    if tower is None:
        if section == "projector":
            extra = sorted(towers - {"language", "other"})
            tower = extra[0] if len(extra) == 1 else "other"
        else:
            tower = "language" if towers <= {"language"} else "other"
    m = _LAYER.search(rest)
    module, expert, role = _module(section, rest)
    return Place(tower, int(m.group(1)) if m else -1, module, expert, role)


def towers_of(names: Iterable[str]) -> frozenset[str]:
    """The towers a checkpoint has, from its names' sections."""
    found = {_SECTION_TOWER.get(split_section(n)[0], "") for n in names}
    return frozenset(t for t in found if t) or frozenset({"language"})


@dataclass
class Structure:
    """The places of a checkpoint's tensors as columns (one entry per name, in `names` order): tower, layer,
    module, expert, role — arrays, so that statistics can be grouped without a Python row per tensor."""

    names: list[str]
    tower: np.ndarray  # object: "language" | "vision" | "audio" | "other"
    layer: np.ndarray  # int64 (objects when a number exceeds int64): −1 outside the blocks
    module: np.ndarray  # object
    expert: np.ndarray  # object: "" | "fused" | "<index>"
    role: np.ndarray  # object: "" | expert | shared_expert | router

    @property
    def unknown(self) -> list[str]:
        """Names no rule recognises (module kind "other"): shown to the user, never pooled with a known kind."""
        return [n for n, m in zip(self.names, self.module) if m == "other"]

    def place(self, i: int) -> Place:
        return Place(self.tower[i], int(self.layer[i]), self.module[i], self.expert[i], self.role[i])

    def columns(self) -> dict[str, np.ndarray]:
        """The grouping columns, keyed as the analysis frame names them."""
        return {"tower": self.tower, "layer": self.layer, "module": self.module, "expert": self.expert,
                "role": self.role}

    def summary(self) -> list[str]:
        """A few lines on what was recognised: towers and their layers, MoE experts and their layout, routers,
        shared experts, and the names no rule knows."""
        lines = []
        for tower in TOWERS:
            sel = self.tower == tower
            if not sel.any():
                continue
            layers = self.layer[sel]
            count = len(set(layers[layers >= 0].tolist()))
            lines.append(f"{tower}: {int(sel.sum()):,} tensors" + (f" in {count} layers" if count else ""))
        experts = self.role == "expert"
        if experts.any():
            indexed = {e for e in self.expert[experts] if e != FUSED}
            fused = int((self.expert[experts] == FUSED).sum())
            moe_layers = len(set(self.layer[experts].tolist()))
            layout = ([f"{len(indexed)} experts stored one tensor per expert and projection"] if indexed else []) + \
                ([f"{fused} fused tensors (every expert stacked along the first axis)"] if fused else [])
            lines.append(f"mixture of experts: {moe_layers} layers, " + " and ".join(layout))
        for role, what in (("router", "routers"), ("shared_expert", "shared-expert tensors")):
            n = int((self.role == role).sum())
            if n:
                lines.append(f"{n} {what}")
        unknown = self.unknown
        if unknown:
            shown = ", ".join(unknown[:3]) + (f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else "")
            lines.append(f"{len(unknown)} tensors of no known module kind (grouped as 'other'): {shown}")
        return lines


def structure_of(names: Iterable[str]) -> Structure:
    """The structure of a checkpoint (or of any list of its tensor names); the last one is remembered (a pass and
    the note before it ask for the same 100,000 names)."""
    names = list(names)
    if _LAST and _LAST[0] == names:
        return _LAST[1]
    split = [split_section(n) for n in names]
    found = {_SECTION_TOWER.get(section, "") for section, _ in split}
    towers = frozenset(t for t in found if t) or frozenset({"language"})
    places = [_place(section, rest, towers) for section, rest in split]

    def col(values: list) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    layers = [p.layer for p in places]
    fits = all(-2**63 <= v < 2**63 for v in layers)  # a layer number beyond int64 is legal in a name: kept as is
    out = Structure(names, col([p.tower for p in places]), np.array(layers, dtype=np.int64) if fits else col(layers),
                    col([p.module for p in places]), col([p.expert for p in places]), col([p.role for p in places]))
    _LAST[:] = [list(names), out]
    return out


_LAST: list = []  # [names, Structure] of the last call
