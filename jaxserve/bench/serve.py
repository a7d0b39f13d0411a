"""``jaxserve bench serve``: online serving latency against a running server, in the style of ``vllm bench serve``.

Sends ``--num-prompts`` streaming ``/v1/completions`` requests to ``--base-url`` at ``--request-rate``
(Gamma-distributed gaps of shape ``--burstiness``: 1 is Poisson; ``inf`` sends them all at once), at most
``--max-concurrency`` in flight. Prompts are token ids with lengths from ``jaxserve.bench.workload``
(``random``: uniform in ranges; ``sharegpt``: ShareGPT's long-tailed log-normal lengths, synthetic, no
download); ``ignore_eos`` makes each produce its drawn output length. Reports, as JSON with vLLM's keys:
request/token throughput and TTFT (time to first token), TPOT (time per output token after the first,
per request), ITL (gaps between streamed chunks), E2EL (end-to-end latency) and NORM_LATENCY (E2EL / output
tokens, per request: the vLLM paper's normalized latency): mean, median (p50), std, p99, in ms. Works against any OpenAI-compatible server that accepts token-id prompts (vLLM's too:
pass ``--vocab-size`` where ``/v1/models`` does not report one).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import time

import numpy as np

from jaxserve.bench.workload import BenchRequest, gamma_arrivals, make_workload


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxserve bench serve")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    p.add_argument("--model", default=None, help="the model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--dataset", choices=["random", "sharegpt"], default="random")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, nargs=2, default=(32, 96), metavar=("LO", "HI"), help="random dataset")
    p.add_argument("--output-len", type=int, nargs=2, default=(64, 192), metavar=("LO", "HI"), help="random dataset")
    p.add_argument("--length-scale", type=float, default=1.0, help="sharegpt: multiplies the mean lengths")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="clip prompt + output to this (default: the server's max_model_len)")
    p.add_argument("--vocab-size", type=int, default=None, help="token ids are drawn below this (default: the "
                                                                "server's vocab_size)")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape of the gaps (1: Poisson)")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-detailed", action="store_true", help="also per-request lengths, TTFTs and ITLs")
    p.add_argument("--out", default=None, help="write the JSON result here")
    return p


@dataclasses.dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # s
    latency: float = 0.0  # s, send to the last event
    itl: list[float] = dataclasses.field(default_factory=list)  # s, between streamed chunks with text


async def _one(client, url: str, body: dict, headers: dict) -> RequestResult:
    res = RequestResult(prompt_len=len(body["prompt"]))
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    res.error = chunk["error"].get("message", str(chunk["error"]))
                    return res
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    now = time.perf_counter()
                    if res.ttft == 0.0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.latency = time.perf_counter() - start
        res.ok = res.ttft > 0
        res.error = "" if res.ok else "no text was streamed"
    except Exception as e:  # noqa: BLE001 -- a failed request is counted, the run goes on
        res.error = f"{type(e).__name__}: {e}"
    return res


async def _server_info(client, base_url: str, headers: dict) -> dict:
    r = await client.get(f"{base_url}/v1/models", headers=headers)
    r.raise_for_status()
    return r.json()["data"][0]


async def run(args, requests: list[BenchRequest] | None = None) -> dict:
    """Runs the benchmark described by ``args`` (``_parser``'s); returns the result dict."""
    import httpx
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.base_url.rstrip("/")
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=httpx.Limits(max_connections=None)) \
            as client:
        info = await _server_info(client, base, headers)
        model = args.model or info["id"]
        vocab = args.vocab_size or info.get("vocab_size")
        max_len = args.max_model_len or info.get("max_model_len")
        if vocab is None or max_len is None:
            raise ValueError("the server's /v1/models reports no vocab_size / max_model_len: pass --vocab-size "
                             "and --max-model-len")
        if requests is None:
            requests = make_workload(args.dataset, args.num_prompts, vocab, max_len, args.seed,
                                     input_len=tuple(args.input_len), output_len=tuple(args.output_len),
                                     length_scale=args.length_scale)
        arrivals = gamma_arrivals(args.request_rate, len(requests), args.burstiness, args.seed + 1)
        limit = asyncio.Semaphore(args.max_concurrency or len(requests))
        start = time.perf_counter()

        async def send(req: BenchRequest, at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            body = {"model": model, "prompt": req.prompt_token_ids, "max_tokens": req.output_len,
                    "temperature": args.temperature, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with limit:
                return await _one(client, f"{base}/v1/completions", body, headers)

        results = await asyncio.gather(*[send(r, float(a)) for r, a in zip(requests, arrivals)])
        duration = time.perf_counter() - start
    return summarize(results, duration) | {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "backend": "openai", "base_url": base,
        "model": model, "dataset": args.dataset, "num_prompts": len(requests), "request_rate": args.request_rate,
        "burstiness": args.burstiness, "max_concurrency": args.max_concurrency, "seed": args.seed,
        **(_detailed(results) if args.save_detailed else {})}


def bench_rate(base_url: str, requests: list[BenchRequest], rate: float, *, seed: int = 0,
               timeout: float = 600.0) -> dict:
    """``jaxserve bench serve`` of ``requests`` against ``base_url`` at ``rate`` requests/s (Poisson), greedy."""
    args = _parser().parse_args(["--base-url", base_url, "--request-rate", str(rate), "--seed", str(seed),
                                 "--timeout", str(timeout)])
    return asyncio.run(run(args, requests))


def summarize(results: list[RequestResult], duration: float) -> dict:
    """vLLM's ``benchmark_serving`` figures over the requests that completed (times in ms)."""
    done = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_len for r in done)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    metrics = {"ttft": [r.ttft for r in done], "tpot": tpot, "itl": [x for r in done for x in r.itl],
               "e2el": [r.latency for r in done],
               "norm_latency": [r.latency / r.output_tokens for r in done if r.output_tokens > 0]}
    summary = {"duration": duration, "completed": len(done), "failed": len(results) - len(done),
               "errors": sorted({r.error for r in results if not r.ok})[:5],
               "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
               "request_throughput": len(done) / duration, "output_throughput": out_tokens / duration,
               "total_token_throughput": (in_tokens + out_tokens) / duration}
    for name, values in metrics.items():
        ms = np.asarray(values, float) * 1000 if values else np.full(1, np.nan)
        summary |= {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
                    f"std_{name}_ms": float(ms.std()), f"p50_{name}_ms": float(np.percentile(ms, 50)),
                    f"p99_{name}_ms": float(np.percentile(ms, 99))}
    return summary


def _detailed(results: list[RequestResult]) -> dict:
    return {"input_lens": [r.prompt_len for r in results], "output_lens": [r.output_tokens for r in results],
            "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
            "errors_per_request": [r.error for r in results]}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    gamma_arrivals(args.request_rate, 1, args.burstiness)  # checks both before any request is sent
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if result["failed"] == 0 else 1
