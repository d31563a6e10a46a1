"""The models a command names: the positional base and agents, downloading Hub models first with progress, and
checking an output file against the inputs before any work starts."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from merging.common.errors import RamStudioError, printable
from ram_studio.console import say


def add_model_arguments(sp: argparse.ArgumentParser) -> None:
    """The base, the agents and --on-mismatch, as `inspect`, `analyze`, `merge` and `sweep` take them."""
    sp.add_argument("base", help="base model: folder, org/name[@revision] or demo:base")
    sp.add_argument("agents", nargs="*", help="agent models (same forms)")
    sp.add_argument("--on-mismatch", choices=["error", "base"], default="error",
                    help="what to do when agents differ from the base (see docs/models.md)")


def download_printer():
    """Download progress on stderr: overall percent, bytes, rate and ETA, and the current file. On a terminal
    one line is rewritten in place; otherwise a line is printed per finished file and every 5 seconds."""
    import time

    from merging.common.units import format_bytes, format_seconds

    tty = sys.stderr.isatty()
    state = {"file": None, "files_done": -1, "printed": 0.0}

    def show(p) -> None:
        eta = f"  ETA {format_seconds(p.eta)}" if p.eta is not None and p.done < p.total else ""
        file_pct = f"{100 * p.file_done / p.file_total:.0f}%" if p.file_total else "–"
        line = (f"download: {100 * p.fraction:5.1f}%  {format_bytes(p.done)} of {format_bytes(p.total)}  "
                f"{format_bytes(p.rate)}/s{eta}  [{p.files_done}/{p.files_total} files] "
                f"{printable(p.repo_id)} {printable(p.file)} {file_pct}")
        now = time.monotonic()
        if tty:
            sys.stderr.write("\r\033[K" + line)
            if p.done >= p.total:
                sys.stderr.write("\n")
        elif p.files_done != state["files_done"] or now - state["printed"] >= 5 or p.done >= p.total:
            sys.stderr.write(line + "\n")
            state["printed"] = now
        state["files_done"] = p.files_done
        sys.stderr.flush()

    return show


def describe_plan(plan) -> list[str]:
    """What a download needs, in lines: per repo its files and size, then the total, where and the free space."""
    from merging.common.units import format_bytes

    lines = [f"{printable(r.repo_id)} @ {r.commit[:12]}: {len(r.files)} files, "
             f"{format_bytes(sum(f.size for f in r.files))}" for r in plan.repos]
    if plan.remaining == 0:
        lines.append(f"everything is already in the cache ({plan.cache_dir}).")
    else:
        kept = plan.cached + plan.partial
        lines.append(f"to download: {format_bytes(plan.remaining)}"
                     + (f" ({format_bytes(kept)} already in the cache, partial files resume)" if kept else "")
                     + f" into {plan.cache_dir} (the Hugging Face cache; {format_bytes(plan.free())} free)")
    return lines


def prefetch(refs, quiet: bool, stop=None) -> None:
    """Download the Hub models among `refs` that are not in the cache yet, with progress, before a command
    reads them (the command itself then opens them from the cache)."""
    from merging.reading.refs import hub_repos

    hub = hub_repos(list(refs))
    if not hub:
        return
    from merging.reading.hub import download, offline_mode, plan_download

    if offline_mode():
        return  # the command says what is missing from the cache
    plan = plan_download(hub)
    if plan.remaining == 0:
        return
    if not quiet:
        for line in describe_plan(plan):
            say(f"download: {line}", file=sys.stderr)
    download(plan, progress=None if quiet else download_printer(), cancel=stop)


def file_output(path: str | None, checkpoints, overwrite: bool) -> Path | None:
    """Check a --json/--csv path against the placement rules before any work starts."""
    if not path:
        return None
    from merging.writing.placement import check_output_file, protected_paths

    return check_output_file(path, protected_paths([(c.ref.raw, c.folder) for c in checkpoints]), overwrite=overwrite)


def local_folder(ref: str) -> Path | None:
    """The folder a model reference names when it is on this machine already (nothing is downloaded)."""
    from merging.reading.refs import resolve

    try:
        return resolve(ref, download=False)
    except RamStudioError:
        return None
