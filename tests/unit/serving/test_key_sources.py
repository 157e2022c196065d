"""auth_keys.take_keys: a key from --*-api-key-file, SGLESS_*_API_KEY or the command line, one source
per key; environment variables removed once read; a key on the command line hidden from this
process's argv (checked in a child process, whose /proc/self/cmdline is its own)."""

import argparse
import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.launcher import auth_keys  # noqa: E402
from sgl_ess.serving.ops_config import OpsConfigError  # noqa: E402


def _files(api=None, admin=None):
    """The launcher's parsed --api-key-file / --admin-api-key-file (its parser takes them; SGLang's argv never
    holds them)."""
    return argparse.Namespace(api_key_file=api, admin_api_key_file=admin)


def _file(tmp_path, name, text, mode=0o600):
    p = tmp_path / name
    p.write_text(text)
    os.chmod(p, mode)
    return str(p)


def test_file_and_env_sources(tmp_path):
    env = {"SGLESS_API_KEY": "user-from-env", "OTHER": "x"}
    path = _file(tmp_path, "admin.key", "admin-from-file\n")
    argv, keys = auth_keys.take_keys(["--port", "1", "--tp", "1"], env, _files(admin=path))
    assert argv == ["--port", "1", "--tp", "1"]
    assert keys == {"--api-key": "user-from-env", "--admin-api-key": "admin-from-file"}
    assert env == {"OTHER": "x"}                      # read, then removed: no child inherits it


@pytest.mark.parametrize("text, key", [("u-key\n", "u-key"), ("u-key\r\n", "u-key"), ("u-key", "u-key"),
                                       ("  u key \n", "  u key ")])
def test_key_file_drops_one_trailing_newline_only(tmp_path, text, key):
    path = _file(tmp_path, "u.key", text)
    argv, keys = auth_keys.take_keys([], {}, _files(api=path))
    assert argv == [] and keys == {"--api-key": key, "--admin-api-key": None}


@pytest.mark.parametrize("argv, file_given, env", [
    (["--api-key", "a"], True, {}),
    ([], True, {"SGLESS_API_KEY": "b"}),
    (["--admin-api-key", "a"], False, {"SGLESS_ADMIN_API_KEY": "b"}),
])
def test_two_sources_refused(tmp_path, argv, file_given, env):
    path = _file(tmp_path, "k", "k\n")
    with pytest.raises(OpsConfigError, match="given 2 times"):
        auth_keys.take_keys(argv, dict(env), _files(api=path if file_given else None))


@pytest.mark.parametrize("text, match", [("", "holds nothing"), ("\n", "holds nothing"),
                                         ("a\nb\n", "more than one line"), ("a\n\n", "more than one line")])
def test_bad_key_file_refused(tmp_path, text, match):
    with pytest.raises(OpsConfigError, match=match):
        auth_keys.take_keys([], {}, _files(api=_file(tmp_path, "k", text)))


def test_missing_key_file_refused(tmp_path):
    with pytest.raises(OpsConfigError, match="cannot read"):
        auth_keys.take_keys([], {}, _files(api=str(tmp_path / "absent")))


def test_group_readable_key_file_warns(tmp_path, caplog):
    path = _file(tmp_path, "k", "k\n", mode=0o644)
    with caplog.at_level("WARNING", logger="sgl_ess"):
        auth_keys.take_keys([], {}, _files(api=path))
    assert "readable by other users" in caplog.text


def test_flag_without_value_left_for_sglang():
    argv, keys = auth_keys.take_keys(["--port", "1", "--api-key"], {})
    assert argv == ["--port", "1", "--api-key"] and keys["--api-key"] is None


def test_command_line_key_hidden_from_own_cmdline():
    code = ("import sys\n"
            "from sgl_ess.integration.sglang.launcher import auth_keys\n"
            "argv, keys = auth_keys.take_keys(sys.argv[1:], {})\n"
            "import os\n"
            "assert keys['--api-key'] == os.environ['EXPECTED_KEY']\n"
            "shown = open('/proc/self/cmdline', 'rb').read()\n"
            "print('SHOWN', shown.replace(b'\\0', b' ').decode().strip())\n"
            "print('ARGV', ' '.join(sys.argv))\n")
    out = subprocess.run([sys.executable, "-c", code, "--port", "1", "--api-key", "cmdline-secret-123"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "EXPECTED_KEY": "cmdline-secret-123"})
    assert out.returncode == 0, out.stderr
    assert "cmdline-secret-123" not in out.stdout
    assert "SHOWN " in out.stdout and "--api-key" in out.stdout     # the flag is still named, its value redacted
    assert "--api-key-file" in out.stderr                           # the warning names the better forms


def test_launcher_takes_keys_before_the_slow_steps(monkeypatch):
    """main() hides a command-line key right after parsing, before the parallel-layout check and the
    defaults (which read the model's config); nothing after that sees the key in SGLang's argv."""
    from sgl_ess.integration.sglang.launcher import server_args
    from sgl_ess.serving.preflight import PreflightError

    events = []
    monkeypatch.delenv("SGLESS_API_KEY", raising=False)
    monkeypatch.setattr(auth_keys, "hide_keys_from_cmdline", lambda: events.append("hide"))

    def refuse(argv):
        events.append(("check_parallel", "--api-key" in argv, "k-secret" in argv))
        raise PreflightError("stop here")
    monkeypatch.setattr(server_args, "check_parallel", refuse)
    with pytest.raises(SystemExit) as e:
        server_args.main(["--api-key", "k-secret", "--port", "1"])
    assert e.value.code == 2
    assert events == ["hide", ("check_parallel", False, False)]
