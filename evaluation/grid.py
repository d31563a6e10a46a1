"""Candidate grids of a sweep: a method and lists of parameter values, checked against the methods' parameter
declarations (merging/methods/params.py) before anything runs.

Two spellings of the same thing:
- `--try "ties lambda=0.1,0.3,1.0 density=0.1,0.2"` (one grid per flag);
- a YAML file `grids: [{method: ties, lambda: [0.1, 0.3, 1.0], density: [0.1, 0.2]}, …]` (items may also be
  strings in the `--try` form).
A grid's candidates are every combination of its values, the FIRST parameter varying fastest (the order in
which they are scored and the order that breaks ties in selection). A value `@METHOD` (`lambda=@ties`) takes
the value of that parameter from the candidate selected for METHOD on the validation split — the paper's
DARE search at the λ chosen for Task Arithmetic — so such a grid runs after METHOD's selection.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from merging.common.errors import RamStudioError, printable
from merging.common.untrusted import TooComplex, loads_yaml
from merging.methods import get_method

MAX_GRID_BYTES = 1 << 20
MAX_CANDIDATES = 10_000
MAX_QUOTED_TRY = 16 << 10  # shell quoting in --try is read by shlex, quadratic in a word's length


@dataclass(frozen=True)
class Ref:
    """A parameter value taken from the candidate selected for `method`."""

    method: str

    def __str__(self) -> str:
        return f"@{self.method}"


@dataclass(frozen=True)
class Candidate:
    """One merge to score: a method and every parameter value (resolved, in declaration order); `given` names
    the parameters the grid set, in the grid's order (what its label shows)."""

    method: str
    params: tuple[tuple[str, Any], ...]
    given: tuple[str, ...] = ()

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def settings(self) -> str:
        """The grid-set parameters as `k=v k=v` (e.g. `lambda=1.0 density=0.2`)."""
        p = self.param_dict
        return " ".join(f"{k}={p[k]}" for k in self.given)

    @property
    def label(self) -> str:
        """`method k=v …`: short, unique within a sweep, the row name in tables and charts."""
        return f"{self.method} {self.settings}".strip()


@dataclass(frozen=True)
class Grid:
    """A method and, per parameter (in the given order), its values or one Ref."""

    method: str
    axes: tuple[tuple[str, tuple[Any, ...]], ...]

    @property
    def refs(self) -> dict[str, str]:
        """Parameter → the method whose selected value it takes."""
        return {name: values[0].method for name, values in self.axes if isinstance(values[0], Ref)}

    @property
    def text(self) -> str:
        """The grid in the `--try` form."""
        return " ".join([self.method] + [f"{n}={','.join(str(v) for v in vs)}" for n, vs in self.axes])

    def size(self) -> int:
        return math.prod(len(vs) for _, vs in self.axes)

    def expand(self, selected: dict[str, Candidate] | None = None) -> list[Candidate]:
        """Every combination (first parameter fastest); Refs take their value from `selected` (by method)."""
        m = get_method(self.method)
        axes = []
        for name, values in self.axes:
            if isinstance(values[0], Ref):
                chosen = (selected or {}).get(values[0].method)
                if chosen is None:
                    raise RamStudioError(f"{self.method}: {name}={values[0]} needs the selected {values[0].method} "
                                         "candidate first.", "List that method's grid too.")
                values = (chosen.param_dict[name],)
            axes.append((name, values))
        combos: list[dict[str, Any]] = [{}]
        for name, values in axes:  # first axis fastest: later axes wrap the earlier ones
            combos = [{**c, name: v} for v in values for c in combos]
        names = tuple(name for name, _ in self.axes)
        out = []
        for given in combos:
            resolved = m.resolve_params(given)
            out.append(Candidate(m.name, tuple(resolved.items()), names))
        return out


def candidate(method: str, params: dict[str, Any], given: Iterable[str] | None = None) -> Candidate:
    """One candidate from a method and parameter values (checked and completed by the declaration); `given`
    (default: the keys of `params`) are the ones its label shows."""
    m = get_method(method)
    resolved = m.resolve_params(params)
    return Candidate(m.name, tuple(resolved.items()), tuple(params if given is None else given))


