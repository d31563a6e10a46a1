"""Is the overlap real? Views of the shared-region diagnostics of an analysis, each next to its chance value,
and the plain-language reading they support. No weights are read.

RAM averages an element that several agents changed, on the premise that it holds shared knowledge. If the
agents' updates there are unrelated, their signs agree half of the time and their cosine is 0: averaging then
mostly divides the largest update by the number of agents. The numbers here say which case a model set is in:

- per pair of agents, on the elements both changed (|τ| > ε): how many (and how many independent masks of the
  same densities would give, over the whole model and tensor by tensor), the share with the same sign (chance
  50 %), the cosine of the two updates (chance 0);
- per agent, on its shared elements: the share of (element, partner) pairs with the same sign (chance 50 %),
  the share where every active agent has its sign (chance Σ_k h_k·2^(1−k) / shared, h_k the elements shared
  with k − 1 others), the cosine of its update with the others' combined update o_t (chance 0), and the
  dominance profile: the share of its shared-region energy Σ τ_t² where the partners' combined |τ| is below
  10 % or 30 % of its own (there averaging divides its update while the partners barely moved).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from merging.methods.regions import chance_unique_share

from .ladder import DOMINANCE
from .noise import Z
from .stats import DOMINATED_COLUMNS, AnalysisResult
from .tables import module_ordered, per_tensor_chance, with_parts

MIN_ELEMENTS = 100  # fewer elements both changed than this: too few to read an agreement from
CHANCE_BAND = 0.05  # sign agreement within 50 % ± this and |cosine| below it read as chance level
AGREE = (0.6, 0.1)  # sign agreement and cosine at or above these: the pair shares a direction
OPPOSE = (0.4, -0.1)  # at or below either of these: the pair's updates oppose
DILUTED = 0.25  # an agent whose energy averaged while partners barely moved (30 % bound) is at least this share


def _rows(frame: pd.DataFrame, eps: float, what: str) -> pd.DataFrame:
    rows = frame[frame["eps"] == eps]
    if rows.empty and not frame.empty:
        raise KeyError(f"ε={eps:g} is not in the analysed ladder ({what})")
    return rows


def _ratio(num, den):
    """num / den element-wise, NaN where den is 0 (no element to measure on)."""
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _cosine(dot, sq_a, sq_b):
    den = np.sqrt(np.asarray(sq_a, dtype=float) * np.asarray(sq_b, dtype=float))
    return np.clip(_ratio(dot, den), -1.0, 1.0)


def _pair_sums(result: AnalysisResult, eps: float, keys: list[str]) -> pd.DataFrame:
    """Pair sums at ε per (a, b, *keys), with the expected number of elements both changed under independent
    masks of each tensor's own densities (summed over the group's tensors)."""
    pr = with_parts(_rows(result.pairs, eps, "pairs"))  # expected_both_tensor: summed over each row's tensors
    cols = ["both_changed", "same_sign", "dot", "sq_a", "sq_b", "expected_both_tensor"]
    return pr.groupby(["a", "b", *keys], sort=False, observed=True)[cols].sum().reset_index()


def _pair_view(g: pd.DataFrame) -> pd.DataFrame:
    """Shares, cosine and their chance values from summed pair columns."""
    g["sign_agreement"] = _ratio(g["same_sign"], g["both_changed"])
    g["chance_sign_agreement"] = 0.5
    # one binomial standard error at chance: the band a sign agreement of unrelated updates falls in
    g["sign_agreement_se"] = np.sqrt(_ratio(0.25, g["both_changed"]))
    g["cosine"] = _cosine(g["dot"], g["sq_a"], g["sq_b"])
    g["chance_cosine"] = 0.0
    return g


def pair_agreement(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per pair of agents at ε, on the elements both changed: their count next to what independent masks of the
    agents' densities would give (over the whole model, and tensor by tensor), the share with the same sign
    (chance 50 %, with one standard error at chance), and the cosine of the two updates there (chance 0)."""
    g = _pair_sums(result, eps, [])
    dens = _rows(result.frame, eps, "agents").groupby("agent", sort=False)["changed"].sum()
    total = float(result.total_params)
    g["changed_a"] = g["a"].map(dens).astype("int64")
    g["changed_b"] = g["b"].map(dens).astype("int64")
    g["expected_both"] = g["changed_a"] * g["changed_b"] / total if total else 0.0
    g["both_share_of_a"] = _ratio(g["both_changed"], g["changed_a"])
    g["both_share_of_b"] = _ratio(g["both_changed"], g["changed_b"])
    g = _pair_view(g)
    g.insert(2, "eps", eps)
    return g


