"""docs/models.md is generated from the model table (sgl_ess/models/table_doc.py) and says what the
table says: every family, served or refused as the table decides."""

import subprocess
import sys
from pathlib import Path

from sgl_ess.models import families, table_doc

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "models.md"


def test_models_page_is_generated_from_the_table():
    assert PAGE.read_text() == table_doc.render(), (
        "docs/models.md differs from sgl_ess/models/families.py; regenerate it: "
        "python -m sgl_ess.models.table_doc > docs/models.md")


def test_every_family_is_on_the_page_in_its_section():
    page = table_doc.render()
    served, refused = page.split("## Refused")
    for fam in families.FAMILIES:
        row = f"| {fam.name} |"
        assert row in (served if fam.supported else refused), fam.name
        assert row not in (refused if fam.supported else served), fam.name
    for arch in families.OTHER_SPARSE:
        assert f"`{arch}`" in refused


def test_the_generator_loads_neither_sglang_nor_torch():
    code = ("import sys; from sgl_ess.models import table_doc; table_doc.render(); "
            "print(sorted(m for m in ('sglang', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
