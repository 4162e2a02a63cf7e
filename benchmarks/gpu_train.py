"""The GPU-scale comparison and ladder in one command: parts 1 and 2 of the GPU check
(``benchmarks/gpu_check.py``) without the test suite's GPU tests and the Hugging Face benchmark.

    python benchmarks/gpu_train.py --data /path/to/folder/with/tinyshakespeare.txt --out runs/gpu
    python benchmarks/gpu_train.py --smoke --out /tmp/smoke   # the same code on the CPU at tiny sizes

Results go to OUT/<gpu>_torch-<version>_<date>/part1 (the comparison: a learning-rate sweep per arm,
then 3 seeds) and part2 (the ladder and the leave-one-out ablations); see gpu_check.py.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402


def check_arguments(argv=None) -> list[str]:
    """The ``gpu_check`` command line this command stands for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu", help="output root")
    parser.add_argument("--data", default=None, help="folder holding tinyshakespeare.txt")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--jobs", type=int, default=None, help="trainings at once")
    parser.add_argument("--smoke", action="store_true", help="tiny models on the CPU (gpu_check's --dry-run)")
    args = parser.parse_args(argv)
    out = ["part1", "part2", "--skip-tests", "--skip-bench", "--out", args.out]
    out += ["--data", args.data] if args.data else []
    out += ["--seeds", *map(str, args.seeds)] if args.seeds else []
    out += ["--jobs", str(args.jobs)] if args.jobs else []
    return out + (["--dry-run"] if args.smoke else [])


def main(argv=None) -> int:
    return gpu_check.main(check_arguments(argv))


if __name__ == "__main__":
    sys.exit(main())
