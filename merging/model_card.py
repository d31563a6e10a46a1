"""The merged model's README.md: YAML front matter for the Hub, then method, parameters, ρ_t/λ_t and recipe."""
from __future__ import annotations

import json
import math
from typing import Any

from .errors import RamStudioError
from .methods import get_method
from .recipe import MergeSpec


def _yaml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML scalar


def hub_ids(refs: list[str]) -> list[str]:
    """The Hugging Face repo ids among model references (`org/name`, revision dropped), in order, once each.

    Only these belong in the card's `base_model:` front matter: a local folder or a `demo:` model is not
    a Hub id (the Hub would link it to a wrong or missing repo)."""
    from .refs import parse_ref

    out: list[str] = []
    for ref in refs:
        try:
            r = parse_ref(ref)
        except RamStudioError:
            continue
        if r.kind == "hub" and r.repo_id and r.repo_id not in out:
            out.append(r.repo_id)
    return out


def render_card(spec: MergeSpec, agent_labels: list[str], lambdas: list[dict[str, Any]] | None,
                recipe_text: str, notes: list[str], mergekit: tuple[str | None, str] | None = None,
                statistics: list[str] | None = None) -> str:
    """Markdown model card; `lambdas` rows hold agent, shared, unique, rho, lambda when RAM+ used them;
    `statistics` are Markdown lines of the inputs' shared-region diagnostics (made by analysis.agreement)."""
    method = get_method(spec.method)
    lines = ["---"]
    hub = hub_ids([spec.base, *spec.agents])
    if hub:  # the Hub's merge relation needs the parents it links to
        lines += ["base_model:", *[f"- {_yaml_str(m)}" for m in hub], "base_model_relation: merge"]
    lines += ["library_name: transformers", "tags:", "- merge", "- ram",
              f"- {spec.method}", "---", "", f"# Merged model ({spec.method})", "",
              f"Made with RAM Studio from base `{spec.base}` and {len(spec.agents)} agents:", ""]
    lines += [f"- `{ref}` ({label})" for ref, label in zip(spec.agents, agent_labels)]
    lines += ["", "## Method", "", method.summary, "", "| parameter | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in spec.params.items()]
    lines += [f"| output dtype | {spec.out_dtype or 'same as base'} |", ""]
    if lambdas:
        lines += ["## Overlap-unique ratio ρ_t and rescale λ_t", "",
                  "| agent | shared | unique | ρ_t | λ_t |", "|---|---:|---:|---:|---:|"]
        for row in lambdas:
            rho = row["rho"]
            rho_s = "∞" if rho is None or (isinstance(rho, float) and math.isinf(rho)) else f"{rho:.4f}"
            lines.append(f"| {row['agent']} | {row['shared']:,} | {row['unique']:,} | {rho_s} | {row['lambda']:.4f} |")
        lines.append("")
    if statistics:
        lines += [*statistics, ""] if statistics[-1] else statistics
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    if mergekit is not None:
        config, why = mergekit
        if config is not None:
            lines += ["## mergekit", "", "The same merge as a mergekit config (`mergekit.yaml` in this folder):", "",
                      "```yaml", config.strip(), "```", ""] + ([f"Note: {why}.", ""] if why else [])
        else:
            head, _, nearest = why.partition("\n")
            lines += ["## mergekit", "", f"No mergekit config computes this merge: {head}", ""]
            if nearest.strip():
                lines += ["```yaml", nearest.strip(), "```", ""]
    lines += ["## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              'model = AutoModelForCausalLM.from_pretrained("PATH_TO_THIS_FOLDER")',
              'tokenizer = AutoTokenizer.from_pretrained("PATH_TO_THIS_FOLDER")', "```", "",
              "## Recipe", "", "Reproduce with `ram-studio run ram_recipe.json` (RAM Studio):", "", "```json",
              recipe_text.strip(), "```", ""]
    return "\n".join(lines)
