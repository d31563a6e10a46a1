"""The joint-state code the histogram strategy of `analysis/ladder.py` uses: each element's state over N agents
is one number, Σ_t digit_t·s**t with digit_t = 2·b_t + (τ_t > 0) and s = 2·(L+1) (b_t: ladder values below
|τ_t|). These tables say, per state and per ε, which agents are active, shared, unique or in a sign conflict, so
histograms of states decode into counts and sums for every ε at once. Also the binning both strategies use
(`bincount`) and the dominance intervals the histogram sums (`dominance_tables`)."""
from __future__ import annotations

import torch

from merging.methods import regions


def decode_tables(n: int, L: int) -> dict:
    """Indicator tables over joint states: which agents are active/unique/shared/conflicting at each ε."""
    s = 2 * (L + 1)
    states = s ** n
    code = torch.arange(states, dtype=torch.int64)
    digits = torch.stack([(code // s ** t) % s for t in range(n)], 1)  # (states, N)
    b, pos = digits // 2, (digits % 2).bool()
    active = b.unsqueeze(2) > torch.arange(L).view(1, 1, L)  # (states, N, L): |τ_t| > ε_j
    c, shared, unique = regions.shared_and_unique(active, dim=1)
    c = c.unsqueeze(1)  # (states, 1, L)
    n_pos = (active & pos.unsqueeze(2)).sum(1, keepdim=True)
    n_neg = (active & ~pos.unsqueeze(2)).sum(1, keepdim=True)
    conflict = shared & torch.where(pos.unsqueeze(2), n_neg > 0, n_pos > 0)
    k = torch.arange(1, n + 1).view(1, 1, 1, n)
    hist = active.unsqueeze(3) & (c.unsqueeze(3) == k)  # (states, N, L, N)
    f = torch.float64
    d = torch.arange(s)
    act = (d // 2).unsqueeze(1) > torch.arange(L).view(1, L)  # (s, L): a digit's agent is active at ε_j
    pos_d = (d % 2).bool()
    pair_both = act.view(s, 1, L) & act.view(1, s, L)
    pair_agree = pair_both & (pos_d.view(s, 1, 1) == pos_d.view(1, s, 1))
    triple = pair_both.view(s, s, 1, L) & act.view(1, 1, s, L)
    k = torch.arange((L + 1) ** 2)
    start, end = (k // (L + 1)).view(-1, 1), (k % (L + 1)).view(-1, 1)
    j = torch.arange(L).view(1, L)
    return {"states": states, "s": s, "digits": digits, "active": active.to(f), "shared": shared.to(f),
            "unique": unique.to(f),
            "conflict": conflict.to(f), "hist": hist.to(f), "pair_both": pair_both.to(f),
            "pair_agree": pair_agree.to(f), "triple_active": triple.to(f),
            "interval": ((start <= j) & (j < end)).to(f)}


def marginal(x: torch.Tensor, digits: torch.Tensor, s: int, keep: tuple[int, ...]) -> torch.Tensor:
    """Sums over the joint states given by `digits` (…, states) reduced onto the digits of the agents in
    `keep`: (…, s, …, s) indexed by their digits in `keep`'s order. `digits` (states, N) holds each state's
    digit per agent (a state's code is Σ_t digit_t·s**t)."""
    code = torch.zeros(digits.shape[0], dtype=torch.int64)
    for t in keep:
        code = code * s + digits[:, t]
    out = torch.zeros(*x.shape[:-1], s ** len(keep), dtype=x.dtype)
    out.index_add_(x.dim() - 1, code, x)
    return out.reshape(*x.shape[:-1], *([s] * len(keep)))


def dominance_tables(wide: torch.Tensor, b: torch.Tensor, L: int, fractions: tuple[float, ...]) -> torch.Tensor:
    """Per agent t and fraction f of `fractions`, Σ τ_t² binned by the interval [start, end) of ladder indices j where t
    is active and shared (end = min(b_t, max of the others' b)) and the active partners' Σ|τ| < f·|τ_t| (from start on).
    The partners' sum can only fall at one of their bucket values, so start is the least candidate (0 or a partner's
    bucket) where it is below the bound. (N, F, (L+1)²), float64."""
    n = wide.shape[0]
    mag = wide.abs()
    out = torch.zeros(n, len(fractions), (L + 1) ** 2, dtype=torch.float64, device=wide.device)
    if n < 2:
        return out
    for t in range(n):
        others = [o for o in range(n) if o != t]
        end = torch.minimum(b[t], torch.stack([b[o] for o in others]).amax(0))
        starts = [torch.full_like(b[t], L) for _ in fractions]
        for cand in [torch.zeros_like(b[t])] + [b[o] for o in others]:
            partners = torch.zeros_like(mag[t])
            for o in others:
                partners = partners + torch.where(b[o] > cand, mag[o], 0.0)
            for f, frac in enumerate(fractions):
                starts[f] = torch.where(partners < frac * mag[t], torch.minimum(starts[f], cand), starts[f])
        for f in range(len(fractions)):
            out[t, f] = bincount(starts[f] * (L + 1) + end, (L + 1) ** 2, mag[t].square())
    return out


def bincount(x: torch.Tensor, bins: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """torch.bincount with a known number of bins; on a GPU by scatter-add, which (unlike bincount)
    does not wait for the device to learn the largest value."""
    if x.device.type == "cpu":
        return torch.bincount(x.reshape(-1), weights=weights, minlength=bins)
    src = weights.reshape(-1) if weights is not None else torch.ones_like(x.reshape(-1), dtype=torch.int64)
    return torch.zeros(bins, dtype=src.dtype, device=x.device).scatter_add_(0, x.reshape(-1).long(), src)


def decode_diagnostics(tb: dict, pairs: list[tuple[int, int]], L: int, counts: torch.Tensor, sq: torch.Tensor,
                       prod: torch.Tensor, dom: torch.Tensor, digits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The pair and per-agent diagnostics from joint-state sums: each needs only the digits of two or
    three agents, so the sums are first reduced onto those agents' digits (a reshape and a sum over the
    others), then decoded with small indicator tables."""
    n, T, P = sq.shape[1], counts.shape[0], len(pairs)
    both_ind, agree_ind = tb["pair_both"], tb["pair_agree"]

    def marg(x: torch.Tensor, keep: tuple[int, ...]) -> torch.Tensor:
        return marginal(x, digits, tb["s"], keep)

    def dec(x: torch.Tensor, ind: torch.Tensor) -> torch.Tensor:  # (T, s, …) × (s, …, L) → (T, L)
        return x.reshape(T, -1) @ ind.reshape(-1, L)

    z = torch.zeros(T, P, L, dtype=torch.float64)
    both, agree, dot, sq_a, sq_b = (z.clone() for _ in range(5))
    for p, (a, b) in enumerate(pairs):
        mc = marg(counts, (a, b))
        both[:, p], agree[:, p] = dec(mc, both_ind), dec(mc, agree_ind)
        dot[:, p] = dec(marg(prod[:, p], (a, b)), both_ind)
        sq_a[:, p] = dec(marg(sq[:, a], (a, b)), both_ind)
        sq_b[:, p] = dec(marg(sq[:, b], (a, b)), both_ind)
    dot_others = torch.zeros(T, n, L, dtype=torch.float64)
    sq_others = torch.zeros(T, n, L, dtype=torch.float64)
    for p, (a, b) in enumerate(pairs):
        dot_others[:, a] += dot[:, p]
        dot_others[:, b] += dot[:, p]
        sq_others[:, a] += sq_b[:, p]  # o_a² = Σ_{b active} τ_b² + 2·Σ_{b<c active} τ_b·τ_c
        sq_others[:, b] += sq_a[:, p]
        for t in range(n):
            if t not in (a, b):
                cross = dec(marg(prod[:, p], (t, a, b)), tb["triple_active"])
                sq_others[:, t] += 2 * cross
    dominated = torch.einsum("tnfk,kj->tnjf", dom, tb["interval"])
    as_int = lambda x: x.round().to(torch.int64)  # noqa: E731 - counts summed in float64 are exact
    return as_int(both), as_int(agree), dot, sq_a, sq_b, dot_others, sq_others, dominated
