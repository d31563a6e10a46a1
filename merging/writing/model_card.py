"""The merged model's README.md: Hub metadata through huggingface_hub's ModelCardData (the Hub's own schema),
then method, parameters, ρ_t/λ_t and recipe as Markdown in which every file-derived text is escaped."""
from __future__ import annotations

import math
from typing import Any

from merging.common.errors import RamStudioError
from merging.common.escaping import markdown_code, markdown_fence, markdown_text
from merging.methods import get_method
from merging.recipe import MergeSpec

# The relations the Hub's model tree knows (https://huggingface.co/docs/hub/model-cards#specifying-a-base-model).
BASE_MODEL_RELATIONS = ("adapter", "merge", "quantized", "finetune")


def hub_ids(refs: list[str]) -> list[str]:
    """The Hugging Face repo ids among model references (`org/name`, revision dropped), in order, once each.

    Only these belong in the card's `base_model:` front matter: a local folder or a `demo:` model is not
    a Hub id (the Hub would link it to a wrong or missing repo)."""
    from merging.reading.refs import parse_ref

    out: list[str] = []
    for ref in refs:
        try:
            r = parse_ref(ref)
        except RamStudioError:
            continue
        if r.kind == "hub" and r.repo_id and r.repo_id not in out:
            out.append(r.repo_id)
    return out


# transformers' auto-class tables (model type → class name), in the order a class found in several decides its
# task: a vision-language class is also a causal LM in some tables, and image-text-to-text is what it does.
PIPELINE_TABLES = (("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "image-text-to-text"),
                   ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "automatic-speech-recognition"),
                   ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "text-generation"),
                   ("MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES", "any-to-any"),
                   ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "text2text-generation"),
                   ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "text-classification"),
                   ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classification"))


def pipeline_tag(config: dict | None) -> str | None:
    """The Hub task of the base's architecture (`architectures[0]` in its config), from transformers' auto-class
    tables; an audio-and-text model is audio-text-to-text; None when the architecture is not in them."""
    archs = (config or {}).get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None:
        return None
    from transformers.models.auto import modeling_auto

    for table, tag in PIPELINE_TABLES:
        names = getattr(modeling_auto, table, {})
        if any(arch == v or (isinstance(v, tuple) and arch in v) for v in names.values()):
            if tag == "any-to-any" and "audio_config" in (config or {}) and "vision_config" not in (config or {}):
                return "audio-text-to-text"
            return tag
    return None


def card_data(spec: MergeSpec, config: dict | None = None):
    """The card's metadata: the Hub parents (`base_model`, `base_model_relation: merge`) when there are any,
    the library that loads it, the task (from the base's architecture; text-generation without a config) and
    the tags."""
    from huggingface_hub import ModelCardData

    hub = hub_ids([spec.base, *spec.agents])
    tag = pipeline_tag(config) if config is not None else "text-generation"
    return ModelCardData(base_model=hub or None, base_model_relation="merge" if hub else None,
                         library_name="transformers", pipeline_tag=tag, tags=["merge", "ram", spec.method])


def check_card_metadata(text: str) -> None:
    """Load a card the way the Hub client does (`ModelCard`, metadata errors not ignored) and check the fields
    the Hub's model tree reads; raises ValueError naming the field. (The Hub's own YAML validator is a web
    service: `ModelCard.validate` needs the network.)"""
    from huggingface_hub import ModelCard
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    data = ModelCard(text, ignore_metadata_errors=False).data
    parents = data.get("base_model")
    for repo in [parents] if isinstance(parents, str) else parents or []:
        try:
            validate_repo_id(repo)
        except HFValidationError as exc:
            raise ValueError(f"base_model {repo!r} is not a Hub repo id: {exc}") from None
    relation = data.get("base_model_relation")
    if relation is not None and (relation not in BASE_MODEL_RELATIONS or not parents):
        raise ValueError(f"base_model_relation {relation!r} needs a base_model and one of {BASE_MODEL_RELATIONS}")
    tags = data.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise ValueError("tags must be a list of strings")
    if not isinstance(data.get("library_name", ""), str):
        raise ValueError("library_name must be a string")


