"""Mechanism exploration for the demo: which training choices make RL task vectors sparse and
heterogeneous, and what each costs in learning.

Every configuration ("trio") is a base architecture (tokenizer, activation, width, tied or untied
embeddings; warmed up once and cached) plus one RL recipe per agent. For each trio the three agents
are trained with the same GRPO code as the build, stored in bf16, scored greedily on the
**validation** split of their own task, and analysed with the library at ε = 1e-5 (density,
unique share of changed, ρ_t) next to what independent random masks of the same densities would
give. Nothing is masked, frozen or edited; every trio that was run is a row of the table.

    python -m demo.explore list
    python -m demo.explore base NAME          # warm up one base (cached under --work)
    python -m demo.explore trio ID [ID ...]   # train + analyse trios, update the CSVs
    python -m demo.explore table              # print the markdown table of mechanisms.csv

The package: the bases, recipes and trios tried (`configs.py`), training and scoring them (`runs.py`), the
brute-force pair agreement (`agreement.py`), the reachability and warm-up probes (`probes.py`), the CSV
tables (`tables.py`) and the command line (`__main__.py`).

Outputs: `results/mechanisms.csv` (one row per trio × agent), `results/mechanisms_modules.csv`
(density and unique share per module kind), `results/mechanisms_bases.csv` (each base's
validation accuracy and warm-up time). Checkpoints stay in the scratch folder `--work`
(default `.explore/` at the repository root, not committed).
"""
