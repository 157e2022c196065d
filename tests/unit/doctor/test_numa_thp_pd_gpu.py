"""NUMA placement, THP mode, PD packages and the GPU probe's skip, on fake inputs."""
from sgl_ess.doctor.gpu import check_gpu_probe, gpu_absent_reason
from sgl_ess.doctor.numa import check_numa, parse_numa_maps_policy
from sgl_ess.doctor.pd_packages import check_pd
from sgl_ess.doctor.sysfs import nvidia_gpus
from sgl_ess.doctor.thp import check_thp, selected
from tests.unit.doctor.fake_tree import numa_nodes, pci_device, write

STATUS_ALL = "Mems_allowed_list:\t0-1\n"
DEFAULT_MAP = "55d0c8a00000 default file=/usr/bin/python3 mapped=2 N0=2"


def _numa(tmp_path, status=STATUS_ALL, first_line=DEFAULT_MAP, which=lambda n: None, has=lambda n: False, env=None):
    numa_nodes(tmp_path, "0-1")
    pci_device(tmp_path, "0000:c1:00.0", numa_node=1)
    return check_numa(nvidia_gpus(str(tmp_path)), str(tmp_path), status, first_line, env or {}, which, has)


def test_gpu_node_outside_cpuset_warns(tmp_path):
    (f,) = _numa(tmp_path, status="Mems_allowed_list:\t0\n")
    assert f.status == "warn" and "node 1" in f.detail and "cpuset" in f.detail


def test_policy_bound_elsewhere_warns(tmp_path):
    (f,) = _numa(tmp_path, first_line="55d0c8a00000 bind:0 file=/usr/bin/python3")
    assert f.status == "warn" and "--membind=1" in f.fix


def test_nothing_binds_warns_unless_sglang_will(tmp_path):
    (f,) = _numa(tmp_path)
    assert f.status == "warn" and "numactl" in f.fix and "numactl is not on PATH" in f.detail
    (ok,) = _numa(tmp_path, which=lambda n: "/usr/bin/numactl", has=lambda n: True)
    assert ok.status == "ok" and "SGLang binds" in ok.detail
    (off,) = _numa(tmp_path, which=lambda n: "/usr/bin/numactl", has=lambda n: True,
                   env={"SGLANG_AUTO_NUMA_BIND": "0"})
    assert off.status == "warn"


def test_one_node_ok_and_no_gpu_skips(tmp_path):
    numa_nodes(tmp_path, "0")
    assert check_numa([], str(tmp_path), STATUS_ALL, DEFAULT_MAP, {}, lambda n: None, lambda n: False)[0].status == "ok"
    numa_nodes(tmp_path, "0-1")
    (f,) = check_numa([], str(tmp_path), STATUS_ALL, DEFAULT_MAP, {}, lambda n: None, lambda n: False)
    assert f.status == "skip" and f.detail.startswith("no GPU")


def test_numa_maps_policy_parse():
    assert parse_numa_maps_policy("7f00 bind:0-1 anon=3").nodes == {0, 1}
    p = parse_numa_maps_policy("7f00 prefer (many):1 anon=3")
    assert p.mode == "prefer (many)" and p.nodes == {1}
    assert parse_numa_maps_policy("7f00 bind=static:1 anon=3").mode == "bind"
    assert parse_numa_maps_policy(DEFAULT_MAP).nodes is None


def test_thp_is_info_and_names_shmem(tmp_path):
    base = tmp_path / "kernel" / "mm" / "transparent_hugepage"
    write(base / "enabled", "always [madvise] never")
    write(base / "shmem_enabled", "always within_size advise [never] deny force")
    f = check_thp(str(tmp_path))
    assert f.status == "info" and "4 KiB pages" in f.detail and "[never]" in f.detail
    assert selected("always [madvise] never") == "madvise" and selected(None) is None


def test_pd_packages_are_info_either_way(tmp_path):
    absent = check_pd(str(tmp_path), has_module=lambda n: False, can_load=lambda s: False, which=lambda n: None)
    present = check_pd(str(tmp_path), has_module=lambda n: True, can_load=lambda s: True, which=lambda n: "/bin/smg")
    assert [f.check for f in absent] == ["pd-mooncake", "pd-ibverbs", "pd-router"]
    assert {f.status for f in absent + present} == {"info"}
    assert "not installed" in absent[0].detail and "loads" in present[1].detail


def test_gpu_probe_skips_without_device_node(tmp_path):
    reason = gpu_absent_reason(str(tmp_path))
    assert reason and "nvidia0" in reason
    f = check_gpu_probe(reason, True, 5.0, str(tmp_path))
    assert f.status == "skip" and f.detail.startswith("no GPU: skipped (") and "not yet run on a GPU" in f.detail