def render_card(spec: MergeSpec, agent_labels: list[str], lambdas: list[dict[str, Any]] | None,
                recipe_text: str, notes: list[str], mergekit: tuple[str | None, str] | None = None,
                statistics: list[str] | None = None, base_config: dict | None = None) -> str:
    """Markdown model card; `lambdas` rows hold agent, shared, unique, rho, lambda when RAM+ used them;
    `statistics` are Markdown lines of the inputs' shared-region diagnostics (made by analysis.agreement,
    already escaped). References, labels, values and notes come from files or users: escaped here."""
    from huggingface_hub import ModelCard

    method = get_method(spec.method)
    lines = ["", f"# Merged model ({markdown_text(spec.method)})", "",
             f"Made with RAM Studio from base {markdown_code(spec.base)} and {len(spec.agents)} agents:", ""]
    lines += [f"- {markdown_code(ref)} ({markdown_text(label)})" for ref, label in zip(spec.agents, agent_labels)]
    lines += ["", "## Method", "", method.summary, "", "| parameter | value |", "|---|---|"]
    lines += [f"| {markdown_text(k)} | {markdown_text(v)} |" for k, v in spec.params.items()]
    lines += [f"| output dtype | {markdown_text(spec.out_dtype or 'same as base')} |", ""]
    if lambdas:
        lines += ["## Overlap-unique ratio ρ_t and rescale λ_t", "",
                  "| agent | shared | unique | ρ_t | λ_t |", "|---|---:|---:|---:|---:|"]
        for row in lambdas:
            rho = row["rho"]
            rho_s = "∞" if rho is None or (isinstance(rho, float) and math.isinf(rho)) else f"{rho:.4f}"
            lines.append(f"| {markdown_text(row['agent'])} | {row['shared']:,} | {row['unique']:,} | {rho_s} | "
                         f"{row['lambda']:.4f} |")
        lines.append("")
    if statistics:
        lines += [*statistics, ""] if statistics[-1] else statistics
    if notes:
        lines += ["## Notes", ""] + [f"- {markdown_text(n)}" for n in notes] + [""]
    if mergekit is not None:
        config, why = mergekit
        if config is not None:
            lines += ["## mergekit", "", "The same merge as a mergekit config (`mergekit.yaml` in this folder):", "",
                      *markdown_fence(config, "yaml"), ""] + ([f"Note: {markdown_text(why)}.", ""] if why else [])
        else:
            head, _, nearest = why.partition("\n")
            lines += ["## mergekit", "", f"No mergekit config computes this merge: {markdown_text(head)}", ""]
            if nearest.strip():
                lines += [*markdown_fence(nearest, "yaml"), ""]
    loader, reader = (("AutoModelForImageTextToText", "AutoProcessor")
                      if base_config is not None and pipeline_tag(base_config) == "image-text-to-text"
                      else ("AutoModelForCausalLM", "AutoTokenizer"))
    lines += ["## Use", "", "```python", f"from transformers import {loader}, {reader}",
              f'model = {loader}.from_pretrained("PATH_TO_THIS_FOLDER")',
              f'{"processor" if reader == "AutoProcessor" else "tokenizer"} = {reader}.from_pretrained('
              '"PATH_TO_THIS_FOLDER")', "```", "",
              "## Recipe", "", "Reproduce with `ram-studio run ram_recipe.json` (RAM Studio):", "",
              *markdown_fence(recipe_text, "json"), ""]
    # Built from the text, not from a template: ModelCard.from_template runs Jinja over its template, and this
    # body holds file-derived text (a name with `{{ … }}` must stay text).
    return str(ModelCard(f"---\n{card_data(spec, base_config).to_yaml()}\n---\n" + "\n".join(lines)))