def _values(method: str, name: str, raw: list[Any]) -> tuple[Any, ...]:
    """The values of one axis, each checked against the parameter's declaration (or one `@METHOD`)."""
    m = get_method(method)
    decl = next((p for p in m.params if p.name == name), None)
    if decl is None:
        known = ", ".join(p.name for p in m.params) or "none"
        raise RamStudioError(f"{method} has no parameter {printable(name, 40)!r}.", f"Its parameters: {known}.")
    if not raw:
        raise RamStudioError(f"empty grid: {method} {name}= lists no values.",
                             f"Give at least one value, e.g. {name}={decl.default}.")
    if any(isinstance(v, str) and v.strip().startswith("@") for v in raw):
        if len(raw) != 1:
            raise RamStudioError(f"{method} {name}: a value @METHOD must be the only value of its parameter.",
                                 f"Write {name}=@METHOD alone.")
        ref = raw[0].strip()[1:]
        if ref == method:
            raise RamStudioError(f"{method} {name}=@{ref} refers to itself.", "Name another method of the sweep.")
        other = get_method(ref)
        if not any(p.name == name for p in other.params):
            raise RamStudioError(f"{method} {name}=@{ref}: {ref} has no parameter {name}.",
                                 "Take the value from a method that has it.")
        return (Ref(other.name),)
    if len(raw) > MAX_CANDIDATES:  # counted before any value is read: the work below is linear in what is kept
        raise RamStudioError(f"{method} {name}= lists {len(raw):,} values, more than {MAX_CANDIDATES:,}.",
                             "Use fewer values per parameter.")
    # each value checked (a clear line for a bad or out-of-range value); duplicates dropped in one linear pass
    return tuple(dict.fromkeys(decl.resolve(v.strip() if isinstance(v, str) else v) for v in raw))


def parse_try(text: str) -> Grid:
    """`METHOD name=v1,v2 name=v3` → a Grid (every value checked). Shell quoting inside the text is understood
    (shlex) only in short texts: shlex takes quadratic time on a long word."""
    if len(text) > MAX_GRID_BYTES or text.count(",") > MAX_CANDIDATES * 16:
        raise RamStudioError(f"--try {printable(text, 80)!r}… is too long ({len(text):,} characters).",
                             f"A sweep runs at most {MAX_CANDIDATES:,} candidates: use fewer values per parameter.")
    try:
        quoted = any(c in text for c in "'\"\\")
        if quoted and len(text) > MAX_QUOTED_TRY:
            raise ValueError(f"quotes in a text of more than {MAX_QUOTED_TRY:,} characters")
        words = shlex.split(text) if quoted else text.split()
    except ValueError as exc:
        raise RamStudioError(f"cannot read --try {printable(text, 80)!r} ({exc}).",
                             'Write it as "METHOD name=v1,v2 name=v3".') from None
    if not words:
        raise RamStudioError("empty grid: --try names no method.", 'Write it as "METHOD name=v1,v2 name=v3".')
    method = get_method(words[0]).name
    axes: dict[str, tuple[Any, ...]] = {}
    for word in words[1:]:
        name, eq, values = word.partition("=")
        if not eq or not name:
            raise RamStudioError(f"--try {printable(text, 80)!r}: {printable(word, 40)!r} is not name=values.",
                                 'Write it as "METHOD name=v1,v2 name=v3".')
        if name in axes:
            raise RamStudioError(f"--try {printable(text, 80)!r} gives {name} twice.", "List all its values once.")
        axes[name] = _values(method, name, [v for v in values.split(",") if v.strip()])
    return _checked(Grid(method, tuple(axes.items())))


def _checked(grid: Grid) -> Grid:
    """Refuse grids too large to run, and catch values that only fail together (e.g. λ_t overflowing)."""
    if grid.size() > MAX_CANDIDATES:
        raise RamStudioError(f"{grid.method}: {grid.size():,} candidates is more than {MAX_CANDIDATES:,}.",
                             "Use fewer values per parameter.")
    if not grid.refs:
        grid.expand()
    return grid


