"""The merged export never points outside itself: tokenizer_config.json's tokenizer_file (and any `*_file` entry
that is not a plain name of a file written beside it), a local name_or_path, and auto_map entries naming another
repository's code are dropped from the copied side files and config.json; a base without such pointers is copied
byte for byte."""
from __future__ import annotations

import json
import shutil

from tests.cli_helpers import run


def test_pointers_out_of_the_model_are_dropped_on_export(capsys, family, tmp_path):
    base, agents = family
    base = shutil.copytree(base, tmp_path / "base")
    outside = tmp_path / "elsewhere" / "tokenizer.json"
    outside.parent.mkdir()
    outside.write_text("{}")
    tok_cfg = json.loads((base / "tokenizer_config.json").read_text())
    tok_cfg.update(tokenizer_file=str(outside), vocab_file="../elsewhere/vocab.json", merges_file="merges.txt",
                   special_tokens_map_file="special_tokens_map.json", name_or_path=str(base),
                   auto_map={"AutoTokenizer": ["someone/else--tokenization_x.XTokenizer", None]})
    (base / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (base / "special_tokens_map.json").write_text('{"pad_token": "<pad>"}')
    cfg = json.loads((base / "config.json").read_text())
    cfg.update(_name_or_path=str(base), auto_map={"AutoConfig": "someone/else--configuration_x.XConfig"})
    (base / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "merged"
    code, _, err = run(capsys, "merge", base, *agents, "--method", "task_arithmetic", "--out", out, "--quiet")
    assert code == 0, err
    got = json.loads((out / "tokenizer_config.json").read_text())
    for key in ("tokenizer_file", "vocab_file", "merges_file", "name_or_path", "auto_map"):
        assert key not in got, key
    assert got["special_tokens_map_file"] == "special_tokens_map.json"  # a plain name of a file written beside it
    assert {k: v for k, v in tok_cfg.items() if k in got} == got  # everything else as it was
    got_cfg = json.loads((out / "config.json").read_text())
    assert "_name_or_path" not in got_cfg and "auto_map" not in got_cfg
    assert str(tmp_path) not in "".join(p.read_text() for p in out.glob("*.json") if p.name != "ram_recipe.json")


def test_a_base_without_pointers_is_copied_byte_for_byte(capsys, family, tmp_path):
    base, agents = family
    out = tmp_path / "merged"
    code, _, err = run(capsys, "merge", base, *agents, "--method", "task_arithmetic", "--out", out, "--quiet")
    assert code == 0, err
    for name in ("tokenizer_config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes()
