"""`ram_studio.sweep`: score merge candidates by the paper's protocol (each method's best chosen on validation,
reported on test, next to the base and the agents) — the CLI's `ram-studio sweep` as a function."""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from ram_studio.api.display import Shown
from ram_studio.api.options import model_refs, parse
from ram_studio.api.progress import Progress, ProgressArg, close, sink
from ram_studio.api.running import prefetch

Grid = Union[str, Mapping[str, Any]]  # a --try text, or {"method": …, parameter: values}


def _try_text(grid: Any) -> Any:
    """A grid given as a mapping ({"method": "ties", "lambda": [0.5, 1.0]}) as its --try text."""
    if not isinstance(grid, Mapping):
        return grid
    values = {k: v for k, v in grid.items() if k != "method"}
    bits = [f"{k}={','.join(str(x) for x in (v if isinstance(v, (list, tuple)) else [v]))}" for k, v in values.items()]
    return " ".join([str(grid.get("method", "")), *bits])


def sweep(base: str | os.PathLike, agents: Sequence[str | os.PathLike], *, try_: Sequence[Grid] | Grid | None = None,
          grids: Sequence[str | os.PathLike] | str | os.PathLike | None = None,
          tasks: Sequence[str] | str | None = None,
          suite: str | None = None, lm_eval: Sequence[str] | str | None = None,
          include_path: str | os.PathLike | None = None, backend: str = "auto", device: str = "auto",
          batch_size: int | str | None = None, select_on: str = "validation", report_on: str = "test",
          limit: int | None = None, keep: str = "none", out: str | os.PathLike = "merged-models",
          executor: str = "local", json: str | os.PathLike | None = None, csv: str | os.PathLike | None = None,
          overwrite: bool = False, no_resume: bool = False, no_references: bool = False, on_mismatch: str = "error",
          fisher_tasks: Sequence[str] | str | None = None, progress: ProgressArg = True) -> "Sweep":
    """Sweep as `ram-studio sweep` does (keywords are its flags; `try_` is --try): grids as "METHOD name=v1,v2"
    strings or mappings ({"method": "ties", "lambda": [0.5, 1.0]}), YAML `grids` files; every candidate merged in
    memory and scored on `select_on`, each method's best then on `report_on`. Scores are stored as they come, so
    a repeated call resumes (`no_resume=True` scores again). Returns a Sweep (every score as a frame, the choices,
    the app's charts); bad input raises RamStudioError before anything runs."""
    if try_ is not None and (isinstance(try_, (str, Mapping))):
        try_ = [try_]
    options = dict(try_=[_try_text(g) for g in try_] if try_ is not None else None, grids=grids, tasks=tasks,
                   suite=suite, lm_eval=lm_eval, include_path=include_path, backend=backend, device=device,
                   batch_size=batch_size, select_on=select_on, report_on=report_on, limit=limit, keep=keep, out=out,
                   executor=executor, json=json, csv=csv, overwrite=overwrite, no_resume=no_resume,
                   no_references=no_references, on_mismatch=on_mismatch, fisher_tasks=fisher_tasks)
    args = parse("sweep", [*model_refs(base, "base"), *model_refs(agents, "agents")], options)
    return _run(args, sink(progress))


def _run(args, to) -> "Sweep":
    """cmd_sweep's checks and run, with progress to `to` and nothing printed."""
    from evaluation.executors import EXECUTORS
    from evaluation.keep import check_root, keep_models
    from evaluation.quiet import quiet_libraries
    from evaluation.store import ScoreStore
    from evaluation.sweep import SweepSpec, check_agents, check_splits, run_sweep
    from ram_studio.commands.evaluator_options import build_evaluator
    from ram_studio.commands.sweep import checked_grids, output_files
    from ram_studio.console import stop_on_signal
    from ram_studio.inputs import local_folder

    grids = checked_grids(args)
    make_evaluator = functools.partial(build_evaluator, args, suite_folder=local_folder(args.base))
    evaluator = make_evaluator()
    check_splits(evaluator, args.select_on, args.report_on)
    check_agents(grids, list(args.agents))
    outputs = output_files(args)
    root = Path(args.out)
    if args.keep != "none":
        check_root(root, args.base, list(args.agents))
    spec = SweepSpec(args.base, list(args.agents), grids, evaluator, args.select_on, args.report_on, args.limit,
                     args.on_mismatch, args.device, args.inputs, references=not args.no_references,
                     make_evaluator=make_evaluator,
                     fisher_tasks=[t for t in (args.fisher_tasks or "").split(",") if t.strip()] or None)
    executor = EXECUTORS[args.executor]()
    show = None if to is None else (lambda p: to(Progress("sweep", p.done, p.total, _progress_text(p))))
    try:
        with stop_on_signal() as stop, quiet_libraries():
            prefetch([args.base, *args.agents], to, stop)
            res = run_sweep(spec, executor, store=ScoreStore(read=not args.no_resume), progress=show, cancel=stop)
            kept = keep_models(res, args.keep, root, overwrite=args.overwrite,
                               cancel=stop) if args.keep != "none" else []
    finally:
        close(to)
    swept = Sweep(res, executor.name, [Path(k.out) for k in kept])
    _write(swept, outputs)
    return swept


def _progress_text(p) -> str:
    phase = {"open": "opening", "select": "selection split", "report": "report split", "done": "done"}[p.phase]
    return f"{phase}: {p.current}" if p.current else phase


