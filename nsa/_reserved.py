"""Entry point reserved for the trainer (`nsa-train`), which is not built yet."""

import sys


def train_main() -> None:
    print("nsa-train: the trainer is not part of this release yet; the NSA attention layer is (import nsa).",
          file=sys.stderr)
    sys.exit(2)
