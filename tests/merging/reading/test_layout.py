"""Agents read in the base's layout: fused ↔ per-expert MoE experts and legacy ↔ prefixed vision-language names are
the same weights — mapped from headers, read piece by piece in chunks, refused only where the map would guess."""
from __future__ import annotations

import pytest
import torch

from merging.common.errors import RamStudioError
from merging.reading.checkpoint import open_folder, tensor_order
from merging.reading.chunks import ChunkReader, row_spans
from merging.reading.compat import ModelHeaders, check_compatibility
from merging.reading.fingerprint import Fingerprinter
from merging.reading.layout import map_layout
from merging.reading.mapped import MappedCheckpoint, MappedEntry
from tests.families import FAMILIES

MAPPED = [f for f, s in FAMILIES.items() if s.kind in ("moe", "vl")]
DIRECTIONS = [("saved", "state_dict"), ("state_dict", "saved")]


def headers(folder) -> ModelHeaders:
    return ModelHeaders.from_checkpoint(open_folder(folder))


def aligned(base, agent):
    """The agent's checkpoint read in the base's layout, and the report."""
    b, a = open_folder(base), open_folder(agent)
    report = check_compatibility(ModelHeaders.from_checkpoint(b), [ModelHeaders.from_checkpoint(a)])
    return b, report.aligned([a])[0], report


@pytest.mark.parametrize("base_layout,agent_layout", DIRECTIONS)
@pytest.mark.parametrize("family", MAPPED)
def test_other_layout_reads_as_the_same_agent_in_the_base_layout(families, family, base_layout, agent_layout):
    base = families.base(family, base_layout)
    b, mapped, report = aligned(base, families.agent(family, 1, agent_layout))
    assert report.ok and report.layout_notes(), report.mismatches
    assert isinstance(mapped, MappedCheckpoint)
    same = open_folder(families.agent(family, 1, base_layout))  # the same agent, written in the base's layout
    assert {n: (e.dtype, e.shape) for n, e in mapped.tensors.items()} == \
        {n: (e.dtype, e.shape) for n, e in same.tensors.items()}
    for name in same.tensors:  # whole tensors and row ranges, assembled from the stored pieces
        assert torch.equal(mapped.read(name).view(torch.uint8), same.read(name).view(torch.uint8)), name
        rows = same.tensors[name].shape[0] if same.tensors[name].shape else 0
        if rows > 2:
            assert torch.equal(mapped.read(name, 1, rows - 1), same.read(name, 1, rows - 1)), name
    # the engine's reader: small chunks cut experts and fused tensors apart; every chunk has the stored bytes
    reader = ChunkReader(b, [mapped, same], threads=2)
    try:
        spans = [s for n in tensor_order(b) for s in row_spans(n, b.tensors[n].shape, 24)]
        for span, data in reader.stream((s, s) for s in spans):
            assert torch.equal(data.agents[0].view(torch.uint8), data.agents[1].view(torch.uint8)), span
            data.release()
    finally:
        reader.close()


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_vl"])
def test_the_same_agent_in_two_layouts_has_one_weights_fingerprint(families, family):
    base = families.base(family, "saved")
    b, mapped, _ = aligned(base, families.agent(family, 1, "state_dict"))
    same = open_folder(families.agent(family, 1, "saved"))
    prints = Fingerprinter([b, mapped, same])
    for name in b.tensors:
        prints.add(1, name, 0, mapped.read(name))
    found = prints.finish()
    assert found[1]["weights_xxh3_128"] == found[2]["weights_xxh3_128"]
    assert set(found[1]["files"]) == {"model.safetensors"}


def test_the_same_agent_twice_in_two_layouts_is_refused(families):
    from analysis.stats import analyze

    base = families.base("mixtral", "saved")
    with pytest.raises(RamStudioError, match="same weights as agent"):
        analyze(base, [families.agent("mixtral", 1, "saved"), families.agent("mixtral", 1, "state_dict")],
                use_cache=False)


