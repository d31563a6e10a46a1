"""The demo's mini Table 1 is a sweep definition: run through the sweep code it reproduces the committed
results/table1.csv, table1.md, table1_validation_search.csv and table1_comparisons.csv byte for byte (111
validation candidates — 36 of them Fisher merging's, after each agent's Fisher pass — the 8 chosen and the base and
agents on test)."""
from __future__ import annotations

from pathlib import Path

import pytest

from assets.demo import table1
from evaluation.store import ScoreStore

RESULTS = table1.DEMO_DIR / "results"
FILES = ("table1.csv", "table1_validation_search.csv", "table1.md", "table1_comparisons.csv")

pytestmark = pytest.mark.timeout(3600)  # 123 scorings of 900 examples and three Fisher passes of 2048 on a CPU


def test_the_sweep_reproduces_the_committed_table(tmp_path: Path):
    res = table1.sweep(table1.DEMO_DIR / "models", store=ScoreStore(tmp_path / "store"))
    assert len(res.candidates("validation")) == 111 and len(res.candidates("test")) == 8
    assert len(res.references()) == 4
    table1.save(*table1.tables(res), tmp_path / "out", "demo", table1.comparisons(res), res.notes)
    differ = [f for f in FILES if (tmp_path / "out" / f).read_bytes() != (RESULTS / f).read_bytes()]
    assert not differ, f"the sweep's {differ} differ from the committed results"
