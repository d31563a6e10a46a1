"""`ram_studio.analyze`: task-vector statistics of a base and its agents for a ladder of ε, in one streaming pass —
the CLI's `ram-studio analyze` as a function returning tables and the app's figures."""
from __future__ import annotations

import json as _json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ram_studio.api.display import Shown
from ram_studio.api.options import model_refs, parse
from ram_studio.api.progress import ProgressArg, engine, sink
from ram_studio.api.running import prefetch


def analyze(base: str | os.PathLike, agents: Sequence[str | os.PathLike], *,
            eps_ladder: Sequence[float] | str | None = None,
            eps: float = 1e-5, eps_steps: float | None = None, json: str | os.PathLike | None = None,
            csv: str | os.PathLike | None = None,
            pairs_csv: str | os.PathLike | None = None, overwrite: bool = False, device: str = "auto",
            no_cache: bool = False, on_mismatch: str = "error", progress: ProgressArg = True) -> "Analysis":
    """Analyse `agents` against `base` as `ram-studio analyze` does (keywords are its flags): every ε of
    `eps_ladder` in one pass, cached (with `eps_steps` K the ladder counts representable steps of the stored dtype
    and the summary is at K steps); `json`/`csv`/`pairs_csv` write its files (placement rules checked before
    any work). Models: a folder, a Hub id ("org/name[@revision]") or a demo model ("demo:code").
    Returns an Analysis (tables as pandas frames, the app's figures); bad input raises RamStudioError."""
    from analysis.stats import analyze as run_analysis
    from merging.reading.checkpoint import open_checkpoint
    from ram_studio.commands.analyze import ladder_and_unit, summary_eps, write_outputs
    from ram_studio.console import stop_on_signal
    from ram_studio.inputs import file_output

    args = parse("analyze", [*model_refs(base, "base"), *model_refs(agents, "agents")],
                 dict(eps_ladder=eps_ladder, eps=eps, eps_steps=eps_steps, json=json, csv=csv, pairs_csv=pairs_csv,
                      overwrite=overwrite,
                      device=device, no_cache=no_cache, on_mismatch=on_mismatch))
    to = sink(progress)
    with stop_on_signal() as stop:
        prefetch([args.base, *args.agents], to, stop)
        base_ckpt = open_checkpoint(args.base)
        agent_ckpts = [open_checkpoint(a) for a in args.agents]
        outputs = {flag: file_output(getattr(args, flag), [base_ckpt, *agent_ckpts], args.overwrite)
                   for flag in ("json", "csv", "pairs_csv")}
        ladder, unit = ladder_and_unit(args)
        result = run_analysis(base_ckpt, agent_ckpts, ladder=ladder, device=args.device, policy=args.on_mismatch,
                              use_cache=not args.no_cache, progress=engine(to, "analyze"), cancel=stop,
                              warn=lambda text: warnings.warn(text, stacklevel=3), unit=unit)
    at = summary_eps(result, args.eps, args.eps_steps)
    from analysis import agreement

    write_outputs(outputs, result, at, agreement.reading(result, at))
    return Analysis(result, at, {k: Path(v) for k, v in outputs.items() if v})