def _write(swept: "Sweep", outputs: dict) -> None:
    """--json and --csv, atomically and checked again at write time, as the CLI writes them."""
    import json

    from evaluation.report import csv_bytes, result_frame
    from merging.writing.checked_output import write_file_atomically

    if "json" in outputs:
        doc = swept.to_json()
        write_file_atomically(outputs["json"], (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode())
    if "csv" in outputs:
        write_file_atomically(outputs["csv"], csv_bytes(result_frame(swept.result)))
    swept.files = {k: Path(v) for k, v in outputs.items()}


@dataclass(repr=False)
class Sweep(Shown):
    """A finished sweep: every entry (`table()`), each method's chosen candidate (`selected`, `chosen()`), the best
    overall (`best`), kept model folders (`kept`), the CLI's JSON document (`to_json()`) and the Sweep page's
    charts."""

    result: Any  # evaluation.sweep.SweepResult
    executor: str
    kept: list[Path] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def selected(self) -> dict[str, str]:
        """Method → the label of its chosen candidate (chosen on the selection split)."""
        return {m: c.label for m, c in self.result.selected.items()}

    @property
    def best(self) -> str | None:
        return self.result.best.label if self.result.best is not None else None

    @property
    def seconds(self) -> float:
        return self.result.seconds

    def table(self):
        """One row per entry: kind, candidate, method, split, parameters, per-task scores, average, seconds."""
        from evaluation.report import result_frame

        return result_frame(self.result)

    def chosen(self):
        """Each method's chosen setting with its selection and report averages."""
        import pandas as pd

        spec = self.result.spec
        sel, rep = self.result.candidates(spec.select_on), self.result.candidates(spec.report_on)
        avg = lambda entries, c: next((e.average for e in entries if e.candidate == c), math.nan)  # noqa: E731
        return pd.DataFrame([{"method": m, "setting": c.settings or "(no parameters)",
                              f"{spec.select_on} average": avg(sel, c), f"{spec.report_on} average": avg(rep, c)}
                             for m, c in self.result.selected.items()])

    def to_json(self) -> dict:
        """The document `ram-studio sweep --json` writes (candidates, references, selected, best, sweep)."""
        from evaluation.report import result_json

        return {**result_json(self.result, self.executor), "kept": [str(k) for k in self.kept]}

    # ------------------------------------------------------------ figures (the Sweep page's)

    def _tasks_agents(self) -> tuple[list[str], list[str]]:
        entries = self.result.entries
        return list(dict.fromkeys(k for e in entries for k in e.scores)), self.result.context["labels"][1:]

    def chosen_chart(self, theme: str = "light"):
        """Each method's chosen candidate next to the base and the agents, per task, on the report split."""
        import pandas as pd

        from ram_studio.api.figures import charts, titled

        c, spec = charts(), self.result.spec
        tasks, agents = self._tasks_agents()
        rows = [{"name": e.label, "short": c.short_candidate(e.method, e.params, list(e.candidate.given)),
                 **e.scores, "average": e.average} for e in self.result.candidates(spec.report_on)]
        refs = self.result.references()
        names = c.short_labels([e.label for e in refs])
        rows += [{"name": e.label, "short": names[e.label], **e.scores, "average": e.average} for e in refs]
        df = pd.DataFrame(rows)
        df["short"] = c.short_candidate_labels(list(df["short"]), limit=20)
        return titled(c.sweep_task_bars(df, tasks, agents), "Chosen candidates and the agents",
                      {"split": spec.report_on, "agents": agents}, theme)

    def parameter_chart(self, method: str, param: str, theme: str = "light"):
        """Score per task against one swept parameter of `method` on the selection split (the paper's Table 2
        view); the method's other swept parameters stay at its chosen candidate's values."""
        import pandas as pd

        from merging.common.errors import RamStudioError
        from ram_studio.api.figures import charts, titled

        spec = self.result.spec
        part = [e for e in self.result.candidates(spec.select_on) if e.method == method and e.ok]
        if not part or param not in part[0].params:
            raise RamStudioError(f"no {method} candidates with a parameter {param!r} were scored.",
                                 "See table() for the methods and parameters swept.")
        chosen = self.result.selected.get(method)
        fixed = {k: dict(chosen.param_dict)[k] for k in (chosen.given if chosen else ())
                 if k != param and len({repr(e.params[k]) for e in part}) > 1}
        part = [e for e in part if all(e.params[k] == v for k, v in fixed.items())]
        tasks, agents = self._tasks_agents()
        df = pd.DataFrame([{"candidate": e.label, param: e.params[param], **e.scores, "average": e.average}
                           for e in part])
        return titled(charts().sweep_param_lines(df, param, tasks, agents), f"{method}: score against {param}",
                      {"split": spec.select_on, "method": method, **fixed}, theme)

    def time_chart(self, theme: str = "light"):
        """Each candidate's selection-split average against its merge's seconds (the paper's Fig. 9 view)."""
        import pandas as pd

        from ram_studio.api.figures import charts, titled

        spec = self.result.spec
        df = pd.DataFrame([{"candidate": e.label, "method": e.method, "merge_s": e.merge_s, "average": e.average,
                            "selected": e.selected} for e in self.result.candidates(spec.select_on) if e.ok])
        return titled(charts().sweep_time_scatter(df), "Score against merge time", {"split": spec.select_on}, theme)

    # ------------------------------------------------------------ display

    def _title(self) -> str:
        spec = self.result.spec
        return (f"Sweep of {len(self.result.candidates(spec.select_on))} candidates: chosen on {spec.select_on}, "
                f"reported on {spec.report_on}")

    def _facts(self) -> dict[str, Any]:
        stored = sum(e.resumed for e in self.result.entries)
        facts = {"best": self.best or "–", "time": f"{self.seconds:.1f} s"}
        if stored:
            facts["reused scores"] = stored
        return facts

    def _parts(self) -> list[tuple[str, Any]]:
        return [("table", self.chosen())] + [("text", n) for n in self.result.notes]
