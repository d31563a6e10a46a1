"""`ram_studio.merge`: merge a base and its agents with a method or a preset into a Hugging Face folder — the CLI's
`ram-studio merge` as a function (the same spec, placement rules, cached counts, recipe and model card)."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ram_studio.api.display import Shown
from ram_studio.api.options import model_refs, parse
from ram_studio.api.progress import ProgressArg, engine, sink
from ram_studio.api.running import prefetch


def merge(base: str | os.PathLike, agents: Sequence[str | os.PathLike], *, out: str | os.PathLike,
          method: str | None = None, preset: str | None = None, rescale_factor: float | None = None,
          device: str = "auto", shard_size: str = "5GB", out_dtype: str | None = None, on_mismatch: str = "error",
          vocab: str = "base", untie: bool = False, overwrite: bool = False, allow_noop: bool = False,
          fisher_tasks: Sequence[str] | str | None = None, fisher_lm_eval: Sequence[str] | str | None = None,
          include_path: str | os.PathLike | None = None, suite: str | None = None, progress: ProgressArg = True,
          **params: Any) -> "Merged":
    """Merge `agents` into `base` as `ram-studio merge` does (keywords are its flags): `method` (see
    `ram-studio methods`) or a `preset`, the method's parameters by name (eps=, r=, alpha=, rho_scope=,
    count_tied_twice=, eps_steps=, density=, drop_rate=, seed=, agent=, dilute=, fisher_examples=, fisher_rule=,
    fisher_floor=, and λ as lambda_= or **{"lambda": …}; for method="fisher" the Fisher data is fisher_tasks= (demo
    tasks, one per agent) or fisher_lm_eval= with include_path=, and suite=), written atomically into `out`. A
    parameter the method does not take is an error, as in the CLI. `vocab="union"` keeps the tokens agents add to the
    base's tokenizer, `untie=True` writes an untied head for a tied base (the CLI's --vocab and --untie). Returns a
    Merged (the folder, its files, ρ_t and λ_t, the recipe); bad input raises RamStudioError and writes nothing; a
    lineage warning (an agent that may not descend from the base) is a Python warning."""
    from ram_studio.commands.merge import cached_statistics, side_for, spec_from_args
    from ram_studio.console import stop_on_signal

    options = dict(out=out, method=method, preset=preset, rescale_factor=rescale_factor, device=device,
                   shard_size=shard_size, out_dtype=out_dtype, on_mismatch=on_mismatch, vocab=vocab, untie=untie,
                   overwrite=overwrite, allow_noop=allow_noop, fisher_tasks=fisher_tasks, fisher_lm_eval=fisher_lm_eval,
                   include_path=include_path, suite=suite, **params)
    args = parse("merge", [*model_refs(base, "base"), *model_refs(agents, "agents")], options, method_flags=True)
    spec = spec_from_args(args)
    provenance = None
    if args.preset:
        from merging.presets import provenance as preset_provenance

        provenance = preset_provenance(args.preset, spec.method, spec.params)
    to = sink(progress)
    from merging.merge import merge_to_folder

    with stop_on_signal() as stop:
        prefetch([spec.base, *spec.agents], to, stop)
        side = side_for(spec, args, stop, quiet=True)  # each agent's Fisher, for method="fisher"
        counts, overlap = cached_statistics(spec)
        result = merge_to_folder(spec, overwrite=args.overwrite, allow_noop=args.allow_noop, counts=counts, side=side,
                                 provenance=provenance, overlap=overlap,
                                 warn=lambda message: warnings.warn(message, stacklevel=3),
                                 progress=engine(to, "merge"), count_progress=engine(to, "count"), cancel=stop)
    for note in result.notes:
        if note.startswith("WARNING"):
            warnings.warn(note, stacklevel=2)
    return Merged(result, spec.method, [spec.base, *spec.agents])


@dataclass(repr=False)
class Merged(Shown):
    """A merged model folder: `out` (load it with transformers' from_pretrained, or score it with
    ram_studio.evaluate), its files, the recipe that reproduces it, and for RAM+ each agent's ρ_t and λ_t."""

    result: Any  # merging.merge.MergeResult
    method: str
    models: list[str]

    @property
    def out(self) -> Path:
        return Path(self.result.out)

    @property
    def files(self) -> list[Path]:
        return list(self.result.files)

    @property
    def seconds(self) -> float:
        return self.result.seconds

    @property
    def notes(self) -> list[str]:
        """What the model card notes: deviations, mismatch policy losses, warnings."""
        return list(self.result.notes)

    @property
    def recipe(self) -> dict:
        """The ram_recipe.json the merge wrote (`ram-studio run` reproduces the merge from it)."""
        import json

        return json.loads((self.out / "ram_recipe.json").read_text())

    @property
    def params(self) -> dict:
        """Every parameter of the method, defaults filled in (from the recipe)."""
        return dict(self.recipe.get("spec", {}).get("params", {}))

    def lambdas(self):
        """Per agent: shared and unique elements, ρ_t and λ_t (RAM+ methods; an empty frame otherwise)."""
        import pandas as pd

        return pd.DataFrame(self.result.lambdas or [], columns=None if self.result.lambdas else
                            ["agent", "shared", "unique", "rho", "lambda"])

    def _title(self) -> str:
        return f"Merged {len(self.models) - 1} agents with {self.method} into {self.out}"

    def _facts(self) -> dict[str, Any]:
        from merging.common.units import format_bytes

        return {"files": len(self.files), "size": format_bytes(self.result.bytes_written),
                "time": f"{self.seconds:.1f} s"}

    def _parts(self) -> list[tuple[str, Any]]:
        import pandas as pd

        parts: list[tuple[str, Any]] = [("table", pd.DataFrame([{"parameter": k, "value": v}
                                                                for k, v in self.params.items()]))]
        if self.result.lambdas:
            parts.append(("table", self.lambdas()))
        parts += [("text", n) for n in self.notes]
        return parts