def agreement_by(result: AnalysisResult, eps: float, by: str) -> pd.DataFrame:
    """Per pair of agents and layer or module kind (`by`) at ε: where the agreement concentrates. Groups in
    layer order (−1, outside the blocks, first) or the usual module order."""
    if by not in ("layer", "module"):
        raise KeyError(f"unknown grouping {by!r}; use layer or module")
    g = _pair_view(_pair_sums(result, eps, [by]))
    if by == "module":
        g = module_ordered(g)
    order = {a: i for i, a in enumerate(result.agents)}
    return g.sort_values(["a", "b", by], key=lambda c: c.map(order) if c.name in ("a", "b") else c) \
        .reset_index(drop=True)


def agent_agreement(result: AnalysisResult, eps: float) -> pd.DataFrame:
    """Per agent at ε, on its shared elements: sign agreement with each partner (pooled; chance 50 %), all
    active agents with its sign (and that share's chance), cosine with the others' combined update (chance 0),
    the share of its update energy in shared elements and the dominance profile; and its unique share next to
    the whole-model and per-tensor chance."""
    rows = _rows(result.frame, eps, "agents")
    ks = sorted((c for c in rows.columns if c.startswith("k") and c[1:].isdigit()), key=lambda c: int(c[1:]))
    rows = rows.assign(sq_unique=rows["norm_unique"] ** 2, sq_shared=rows["norm_shared"] ** 2)
    cols = ["changed", "shared", "unique", "sign_conflicts", "sq_unique", "sq_shared", "dot_others", "sq_others",
            "chance_unique_binade", *DOMINATED_COLUMNS, *ks]
    g = rows.groupby("agent", sort=False)[cols].sum().reindex(result.agents)
    out = pd.DataFrame({"agent": result.agents})
    for c in ("changed", "shared", "unique"):
        out[c] = g[c].to_numpy(dtype="int64")
    pr = _rows(result.pairs, eps, "pairs")
    same = pd.concat([pr.groupby("a")["same_sign"].sum(), pr.groupby("b")["same_sign"].sum()]).groupby(level=0).sum()
    both = pd.concat([pr.groupby("a")["both_changed"].sum(), pr.groupby("b")["both_changed"].sum()]) \
        .groupby(level=0).sum()
    out["pair_elements"] = out["agent"].map(both).fillna(0).astype("int64").to_numpy()
    out["sign_agreement"] = _ratio(out["agent"].map(same).fillna(0), out["pair_elements"])
    out["chance_sign_agreement"] = 0.5
    shared = g["shared"].to_numpy(dtype=float)
    out["all_agree"] = 1.0 - _ratio(g["sign_conflicts"], shared)
    k_weights = np.array([0.5 ** (int(k[1:]) - 1) for k in ks[1:]])  # k agents active: all agree w.p. 2^(1−k)
    out["chance_all_agree"] = _ratio(g[ks[1:]].to_numpy(dtype=float) @ k_weights, shared) if ks[1:] else np.nan
    out["cosine_others"] = _cosine(g["dot_others"], g["sq_shared"], g["sq_others"])
    out["chance_cosine"] = 0.0
    energy = g["sq_unique"].to_numpy(dtype=float) + g["sq_shared"].to_numpy(dtype=float)
    out["shared_energy_share"] = _ratio(g["sq_shared"], energy)
    for _f, col in zip(DOMINANCE, DOMINATED_COLUMNS):
        out[f"{col}_share"] = _ratio(g[col], g["sq_shared"])
    changed = g["changed"].to_numpy(dtype=float)
    out["unique_share"] = np.nan_to_num(_ratio(g["unique"], changed))
    out["chance_unique_share"] = chance_unique_share(list(changed / result.total_params))
    out["chance_unique_share_tensor"] = out["agent"].map(per_tensor_chance(result, eps)).to_numpy()
    out["chance_unique_share_binade"] = np.nan_to_num(_ratio(g["chance_unique_binade"], changed))
    out.insert(1, "eps", eps)
    return out


# ---------------------------------------------------------------- the reading

@dataclass
class Reading:
    """What the diagnostics say, as a regime name, one paragraph of plain language, and the facts used."""

    regime: str  # single, too_few, chance, shared, opposed, mixed
    text: str
    pairs: dict[str, str] = field(default_factory=dict)  # "a|b" → chance / agree / oppose / weak / too_few
    diluted: list[str] = field(default_factory=list)  # agents whose update averaging mostly dilutes


