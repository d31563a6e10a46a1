"""Every bad input gets one clear message naming the file/tensor, a non-zero exit, and no output.

Each test id here is a row of the "Bad inputs and faults" table in docs/security.md.
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ram_studio.cli import main
from tests.factory import join_safetensors, split_safetensors, state, write_like


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def first_shard(folder: Path) -> Path:
    return sorted(folder.glob("*.safetensors"))[0]


def assert_refused(capsys, family, agents, out: Path, *fragments: str, extra: tuple[str, ...] = ()) -> str:
    base, _ = family
    code, err = run(capsys, "merge", str(base), *map(str, agents), "--method", "ram", "--out", str(out), "--quiet",
                    *extra)
    assert code != 0
    assert err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1, err
    for f in fragments:
        assert f in err, err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if ".partial-" in p.name]
    return err


# --- paths and formats -------------------------------------------------------------------------------

def test_missing_path(capsys, family, tmp_path):
    _, agents = family
    assert_refused(capsys, family, [agents[0], tmp_path / "nope"], tmp_path / "out", "does not exist")


def test_folder_without_weights(capsys, family, tmp_path):
    _, agents = family
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert_refused(capsys, family, [agents[0], empty], tmp_path / "out", "no model weights", str(empty))


def test_pickle_only_checkpoint(capsys, family, tmp_path):
    _, agents = family
    pk = tmp_path / "pickle"
    pk.mkdir()
    (pk / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    err = assert_refused(capsys, family, [agents[0], pk], tmp_path / "out", "pickle", "save_pretrained")
    assert "safe_serialization=True" in err


def test_truncated_safetensors(capsys, family, tmp_path):
    _, agents = family
    bad = copy_model(agents[1], tmp_path / "trunc")
    shard = first_shard(bad)
    shard.write_bytes(shard.read_bytes()[:-1000])
    assert_refused(capsys, family, [agents[0], bad], tmp_path / "out", shard.name, "truncated")


def test_header_not_json(capsys, family, tmp_path):
    _, agents = family
    bad = copy_model(agents[1], tmp_path / "nojson")
    shard = first_shard(bad)
    raw = bytearray(shard.read_bytes())
    raw[8:12] = b"!!!!"
    shard.write_bytes(bytes(raw))
    assert_refused(capsys, family, [agents[0], bad], tmp_path / "out", shard.name, "not valid JSON")


def _rewrite_header(shard: Path, edit) -> None:
    header, data = split_safetensors(shard)
    edit(header)
    join_safetensors(shard, header, data)


def test_offsets_outside_file(capsys, family, tmp_path):
    _, agents = family
    bad = copy_model(agents[1], tmp_path / "offsets")
    shard = first_shard(bad)

    def edit(h):
        name = next(k for k in h if k != "__metadata__")
        b, e = h[name]["data_offsets"]
        h[name]["data_offsets"] = [b + 10**9, e + 10**9]
    _rewrite_header(shard, edit)
    assert_refused(capsys, family, [agents[0], bad], tmp_path / "out", shard.name, "data section")


def test_header_claiming_huge_size(capsys, family, tmp_path):
    _, agents = family
    bad = copy_model(agents[1], tmp_path / "huge")
    shard = first_shard(bad)
    raw = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", 2**40) + raw[8:])
    assert_refused(capsys, family, [agents[0], bad], tmp_path / "out", shard.name, "header")


def test_index_points_at_missing_shard(capsys, family, tmp_path):
    _, agents = family
    bad = copy_model(agents[1], tmp_path / "noshard")
    shard = first_shard(bad)
    shard.unlink()
    assert_refused(capsys, family, [agents[0], bad], tmp_path / "out", shard.name, "missing")


def test_two_shards_claim_same_tensor(capsys, family, tmp_path):
    _, agents = family
    bad = copy_model(agents[1], tmp_path / "dup")
    shards = sorted(bad.glob("*.safetensors"))
    t = state(bad)
    from safetensors import safe_open
    with safe_open(str(shards[0]), "pt") as f:
        stolen = next(iter(f.keys()))
    second = {k: t[k] for k in safe_open(str(shards[1]), "pt").keys()}
    second[stolen] = t[stolen]
    save_file(second, shards[1], metadata={"format": "pt"})
    assert_refused(capsys, family, [agents[0], bad], tmp_path / "out", stolen, "stored twice")


# --- base and agents that do not match ---------------------------------------------------------------

def test_different_architecture(capsys, family, tmp_path):
    _, agents = family
    other = copy_model(agents[1], tmp_path / "llama")
    cfg = json.loads((other / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["model_type"] = "llama"
    (other / "config.json").write_text(json.dumps(cfg))
    err = assert_refused(capsys, family, [agents[0], other], tmp_path / "out", "architecture", "LlamaForCausalLM")
    # No policy repairs a different architecture.
    assert_refused(capsys, family, [agents[0], other], tmp_path / "out", "architecture",
                   extra=("--on-mismatch", "base"))
    assert "cannot be merged" in err


def test_missing_and_extra_tensors(capsys, family, tmp_path):
    base, agents = family
    t = state(agents[1])
    dropped = "model.layers.1.mlp.down_proj.weight"
    t.pop(dropped)
    t["model.extra.weight"] = torch.zeros(3, dtype=torch.bfloat16)
    odd = tmp_path / "odd"
    odd.mkdir()
    save_file(t, odd / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(base / "config.json", odd / "config.json")
    err = assert_refused(capsys, family, [agents[0], odd], tmp_path / "out", dropped, "--on-mismatch base")
    assert "model.extra.weight" in err or "more" in err
    # With the documented policy the merge runs: the missing tensor counts as unchanged for that agent.
    out = tmp_path / "ok"
    code, err = run(capsys, "merge", str(base), str(agents[0]), str(odd), "--method", "ram", "--out", str(out),
                    "--quiet", "--on-mismatch", "base")
    assert code == 0, err
    merged = state(out)
    assert set(merged) == set(state(base))
    expect = (state(base)[dropped].float() + (state(agents[0])[dropped].float() - state(base)[dropped].float())
              * ((state(agents[0])[dropped].float() - state(base)[dropped].float()).abs() > 1e-5))
    assert torch.equal(merged[dropped], expect.to(torch.bfloat16))


def test_resized_vocabulary(capsys, family, tmp_path):
    base, agents = family
    t = state(agents[1])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        t[name] = torch.cat([t[name], t[name][:2]])  # two new token rows (0.5 % of this tiny agent)
    big = write_like(agents[1], tmp_path / "bigvocab", {})
    for f in big.glob("*.safetensors"):
        f.unlink()
    (big / "model.safetensors.index.json").unlink()
    save_file(t, big / "model.safetensors", metadata={"format": "pt"})
    assert_refused(capsys, family, [agents[0], big], tmp_path / "out", "embed_tokens", "shape")
    out = tmp_path / "ok"
    code, err = run(capsys, "merge", str(base), str(agents[0]), str(big), "--method", "ram", "--out", str(out),
                    "--quiet", "--on-mismatch", "base")
    assert code == 0, err
    assert state(out)["model.embed_tokens.weight"].shape == state(base)["model.embed_tokens.weight"].shape


def test_different_dtypes(capsys, family, tmp_path):
    base, agents = family
    t = {k: v.float() for k, v in state(agents[1]).items()}
    f32 = write_like(agents[1], tmp_path / "f32", t)
    assert_refused(capsys, family, [agents[0], f32], tmp_path / "out", "dtype", "BF16", "F32")


def test_non_float_tensors_that_differ(capsys, family, tmp_path):
    base, agents = family
    with_buf = []
    for i, src in enumerate([base, agents[0], agents[1]]):
        t = state(src)
        t["model.position_ids"] = torch.arange(8, dtype=torch.int64) + (i == 2)
        with_buf.append(write_like(src, tmp_path / f"buf{i}", t))
    # rewrite the index of each copy so it lists the new tensor
    for folder in with_buf:
        idx = json.loads((folder / "model.safetensors.index.json").read_text())
        shard = sorted(folder.glob("*.safetensors"))[0]
        from safetensors import safe_open
        t = {k: safe_open(str(shard), "pt").get_tensor(k) for k in safe_open(str(shard), "pt").keys()}
        t["model.position_ids"] = torch.arange(8, dtype=torch.int64) + (folder.name == "buf2")
        save_file(t, shard, metadata={"format": "pt"})
        idx["weight_map"]["model.position_ids"] = shard.name
        (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
    out = tmp_path / "out"
    code, err = run(capsys, "merge", *map(str, with_buf), "--method", "ram", "--out", str(out), "--quiet")
    assert code == 2 and "model.position_ids" in err and "non-float" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_in_an_input(capsys, family, tmp_path, value):
    _, agents = family
    t = state(agents[1])
    name = "model.layers.0.self_attn.q_proj.weight"
    t[name] = t[name].clone()
    t[name].view(-1)[5] = value
    bad = write_like(agents[1], tmp_path / "nan", t)
    err = assert_refused(capsys, family, [agents[0], bad], tmp_path / "out", name, "NaN or Inf", "flat index 5")
    assert "nan" in err  # names the model (its folder)
    base, _ = family
    code, err = run(capsys, "analyze", str(base), str(agents[0]), str(bad), "--quiet")
    assert code == 2 and name in err


# --- agent sets --------------------------------------------------------------------------------------

def test_agent_identical_to_base(capsys, family, tmp_path):
    base, agents = family
    twin = copy_model(base, tmp_path / "twin")
    assert_refused(capsys, family, [agents[0], twin], tmp_path / "out", "twin", "identical to the base")


def test_base_given_as_agent(capsys, family, tmp_path):
    base, agents = family
    assert_refused(capsys, family, [agents[0], base], tmp_path / "out", "base model itself")


def test_same_agent_twice(capsys, family, tmp_path):
    _, agents = family
    assert_refused(capsys, family, [agents[0], agents[0]], tmp_path / "out", "same model as agent")


def test_single_agent(capsys, family, tmp_path):
    _, agents = family
    assert_refused(capsys, family, [agents[0]], tmp_path / "out", "at least 2 agents")


def test_zero_agents(capsys, family, tmp_path):
    assert_refused(capsys, family, [], tmp_path / "out", "no agents")
    base, _ = family
    code, err = run(capsys, "analyze", str(base), "--quiet")
    assert code == 2 and "no agents" in err


# --- parameters --------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,fragment", [
    (("--eps=-1e-5",), "eps"), (("--method", "ram_plus", "--r=-0.1"), "r="),
    (("--method", "ram_plus", "--alpha=-2"), "alpha"), (("--method", "ties", "--density", "0"), "density"),
    (("--method", "ties", "--density", "1.2"), "density"), (("--method", "dare_ta", "--drop-rate", "1"), "drop_rate"),
    (("--method", "dare_ta", "--drop-rate=-0.5"), "drop_rate"), (("--method", "regmean",), "unknown merge method"),
])
def test_invalid_parameters(capsys, family, tmp_path, extra, fragment):
    base, agents = family
    out = tmp_path / "out"
    argv = ["merge", str(base), *map(str, agents), "--out", str(out), "--quiet"]
    argv += list(extra) if "--method" in extra else ["--method", "ram", *extra]
    code, err = run(capsys, *argv)
    assert code == 2 and fragment in err and not out.exists()


def test_negative_eps_in_ladder(capsys, family):
    base, agents = family
    code, err = run(capsys, "analyze", str(base), *map(str, agents), "--eps-ladder=0,-1e-5", "--quiet")
    assert code == 2 and "ε" in err


# --- Hugging Face Hub --------------------------------------------------------------------------------

def test_hub_offline_is_a_clear_error_and_token_never_printed(capsys, family, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRETSECRET")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import importlib

    import huggingface_hub.constants as c
    importlib.reload(c)
    try:
        base, agents = family
        code, err = run(capsys, "merge", str(base), str(agents[0]), "no-such-org/no-such-model", "--method", "ram",
                        "--out", str(tmp_path / "out"), "--quiet")
        assert code == 2 and "no-such-org/no-such-model" in err and "not in the local Hugging Face cache" in err
        assert "HF_HUB_OFFLINE" in err and "SECRET" not in err
    finally:
        monkeypatch.delenv("HF_HUB_OFFLINE")
        importlib.reload(c)


def test_hub_error_messages():
    """The client's own exception types map to one actionable line each."""
    import importlib

    import huggingface_hub.errors as e

    from merging.reading.hub_errors import hub_error

    # The client's HTTP library (httpx or its successor) is whatever its error class derives from.
    http = importlib.import_module(e.HfHubHTTPError.__mro__[1].__module__.split(".")[0])
    response = http.Response(404, request=http.Request("GET", "https://example.invalid"))
    cases = [
        (e.RepositoryNotFoundError("x", response=response), "does not exist"),
        (e.GatedRepoError("x", response=response), "gated"),
        (e.RevisionNotFoundError("x", response=response), "revision"),
    ]
    for exc, fragment in cases:
        msg = str(hub_error("org/model", "v1", exc))
        assert fragment in msg and "org/model" in msg


