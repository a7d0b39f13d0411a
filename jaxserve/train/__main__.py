"""``python -m jaxserve.train model=tiny-code train.steps=2000 train.out_dir=runs/tiny-code ...``"""
import sys

from jaxserve.train import parse_run_config, train


def main(argv: list[str]) -> None:
    result = train(parse_run_config(argv))
    print(f"stopped at step {result['step']}; final validation: {result['final_eval']}; out: {result['out_dir']}")


if __name__ == "__main__":
    main(sys.argv[1:])