def sign_se(both: int, sign_agreement: float) -> float:
    """The binomial standard error √(p(1−p)/n) of a pair's sign agreement p on its n shared elements."""
    p = min(max(sign_agreement, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / both) if both > 0 else float("nan")


def classify_pair(both: int, sign_agreement: float, cosine: float) -> str:
    """One pair's verdict: too_few elements, agree (a common direction), oppose, chance level, or weak.

    The sign-agreement thresholds are bands of Z standard errors (analysis/noise.py): a pair agrees when its
    sign agreement is above chance beyond noise and reaches 60 % within noise (so 59.8 ± 0.2 % counts), with a
    cosine of at least 0.1; it opposes when below chance beyond noise and down to 40 % within noise, or with a
    cosine of −0.1 or less; it is at chance level when within 5 points (plus noise) of 50 % with |cosine| ≤ 0.05."""
    if both < MIN_ELEMENTS or not math.isfinite(sign_agreement):
        return "too_few"
    band = Z * sign_se(both, sign_agreement)
    if sign_agreement + band >= AGREE[0] and sign_agreement - band > 0.5 and cosine >= AGREE[1]:
        return "agree"
    if (sign_agreement - band <= OPPOSE[0] and sign_agreement + band < 0.5) or cosine <= OPPOSE[1]:
        return "oppose"
    if abs(sign_agreement - 0.5) <= CHANCE_BAND + band and abs(cosine) <= CHANCE_BAND:
        return "chance"
    return "weak"


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def _sign(r) -> str:
    """`59.8 ± 0.2 % same sign` for a pair row (one binomial standard error)."""
    return f"{100 * r.sign_agreement:.1f} ± {100 * sign_se(int(r.both_changed), r.sign_agreement):.1f} % same sign"


def reading(result: AnalysisResult, eps: float, scores: str = "") -> Reading:
    """The plain-language reading of the diagnostics at ε: whether shared updates agree beyond chance, which
    agent averaging mostly dilutes, and what to compare. The thresholds are this module's constants, as bands of
    standard errors (classify_pair). Whether RAM's averaging pays off is never read from the weights alone:
    `scores` is a sentence citing scores of these same models (a sweep or Table 1: `analysis/regimes.py: evidence`),
    quoted when given; without it the reading says that scores are needed."""
    from analysis.lineage import lineage_sentences

    lineage = lineage_sentences(result, eps)  # an agent from another base first: it distorts everything below
    if len(result.agents) < 2:
        return Reading("single", " ".join([*lineage, "With one agent nothing is shared: RAM keeps its whole update "
                                                     "(RAM = the agent)."]))
    pa = pair_agreement(result, eps)
    ag = agent_agreement(result, eps)
    verdicts = {f"{r.a}|{r.b}": classify_pair(int(r.both_changed), float(r.sign_agreement), float(r.cosine))
                for r in pa.itertuples()}
    measured = [r for r in pa.itertuples() if verdicts[f"{r.a}|{r.b}"] != "too_few"]
    diluted_rows = [r for r in ag.itertuples()
                    if np.nan_to_num(r.shared_energy_share * getattr(r, f"{DOMINATED_COLUMNS[-1]}_share")) >= DILUTED]
    diluted = [r.agent for r in diluted_rows]
    regime = _regime(set(verdicts[f"{r.a}|{r.b}"] for r in measured))
    parts = lineage + _regime_sentences(regime, eps, measured, verdicts)
    parts += [_dilution_sentence(r) for r in diluted_rows]
    if regime == "shared" and not diluted:
        parts.append("Agreement is a premise, not a result: whether averaging the shared region beats summing it "
                     "(task arithmetic) is for scores on your tasks to say.")
    elif regime in ("chance", "opposed", "mixed") or diluted:
        parts.append("Compare RAM with task arithmetic (λ = 1), which keeps every update whole, on your tasks "
                     "before choosing.")
    parts.append(scores or "No scores of these models are at hand: a sweep (Sweep page, `ram-studio sweep`) "
                 "measures RAM against task arithmetic on your tasks.")
    return Reading(regime, " ".join(parts), verdicts, diluted)


def _regime(kinds: set[str]) -> str:
    """The overall regime from the verdicts of the pairs with enough shared elements (none: too_few)."""
    if not kinds:
        return "too_few"
    if kinds == {"chance"}:
        return "chance"
    if "agree" in kinds:
        return "shared"
    if kinds <= {"oppose", "chance", "weak"} and "oppose" in kinds:
        return "opposed"
    return "mixed"


def _pair_name(r) -> str:
    return f"{r.a}–{r.b}"


def _regime_sentences(regime: str, eps: float, measured: list, verdicts: dict[str, str]) -> list[str]:
    """What the regime says, with every measured pair's sign agreement and cosine."""
    stats = "; ".join(f"{_pair_name(r)} {_sign(r)}, cosine {r.cosine:+.3f}" for r in measured)
    if regime == "too_few":
        return [f"At ε = {eps:g} the agents share fewer than {MIN_ELEMENTS} changed elements per pair: too few "
                "to tell shared knowledge from coincidence."]
    if regime == "chance":
        return [f"Shared updates agree in sign practically no more than chance (every pair within "
                f"{100 * CHANCE_BAND:.0f} points of 50 % and |cosine| ≤ {CHANCE_BAND:g}: {stats}; unrelated updates "
                "give 50 % and 0): the shared region is coincidental overlap of unrelated updates, not shared "
                "knowledge."]
    if regime == "opposed":
        return [f"Shared updates tend to oppose each other ({stats}; chance 50 % and 0): averaging cancels "
                "them, which task arithmetic's sum would do too; TIES-style sign election may keep more."]
    if regime != "shared":
        return [f"Shared updates agree only slightly beyond chance ({stats}; chance 50 % and 0)."]
    by_verdict = {v: [_pair_name(r) for r in measured if verdicts[f"{r.a}|{r.b}"] == v]
                  for v in ("agree", "weak", "chance")}
    parts = [f"Shared updates point the same way for {', '.join(by_verdict['agree'])} ({stats}; chance 50 % and 0): "
             "there the shared region carries a common direction, which averaging keeps — RAM's premise "
             "holds for these agents."]
    close = [r for r in measured if verdicts[f"{r.a}|{r.b}"] == "agree" and r.sign_agreement < AGREE[0]]
    if close:
        parts.append(f"{', '.join(_pair_name(r) for r in close)} {'is' if len(close) == 1 else 'are'} within "
                     f"{Z:g} standard errors of the {100 * AGREE[0]:.0f} % threshold, so counted as agreeing.")
    if by_verdict["weak"]:
        parts.append(f"For {', '.join(by_verdict['weak'])} the updates are beyond chance but below the thresholds for "
                     f"agreement ({100 * AGREE[0]:.0f} % same sign within {Z:g} standard errors, and cosine "
                     f"{AGREE[1]:g}).")
    if by_verdict["chance"]:
        parts.append(f"For {', '.join(by_verdict['chance'])} the overlap is close to chance.")
    return parts


def _dilution_sentence(r) -> str:
    """Why averaging mostly dilutes the agent of row `r` (its shared energy, and how much of it is dominated)."""
    dom = getattr(r, f"{DOMINATED_COLUMNS[-1]}_share")
    return (f"Averaging will mostly dilute {r.agent}: {_pct(r.shared_energy_share)} of its update energy "
            f"lies in shared elements, {_pct(dom)} of that where the other agents together moved less "
            f"than {round(100 * DOMINANCE[-1])} % as much, and the mean over active agents divides it.")


# ---------------------------------------------------------------- JSON

def _num(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


PAIR_JSON = ["both_changed", "expected_both", "expected_both_tensor", "same_sign", "sign_agreement",
             "chance_sign_agreement", "sign_agreement_se", "cosine", "chance_cosine"]
AGENT_JSON = ["sign_agreement", "chance_sign_agreement", "all_agree", "chance_all_agree", "cosine_others",
              "chance_cosine", "shared_energy_share", *[f"{c}_share" for c in DOMINATED_COLUMNS], "unique_share",
              "chance_unique_share", "chance_unique_share_tensor", "chance_unique_share_binade"]


def pairs_json(result: AnalysisResult) -> list[dict]:
    """One record per pair of agents per ε (the CLI's `"pairs"`): a, b (names as in `"agents"`), eps, and
    each count, share and cosine with its chance value."""
    out = []
    for eps in result.ladder:
        for _, r in pair_agreement(result, eps).iterrows():
            rec = {"a": r["a"], "b": r["b"], "eps": eps}
            for c in PAIR_JSON:
                rec[c] = int(r[c]) if c in ("both_changed", "same_sign") else _num(r[c])
            out.append(rec)
    return out


def agent_fields(result: AnalysisResult) -> dict[tuple[str, float], dict]:
    """The per-agent diagnostics for every ε, keyed by (agent, eps), for the CLI's `"agents"` records."""
    out = {}
    for eps in result.ladder:
        for _, r in agent_agreement(result, eps).iterrows():
            out[(r["agent"], eps)] = {c: _num(r[c]) for c in AGENT_JSON}
    return out


# ---------------------------------------------------------------- model card

def markdown_text(text: object, limit: int | None = None) -> str:
    """Text holding file-derived names (agent labels) for Markdown (the card, the app): the one rule of
    `merging.common.escaping.markdown_text` — every construct escaped, GFM's autolinks (`www.`, `://`, `@`) broken."""
    from merging.common.escaping import markdown_text as escape

    return escape(text, limit)


def overlap_summary(result: AnalysisResult, eps: float) -> dict:
    """The diagnostics at ε for a merge's model card and recipe: the pair and agent numbers (JSON), the reading,
    and the card's Markdown section."""
    pa = pair_agreement(result, eps)
    ag = agent_agreement(result, eps)
    read = reading(result, eps)
    pct = lambda v: "–" if not math.isfinite(v) else f"{100 * v:.1f} %"  # noqa: E731
    lines = [f"## Is the overlap real? Shared-region diagnostics at ε = {eps:g}", "",
             "From RAM Studio's analysis of these inputs, on the elements two agents both changed. Unrelated "
             "updates would agree in sign 50 % of the time with cosine 0; the chance count is what independent "
             "random masks of each tensor's densities would share.", "",
             "| pair | both changed | chance | same sign (± s.e.) | cosine |", "|---|---:|---:|---:|---:|"]
    for r in pa.itertuples():
        cos = "–" if not math.isfinite(r.cosine) else f"{r.cosine:+.3f}"
        pair = f"{markdown_text(r.a, 200)} – {markdown_text(r.b, 200)}"
        se = sign_se(int(r.both_changed), r.sign_agreement) if math.isfinite(r.sign_agreement) else float("nan")
        same = pct(r.sign_agreement) + ("" if not math.isfinite(se) else f" (± {100 * se:.1f})")
        lines.append(f"| {pair} | {int(r.both_changed):,} | {r.expected_both_tensor:,.0f} | {same} | {cos} |")
    top = DOMINATED_COLUMNS[-1]
    lines += ["", f"| agent | shared energy | of it, partners < {round(100 * DOMINANCE[-1])} % | cosine vs others | "
                  "unique share | chance (model / per tensor) |", "|---|---:|---:|---:|---:|---:|"]
    for r in ag.itertuples():
        cos = "–" if not math.isfinite(r.cosine_others) else f"{r.cosine_others:+.3f}"
        lines.append(f"| {markdown_text(r.agent, 200)} | {pct(r.shared_energy_share)} | "
                     f"{pct(getattr(r, top + '_share'))} | {cos} | {pct(r.unique_share)} | "
                     f"{pct(r.chance_unique_share)} / {pct(r.chance_unique_share_tensor)} |")
    lines += ["", markdown_text(read.text), ""]
    records = lambda f: [{k: v if isinstance(v, (str, int)) else _num(v) for k, v in row.items()}  # noqa: E731
                         for row in f.to_dict("records")]
    return {"eps": eps, "regime": read.regime, "reading": read.text, "pairs": records(pa), "agents": records(ag),
            "markdown": lines}


def merge_statistics(result: AnalysisResult, method: str, params: dict) -> tuple[dict | None, dict | None]:
    """What a merge takes from an analysis of its inputs: whole-model shared/unique counts at the method's ε
    (saves the counting pass global ρ needs; None when the method needs none or ε was not analysed) and the
    shared-region diagnostics for its card and recipe (at the method's ε if analysed, else 1e-5). The analysis
    counts stored tensors once: a merge that counts tied aliases too (count_tied_twice) makes its own counts."""
    from merging.methods import get_method
    from merging.methods.ram import counts_tied_twice

    m = get_method(method)
    resolved = m.resolve_params(params)
    eps = m.global_counts_eps(resolved)
    usable = eps is not None and result.covers(eps) and not counts_tied_twice(resolved)
    counts = result.counts_at(eps) if usable else None
    card_eps = resolved.get("eps", 1e-5)
    if card_eps not in result.ladder:
        card_eps = 1e-5 if 1e-5 in result.ladder else result.ladder[-1]
    return counts, overlap_summary(result, card_eps) if len(result.agents) > 1 else None