def test_an_agent_with_more_experts_is_not_mapped_in_part(families):
    base = families.base("qwen3_moe", "saved")
    agent = families.agent("qwen3_moe", 1, "state_dict", num_experts=6)
    report = check_compatibility(headers(base), [headers(agent)])
    assert not report.ok and report.layout_notes() == []
    with pytest.raises(RamStudioError) as err:
        report.enforce("base")
    assert "read only in part" in err.value.hint or "read only in part" in str(err.value)


def _moe_headers(fused: bool, experts: int = 2) -> dict:
    if fused:
        return {"model.layers.0.mlp.experts.gate_up_proj": ("BF16", (experts, 8, 4)),
                "model.layers.0.mlp.experts.down_proj": ("BF16", (experts, 4, 4))}
    return {f"model.layers.0.mlp.experts.{e}.{p}.weight": ("BF16", (4, 4) if p != "down_proj" else (4, 4))
            for e in range(experts) for p in ("gate_proj", "up_proj", "down_proj")}


def test_fused_experts_of_an_unknown_layout_are_not_guessed():
    per_expert, fused = _moe_headers(False), _moe_headers(True)
    known = map_layout(per_expert, fused, {"model_type": "qwen3_moe"}, {"model_type": "qwen3_moe"})
    assert known is not None and len(known.sources) == 6
    gate1 = known.sources["model.layers.0.mlp.experts.1.gate_proj.weight"].blocks
    assert [(b.source, b.source_start, b.count) for b in gate1] == [("model.layers.0.mlp.experts.gate_up_proj", 32, 16)]
    up1 = known.sources["model.layers.0.mlp.experts.1.up_proj.weight"].blocks
    assert [(b.source_start, b.count) for b in up1] == [(48, 16)]  # expert 1's up rows follow its gate rows
    back = map_layout(fused, per_expert, {"model_type": "mixtral"}, {"model_type": "mixtral"})
    stacked = back.sources["model.layers.0.mlp.experts.gate_up_proj"].blocks
    assert [b.source.split("experts.")[1] for b in stacked] == ["0.gate_proj.weight", "0.up_proj.weight",
                                                                "1.gate_proj.weight", "1.up_proj.weight"]
    assert [b.start for b in stacked] == [0, 16, 32, 48]
    for kind in ("llama4", "gpt_oss", "qwen3_vl_moe", ""):  # stored [E, H, 2I] or unknown: refused, said why
        unknown = map_layout(per_expert, fused, {"model_type": kind}, {"model_type": kind})
        assert unknown is not None and not unknown.sources and "not mapped" in unknown.problems[0]


def test_ambiguous_names_are_not_renamed():
    base = {"model.layers.0.mlp.up_proj.weight": ("BF16", (4, 4))}
    agent = {"model.language_model.layers.0.mlp.up_proj.weight": ("BF16", (4, 4)),
             "language_model.model.layers.0.mlp.up_proj.weight": ("BF16", (4, 4))}
    assert map_layout(base, agent) is None
    one = map_layout(base, dict(list(agent.items())[:1]))
    assert list(one.sources) == ["model.layers.0.mlp.up_proj.weight"] and one.sources[
        "model.layers.0.mlp.up_proj.weight"].kind == "renamed"


def test_mapped_entries_split_a_byte_range_across_pieces(families):
    b, mapped, _ = aligned(families.base("qwen2_moe", "state_dict"), families.agent("qwen2_moe", 1, "saved"))
    entry = mapped.tensors["model.layers.0.mlp.experts.gate_up_proj"]
    assert isinstance(entry, MappedEntry) and len(entry.pieces) == 8  # gate and up of each of 4 experts
    pieces = list(entry.byte_pieces(10, entry.nbytes - 20))
    assert sum(p[3] for p in pieces) == entry.nbytes - 20 and pieces[0][1] == 0 and pieces[0][2] == 10
    assert [p[1] for p in pieces] == sorted(p[1] for p in pieces)
