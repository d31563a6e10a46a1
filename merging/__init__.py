"""RAM Studio's merging library, in the order a merge runs (each stage imports only the ones below it):

merge.py      the orchestrator: a MergeSpec in, a checked Hugging Face folder out
interop/      mergekit configs (read theirs, write ours as theirs), the Hub upload
engine/       the streaming merge loop, its paths, one tensor's passes and merge, the counting pass for global ρ
passes.py     chunk iteration, progress and finiteness checks (shared with the counting pass and the analysis)
writing/      shards, side files, the model card, output checks, placement and the atomic commit
recipe.py     MergeSpec and ram_recipe.json
reading/      model references, the Hub download, model folders, safetensors headers, checkpoints, chunked reads
methods/      the changed/shared/unique rule (regions.py) and one file per merge method
kernels/      fused numba CPU kernels, bit for bit the methods' torch functions
common/       errors, escaping, bounded parsers, dtypes, units, the compute device
"""

import os

__version__ = "0.2.0"

# OpenMP threads (numba's parallel kernels, torch's intra-op pool) sleep instead of spinning between
# parallel regions: spinning takes the cores the reader, writer and compute threads need (measured: a
# 2-core analysis used 45 s of CPU instead of 16). Set before torch or numba load their OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
