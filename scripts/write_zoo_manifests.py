"""Writes ``jaxserve_manifest.json`` for every bundled zoo checkpoint (``jaxserve/zoo/*``).

Run after changing a zoo model's files (``python scripts/write_zoo_manifests.py``); commit the
manifests. ``--check`` verifies them instead (exit 1 on the first mismatch).
"""
from __future__ import annotations

import sys

from jaxserve.models.checkpoint import CheckpointError, verify_manifest, write_manifest
from jaxserve.zoo import trained_models, zoo_path


def main(argv: list[str]) -> int:
    for name in trained_models():
        if "--check" in argv:
            try:
                verify_manifest(zoo_path(name))
            except CheckpointError as e:
                print(f"{name}: {e}", file=sys.stderr)
                return 1
            print(f"{name}: ok")
        else:
            print(write_manifest(zoo_path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
