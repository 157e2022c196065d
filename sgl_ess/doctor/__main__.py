"""`python -m sgl_ess.doctor`: see cli.py (flags, output, exit code) and runner.py (the checks)."""
import sys

from sgl_ess.doctor.cli import main

if __name__ == "__main__":
    sys.exit(main())
