"""mergekit interop: `run CONFIG` runs mergekit YAML for the methods both tools have, every
merge writes the mergekit config that reproduces it (or says why none does), and everything we would not
reproduce faithfully is refused with one line naming the field. The comparison against mergekit's own
output lives in tests/benchmarks/mergekit_interop.py (it needs mergekit's separate venv)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from merging.common.errors import RamStudioError
from merging.interop.mergekit import parse_mergekit_yaml, read_mergekit_yaml
from ram_studio.cli import main


def shards(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def config(family, method: str, params: dict | None = None, per_model: dict | None = None, **top) -> dict:
    base, agents = family
    models = [{"model": str(a), **({"parameters": dict(per_model)} if per_model is not None else {})} for a in agents]
    return {"merge_method": method, "base_model": str(base), "models": models,
            **({"parameters": params} if params else {}), **top}


def run_yaml(tmp_path: Path, doc: dict, out: Path, capsys) -> tuple[int, str]:
    path = tmp_path / f"{out.name}.yml"
    path.write_text(yaml.safe_dump(doc))
    code = main(["run", str(path), "--out", str(out), "--quiet"])
    return code, capsys.readouterr().err


# Each case: a mergekit config and the same merge written as our own CLI flags.
CASES = [
    ("task_arithmetic", {"lambda": 0.7}, {"weight": 1.0}, ["--method", "task_arithmetic", "--lambda", "0.7"]),
    ("task_arithmetic", {"normalize": True}, {"weight": 0.5}, ["--method", "task_arithmetic", "--lambda", str(1 / 3)]),
    ("linear", None, {"weight": 1.0}, ["--method", "average"]),
    ("ties", {"lambda": 0.9}, {"weight": 1.0, "density": 0.3},
     ["--method", "ties", "--density", "0.3", "--lambda", "0.9"]),
    ("dare_linear", {"lambda": 0.5}, {"weight": 1.0, "density": 0.7},
     ["--method", "dare_ta", "--drop-rate", str(1 - 0.7), "--lambda", "0.5"]),
    ("dare_ties", {"normalize": True}, {"weight": 1.0, "density": 0.6},
     ["--method", "dare_ties", "--drop-rate", str(1 - 0.6)]),
    ("ram", {"epsilon": 2e-5}, None, ["--method", "ram", "--eps", "2e-5"]),
    ("ramplus_tl", None, None, ["--method", "ram_plus", "--rho-scope", "tensor", "--alpha", "0.2"]),
    ("ramplus_tl", {"r": 0.3, "alpha": 1.5, "epsilon": 1e-5}, None,
     ["--method", "ram_plus", "--rho-scope", "tensor", "--r", "0.3", "--alpha", "1.5"]),
]


@pytest.mark.parametrize("method,params,per_model,flags", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_yaml_run_equals_direct_merge_bit_for_bit(family, tmp_path, capsys, method, params, per_model, flags):
    base, agents = family
    code, err = run_yaml(tmp_path, config(family, method, params, per_model), tmp_path / "from-yaml", capsys)
    assert code == 0, err
    direct = tmp_path / "direct"
    assert main(["merge", str(base), *map(str, agents), *flags, "--out", str(direct), "--quiet"]) == 0
    assert shards(tmp_path / "from-yaml") == shards(direct)
    recipe = json.loads((tmp_path / "from-yaml" / "ram_recipe.json").read_text())
    assert yaml.safe_load(recipe["mergekit_config"])["merge_method"] == method  # provenance kept


@pytest.mark.parametrize("flags", [
    ["--method", "ram"], ["--method", "ram_plus", "--rho-scope", "tensor", "--r", "0.2"],
    ["--method", "task_arithmetic", "--lambda", "0.4"], ["--method", "average"],
    ["--method", "ties", "--density", "0.4"], ["--method", "dare_ta", "--drop-rate", "0.25"],
    ["--method", "dare_ties", "--drop-rate", "0.5", "--lambda", "0.8"],
    ["--method", "ram", "--out-dtype", "float32"],
], ids=lambda f: "-".join(f[1:]))
def test_exported_yaml_parses_back_to_the_same_merge(family, tmp_path, capsys, flags):
    base, agents = family
    first = tmp_path / "first"
    assert main(["merge", str(base), *map(str, agents), *flags, "--out", str(first), "--quiet"]) == 0
    exported = first / "mergekit.yaml"
    assert exported.exists() and "mergekit.yaml" in (first / "README.md").read_text()
    again = tmp_path / "again"
    assert main(["run", str(exported), "--out", str(again), "--quiet"]) == 0, capsys.readouterr().err
    assert shards(again) == shards(first)
    spec = json.loads((first / "ram_recipe.json").read_text())["spec"]
    back = parse_mergekit_yaml(exported.read_text())
    assert back.out_dtype == (spec["out_dtype"] or "BF16") and back.agents == spec["agents"]  # the family is bf16


@pytest.mark.parametrize("flags,fragment", [
    (["--method", "ram_plus"], "global scope"),
    (["--method", "ram_plus_soft"], "soft rule"),
    (["--method", "unique_only", "--agent", "0"], "no equivalent"),
])
def test_merges_mergekit_cannot_express_say_so_in_the_card(family, tmp_path, flags, fragment):
    base, agents = family
    out = tmp_path / "m"
    assert main(["merge", str(base), *map(str, agents), *flags, "--out", str(out), "--quiet"]) == 0
    card = (out / "README.md").read_text()
    assert not (out / "mergekit.yaml").exists()
    assert "No mergekit config computes this merge" in card and fragment in card
    if flags[1] == "ram_plus":
        assert "merge_method: ramplus_tl" in card  # the nearest config is shown


def _with(doc: dict, **changes) -> dict:
    doc = json.loads(json.dumps(doc))
    for k, v in changes.items():
        doc[k] = v
    return doc


REFUSALS = [
    ("unequal weights", lambda f: config(f, "task_arithmetic", None, None) | {
        "models": [{"model": str(a), "parameters": {"weight": w}} for a, w in zip(f[1], (1.0, 0.5, 1.0))]},
     "per-model weights differ"),
    ("unequal densities", lambda f: config(f, "ties", None, None) | {
        "models": [{"model": str(a), "parameters": {"weight": 1, "density": d}} for a, d in zip(f[1], (.2, .3, .2))]},
     "per-model densities differ"),
    ("missing weight", lambda f: config(f, "task_arithmetic"), "needs a weight"),
    ("layer slices", lambda f: _with(config(f, "ram"), slices=[{"sources": []}]), "'slices'"),
    ("modules", lambda f: _with(config(f, "ram"), modules={"text": {}}), "'modules'"),
    ("tokenizer merge", lambda f: _with(config(f, "ram"), tokenizer={"source": "union"}), "'tokenizer'"),
    ("tokenizer_source union", lambda f: _with(config(f, "ram"), tokenizer_source="union"), "tokenizer_source"),
    ("chat_template", lambda f: _with(config(f, "ram"), chat_template="chatml"), "chat_template"),
    ("unknown method", lambda f: _with(config(f, "ram"), merge_method="slerp"), "merge_method 'slerp'"),
    ("unknown field", lambda f: _with(config(f, "ram"), name="my-merge"), "unknown field name"),
    ("gradient parameter", lambda f: config(f, "ram", {"epsilon": [1e-5, 2e-5]}), "gradient or conditional"),
    ("conditional parameter", lambda f: config(f, "ties", {"lambda": [{"filter": "mlp", "value": 0.5}]},
                                               {"weight": 1, "density": .3}), "gradient or conditional"),
    ("unknown parameter", lambda f: config(f, "ram", {"r": 0.1}), "parameter 'r' is not one ram takes"),
    ("per-model parameter not per model", lambda f: config(f, "ties", None, {"weight": 1, "density": .3, "lambda": 1}),
     "not a per-model parameter"),
    ("no base model", lambda f: _with(config(f, "ram"), base_model=None), "base_model is required"),
    ("LoRA reference", lambda f: _with(config(f, "ram"), base_model=str(f[0]) + "+some/lora"), "LoRA"),
    ("ties without normalize", lambda f: config(f, "ties", {"normalize": False}, {"weight": 1, "density": .3}),
     "normalize: false"),
    ("dare_ties without normalize", lambda f: config(f, "dare_ties", None, {"weight": 1, "density": .5}),
     "normalize: false"),
    ("dare without rescale", lambda f: config(f, "dare_linear", {"rescale": False}, {"weight": 1, "density": .5}),
     "rescale: false"),
    ("weights for ram", lambda f: config(f, "ramplus_tl", None, {"weight": 2}), "is not a per-model parameter"),
    ("base listed in linear", lambda f: config(f, "linear", None, {"weight": 1}) | {
        "models": [{"model": str(p), "parameters": {"weight": 1}} for p in [f[0], *f[1]]]}, "lists base_model"),
    ("linear without normalize", lambda f: config(f, "linear", {"normalize": False}, {"weight": 1}),
     "normalize: false"),
    ("structured model reference", lambda f: _with(config(f, "ram"), base_model={"model": {"path": "x"}}),
     "structured model reference"),
    ("string parameter", lambda f: config(f, "ram", {"epsilon": "tiny"}), "must be a number"),
    ("bad dtype", lambda f: _with(config(f, "ram"), dtype="int8"), "dtype 'int8'"),
    ("one agent", lambda f: config(f, "ram") | {"models": [{"model": str(f[1][0])}]}, "1 model(s) besides base_model"),
]


@pytest.mark.parametrize("name,make,fragment", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_every_refusal_is_one_line_naming_the_field(family, tmp_path, capsys, name, make, fragment):
    out = tmp_path / "out"
    code, err = run_yaml(tmp_path, make(family), out, capsys)
    assert code == 2 and fragment in err, err
    assert err.startswith("error: mergekit config: ") and err.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize("text,fragment", [("merge_method: [unclosed", "not valid YAML (line 1)"),
                                           ("- just\n- a list\n", "not a mapping"),
                                           ("!!python/object/apply:os.system ['touch /tmp/x']", "not valid YAML")])
def test_malformed_yaml_is_refused_and_never_executed(tmp_path, capsys, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert fragment in capsys.readouterr().err


def test_yaml_needs_an_output_folder(family, tmp_path, capsys):
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump(config(family, "ram")))
    assert main(["run", str(path), "--quiet"]) == 2 and "--out" in capsys.readouterr().err


def test_notes_say_what_differs(family):
    cfg = read_mergekit_yaml(yaml.safe_dump(config(family, "ties", {"int8_mask": True}, {"weight": 1, "density": .3},
                                                   dtype="bfloat16")))
    text = " ".join(cfg.notes)
    assert "float32" in text and "int8_mask" in text and "max(1, int(density·n))" in text
    assert cfg.spec.out_dtype == "BF16" and cfg.spec.method == "ties"
    with pytest.raises(RamStudioError):
        parse_mergekit_yaml("merge_method: ram\n")


# --- hand-written numbers; nested and aliased YAML --------------

HAND_WRITTEN = """\
# written by hand, the way people write mergekit configs
merge_method: ramplus_tl
base_model: {base}
models:
  - model: {a0}
  - model: {a1}
