"""The ``jaxserve`` command: ``generate``, ``chat`` (interactive), ``serve`` (an OpenAI-compatible server),
``bench`` for measurements.

Thin: parse, call the library."""
from __future__ import annotations

import argparse
import sys

from jaxserve.config import engine_kwargs


def _llm(args):
    from jaxserve.engine.llm import LLM
    from jaxserve.speculative.config import SpeculativeConfig
    speculative = None if args.speculative_config is None else SpeculativeConfig.from_json(args.speculative_config)
    kwargs = engine_kwargs(args.overrides)
    for name in ("tensor_parallel_size", "data_parallel_size", "enable_expert_parallel"):
        if getattr(args, name) is not None:  # the vLLM-style flags win over engine.* overrides
            kwargs[name] = getattr(args, name)
    return LLM(args.model, dtype=args.dtype, matmul_dtype=args.matmul_dtype, speculative=speculative, **kwargs)


def _sampling_params(args, n: int = 1):
    from jaxserve.sampling_params import SamplingParams
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, n=n)


def _conversation(system: str | None, user: str) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def cmd_generate(args) -> int:
    llm = _llm(args)
    params = _sampling_params(args, args.n)
    if args.chat:  # each prompt is a user message; the reply alone is printed
        outs = llm.chat([_conversation(args.system, p) for p in args.prompt], params, use_tqdm=False)
    else:
        outs = llm.generate(args.prompt, params, use_tqdm=False)
    for out in outs:
        for completion in out.outputs:
            sys.stdout.write(f"{'' if args.chat else out.prompt}{completion.text}\n")
            if len(out.outputs) > 1 or len(outs) > 1:
                sys.stdout.write("-" * 40 + "\n")
    return 0


def cmd_chat(args) -> int:
    """An interactive conversation: each line is a user turn, the reply streams as it is generated."""
    llm = _llm(args)
    params = _sampling_params(args)
    history = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    if interactive:
        sys.stdout.write(f"jaxserve chat with {args.model}: type a message, /exit to quit, /reset to forget\n")
    while True:
        if interactive:
            sys.stdout.write("> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line.rstrip("\n")})
        reply = []
        for piece in llm.stream_chat(history, params):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})


def cmd_serve(args) -> int:
    """Loads the model, compiles its step programs (unless --no-warmup), and serves until interrupted."""
    import os
    from jaxserve.server import serve
    api_key = args.api_key or os.environ.get("JAXSERVE_API_KEY")
    llm = _llm(args)
    if not args.no_warmup:
        llm.warmup()
    serve(llm, args.served_model_name or args.model, host=args.host, port=args.port, api_key=api_key,
          log_level=args.log_level)
    return 0


BENCHMARKS = ("throughput", "latency", "serve")


def cmd_bench(args) -> int:
    if not args.rest or args.rest[0] not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {args.rest[0] if args.rest else ''!r}; available: {', '.join(BENCHMARKS)}")
    if args.rest[0] == "serve":
        from jaxserve.bench import serve
        return serve.main(args.rest[1:])
    if args.rest[0] == "latency":
        from jaxserve.bench import latency
        return latency.main(args.rest[1:])
    from jaxserve.bench import throughput
    return throughput.main(args.rest[1:])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxserve", description="JAX/Pallas LLM serving research framework.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,chat,serve,bench}")
    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    _model_arguments(gen, max_tokens=64)
    gen.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    gen.add_argument("--chat", action="store_true",
                     help="treat each prompt as a user message under the model's chat template; print the reply")
    gen.add_argument("-n", type=int, default=1, help="samples per prompt")
    gen.set_defaults(func=cmd_generate)
    chat = sub.add_parser("chat", help="an interactive conversation, the reply streamed (/exit to quit)")
    _model_arguments(chat, max_tokens=256)
    chat.set_defaults(func=cmd_chat)
    _serve_parser(sub)
    bench = sub.add_parser("bench", help="benchmarks: `jaxserve bench throughput --help`, `jaxserve bench latency "
                                         "--help`, `jaxserve bench serve --help`", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    return parser


def _serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    serve.add_argument("model", help="zoo name (smollm2-135m-instruct, jaxserve/tiny-code, ...), a .gguf file, a "
                                     "jaxserve checkpoint dir or a local HF dir")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on /v1 (default: $JAXSERVE_API_KEY, else none)")
    serve.add_argument("--served-model-name", default=None, help="the name clients pass as model (default: MODEL)")
    serve.add_argument("--no-warmup", action="store_true", help="compile step programs on first use, not at start")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    _load_arguments(serve)
    serve.set_defaults(func=cmd_serve)


def _model_arguments(cmd: argparse.ArgumentParser, max_tokens: int) -> None:
    from jaxserve.zoo import DEFAULT_MODEL
    cmd.add_argument("--model", default=DEFAULT_MODEL,
                     help=f"zoo name ({DEFAULT_MODEL}, jaxserve/tiny-code, ...), a .gguf file, a jaxserve checkpoint "
                          f"dir or a local HF dir (default {DEFAULT_MODEL})")
    cmd.add_argument("--system", default=None, help="a system message (with --chat, and for chat)")
    cmd.add_argument("--max-tokens", type=int, default=max_tokens)
    cmd.add_argument("--temperature", type=float, default=0.0)
    cmd.add_argument("--top-k", type=int, default=0)
    cmd.add_argument("--top-p", type=float, default=1.0)
    cmd.add_argument("--seed", type=int, default=None)
    _load_arguments(cmd)


def _load_arguments(cmd: argparse.ArgumentParser) -> None:
    """How the model is loaded and the engine configured (shared by every command that builds an LLM)."""
    cmd.add_argument("--dtype", default=None, help="override the model dtype (float32, bfloat16)")
    cmd.add_argument("--matmul-dtype", default=None,
                     help="round the Dense layers' dot operands to this dtype, summing in float32 (bfloat16)")
    cmd.add_argument("--speculative-config", default=None, metavar="JSON",
                     help='speculative decoding, as vLLM\'s: \'{"method": "draft_model", "draft_model": '
                          '"jaxserve/tiny-code-draft", "num_speculative_tokens": 3}\'')
    cmd.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                     help="split heads, KV heads and MLPs over this many devices (docs/architecture.md, Scaling out)")
    cmd.add_argument("--data-parallel-size", "-dp", type=int, default=None,
                     help="data-parallel attention replicas beside expert-parallel MoE (with --enable-expert-parallel)")
    cmd.add_argument("--enable-expert-parallel", action="store_true", default=None,
                     help="split every MoE layer's experts over all devices (all_to_all dispatch)")
    cmd.add_argument("overrides", nargs="*", help="engine overrides, e.g. engine.block_size=32")


def main(argv: list[str] | None = None) -> int:
    """Runs a command; every user error (a bad value or type, a missing or corrupt file: ``ValueError``,
    ``TypeError``, ``OSError``, ``CheckpointError``) is ``jaxserve: error: ...`` on stderr and exit 2."""
    args = _parse(build_parser(), argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"jaxserve: error: {_describe(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxserve: interrupted", file=sys.stderr)
        return 130


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parse_args``, except that overrides may also follow options (``serve MODEL --port 8001 engine.x=1``):
    argparse takes one run of positionals, and ``parse_intermixed_args`` does not allow ``bench``'s REMAINDER."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None:  # "No such file or directory: 'x'"
        return f"{e.strerror or type(e).__name__}: {e.filename!r}"
    return str(e) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
