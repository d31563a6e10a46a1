"""`ram-studio merge`'s method flags: every parameter of every method written as flags reads back the same."""
from __future__ import annotations


def test_param_flags_are_the_inverse_of_the_cli_parser():
    """Every parameter of every method written as flags (Param.flag) reads back as the same parameters."""
    from merging.methods import METHODS
    from ram_studio.cli import build_parser
    from ram_studio.commands.merge import param_flags, params_from_args

    for method in METHODS.values():
        params = {p.name: (True if p.kind is bool else p.choices[-1] if p.choices else
                           "code" if p.kind is str else p.kind(p.default or 1)) for p in method.params}
        args = build_parser().parse_args(["merge", "b", "a1", "a2", "--method", method.name, "--out", "o",
                                          *param_flags(params)])
        back = params_from_args(args)
        assert {k: str(v) for k, v in back.items()} == {k: str(v) for k, v in params.items()}, method.name
    assert param_flags({"dilute": False, "drop_rate": 0.3}) == ["--no-dilute", "--drop-rate", "0.3"]