parameters:
  epsilon: 1e-5      # no dot: a string for YAML 1.1, a float for mergekit (pydantic)
  r: 1E-1
  alpha: .5
dtype: float32
"""


def test_hand_written_scientific_notation_is_read_as_mergekit_reads_it(family, tmp_path, capsys):
    """`epsilon: 1e-5` is what people write; PyYAML's YAML 1.1 resolver leaves it a string and mergekit's pydantic
    models convert it to a float. So do we — the same merge as the same values written as floats."""
    base, agents = family
    text = HAND_WRITTEN.format(base=base, a0=agents[0], a1=agents[1])
    assert yaml.safe_load(text)["parameters"]["epsilon"] == "1e-5"  # the resolver's view
    spec = parse_mergekit_yaml(text)
    assert spec.params == {"eps": 1e-5, "r": 0.1, "alpha": 0.5, "rho_scope": "tensor"}
    out = tmp_path / "hand"
    (tmp_path / "hand.yml").write_text(text)
    assert main(["run", str(tmp_path / "hand.yml"), "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    direct = tmp_path / "direct"
    assert main(["merge", str(base), *map(str, agents[:2]), "--method", "ram_plus", "--rho-scope", "tensor",
                 "--eps", "1e-5", "--r", "0.1", "--alpha", "0.5", "--out-dtype", "float32", "--out", str(direct),
                 "--quiet"]) == 0
    assert shards(out) == shards(direct)


@pytest.mark.parametrize("value", ["1e-5", " 1e-5 ", "1E5", "+.5", "5.", "1_0", "-0", "2.5e+3", "inf", "nan", "1e",
                                   "0x10", "abc", "", "١", "1e-5e", "--1"])
def test_numbers_in_strings_follow_pydantic(family, value):
    """Every string mergekit's pydantic float accepts is accepted with the same value (non-finite ones are then
    refused, as RAM Studio needs a number); every string it refuses is refused."""
    from merging.common.errors import RamStudioError

    base, agents = family
    doc = {"merge_method": "task_arithmetic", "base_model": str(base),
           "models": [{"model": str(a), "parameters": {"weight": 1.0}} for a in agents[:2]],
           "parameters": {"lambda": value}}
    pydantic = pytest.importorskip("pydantic")
    try:
        expected = pydantic.TypeAdapter(float).validate_python(value)
    except pydantic.ValidationError:
        expected = None
    try:
        got = parse_mergekit_yaml(yaml.safe_dump(doc)).params["lambda"]
    except RamStudioError as exc:
        assert expected is None or expected != expected or expected in (float("inf"), float("-inf")), (value, exc)
        return
    assert expected is not None and got == expected, (value, got, expected)


def test_nested_and_aliased_yaml_is_refused_at_once(tmp_path, capsys):
    """YAML nested 100,000 deep gave a RecursionError; a 553-byte alias bomb took 56 s and 3.2 GB
    before its error. Both are refused before anything is built."""
    import time

    bomb = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
        f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    assert len(bomb.encode()) < 600
    cases = [("deep.yml", "merge_method: " + "[" * 100_000 + "]" * 100_000, "nested more than"),
             ("deep-block.yml", "".join(" " * i + f"k{i}:\n" for i in range(300)) + " " * 300 + "v: 1\n",
              "nested more than"),
             ("bomb.yml", bomb, "alias")]
    for name, text, fragment in cases:
        (tmp_path / name).write_text(text)
        start = time.monotonic()
        code = main(["run", str(tmp_path / name), "--out", str(tmp_path / "out"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and fragment in err and err.count("\n") == 1 and "Traceback" not in err, (name, err)
        assert time.monotonic() - start < 60  # a guard against a regression to the minutes it took, not a speed claim
        assert not (tmp_path / "out").exists()


def test_models_beyond_what_a_merge_takes_are_refused(family):
    base, agents = family
    doc = {"merge_method": "ram", "base_model": str(base), "models": [{"model": f"m/{i}"} for i in range(200)]}
    with pytest.raises(RamStudioError, match="at most 64 agents"):
        parse_mergekit_yaml(yaml.safe_dump(doc))


def test_mergekit_yaml_becomes_form_values():
    from merging.interop.mergekit_form import form_values, read_mergekit_form

    form = read_mergekit_form("merge_method: ram\nbase_model: org/base\nmodels:\n  - model: org/a\n"
                              "  - model: org/b\nparameters:\n  epsilon: 0.001\n")
    assert (form.spec.method, form.spec.base, form.spec.agents) == ("ram", "org/base", ["org/a", "org/b"])
    assert form.values == {"eps": 0.001, "eps_steps": 0.0} and form.summary == "eps=0.001"  # the rest at defaults
    assert form_values("unique_only", {"dilute": True}) == {"eps": 1e-5, "agent": "", "dilute": True}
    with pytest.raises(RamStudioError):
        read_mergekit_form("merge_method: no_such_method\nmodels: []\n")
