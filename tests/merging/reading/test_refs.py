"""Model references (merging/reading/refs.py): a folder is labelled with the name the user typed."""
from __future__ import annotations


def test_a_symlinked_model_folder_is_labelled_with_the_name_typed(family, tmp_path):
    from merging.reading.checkpoint import open_checkpoint
    from merging.reading.compat import ModelHeaders, check_compatibility
    from merging.reading.refs import parse_ref

    base, agents = family
    link = tmp_path / "Qwen2.5-7B-Instruct-ToolRL-grpo-cold"
    link.symlink_to(agents[1], target_is_directory=True)
    ref = parse_ref(str(link))
    assert ref.label == link.name and ref.path == agents[1].resolve()  # read from the target, named as typed
    assert parse_ref(str(link) + "/").label == link.name
    with open_checkpoint(str(link)) as ckpt:
        assert ModelHeaders.from_checkpoint(ckpt).label == link.name
    with open_checkpoint(str(base)) as b, open_checkpoint(str(link)) as a, open_checkpoint(str(agents[1])) as t:
        report = check_compatibility(ModelHeaders.from_checkpoint(b),
                                     [ModelHeaders.from_checkpoint(a), ModelHeaders.from_checkpoint(t)])
    assert any(m.kind == "duplicate" for m in report.mismatches)  # a link and its target are still one model
