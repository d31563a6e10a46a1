"""RAM Studio's merging library, in the order a merge runs (each stage imports only the ones below it):

merge.py      the orchestrator: a MergeSpec in, a checked Hugging Face folder out
interop/      mergekit configs: read theirs, write ours as theirs
engine/       the streaming merge loop, its paths, one tensor's passes and merge, the counting pass for global ρ
passes.py     chunk iteration, progress and finiteness checks (shared with the counting pass and the analysis)
writing/      shards, side files, the model card, output checks, placement, the atomic commit, the Hub upload
recipe.py     MergeSpec and ram_recipe.json
reading/      model references, the Hub download, model folders, safetensors headers, checkpoints, chunked reads
methods/      the changed/shared/unique rule (regions.py) and one file per merge method
kernels/      fused numba CPU kernels, bit for bit the methods' torch functions
common/       errors, escaping, bounded parsers, dtypes, units, the compute device, OpenMP's wait policy, the version
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """`merging.__version__`: the installed RAM Studio's version (declared once, as `ram_studio.__version__`)."""
    if name == "__version__":
        from merging.common.versions import ram_studio_version

        return ram_studio_version()
    raise AttributeError(f"module 'merging' has no attribute {name!r}")
