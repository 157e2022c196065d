"""The simulator README's generated blocks are current (docs that drift are defects too)."""
from pathlib import Path

from sgl_ess.sim.cli import main

README = Path(__file__).resolve().parents[3] / "sgl_ess" / "sim" / "README.md"


def _block(name: str) -> str:
    text = README.read_text()
    start, end = f"<!-- {name}:begin -->\n", f"\n<!-- {name}:end -->"
    return text[text.index(start) + len(start):text.index(end)]


def test_constants_table_is_current(capsys):
    assert main(["constants"]) == 0
    assert _block("constants") == capsys.readouterr().out.rstrip("\n")


def test_validation_table_is_current(capsys):
    assert main(["validate"]) == 0
    assert _block("validate") == "```\n" + capsys.readouterr().out.rstrip("\n") + "\n```"


def test_every_command_is_documented():
    text = README.read_text()
    for cmd in ("validate", "plan", "run", "constants", "fit", "profile", "sweep", "sensitivity", "bench ops"):
        assert f"python -m sgl_ess.sim {cmd}" in text or f"python -m {cmd}" in text, cmd
