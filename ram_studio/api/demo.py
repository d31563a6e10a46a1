"""The teaching pieces of the Signal dilution page as functions: `toy` (small sparse task vectors with a chosen
overlap, merged by averaging, RAM and RAM+) and `fig3` (the paper's Fig. 3 experiment on real models: the base
plus one agent's unique region, whole and divided by N, scored on the agent's own task)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ram_studio.api.display import Shown
from ram_studio.api.options import model_refs
from ram_studio.api.progress import ProgressArg, fraction, sink

DEMO_AGENTS = ("demo:code", "demo:tool", "demo:memory")


def toy(densities: Sequence[float] = (0.08, 0.35, 0.5), overlaps: Sequence[float] = (0.6, 0.4, 0.3), *,
        seed: int = 0, r: float = 0.1, alpha: float = 2.0) -> "Toy":
    """The app's toy: one agent per density, each with a share `overlaps[t]` of its changes in a region the
    others change too (2 to 5 agents, 128 toy parameters each), merged by averaging, RAM and RAM+ (r, α).
    Returns a Toy: ρ_t and λ_t, what each merge keeps of every agent's unique cells, and the page's figures."""
    from merging.common.errors import RamStudioError

    densities, overlaps = [float(d) for d in densities], [float(o) for o in overlaps]
    if not 2 <= len(densities) <= 5 or len(overlaps) != len(densities):
        raise RamStudioError(f"the toy takes 2 to 5 agents, one overlap per density (got {len(densities)} densities "
                             f"and {len(overlaps)} overlaps).", "E.g. toy([0.1, 0.4, 0.5], [0.6, 0.4, 0.3]).")
    if not all(0 < d <= 1 for d in densities) or not all(0 <= o <= 1 for o in overlaps):
        raise RamStudioError("toy densities must be in (0, 1] and overlaps in [0, 1].", "E.g. densities 0.1–0.6.")
    if r < 0 or alpha < 0 or not (math.isfinite(r) and math.isfinite(alpha)):
        raise RamStudioError(f"r={r} and alpha={alpha} must be finite and ≥ 0.", "The paper uses r=0.1, alpha=2.")
    from analysis.toy import toy_merges, toy_taus

    taus = toy_taus(densities, overlaps, int(seed))
    return Toy(taus, toy_merges(taus, r, alpha), [f"A{i + 1}" for i in range(len(densities))], r, alpha, int(seed))


@dataclass(repr=False)
class Toy(Shown):
    """The toy's task vectors (`taus`, N × 128), their merges (`merged`: average, RAM, RAM+), and its tables."""

    taus: Any
    merged: dict[str, Any]
    names: list[str]
    r: float
    alpha: float
    seed: int

    def rho_lambda(self):
        """Per toy agent: changed, shared, unique, unique share (and chance), ρ_t and λ_t."""
        from analysis.toy import toy_rho_lambda

        return toy_rho_lambda(self.taus, self.names, self.r, self.alpha)

    def retention(self):
        """Per toy agent and merge: the share of its unique update the merge keeps (average 1/N, RAM 1, RAM+ λ_t)."""
        from analysis.toy import unique_retention

        return unique_retention(self.taus, self.merged, self.names)

    def _params(self) -> dict:
        return {"N": len(self.names), "seed": self.seed, "r": self.r, "alpha": self.alpha}

    def heatmaps(self, theme: str = "light"):
        """The toy's task vectors and their three merges as heatmaps (pale = a unique update shrunk to 1/N)."""
        from analysis.toy import COLS, ROWS
        from ram_studio.api.figures import charts, titled

        c, n = charts(), len(self.names)
        colors = c.toy_colors(self.names)
        panels = [(f"τ of {nm}", self.taus[i].view(ROWS, COLS).numpy()) for i, nm in enumerate(self.names)]
        cols = max(n, len(self.merged))
        panels += [(None, None)] * (cols - n)
        panels += [(f"merged: {m}", tm.view(ROWS, COLS).numpy()) for m, tm in self.merged.items()]
        fill = [colors[nm] for nm in self.names] + [None] * (len(panels) - n)
        zmax = float(self.taus.abs().max()) or 1.0
        return titled(c.toy_heatmaps(panels, zmax, fill, cols), "Toy task vectors and their merges",
                      self._params(), theme)

    def retention_chart(self, theme: str = "light"):
        """What each merge keeps of every toy agent's unique cells."""
        from ram_studio.api.figures import charts, titled

        c = charts()
        return titled(c.retention_bars(self.retention(), self.names, c.toy_colors(self.names)),
                      "What each merge keeps of the unique cells", self._params(), theme)

    def _title(self) -> str:
        return f"Toy: {len(self.names)} agents, r = {self.r:g}, α = {self.alpha:g}"

    def _parts(self) -> list[tuple[str, Any]]:
        return [("table", self.rho_lambda())]