def _load_yaml(text: str, where: str) -> Any:
    """The document, read by the bounded reader the mergekit panel uses (size, depth, node count and time
    bounded, no aliases or tags): a 100,000-deep or 145,000-value file is refused in linear time, first."""
    import yaml

    if len(text) > MAX_GRID_BYTES or len(text.encode("utf-8", "replace")) > MAX_GRID_BYTES:
        raise RamStudioError(f"{where} is larger than 1 MB.", "A grid file lists methods and values; keep it small.")
    items = text.count(",") + text.count("\n")  # every value but one per list ends at a comma or a line's end
    if items > 2 * MAX_CANDIDATES + 1000:
        raise RamStudioError(f"{where} lists about {items:,} values, more than a sweep of at most {MAX_CANDIDATES:,} "
                             "candidates can use.", "Use fewer values per parameter.")
    try:
        return loads_yaml(text, tags=False)
    except TooComplex as exc:
        raise RamStudioError(f"{where} {exc.reason}.", "Write every value out plainly (no anchors, aliases or tags), "
                             f"at most {MAX_CANDIDATES:,} candidates in all.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise RamStudioError(f"{where} is not valid YAML{line}.", "Check the file.") from None
    except ValueError:  # a scalar the loader cannot convert (an integer of thousands of digits)
        raise RamStudioError(f"{where}: a value could not be read.", "Check the numbers in the file.") from None


def grids_from_yaml(text: str, where: str = "the grid file") -> list[Grid]:
    """Grids from YAML: `grids:` a list of mappings {method, PARAM: value or [values]} or `--try` strings.
    Read by the bounded YAML reader (merging/common/untrusted.py), at most 1 MB."""
    doc = _load_yaml(text, where)
    items = doc.get("grids") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and set(doc) - {"grids"}:
        raise RamStudioError(f"{where}: unknown field {printable(sorted(map(str, set(doc) - {'grids'})), 80)}.",
                             "The file holds one field, grids: a list of grids.")
    if not isinstance(items, list) or not items:
        raise RamStudioError(f"empty grid: {where} lists no grids.",
                             "Give grids: [{method: ties, lambda: [0.5, 1.0]}, …].")
    grids = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            grids.append(parse_try(item))
            _cap(grids)
            continue
        if not isinstance(item, dict) or not isinstance(item.get("method"), str):
            raise RamStudioError(f"{where}: grids[{i}] is not a mapping with a method.",
                                 "Each grid: {method: NAME, PARAM: [values], …}.")
        method = get_method(item["method"]).name
        axes = []
        for name, raw in item.items():
            if name == "method":
                continue
            values = raw if isinstance(raw, list) else [raw]
            if any(isinstance(v, (list, dict)) or v is None for v in values):
                raise RamStudioError(f"{where}: grids[{i}].{printable(name, 40)} must be a value or a list of values.",
                                     "Nested lists and mappings are not parameter values.")
            axes.append((str(name), _values(method, str(name), values)))
        grids.append(_checked(Grid(method, tuple(axes))))
        _cap(grids)
    return grids


def _cap(grids: list[Grid]) -> None:
    """Refuse as soon as the grids read so far hold more candidates than a sweep may run."""
    total = sum(g.size() for g in grids)
    if total > MAX_CANDIDATES:
        raise RamStudioError(f"the sweep has {total:,} candidates, more than {MAX_CANDIDATES:,}.",
                             "Use fewer values per parameter.")


def read_grid_file(path: str | Path) -> list[Grid]:
    """Grids from a YAML file (a clear line when it cannot be read)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_GRID_BYTES:
            raise RamStudioError(f"{p} is larger than 1 MB.", "A grid file lists methods and values; keep it small.")
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RamStudioError(f"grid file {p} does not exist.", "Check the path.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RamStudioError(f"cannot read {p} as UTF-8 text ({getattr(exc, 'strerror', None) or 'bad bytes'}).",
                             "Give a YAML grid file.") from None
    return grids_from_yaml(text, str(p))


def stages(grids: Iterable[Grid]) -> list[list[Grid]]:
    """Grids in the order they can run: a grid whose values come from @METHOD after every grid of METHOD.
    Refuses a reference to a method the sweep does not search, and cycles."""
    grids = list(grids)
    if not grids:
        raise RamStudioError("empty grid: the sweep has no candidates.", 'Give at least one --try "METHOD name=v1,v2".')
    methods = {g.method for g in grids}
    for g in grids:
        for name, ref in g.refs.items():
            if ref not in methods:
                raise RamStudioError(f"{g.method} {name}=@{ref}: the sweep has no {ref} grid to select from.",
                                     f'Add one, e.g. --try "{ref} {name}=…".')
    done: set[str] = set()
    out: list[list[Grid]] = []
    left = grids
    while left:
        ready = [g for g in left if all(r in done for r in g.refs.values())]
        if not ready:
            raise RamStudioError("the grids' @METHOD references form a cycle.",
                                 "A method cannot take its values from a method that takes values from it.")
        out.append(ready)
        left = [g for g in left if g not in ready]
        # a method is selectable once none of its grids waits any more
        done = {g.method for g in grids} - {g.method for g in left}
    total = sum(g.size() for g in grids)
    if total > MAX_CANDIDATES:
        raise RamStudioError(f"the sweep has {total:,} candidates, more than {MAX_CANDIDATES:,}.",
                             "Use fewer values per parameter.")
    return out
