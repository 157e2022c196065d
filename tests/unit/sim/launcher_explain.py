"""Child process of test_launcher_agreement.py: ``python launcher_explain.py ARGV.json OUT.json``. ARGV.json maps a
case name to the launcher's argv (with --ess-explain); for each case, in this one process, the launcher's main()
runs as ``python -m sgl_ess.launch_server ARGV`` would, and OUT.json maps the case to [exit code, stdout, stderr]
(explain prints its report and exits 0 through sys.exit). Imports the launcher once for every case."""
import contextlib
import io
import json
import sys

from sgl_ess.integration.sglang.launcher.server_args import main


def run(argv: list[str]) -> list:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return [code, out.getvalue(), err.getvalue()]


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        cases = json.load(fh)
    with open(sys.argv[2], "w") as fh:
        json.dump({name: run(argv) for name, argv in cases.items()}, fh)
