"""Write the tiny Qwen3 test checkpoint (HF layout) for the qwen3-tiny shape: `--out DIR --seed N`."""

from __future__ import annotations

import argparse
import os
import sys

# Runnable from a fresh clone without installing xrt.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xrt.models.loader import CheckpointError
from xrt.models.tiny import make_tiny_checkpoint, tiny_model_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="checkpoint directory to write (replaced if it is one already)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed; same seed, same bytes")
    args = parser.parse_args(argv)
    try:
        path = make_tiny_checkpoint(args.out, tiny_model_args(), args.seed)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
