"""The ``jaxserve`` command: ``generate`` now, ``bench`` for measurements. Thin: parse, call the library."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from jaxserve.config import EngineConfig, apply_overrides


@dataclasses.dataclass(frozen=True)
class CliConfig:
    engine: EngineConfig = EngineConfig()


def _engine_from_overrides(overrides: list[str]) -> dict:
    engine = apply_overrides(CliConfig(), overrides).engine
    return {f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)}


def cmd_generate(args) -> int:
    from jaxserve import LLM, SamplingParams
    from jaxserve.spec.config import SpeculativeConfig
    speculative = None if args.speculative_config is None else SpeculativeConfig.from_json(args.speculative_config)
    llm = LLM(args.model, dtype=args.dtype, matmul_dtype=args.matmul_dtype, speculative=speculative,
              **_engine_from_overrides(args.overrides))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, n=args.n)
    outs = llm.generate(args.prompt, params, use_tqdm=False)
    for out in outs:
        for completion in out.outputs:
            sys.stdout.write(f"{out.prompt}{completion.text}\n")
            if len(out.outputs) > 1 or len(outs) > 1:
                sys.stdout.write("-" * 40 + "\n")
    return 0


def cmd_bench(args) -> int:
    if not args.rest or args.rest[0] != "throughput":
        raise ValueError(f"unknown benchmark {args.rest[0] if args.rest else ''!r}; available: throughput")
    from jaxserve.bench import throughput
    return throughput.main(args.rest[1:])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxserve", description="JAX/Pallas LLM serving research framework.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,bench}")
    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    gen.add_argument("--model", default="jaxserve/tiny-code",
                     help="zoo name (jaxserve/<name>), jaxserve checkpoint dir or local HF dir")
    gen.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("-n", type=int, default=1, help="samples per prompt")
    gen.add_argument("--dtype", default=None, help="override the model dtype (float32, bfloat16)")
    gen.add_argument("--matmul-dtype", default=None,
                     help="round the Dense layers' dot operands to this dtype, summing in float32 (bfloat16)")
    gen.add_argument("--speculative-config", default=None, metavar="JSON",
                     help='speculative decoding, as vLLM\'s: \'{"method": "draft_model", "draft_model": '
                          '"jaxserve/tiny-code-draft", "num_speculative_tokens": 3}\'')
    gen.add_argument("overrides", nargs="*", help="engine overrides, e.g. engine.block_size=32")
    gen.set_defaults(func=cmd_generate)
    bench = sub.add_parser("bench", help="benchmarks: `jaxserve bench throughput --help`", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs a command; every user error (a bad value or type, a missing or corrupt file: ``ValueError``,
    ``TypeError``, ``OSError``, ``CheckpointError``) is ``jaxserve: error: ...`` on stderr and exit 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"jaxserve: error: {_describe(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxserve: interrupted", file=sys.stderr)
        return 130


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None:  # "No such file or directory: 'x'"
        return f"{e.strerror or type(e).__name__}: {e.filename!r}"
    return str(e) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