@dataclass(repr=False)
class Analysis(Shown):
    """The statistics of one base + agents set. `eps` is the ε tables and figures use unless given one; every
    table is a pandas DataFrame, every figure the plotly figure the app's Heterogeneity page draws."""

    result: Any  # analysis.stats.AnalysisResult: `frame` (agent × tensor × ε), `pairs` (pair × tensor × ε)
    eps: float
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def agents(self) -> list[str]:
        return list(self.result.agents)

    @property
    def ladder(self) -> list[float]:
        return list(self.result.ladder)

    @property
    def frame(self):
        """Per agent × tensor × ε: counts, overlap histogram, norms, sign conflicts, the diagnostics' sums."""
        return self.result.frame

    def _at(self, eps: float | None) -> float:
        from merging.common.errors import RamStudioError

        eps = self.eps if eps is None else eps
        if eps not in self.result.ladder:
            raise RamStudioError(f"ε={eps:g} is not in the analysed ladder {self.ladder}.",
                                 "Analyse again with it in eps_ladder.")
        return eps

    def summary(self, eps: float | None = None):
        """Per agent at ε: changed, shared and unique elements, density, ρ_t, unique share and its chance levels."""
        from analysis.tables import rho_table, unique_vs_chance

        at = self._at(eps)
        g = unique_vs_chance(self.result, at).merge(rho_table(self.result, at)[["agent", "rho"]], on="agent")
        return g[["agent", "changed", "shared", "unique", "density", "rho", "unique_share", "chance_unique_share",
                  "chance_unique_share_tensor", "chance_unique_share_binade"]]

    def precision(self, eps: float | None = None):
        """Per agent at ε, the number format's view: density, density at ε = 0 (stored value changed at all), the
        share of the changed elements one representable step from the base and their share of Σ τ², and the
        share of weights where ε is below one step."""
        from analysis.tables import precision_view

        return precision_view(self.result, self._at(eps))

    def pairs(self, eps: float | None = None):
        """Per pair at ε, on the elements both changed: count against chance, same sign (± s.e.), cosine."""
        from analysis.agreement import pair_agreement

        return pair_agreement(self.result, self._at(eps))

    def agreement(self, eps: float | None = None):
        """Per agent at ε: sign agreement, cosine against the others, shared energy and its dominance profile."""
        from analysis.agreement import agent_agreement

        return agent_agreement(self.result, self._at(eps))

    def reading(self, eps: float | None = None) -> str:
        """The plain-language reading of the diagnostics at ε (its regime: `regime(eps)`)."""
        from analysis.agreement import reading

        return reading(self.result, self._at(eps)).text

    def regime(self, eps: float | None = None) -> str:
        """The reading's regime at ε: shared, chance, opposed, mixed, single or too_few."""
        from analysis.agreement import reading

        return reading(self.result, self._at(eps)).regime

    def lambdas(self, r: float = 0.1, alpha: float = 2.0, rule: str = "clip", rho_scope: str = "global",
                eps: float | None = None):
        """ρ_t and λ_t per agent for any RAM+ setting (Eq. 6 clip or Eq. 8 soft), from the counts: no weights read."""
        from analysis.tables import lambda_table

        return lambda_table(self.result, self._at(eps), r, alpha, rule, rho_scope)

    def to_json(self) -> dict:
        """The document `ram-studio analyze --json` writes (keys: eps, total_params, agents, pairs, reading, …)."""
        from analysis.agreement import reading
        from ram_studio.commands.analyze import json_document

        return _json.loads(_json.dumps(json_document(self.result, self.eps, reading(self.result, self.eps))))

    # ------------------------------------------------------------ figures (the Heterogeneity page's)

    def _params(self, at: float) -> dict:
        return {"eps": at, "agents": self.agents}

    def density_chart(self, eps: float | None = None, theme: str = "light"):
        """Density per agent (the paper's Fig. 2, left)."""
        from analysis.tables import global_density
        from ram_studio.api.figures import charts, titled

        at = self._at(eps)
        fig = charts().density_bars(global_density(self.result, at), self.agents)
        return titled(fig, "Density per agent", self._params(at), theme)

    def overlap_chart(self, eps: float | None = None, theme: str = "light"):
        """Of each agent's changes, the share changed by exactly k agents, with the unique share's chance level."""
        from analysis.tables import overlap_distribution, unique_vs_chance
        from ram_studio.api.figures import charts, titled

        at = self._at(eps)
        uvc = unique_vs_chance(self.result, at)
        chance = dict(zip(uvc["agent"], uvc["chance_unique_share"]))
        fig = charts().overlap_stacked(overlap_distribution(self.result, at), self.agents, chance)
        return titled(fig, "Overlap distribution", self._params(at), theme)

    def unique_vs_chance_chart(self, eps: float | None = None, log: bool = False, theme: str = "light"):
        """Each agent's unique share next to independent masks' (whole model ◆, tensor by tensor ◇)."""
        from analysis.tables import unique_vs_chance
        from ram_studio.api.figures import charts, titled

        at = self._at(eps)
        fig = charts().unique_vs_chance_bars(unique_vs_chance(self.result, at), self.agents, log)
        return titled(fig, "Unique share against chance", self._params(at), theme)

    def pair_chart(self, eps: float | None = None, theme: str = "light"):
        """Do shared updates agree? Same sign and cosine per pair, coloured against chance."""
        from ram_studio.api.figures import charts, titled

        at = self._at(eps)
        return titled(charts().pair_matrix(self.pairs(at), self.agents), "Do shared updates agree?",
                      self._params(at), theme)

    def energy_chart(self, eps: float | None = None, theme: str = "light"):
        """Where each agent's update energy lies: unique, shared, and shared where the partners barely moved."""
        from ram_studio.api.figures import charts, titled

        at = self._at(eps)
        return titled(charts().energy_profile(self.agreement(at), self.agents),
                      "Where each agent's update energy lies", self._params(at), theme)

    def lambda_chart(self, r: float = 0.1, alpha: float = 2.0, rule: str = "clip", eps: float | None = None,
                     theme: str = "light"):
        """λ(ρ) for a RAM+ setting with every agent's (ρ_t, λ_t) on the curve (the Tune page's chart)."""
        from ram_studio.api.figures import charts, titled

        at = self._at(eps)
        fig = charts().lambda_curve(self.lambdas(r, alpha, rule, "global", at), self.agents, r, alpha, rule)
        return titled(fig, "λ as a function of ρ", {**self._params(at), "r": r, "alpha": alpha}, theme)

    # ------------------------------------------------------------ display

    def _title(self) -> str:
        base = self.result.refs[0] if self.result.refs else self.result.base
        return f"Analysis of {len(self.agents)} agents against {base}"

    def _facts(self) -> dict[str, Any]:
        return {"ε": f"{self.eps:g}", "parameters": self.result.total_params,
                "ladder": ", ".join(f"{e:g}" for e in self.ladder),
                "time": "from cache" if self.result.from_cache else f"{self.result.seconds:.1f} s"}

    def _parts(self) -> list[tuple[str, Any]]:
        parts = [("table", self.summary())]
        if len(self.agents) > 1:
            parts += [("table", self.pairs()[["a", "b", "both_changed", "expected_both", "sign_agreement",
                                              "sign_agreement_se", "cosine"]]),
                      ("text", self.reading())]
        return parts
