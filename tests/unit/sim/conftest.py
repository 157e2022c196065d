import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:       # tests run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))
