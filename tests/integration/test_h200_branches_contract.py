"""Issue 32, "what to build" 1: every place SGLang's DSA attention, model, memory and scheduler code
branches on the device is listed, with the answer an H200 (FP8 KV, FlashMLA) gives and whether the
GPU fake (tests/gpu_fake_site, tests/integration/_cuda_fake.py) takes the same branch, in the table
of patches/README.md ("Device branches on the DSA path"). This test reads the installed SGLang's
source and pins that table: a device query that appears, disappears, moves to another line or
changes its text in these files fails it, naming the rows, so an SGLang upgrade is re-read branch by
branch before the fake is trusted again."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TABLE_BEGIN, TABLE_END = "<!-- h200-branches:begin -->", "<!-- h200-branches:end -->"

# SGLang's files along the DSA path (relative to sglang/srt); layers/attention/dsa/ whole
FILES = ("layers/attention/dsa_backend.py", "layers/attention/dsa/*.py", "models/deepseek_v2.py",
         "models/deepseek_common/attention_backend_handler.py", "models/deepseek_common/utils.py",
         "model_executor/model_runner.py", "mem_cache/memory_pool.py", "mem_cache/kv_cache_configurator.py",
         "managers/scheduler.py", "server_args.py")
# the device queries: sm / capability, CUDA itself, Hopper / Blackwell, FP8 flavour, HiSparse, graph context
DEVICE_QUERY = re.compile(
    r"get_device_sm|get_device_capability|device_sm_major|\bis_cuda\(\)|\b_is_cuda\b|is_sm90_supported"
    r"|is_sm100_supported|is_blackwell|is_hopper|hisparse_coordinator\s+is|enable_hisparse|is_fp8_fnuz"
    r"|is_in_breakable_cuda_graph\(|is_in_tc_piecewise_cuda_graph\(|current_platform\.is_cpu\(\)")


def device_branches(srt: pathlib.Path) -> list[tuple[str, str]]:
    """(file:line, stripped source line) of every device query in FILES, imports and comments left out."""
    out = []
    for pattern in FILES:
        for path in sorted(srt.glob(pattern)):
            rel = path.relative_to(srt).as_posix()
            for i, line in enumerate(path.read_text().splitlines(), 1):
                text = line.strip()
                if DEVICE_QUERY.search(text) and not text.startswith(("#", "from ", "import ")):
                    out.append((f"{rel}:{i}", text))
    return out


def table_rows() -> list[tuple[str, str]]:
    doc = (REPO / "patches" / "README.md").read_text()
    assert TABLE_BEGIN in doc and TABLE_END in doc, "patches/README.md lost its device-branch table markers"
    body = doc.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue                      # header, separator, prose
        rows.append((cells[0].strip("`"), cells[1].strip("`")))
        assert cells[2] and cells[3], f"row {cells[0]}: the H200 answer and the fake's answer must be filled in"
    return rows


def test_every_device_branch_on_the_dsa_path_is_in_the_table():
    sglang = pytest.importorskip("sglang")
    srt = pathlib.Path(sglang.__file__).parent / "srt"
    found, listed = device_branches(srt), table_rows()
    assert len(set(listed)) == len(listed), "a row appears twice in the table"
    new = [f"{loc}  {text}" for loc, text in found if (loc, text) not in set(listed)]
    gone = [f"{loc}  {text}" for loc, text in listed if (loc, text) not in set(found)]
    assert not new and not gone, (
        "SGLang's device branches on the DSA path changed; read each one, decide what an H200 answers and "
        "whether the GPU fake takes it, and update patches/README.md ('Device branches on the DSA path').\n"
        "In SGLang, not in the table:\n  " + "\n  ".join(new) + "\nIn the table, not in SGLang:\n  " + "\n  ".join(gone))
