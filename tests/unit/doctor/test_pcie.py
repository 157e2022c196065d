"""PCIe link check on a fake sysfs tree: full speed is ok, a downgraded link fails with the fix,
non-NVIDIA and non-display devices are ignored, idle speed drops warn unless --under-load."""
import json

from sgl_ess.doctor import cli
from sgl_ess.doctor.pcie import check_pcie
from sgl_ess.doctor.sysfs import nvidia_gpus, parse_cpulist, parse_speed_gts
from tests.unit.doctor.fake_tree import pci_device


def test_full_speed_ok_and_downgraded_fails_with_fix(tmp_path):
    pci_device(tmp_path, "0000:17:00.0")
    pci_device(tmp_path, "0000:65:00.0", speed_now="8.0 GT/s PCIe", width_now=8)
    pci_device(tmp_path, "0000:00:1f.0", vendor="0x8086", cls="0x030000", speed_now="2.5 GT/s PCIe", width_now=1)
    gpus = nvidia_gpus(str(tmp_path))
    assert [g.bdf for g in gpus] == ["0000:17:00.0", "0000:65:00.0"]      # the Intel VGA device is ignored
    ok, bad = check_pcie(gpus, str(tmp_path))
    assert ok.status == "ok" and "0000:17:00.0" in ok.detail and "x16" in ok.detail
    assert bad.status == "fail" and "0000:65:00.0" in bad.detail
    assert "width x8 of x16" in bad.detail and "speed 8 of 16 GT/s" in bad.detail
    for words in ("reseat", "BIOS", "ASPM", "re-check under load"):
        assert words in bad.fix


def test_nvidia_non_display_device_ignored(tmp_path):
    pci_device(tmp_path, "0000:05:00.0", cls="0x068000", width_now=1)    # an NVIDIA bridge (e.g. NVSwitch side)
    (finding,) = check_pcie(nvidia_gpus(str(tmp_path)), str(tmp_path))
    assert finding.status == "skip" and finding.detail.startswith("no GPU: skipped (")


def test_speed_drop_alone_warns_idle_and_fails_under_load(tmp_path):
    pci_device(tmp_path, "0000:17:00.0", speed_now="2.5 GT/s PCIe", speed_max="32.0 GT/s PCIe")
    gpus = nvidia_gpus(str(tmp_path))
    (idle,) = check_pcie(gpus, str(tmp_path))
    assert idle.status == "warn" and "re-check under load" in idle.detail
    (busy,) = check_pcie(gpus, str(tmp_path), under_load=True)
    assert busy.status == "fail"


def test_unreported_link_is_info(tmp_path):
    pci_device(tmp_path, "0000:17:00.0", speed_now="Unknown", width_now=None)
    (finding,) = check_pcie(nvidia_gpus(str(tmp_path)), str(tmp_path))
    assert finding.status == "info"


def test_parsers():
    assert parse_speed_gts("16.0 GT/s PCIe") == 16.0 and parse_speed_gts("8 GT/s") == 8.0
    assert parse_speed_gts("Unknown") is None and parse_speed_gts(None) is None
    assert parse_cpulist("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11} and parse_cpulist("") == set()
    assert parse_cpulist("x") is None


def test_cli_exits_1_on_a_fail(tmp_path, capsys):
    pci_device(tmp_path, "0000:65:00.0", speed_now="8.0 GT/s PCIe", width_now=8)
    rc = cli.main(["--json", "--no-probe", "--sysfs-root", str(tmp_path)])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [r["status"] for r in rows if r["check"] == "pcie"] == ["fail"]
