"""Device selection: `auto` is CUDA when present and CPU otherwise; asking for a missing GPU is a clear error."""
import pytest
import torch

from merging.common.device import pick_device, to_compute
from merging.common.errors import RamStudioError
from ram_studio.cli import main


def test_auto_falls_back_to_cpu_without_cuda():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == expected
    assert pick_device("cpu").type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_requested_without_gpu_is_a_clear_error(family, tmp_path, capsys):
    with pytest.raises(RamStudioError, match="no CUDA GPU"):
        pick_device("cuda")
    base, agents = family
    assert main(["merge", str(base), *map(str, agents), "--method", "ram", "--out", str(tmp_path / "o"),
                 "--device", "cuda", "--quiet"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_unknown_device():
    with pytest.raises(RamStudioError, match="unknown device"):
        pick_device("tpu")


def test_to_compute_converts_to_float32():
    x = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    assert to_compute(x, torch.device("cpu")).dtype == torch.float32
    out = torch.empty(2)
    assert to_compute(x, torch.device("cpu"), out=out) is out and out.tolist() == [1.5, -2.25]
