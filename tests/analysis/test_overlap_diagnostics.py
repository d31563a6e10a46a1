"""Shared-region diagnostics ("is the overlap real?") against a brute-force numpy computation on small random
models, on every path of the analysis pass, and the reading they produce in both regimes."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from analysis import agreement, tables
from analysis import ladder as ladder_module
from analysis.ladder import DOMINANCE, joint_fits, pairs
from analysis.stats import DOMINATED_COLUMNS, analyze
from tests.factory import state

SHORT = (0.0, 1e-6, 1e-5, 3e-4)
LONG = tuple(sorted({0.0, *(m * 10.0 ** e for e in range(-8, -2) for m in (1, 2, 5))}))  # 19 values
SHAPES = {"model.embed_tokens.weight": (40, 24), "model.layers.0.self_attn.q_proj.weight": (24, 24),
          "model.layers.0.mlp.up_proj.weight": (48, 24), "model.layers.1.mlp.down_proj.weight": (24, 48),
          "model.layers.1.input_layernorm.weight": (24,), "model.norm.weight": (24,)}


def write_model(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    return folder


def make_models(root: Path, n: int, dtype: torch.dtype, seed: int, shared_skill: float = 0.0):
    """A base and n agents: sparse updates of log-normal size (so one agent often dwarfs another, which the
    dominance profile measures), some exactly at ladder values, and with `shared_skill` > 0 a component common
    to every agent (their shared updates then agree in sign beyond chance)."""
    g = torch.Generator().manual_seed(seed)
    base = {k: (torch.randn(s, generator=g) * 0.02).to(dtype) for k, s in SHAPES.items()}
    common = {k: torch.randn(s, generator=g) * 3e-3 * (torch.rand(s, generator=g) < 0.5) for k, s in SHAPES.items()}
    folders = [write_model(root / "base", base)]
    for t in range(n):
        density = 0.15 + 0.6 * t / max(n - 1, 1)
        out = {}
        for k, s in SHAPES.items():
            own = torch.randn(s, generator=g) * 1e-3 * torch.exp(1.5 * torch.randn(s, generator=g))
            mask = torch.rand(s, generator=g) < density
            tau = own * mask + shared_skill * common[k] * (torch.rand(s, generator=g) < 0.8)
            flat = tau.reshape(-1)
            flat[:3] = torch.tensor([1e-5, float(np.float32(1e-6)), -3e-4])  # at ladder values
            out[k] = (base[k].float() + tau).to(dtype)
        folders.append(write_model(root / f"agent{t}", out))
    return folders[0], folders[1:]


_BRUTE: dict = {}


def brute(base_dir: Path, agent_dirs: list[Path], eps: float) -> tuple[dict, dict]:
    """Per (tensor, pair) and per (tensor, agent): every diagnostic at ε, straight from the definitions (computed
    once per model set and ε: every path and ladder is checked against the same numbers)."""
    key = (base_dir, tuple(agent_dirs), eps)
    if key not in _BRUTE:
        _BRUTE[key] = _brute(base_dir, agent_dirs, eps)
    return _BRUTE[key]


def _brute(base_dir: Path, agent_dirs: list[Path], eps: float) -> tuple[dict, dict]:
    b = state(base_dir)
    ags = [state(a) for a in agent_dirs]
    n = len(ags)
    per_pair, per_agent = {}, {}
    for name in b:
        tau32 = np.stack([(a[name].float() - b[name].float()).reshape(-1).numpy() for a in ags])
        m = np.abs(tau32) > np.float32(eps)
        x = tau32.astype(np.float64)
        c = m.sum(0)
        for a, bb in pairs(n):
            both = m[a] & m[bb]
            per_pair[(name, a, bb)] = {
                "both_changed": int(both.sum()), "same_sign": int((both & ((x[a] > 0) == (x[bb] > 0))).sum()),
                "dot": float((x[a] * x[bb])[both].sum()), "sq_a": float((x[a] ** 2)[both].sum()),
                "sq_b": float((x[bb] ** 2)[both].sum())}
        for t in range(n):
            shared = m[t] & (c >= 2)
            others = np.zeros_like(x[t])
            partners = np.zeros_like(x[t])
            for o in range(n):
                if o != t:
                    others = others + np.where(m[o], x[o], 0.0)
                    partners = partners + np.where(m[o], np.abs(x[o]), 0.0)
            rec = {"dot_others": float((x[t] * others)[shared].sum()), "sq_others": float((others ** 2)[shared].sum())}
            for f, col in zip(DOMINANCE, DOMINATED_COLUMNS):
                rec[col] = float((x[t] ** 2)[shared & (partners < f * np.abs(x[t]))].sum())
            per_agent[(name, t)] = rec
    return per_pair, per_agent


def close(a: float, b: float, scale: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12 * scale)


_MODELS: dict = {}


@pytest.fixture
def models(tmp_path_factory):
    def get(n: int, dtype: torch.dtype, shared_skill: float = 0.0):
        key = (n, dtype, shared_skill)
        if key not in _MODELS:
            root = tmp_path_factory.mktemp(f"diag{n}")
            _MODELS[key] = make_models(root, n, dtype, seed=10 * n + (dtype == torch.bfloat16),
                                       shared_skill=shared_skill)
        return _MODELS[key]
    return get


PATHS = {"kernel": {"RAM_STUDIO_KERNELS": "numba"}, "torch": {"RAM_STUDIO_KERNELS": "torch"},
         "gpu-style torch": {"RAM_STUDIO_KERNELS": "torch", "RAM_STUDIO_GPU_STYLE": "1"}}


@pytest.mark.parametrize("ladder", [SHORT, LONG], ids=["joint", "eps-loop"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_diagnostics_equal_brute_force(models, monkeypatch, n, dtype, path, ladder):
    """Pair counts, sign agreement, Σ τ_a·τ_b, Σ τ², the per-agent sums against the others and the dominance
    profile equal the definitions, for 2–5 agents, bf16 and fp32, every ε, on the fused kernel, the torch path,
    the GPU-style torch path, the joint histogram (≤ 4 agents, short ladder) and the per-ε loop (5 agents, or
    forced for a long ladder)."""
    assert joint_fits(n, len(SHORT)) == (n <= 4)
    if ladder is LONG:
        monkeypatch.setattr(ladder_module, "joint_fits", lambda n_agents, ladder_len: False)
    monkeypatch.setattr(ladder_module, "SLICE", 97)  # the torch path's slices of a chunk
    for k, v in PATHS[path].items():
        monkeypatch.setenv(k, v)
    base, agents = models(n, dtype)
    res = analyze(base, agents, ladder=ladder, chunk_elems=500, use_cache=False)
    labels = res.agents
    for eps in (ladder if ladder is SHORT else ladder[::4]):
        per_pair, per_agent = brute(base, agents, eps)
        scale = max(v["sq_a"] + v["sq_b"] for v in per_pair.values()) or 1.0
        rows = res.pairs[res.pairs["eps"] == eps]
        assert len(rows) == len(per_pair)
        for r in rows.itertuples():
            e = per_pair[(r.tensor, labels.index(r.a), labels.index(r.b))]
            assert (r.both_changed, r.same_sign) == (e["both_changed"], e["same_sign"]), (eps, r.tensor)
            for c in ("dot", "sq_a", "sq_b"):
                assert close(getattr(r, c), e[c], scale), (eps, r.tensor, c)
        frame = res.frame[res.frame["eps"] == eps]
        for r in frame.to_dict("records"):
            e = per_agent[(r["tensor"], labels.index(r["agent"]))]
            for c in ("dot_others", "sq_others", *DOMINATED_COLUMNS):
                assert close(r[c], e[c], scale), (eps, r["tensor"], r["agent"], c, r[c], e[c])


def test_views_equal_whole_model_brute_force(models):
    """The derived views: whole-model sign agreement, cosine, cosine against the others, dominance shares and
    the per-tensor chance of the unique share, recomputed from the safetensors files."""
    base, agents = models(3, torch.bfloat16)
    res = analyze(base, agents, ladder=SHORT, use_cache=False)
    eps = 1e-5
    b = state(base)
    ags = [state(a) for a in agents]
    names = list(b)
    x = np.stack([np.concatenate([(a[k].float() - b[k].float()).reshape(-1).numpy() for k in names]) for a in ags])
    m = np.abs(x) > np.float32(eps)
    x = x.astype(np.float64)
    pa = agreement.pair_agreement(res, eps).set_index(["a", "b"])
    for a, bb in pairs(3):
        both = m[a] & m[bb]
        row = pa.loc[(res.agents[a], res.agents[bb])]
        assert row["both_changed"] == both.sum()
        assert row["sign_agreement"] == pytest.approx(np.mean(np.sign(x[a][both]) == np.sign(x[bb][both])), abs=1e-12)
        cos = x[a][both] @ x[bb][both] / np.sqrt((x[a][both] @ x[a][both]) * (x[bb][both] @ x[bb][both]))
        assert row["cosine"] == pytest.approx(cos, rel=1e-9)
        assert row["expected_both"] == pytest.approx(m[a].sum() * m[bb].sum() / x.shape[1])
    ag = agreement.agent_agreement(res, eps).set_index("agent")
    c = m.sum(0)
    sizes = [b[k].numel() for k in names]
    bounds = np.cumsum([0] + sizes)
    for t in range(3):
        shared = m[t] & (c >= 2)
        others = sum(np.where(m[o], x[o], 0.0) for o in range(3) if o != t)
        partners = sum(np.where(m[o], np.abs(x[o]), 0.0) for o in range(3) if o != t)
        row = ag.loc[res.agents[t]]
        cos = (x[t] * others)[shared].sum() / np.sqrt((x[t][shared] ** 2).sum() * (others[shared] ** 2).sum())
        assert row["cosine_others"] == pytest.approx(cos, rel=1e-9)
        e_sh = (x[t][shared] ** 2).sum()
        assert row["shared_energy_share"] == pytest.approx(e_sh / (x[t][m[t]] ** 2).sum(), rel=1e-9)
        for f in DOMINANCE:
            dom = (x[t] ** 2)[shared & (partners < f * np.abs(x[t]))].sum() / e_sh
            assert row[f"dominated_{round(100 * f)}_share"] == pytest.approx(dom, rel=1e-9)
        conflict = shared & np.array([any(m[o, i] and np.sign(x[o, i]) != np.sign(x[t, i]) for o in range(3) if o != t)
                                      for i in range(x.shape[1])])
        assert row["all_agree"] == pytest.approx(1 - conflict.sum() / shared.sum())
        k_of = c[shared]  # k agents active: all share t's sign with probability 2^(1−k) by chance
        assert row["chance_all_agree"] == pytest.approx(np.mean(0.5 ** (k_of - 1)))
        expected_unique = 0.0
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            d = m[:, lo:hi].mean(1)
            expected_unique += m[t, lo:hi].sum() * np.prod([1 - d[o] for o in range(3) if o != t])
        assert row["chance_unique_share_tensor"] == pytest.approx(expected_unique / m[t].sum(), rel=1e-12)
    uvc = tables.unique_vs_chance(res, eps).set_index("agent")
    assert (uvc["chance_unique_share_tensor"] == ag["chance_unique_share_tensor"]).all()


def test_reading_in_both_regimes(models):
    """Unrelated updates read as chance-level overlap; a skill common to all agents reads as shared."""
    base, agents = models(3, torch.float32)
    chance = agreement.reading(analyze(base, agents, ladder=SHORT, use_cache=False), 1e-5)
    assert chance.regime == "chance" and set(chance.pairs.values()) == {"chance"}
    assert "no more than chance" in chance.text and "task arithmetic" in chance.text
    base, agents = models(3, torch.float32, shared_skill=4.0)
    res = analyze(base, agents, ladder=SHORT, use_cache=False)
    shared = agreement.reading(res, 1e-5)
    pa = agreement.pair_agreement(res, 1e-5)
    assert (pa["sign_agreement"] >= 0.6).all() and (pa["cosine"] >= 0.1).all()
    assert shared.regime == "shared" and set(shared.pairs.values()) == {"agree"}
    assert "point the same way" in shared.text


@pytest.mark.parametrize("values,regime", [
    ([(5000, 0.50, 0.01), (5000, 0.49, -0.02)], "chance"),
    ([(5000, 0.70, 0.30), (5000, 0.50, 0.00)], "shared"),
    ([(5000, 0.30, -0.40), (5000, 0.50, 0.02)], "opposed"),
    ([(5000, 0.57, 0.06), (5000, 0.50, 0.00)], "mixed"),
    ([(50, 0.90, 0.90), (10, 0.5, 0.0)], "too_few"),
])
def test_pair_verdicts(values, regime):
    """The thresholds of the reading, pair by pair."""
    kinds = {agreement.classify_pair(*v) for v in values}
    expected = {"chance": {"chance"}, "shared": {"agree", "chance"}, "opposed": {"oppose", "chance"},
                "mixed": {"weak", "chance"}, "too_few": {"too_few"}}[regime]
    assert kinds == expected


@pytest.mark.parametrize("path", list(PATHS))
def test_the_pass_reads_each_input_once(models, monkeypatch, path):
    """The diagnostics come from the one streaming pass: every byte of every tensor of the base and the agents
    is read exactly once (by the chunk reader's preadv), and nothing reads tensors another way (but the lineage
    check's sample, through the checkpoint's reader, before the pass)."""
    import os
    import sys

    from merging.reading import checkpoint
    from merging.reading.safetensors_header import read_header

    for k, v in PATHS[path].items():
        monkeypatch.setenv(k, v)
    base, agents = models(3, torch.bfloat16)
    reads: dict[int, list[tuple[int, int]]] = {}
    real = os.preadv

    def counting(fd, buffers, offset, *rest):
        got = real(fd, buffers, offset, *rest)
        reads.setdefault(os.fstat(fd).st_ino, []).append((offset, offset + got))
        return got

    monkeypatch.setattr(os, "preadv", counting)
    real_read = checkpoint.Checkpoint.read

    def sample_only(self, *a, **k):
        """The one read allowed outside the pass: the lineage check's small sample, taken before it."""
        if sys._getframe(1).f_globals.get("__name__") != "merging.reading.lineage":
            pytest.fail("a tensor read outside the pass")
        return real_read(self, *a, **k)

    monkeypatch.setattr(checkpoint.Checkpoint, "read", sample_only)
    res = analyze(base, agents, ladder=SHORT, chunk_elems=300, use_cache=False)
    assert not res.pairs.empty
    for folder in [base, *agents]:
        f = folder / "model.safetensors"
        header = read_header(f)
        start = f.stat().st_size - max(e.end for e in header.tensors.values())
        wanted = sorted((start + e.begin, start + e.end) for e in header.tensors.values())
        got = sorted(reads.pop(f.stat().st_ino))
        merged = []  # consecutive reads joined: the ranges must tile the tensors' data, each byte once
        for lo, hi in got:
            assert not merged or lo >= merged[-1][1], "a byte range was read twice"
            if merged and lo == merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        assert sum(hi - lo for lo, hi in got) == sum(hi - lo for lo, hi in wanted)
        assert merged[0][0] == wanted[0][0] and merged[-1][1] == wanted[-1][1]
    assert not reads


