"""The README and docs/ stay readable and true to the code: a README that fits on a page, a configuration
page generated from the launcher's flag tables, links that lead somewhere, and the test command CI runs."""

import re
import subprocess
import sys
from pathlib import Path

from sgl_ess import config_doc

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 10 * 1024          # the size of the READMEs this audience reads (issue 33, item 6)

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_LINK = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


def relative_links(text: str) -> list[str]:
    """Targets of Markdown and HTML links outside code, minus web addresses and in-page anchors."""
    text = _INLINE_CODE.sub("", _FENCE.sub("", text))
    out = []
    for target in _MD_LINK.findall(text) + _HTML_LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_link_parser_finds_what_a_renderer_would_follow():
    text = ("see [a](docs/a.md#x) and ![img](docs/img/p.svg \"t\") and <img src=\"docs/img/q.png\"> "
            "but not [w](https://x.org), [s](#top) or `[c](code.md)`\n```\n[f](fenced.md)\n```\n")
    assert relative_links(text) == ["docs/a.md", "docs/img/p.svg", "docs/img/q.png"]


def test_readme_fits_on_a_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes; keep it <= {README_MAX_BYTES} "
                                      "and move details to a page under docs/")


def test_configuration_page_is_generated_from_the_flag_tables():
    page = DOCS / "configuration.md"
    assert page.read_text() == config_doc.render(), (
        "docs/configuration.md differs from the flag tables; regenerate it: "
        "python -m sgl_ess.config_doc > docs/configuration.md")


def test_configuration_page_names_every_flag():
    page = config_doc.render()
    from sgl_ess.config import FIELDS
    from sgl_ess.serving.ops_config import FLAG_FIELDS

    flags = ["--ess-" + f.name.replace("_", "-") for f in FIELDS] + ["--" + n.replace("_", "-") for n in FLAG_FIELDS]
    missing = [f for f in flags if f"`{f}`" not in page]
    assert not missing, missing


def test_the_generator_loads_neither_sglang_nor_torch():
    code = ("import sys; from sgl_ess import config_doc; config_doc.render(); "
            "print(sorted(m for m in ('sglang', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_relative_link_resolves_to_a_file_in_the_repo():
    broken = []
    for doc in doc_files():
        for target in relative_links(doc.read_text()):
            path = (doc.parent / target).resolve()
            if not target or ROOT not in path.parents or not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links that lead nowhere: " + ", ".join(broken)


def test_docs_pages_exist_and_are_linked_from_somewhere():
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    linked = set()
    for doc in doc_files():
        for target in relative_links(doc.read_text()):
            linked.add((doc.parent / target).resolve())
    orphans = [p.name for p in pages if p.resolve() not in linked]
    assert not orphans, f"docs pages no README or docs page links to: {orphans}"


def test_readme_names_the_test_command_ci_runs():
    text = README.read_text()
    assert "bash launch/test.sh" in text
    assert "bash launch/test.sh" in (ROOT / ".ci" / "run").read_text()
