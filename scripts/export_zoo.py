"""Copies a finished training run into the zoo (params rounded to bfloat16 for storage).

    python scripts/export_zoo.py runs/tiny-code tiny-code [--note "text for the model card"]

Then run ``python scripts/eval_zoo.py tiny-code`` to measure it and write its MODEL_CARD.md.
"""
import argparse

from jaxserve.train.zoo import export_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("name")
    ap.add_argument("--storage-dtype", default="bfloat16")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    print(export_run(args.run_dir, args.name, args.storage_dtype, args.note))


if __name__ == "__main__":
    main()