def test_hub_connection_errors_say_what_failed(monkeypatch):
    """Offline without HF_HUB_OFFLINE, the message names the failure (never the raw
    '[Errno -2] Name or service not known') and does not ask to unset a variable that is not set."""
    import socket

    import huggingface_hub.constants as c
    import huggingface_hub.errors as e

    from merging.reading.hub_errors import hub_error

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)

    def chained(outer: Exception, inner: BaseException) -> Exception:
        outer.__cause__ = inner
        return outer

    gai = socket.gaierror(-2, "Name or service not known")
    cases = [
        (chained(OSError("[Errno -2] Name or service not known"), gai), "could not be resolved"),
        (chained(e.LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known"),
                 chained(ConnectionError("x"), gai)), "could not be resolved"),
        (ConnectionRefusedError(111, "Connection refused"), "refused"),
        (TimeoutError("timed out"), "timed out"),
    ]
    for exc, fragment in cases:
        err = hub_error("org/model", None, exc)
        assert fragment in err.message and "cannot reach the Hugging Face Hub" in err.message, err.message
        assert "Errno" not in str(err) and "HF_HUB_OFFLINE" not in str(err)
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    err = hub_error("org/model", None, e.LocalEntryNotFoundError("outgoing traffic has been disabled"))
    assert "HF_HUB_OFFLINE" in str(err) and "not in the local Hugging Face cache" in err.message


