"""`ram-studio analyze`: task-vector statistics for a ladder of ε in one streaming pass — the summary table, whether
the overlap is real (sign agreement, cosine), a plain reading, and --json/--csv/--pairs-csv files."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap

from merging.common.errors import RamStudioError, printable
from ram_studio.console import QUIET_HELP, progress_printer, say, stop_on_signal, table
from ram_studio.inputs import add_model_arguments, file_output, prefetch


def add_parser(sub) -> None:
    """The `analyze` subcommand and its options."""
    sp = sub.add_parser("analyze", help="task-vector statistics for a ladder of ε (one streaming pass)")
    add_model_arguments(sp)
    sp.add_argument("--eps-ladder", help="comma-separated ε values (default 0,1e-7,1e-6,3e-6,1e-5,3e-5,1e-4,1e-3)")
    sp.add_argument("--eps", type=float, default=1e-5, help="ε for the printed summary")
    sp.add_argument("--eps-steps", type=float, metavar="K",
                    help="count an element as changed when |τ| exceeds K representable steps of the base's stored "
                         "dtype at the base weight (K > 0; our extension, not the paper's absolute ε): the ladder "
                         "(--eps-ladder, default 0,0.5,1,2,4,8,16, plus K) is then in steps and the summary, "
                         "\"density\" and the shared/unique counts are at K steps")
    sp.add_argument("--json", help="write per-agent summaries for every ε as JSON")
    sp.add_argument("--csv", help="write the full per-tensor table as CSV (one row per agent × tensor × ε)")
    sp.add_argument("--pairs-csv", help="write the per-tensor pair diagnostics as CSV (one row per pair of agents "
                                        "× tensor × ε: elements both changed, same sign, Σ τ_a·τ_b, Σ τ_a², Σ τ_b²)")
    sp.add_argument("--overwrite", action="store_true", help="replace existing --json/--csv/--pairs-csv files")
    sp.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    sp.add_argument("--no-cache", action="store_true", help="recompute even if a cached result exists")
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    """Analyse the base and agents, print the summary at --eps, and write the files asked for."""
    from analysis.stats import analyze, size_note
    from merging.common.timeline import mark
    from merging.reading.checkpoint import open_checkpoint

    mark("analyze: command starts")
    with stop_on_signal() as stop:
        prefetch([args.base, *args.agents], args.quiet, stop)
    base = open_checkpoint(args.base)
    agents = [open_checkpoint(a) for a in args.agents]
    outputs = {flag: file_output(getattr(args, flag), [base, *agents], args.overwrite)
               for flag in ("json", "csv", "pairs_csv")}
    mark("headers read")
    ladder, unit = ladder_and_unit(args)
    note = size_note(base, len(agents), ladder)
    if note and not args.quiet:
        say(f"note: {note}", file=sys.stderr)
    with stop_on_signal() as stop:
        result = analyze(base, agents, ladder=ladder, device=args.device, policy=args.on_mismatch,
                         use_cache=not args.no_cache, progress=None if args.quiet else progress_printer("analyze"),
                         cancel=stop, warn=lambda text: say(f"warning: {text}", file=sys.stderr), unit=unit)
    mark("analysis done")
    eps = summary_eps(result, args.eps, args.eps_steps)
    from demo.evidence import evidence_for  # scores of these same models, when they are a demo trio

    read = _print_summary(result, eps, evidence_for(args.base, list(args.agents)))
    mark("summary printed")
    write_outputs(outputs, result, eps, read)
    mark("outputs written")
    return 0


def ladder_and_unit(args: argparse.Namespace) -> tuple[list[float], str]:
    """The ladder to analyse and its unit: ε values, or with --eps-steps K counts of representable steps (the
    default step ladder, or --eps-ladder read in steps, with K added)."""
    from analysis.ladder import DEFAULT_LADDER, STEP_LADDER

    k = getattr(args, "eps_steps", None)
    if k is None:
        return (_ladder(args.eps_ladder) if args.eps_ladder else list(DEFAULT_LADDER)), "abs"
    if not 0 < k < float("inf"):
        raise RamStudioError(f"--eps-steps {k:g}: K must be a finite number > 0.",
                             "E.g. --eps-steps 1 (changed when |τ| exceeds one step of the stored dtype).")
    return sorted(set(_ladder(args.eps_ladder) if args.eps_ladder else STEP_LADDER) | {float(k)}), "steps"


def summary_eps(result, eps: float, steps: float | None = None) -> float:
    """The ε the summary is given at: K with --eps-steps; else the one asked for when it was analysed, else 1e-5,
    else the ladder's last."""
    if steps is not None:
        return float(steps)
    return eps if eps in result.ladder else (1e-5 if 1e-5 in result.ladder else result.ladder[-1])


def json_document(result, eps: float, read) -> dict:
    """What --json writes: per-agent summaries for every ε, the pairs, the reading at `eps`, the fingerprint."""
    from analysis import agreement
    from analysis.tables import agents_json

    fields = agreement.agent_fields(result)
    records = [{**rec, **fields[(rec["name"], rec["eps"])]} for rec in agents_json(result)]
    return {"eps": list(result.ladder), "eps_unit": result.unit, "total_params": result.total_params,
            "base": result.base, "agents": records, "pairs": agreement.pairs_json(result),
            "reading": {"eps": eps, "regime": read.regime, "text": read.text},
            "fingerprint": result.fingerprint, "seconds": result.seconds}