def fig3(base: str | os.PathLike = "demo:base", agents: Sequence[str | os.PathLike] = DEMO_AGENTS, *,
         split: str = "test", limit: int | None = None, progress: ProgressArg = True) -> "Fig3":
    """The paper's Fig. 3 on real models (the demo's by default): for each agent, the base plus only its unique
    region (ε = 1e-5), whole and divided by N, merged into a temporary folder (deleted afterwards) and scored on
    the agent's own task; the base and the full agents are scored too. The demo's tasks score demo-compatible
    models; `limit` scores the first N examples per task. Returns a Fig3 (the rows and the page's chart)."""
    from demo import fig3 as experiment
    from merging.common.errors import RamStudioError
    from ram_studio.console import stop_on_signal

    if split not in ("validation", "test"):
        raise RamStudioError(f"split={split!r} is not a split of the demo's tasks.", "Use 'validation' or 'test'.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise RamStudioError(f"limit={limit!r} is not a positive number of examples.", "Give limit=1 or more.")
    from evaluation.quiet import quiet_libraries

    refs = model_refs(agents, "agents")
    with stop_on_signal() as stop, quiet_libraries():
        tidy = experiment.run_experiment(model_refs(base, "base")[0], refs, splits=(split,), limit=limit,
                                         step=fraction(sink(progress), "fig3"), cancel=stop)
    return Fig3(experiment.percent_rows(tidy), experiment.labels_of(refs), split, limit)


@dataclass(repr=False)
class Fig3(Shown):
    """Fig. 3's rows (`frame`: agent, variant — base, unique, unique_div_N, agent —, task, split, accuracy %)."""

    frame: Any
    agents: list[str]
    split: str
    limit: int | None

    def own_task(self):
        """Per agent, its own task: base, unique region whole, unique region ÷ N, full agent (accuracy %)."""
        from analysis.fig3 import own_task

        return own_task(self.frame, self.agents, self.split)

    def chart(self, theme: str = "light"):
        """The Signal dilution page's Fig. 3 bars."""
        from ram_studio.api.figures import charts, titled

        return titled(charts().fig3_bars(self.own_task(), self.agents),
                      "Fig. 3: unique region only, whole and ÷ N", {"agents": self.agents, "split": self.split}, theme)

    def _title(self) -> str:
        return (f"Fig. 3 on {len(self.agents)} agents ({self.split} split"
                + (f", first {self.limit} examples per task)" if self.limit else ")"))

    def _parts(self) -> list[tuple[str, Any]]:
        view = self.own_task()
        if view.empty:
            return [("table", self.frame)]
        names = {"base": "base", "unique": "unique region", "unique_div_N": "unique region ÷ N", "agent": "full agent"}
        wide = view.assign(variant=view["variant"].map(names)).pivot(index="agent", columns="variant",
                                                                     values="accuracy")
        wide = wide.reindex(index=[a for a in self.agents if a in wide.index],
                            columns=[v for v in names.values() if v in wide.columns])
        return [("table", wide.rename_axis(columns=None).reset_index())]