# --- Nested data, models evaluate cannot score ---------------------------------------------------

DEEP = 100_000


@pytest.mark.parametrize("where", ["config", "index", "header", "header-entry", "recipe"])
def test_json_nested_100000_deep_is_one_line(capsys, family, tmp_path, where):
    """JSON nested 100,000 deep in config.json, a safetensors header, an index or a recipe gave a
    RecursionError traceback (the app: "unexpected RecursionError"). The depth is checked before parsing."""
    base, agents = family
    deep = "[" * DEEP + "]" * DEEP
    bad = copy_model(agents[1], tmp_path / "deep")
    if where == "config":
        (bad / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "x": ' + deep + "}")
    elif where == "index":
        (bad / "model.safetensors.index.json").write_text('{"metadata": ' + deep + ', "weight_map": {}}')
    elif where.startswith("header"):
        shard = first_shard(bad)
        header, data = split_safetensors(shard)
        text = json.dumps(header)
        text = (text[:-1] + ', "__metadata__": ' + deep + "}") if where == "header" else \
            text.replace('"shape": [', '"shape": ' + "[" * 1000, 1).replace("]", "]" * 1000, 1)
        raw = text.encode()
        raw += b" " * (-(len(raw) + 8) % 8)
        shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    if where == "recipe":
        out = tmp_path / "m"
        assert main(["merge", str(base), *map(str, agents), "--method", "ram", "--out", str(out), "--quiet"]) == 0
        capsys.readouterr()
        recipe = tmp_path / "deep.json"
        recipe.write_text('{"format": 2, "spec": {"base": "x", "agents": ' + deep + "}}")
        code, err = run(capsys, "run", str(recipe), "--out", str(tmp_path / "r"), "--quiet")
    else:
        code, err = run(capsys, "merge", str(base), str(agents[0]), str(bad), "--method", "ram", "--out",
                        str(tmp_path / "out"), "--quiet")
    assert code == 2 and ("nested more than 64 levels" in err or "nested more than 8 levels" in err) \
        and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("case", ["foreign tokenizer", "no tokenizer"])
def test_evaluate_refuses_a_model_that_is_not_demo_compatible(capsys, family, tmp_path, case):
    """`evaluate` on a model that is not demo-compatible (a Qwen2.5-shaped folder) gave an
    IndexError traceback with exit 1."""
    from merging.reading.refs import demo_root

    base, _ = family
    folder = copy_model(base, tmp_path / "qwen-shaped")
    for f in folder.glob("tokenizer*"):
        f.unlink()
    (folder / "special_tokens_map.json").unlink(missing_ok=True)
    if case == "foreign tokenizer":  # the demo's tokenizer has more tokens than this model has embedding rows
        shutil.copy(demo_root() / "base" / "tokenizer.json", folder / "tokenizer.json")
    code, err = run(capsys, "evaluate", str(folder), "--limit", "1")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert ("not a demo-compatible model" in err) if case == "foreign tokenizer" else ("no tokenizer.json" in err)


@pytest.mark.parametrize("which", ["twice", "base"])
def test_the_duplicate_agent_error_says_only_what_is_wrong(capsys, family, tmp_path, which):
    base, agents = family
    given = [agents[0], agents[0]] if which == "twice" else [agents[0], base]
    code = main(["merge", str(base), *map(str, given), "--method", "ram", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert ("same model as agent" if which == "twice" else "base model itself") in err
    assert "architecture" not in err and "Give each agent once" in err, err
