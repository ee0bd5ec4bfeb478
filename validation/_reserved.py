"""Entry point reserved for the validation CLI (`nsa-validate`), which is not built yet."""

import sys


def validate_main() -> None:
    print("nsa-validate: the validation CLI is not part of this release yet; "
          "run `python benchmarks/bench_attention.py` for the attention benchmark.", file=sys.stderr)
    sys.exit(2)
