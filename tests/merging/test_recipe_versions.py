"""Recipes written before the package restructuring still run, and give the same bytes.

`tests/fixtures/recipes-v0.2/*.json` are the `ram_recipe.json` files that RAM Studio 0.2.0 wrote
before merging/ became sub-packages for merges of the bundled demo; SHAS are the SHA-256 of the
`model.safetensors` each of those merges wrote then. Methods with passes (TIES), seeded masks (DARE),
global ρ (RAM+) and the Fig. 3 method are covered.
"""
from __future__ import annotations

import hashlib

import pytest

from ram_studio.cli import main
from tests.paths import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "recipes-v0.2"
SHAS = {
    "ram_plus": "bb90320ede1551fa733421b34c6d4ea61ca6a65fad965356e0c557f4921449c7",
    "ties": "c8aa3a39700a19a775632e56926e63b134740d280e17d56a30ebac62daf75bb0",
    "dare_ties": "91d18f33ba23bda87c81aa7a6ba0faec1f63b75c346cfb10abe3ae51639be126",
    "unique_only": "307d655c3e527c1258b35b4d323c47e463d0f3431f025948a167615ac4421e29",
}


@pytest.mark.parametrize("name", sorted(SHAS))
def test_a_recipe_written_before_the_restructuring_gives_the_same_model(name, tmp_path):
    out = tmp_path / name
    assert main(["run", str(FIXTURES / f"{name}.json"), "--out", str(out), "--quiet"]) == 0
    assert hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest() == SHAS[name]


def test_every_fixture_is_checked():
    assert {p.stem for p in FIXTURES.glob("*.json")} == set(SHAS)