def test_cli_json_csv_and_card(family, tmp_path, capsys):
    """`analyze --json` has the "pairs" list (names as in "agents") and per-agent fields, `--pairs-csv` the
    per-tensor pair sums; a merge after the analysis records the diagnostics in its card and recipe (a merge
    without a cached analysis has no such section)."""
    from ram_studio.cli import main

    base, agents = family
    args = [str(base), *map(str, agents)]
    assert main(["merge", *args, "--method", "ram", "--out", str(tmp_path / "before"), "--quiet"]) == 0
    assert "Is the overlap real?" not in (tmp_path / "before" / "README.md").read_text()
    assert main(["analyze", *args, "--quiet", "--json", str(tmp_path / "a.json"),
                 "--pairs-csv", str(tmp_path / "p.csv")]) == 0
    printed = capsys.readouterr().out
    assert "Is the overlap real?" in printed and "same sign" in printed
    doc = json.loads((tmp_path / "a.json").read_text())
    names = {r["name"] for r in doc["agents"]}
    assert len(doc["pairs"]) == 3 * len(doc["eps"]) and doc["reading"]["regime"]
    for p in doc["pairs"]:
        assert {p["a"], p["b"]} <= names and p["eps"] in doc["eps"]
        assert {"both_changed", "sign_agreement", "cosine", "expected_both", "chance_sign_agreement"} <= set(p)
    for r in doc["agents"]:
        assert {"sign_agreement", "cosine_others", "dominated_10_share", "dominated_30_share",
                "chance_unique_share_tensor", "all_agree", "chance_all_agree"} <= set(r)
    import pandas as pd

    csv = pd.read_csv(tmp_path / "p.csv")
    at = doc["pairs"][len(doc["pairs"]) // 2]
    part = csv[(csv["a"] == at["a"]) & (csv["b"] == at["b"]) & (csv["eps"] == at["eps"])]
    assert part["both_changed"].sum() == at["both_changed"] and part["same_sign"].sum() / at["both_changed"] == \
        pytest.approx(at["sign_agreement"])
    out = tmp_path / "after"
    assert main(["merge", *args, "--method", "ram_plus", "--out", str(out), "--quiet"]) == 0
    card = (out / "README.md").read_text()
    recipe = json.loads((out / "ram_recipe.json").read_text())
    assert "## Is the overlap real? Shared-region diagnostics at ε = 1e-05" in card
    rec = next(p for p in doc["pairs"] if p["eps"] == 1e-5 and (p["a"], p["b"]) == ("agent0", "agent1"))
    assert f"| agent0 – agent1 | {rec['both_changed']:,} |" in card
    assert recipe["overlap"]["eps"] == 1e-5 and recipe["overlap"]["pairs"][0]["both_changed"] == rec["both_changed"]


def test_card_escapes_agent_names():
    """Agent names come from folder names: in the card they are text, never links, HTML or table cells."""
    from markdown_it import MarkdownIt

    from merging.common.escaping import WORD_JOINER

    for name, shown in (("a|b](http://x)<img>`c`", "a|b](http://x)<img>`c`"), ("evil\x1b[31m $x$", "evil\\x1b[31m $x$"),
                        ("www.evil.example", "www.evil.example")):
        source = agreement.markdown_text(name)
        assert "www." not in source and "://" not in source  # nothing GFM would turn into a link by itself
        inline = [t for t in MarkdownIt("commonmark").parse(source) if t.type == "inline"]
        assert len(inline) == 1 and {c.type for c in inline[0].children} == {"text"}, name  # no link, HTML, code
        assert "".join(c.content for c in inline[0].children).replace(WORD_JOINER, "") == shown
    assert "|" not in agreement.markdown_text("a|b").replace("\\|", "")  # never a table cell
