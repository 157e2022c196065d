"""python -m sgl_ess.launch_pd: the command lines it builds (one port range, the same server flags on
every node, ESS off where asked) and the inputs it refuses, with the exit code and the flag to change."""
import socket
import subprocess
import sys

import pytest

from sgl_ess.serving import exit_codes, pd_cluster


def _args(**kw):
    ns = pd_cluster.parser().parse_args([])
    ns.prefill_ess = True
    ns.log_dir = "/tmp/pd_unit_logs"
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_one_port_range_lays_out_every_process():
    procs = pd_cluster.build(_args(ports="31000-31999", decode_nodes=2, plain_decode_nodes=1), ["--x", "1"], "smg")
    names = [p.name for p in procs]
    assert names == ["prefill", "decode0", "decode1", "decode2_plain", "router"]
    pre, d0, d1, plain, router = procs
    assert _flag(pre.cmd, "--port") == "31002" and _flag(pre.cmd, "--disaggregation-bootstrap-port") == "31003"
    assert [_flag(p.cmd, "--port") for p in (d0, d1, plain)] == ["31004", "31005", "31006"]
    assert all(p.cmd[-2:] == ["--x", "1"] for p in procs[:-1])        # the same server flags everywhere
    assert "--ess-enabled" not in d0.cmd and "--ess-enabled" not in pre.cmd
    assert _flag(plain.cmd, "--ess-enabled") == "false"
    assert pre.env == {"MC_MIN_RPC_PORT": "31100", "MC_MAX_RPC_PORT": "31999"}
    assert _flag(router.cmd, "--port") == "31000" and _flag(router.cmd, "--prometheus-port") == "31001"
    assert router.cmd[router.cmd.index("--prefill") + 1:][:2] == [pre.url, "31003"]
    assert [router.cmd[i + 1] for i, a in enumerate(router.cmd) if a == "--decode"] == [d0.url, d1.url, plain.url]
    off = pd_cluster.build(_args(ports="31000-31999", prefill_ess=False), [], "smg")[0]
    assert _flag(off.cmd, "--ess-enabled") == "false"


@pytest.mark.parametrize("ports", ["31000", "a-b", "31000-31050", "70000-70999", "900-1999"])
def test_a_bad_port_range_is_refused(ports):
    with pytest.raises(SystemExit, match="--ports"):
        pd_cluster.parse_ports(ports, 1)


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "sgl_ess.launch_pd", *argv], capture_output=True, text=True,
                          timeout=120)


def test_flags_launch_pd_sets_itself_are_refused_after_the_separator():
    r = _run("--", "--port", "1234")
    assert r.returncode == exit_codes.CONFIG and "--port after '--' is set by launch_pd" in r.stderr


def test_a_missing_router_is_named_with_the_fix():
    r = _run("--router-bin", "/nonexistent/smg")
    assert r.returncode == exit_codes.CONFIG
    assert "router" in r.stderr and "--with-pd" in r.stderr


def test_a_taken_port_is_refused_before_anything_starts():
    if pd_cluster.router_binary(None) is None or pd_cluster.preflight(pd_cluster.router_binary(None)):
        pytest.skip("PD packages not installed: bash launch/setup.sh --with-pd")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        lo = s.getsockname()[1]
        if lo + 200 > 65535:
            pytest.skip("ephemeral port too high for a range")
        r = _run("--ports", f"{lo}-{lo + 199}")
    assert r.returncode == exit_codes.PORT_IN_USE and str(lo) in r.stderr and "--ports" in r.stderr


def test_help_explains_the_layout():
    r = _run("--help")
    assert r.returncode == 0 and "LO+100..HI" in r.stdout and "--plain-decode-nodes" in r.stdout

