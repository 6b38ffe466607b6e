"""`python -m qwen3_runtime generate ...`: the qwen3-runtime command without its script on PATH."""

import sys

from qwen3_runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