def _print_summary(result, eps: float, scores: str = ""):
    """The per-agent table at `eps`, the pair and agent agreement tables, and the reading (returned; `scores`
    cites scores of these models, analysis.agreement.reading)."""
    from analysis import agreement  # pandas: only once there are results
    from analysis.tables import global_density, rho_table

    summary = global_density(result, eps).merge(rho_table(result, eps)[["agent", "rho"]], on="agent")
    summary["density"] = (100 * summary["density"]).map("{:.3f} %".format)
    rule = f"ε = {eps:g}" if result.unit == "abs" else f"ε = {eps:g} steps of the stored dtype"
    say(f"{rule}; {result.total_params:,} parameters; "
          f"{'from cache' if result.from_cache else f'{result.seconds:.1f} s'}")
    say(table(summary[["agent", "changed", "shared", "unique", "density", "rho"]]))
    say("\n" + _precision_lines(result, eps))
    read = agreement.reading(result, eps, scores)
    if len(result.agents) > 1:
        say("\nIs the overlap real? (elements both changed; chance: 50 % same sign, cosine 0)")
        say(table(_pair_summary(agreement.pair_agreement(result, eps))))
        say(table(_agent_summary(agreement.agent_agreement(result, eps))))
    say("\n" + textwrap.fill(printable(read.text, 4000), 100))
    return read


def write_outputs(outputs: dict, result, eps: float, read) -> None:
    """--json (per-agent summaries for every ε, the pairs, the reading), --csv and --pairs-csv."""
    from merging.common.escaping import csv_bytes
    from merging.writing.checked_output import write_file_atomically

    if outputs["json"]:
        doc = json_document(result, eps, read)
        write_file_atomically(outputs["json"], (json.dumps(doc, indent=2) + "\n").encode())
    if outputs["csv"]:
        write_file_atomically(outputs["csv"], csv_bytes(result.frame))
    if outputs["pairs_csv"]:
        write_file_atomically(outputs["pairs_csv"], csv_bytes(result.pairs))


def _ladder(text: str) -> list[float]:
    """The --eps-ladder values (their number bounded by analysis.stats.validate_ladder before the pass)."""
    from analysis.stats import MAX_LADDER, validate_ladder

    words = [x for x in text.split(",") if x.strip()]
    if len(words) > MAX_LADDER:
        validate_ladder(words)  # refuses the count in one line, before any value is read
    try:
        return [float(x) for x in words]
    except ValueError:
        raise RamStudioError(f"cannot read --eps-ladder {printable(text, 80)!r}.",
                             "Use comma-separated numbers, e.g. 0,1e-6,1e-5.") from None


def _precision_lines(result, eps: float) -> str:
    """The precision view at `eps`: stored value changed at all, one-step changes and their energy, and
    where ε sits against one step of the stored dtype."""
    from analysis.tables import precision_view

    pv = precision_view(result, eps)
    lines = [f"Precision: ε is below one step of the stored dtype for {_pct(pv['eps_below_step_share'].iloc[0])} "
             "of the weights" if result.unit == "abs" else "Precision (thresholds in steps of the stored dtype):"]
    for r in pv.itertuples():
        lines.append(f"  {printable(r.agent, 200)}: stored value changed {_pct(r.density_eps0)}; of the changed, "
                     f"{_pct(r.one_step_share)} moved exactly one representable step ({_pct(r.one_step_energy_share)}"
                     " of their Σ τ²)")
    return "\n".join(lines)


def _pct(v: float) -> str:
    return "–" if v != v else f"{100 * v:.1f} %"


def _pair_summary(pa):
    """The pair diagnostics as printed columns."""
    import pandas as pd

    from analysis.agreement import sign_se

    return pd.DataFrame({
        "pair": [f"{a}–{b}" for a, b in zip(pa["a"], pa["b"])],
        "both changed": [f"{int(v):,}" for v in pa["both_changed"]],
        "chance (per tensor)": [f"{v:,.0f}" for v in pa["expected_both_tensor"]],
        "same sign (± s.e.)": [_pct(v) + ("" if v != v else f" ± {100 * sign_se(int(n), v):.1f}")
                               for v, n in zip(pa["sign_agreement"], pa["both_changed"])],
        "cosine": ["–" if v != v else f"{v:+.3f}" for v in pa["cosine"]]})


def _agent_summary(ag):
    """The per-agent diagnostics as printed columns."""
    import pandas as pd

    return pd.DataFrame({
        "agent": ag["agent"], "same sign": [_pct(v) for v in ag["sign_agreement"]],
        "all agree (chance)": [f"{_pct(a)} ({_pct(c)})" for a, c in zip(ag["all_agree"], ag["chance_all_agree"])],
        "cosine vs others": ["–" if v != v else f"{v:+.3f}" for v in ag["cosine_others"]],
        "shared energy": [_pct(v) for v in ag["shared_energy_share"]],
        "partners < 10 % / 30 %": [f"{_pct(a)} / {_pct(b)}" for a, b in
                                   zip(ag["dominated_10_share"], ag["dominated_30_share"])],
        "unique (chance: model / tensor / binade)": [
            f"{_pct(u)} ({_pct(c)} / {_pct(t)} / {_pct(b)})" for u, c, t, b in
            zip(ag["unique_share"], ag["chance_unique_share"], ag["chance_unique_share_tensor"],
                ag["chance_unique_share_binade"])]})
