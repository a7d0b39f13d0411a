"""Builds the pycode corpus snapshot from a CPython ``Lib/`` directory.

    python scripts/build_corpus.py [--lib /path/to/lib/python3.11] [--out data/pycode-v1.jsonl.xz]

Writes the compressed snapshot and ``<out>.manifest.tsv`` (path, split, bytes, sha256 per file).
The committed snapshot was built from CPython 3.11.7; see data/README.md.
"""
from __future__ import annotations

import argparse
import pathlib
import sysconfig

from jaxserve.train.corpus import DEFAULT_CORPUS, select_files, write_corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--out", default=str(DEFAULT_CORPUS))
    ap.add_argument("--max-bytes", type=int, default=12_000_000)
    args = ap.parse_args()
    files = select_files(args.lib, args.max_bytes)
    manifest = write_corpus(args.lib, files, args.out)
    tsv = pathlib.Path(args.out.removesuffix(".jsonl.xz") + ".manifest.tsv")
    tsv.write_text("path\tsplit\tbytes\tsha256\n" + "".join(
        f"{m['path']}\t{m['split']}\t{m['bytes']}\t{m['sha256']}\n" for m in manifest))
    for split in ("train", "val"):
        rows = [m for m in manifest if m["split"] == split]
        print(f"{split}: {len(rows)} files, {sum(m['bytes'] for m in rows):,} bytes")
    print(f"wrote {args.out} ({pathlib.Path(args.out).stat().st_size:,} bytes) and {tsv}")


if __name__ == "__main__":
    main()
