"""Beam search inside the engine: beams are sequences that share KV blocks (fork + copy-on-write).

Each step every live beam runs one token; the runner returns each beam's top ``2 * beam_width``
log-probs; the best ``beam_width`` extensions survive (vLLM's rule: a candidate ending in EOS is
completed, not extended; scores are ``cumulative_logprob / len(prompt + output) ** length_penalty``).
A parent with one surviving child keeps its sequence; each extra child is a ``fork`` of it that
shares every block, the partial last one included, until its first write copies that block; a
parent with no surviving child is dropped and its blocks freed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence as Seq

from jaxserve.engine.batching import NUM_TOP_LOGPROBS
from jaxserve.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # output tokens (prompt excluded)
    cum_logprob: float = 0.0
    text: str | None = None
    finished_by_eos: bool = False


@dataclass
class BeamSearchOutput:
    prompt_token_ids: list[int]
    sequences: list[BeamSearchSequence] = field(default_factory=list)  # best first


def beam_score(prompt_len: int, beam: BeamSearchSequence, length_penalty: float) -> float:
    length = prompt_len + len(beam.tokens) - (1 if beam.finished_by_eos else 0)
    return beam.cum_logprob / (length ** length_penalty)


def beam_search(engine, prompts: Seq, params: BeamSearchParams) -> list[BeamSearchOutput]:
    """Runs beam search for each prompt on ``engine`` (an idle ``LLMEngine``).

    Every prompt is validated before any is queued; on return or on any exception (KeyboardInterrupt
    included) the engine holds nothing of this call."""
    if not isinstance(params, BeamSearchParams):
        raise TypeError(f"expected BeamSearchParams, got {type(params).__name__}")
    width = params.beam_width
    if 2 * width > NUM_TOP_LOGPROBS:
        raise ValueError(f"beam_width={width} exceeds the supported maximum {NUM_TOP_LOGPROBS // 2}")
    if engine.has_unfinished():
        raise ValueError("beam_search needs an idle engine (finish or abort running requests first)")
    per_batch = max(1, engine.engine_config.max_num_seqs // width)
    sp = _beam_sampling_params(params)
    token_ids = [engine.validate_request(p, sp, f"prompt {i}") for i, p in enumerate(prompts)]
    results = []
    for lo in range(0, len(token_ids), per_batch):
        results += _search(engine, token_ids[lo:lo + per_batch], params)
    if engine.tokenizer is not None:
        for out in results:
            for beam in out.sequences:
                beam.text = engine.tokenizer.decode(beam.tokens)
    return results


def _search(engine, prompts: list[list[int]], params: BeamSearchParams) -> list[BeamSearchOutput]:
    sched, eos = engine.scheduler, engine.scheduler.eos_token_id
    sp, rids = _beam_sampling_params(params), []
    try:
        for p in prompts:  # one at a time: an interrupt here is cleaned up too
            rids.append(engine.add_request(p, sp))
        beams = {rid: {sched.get_request(rid).seqs[0].seq_id: BeamSearchSequence([])} for rid in rids}
        completed = {rid: [] for rid in rids}
        steps = {rid: 0 for rid in rids}
        while any(steps[rid] < params.max_tokens for rid in rids):
            out = sched.schedule()
            top = engine.runner.execute(out, top_logprobs=True).top  # greedy rows: beam params have temperature 0
            candidates = {}
            for e in out.scheduled:
                if not e.sample:
                    continue
                lps, ids = top[e.seq_id]
                parent = beams[e.request_id][e.seq_id]
                candidates.setdefault(e.request_id, []).extend(
                    (e.seq_id, int(tok), parent.cum_logprob + float(lp))
                    for lp, tok in zip(lps[: 2 * params.beam_width], ids[: 2 * params.beam_width]))
            plans = {}
            for rid, cands in candidates.items():  # requests still in chunked prefill have none
                if len({c[0] for c in cands}) != len(beams[rid]):
                    raise RuntimeError("beam search needs all of a prompt's beams in each step: raise "
                                       "num_kv_blocks or max_num_batched_tokens")
                plans[rid] = _select(cands, beams[rid], completed[rid], len(sched.get_request(rid).prompt_token_ids),
                                     params, eos)
            # one token per scheduled beam now; forks and drops once the scheduler has advanced
            sched.update(out, {seq_id: (children[0][0] if children else 0)
                               for plan in plans.values() for seq_id, children in plan.items()})
            for rid, plan in plans.items():
                beams[rid] = _apply(sched, plan, beams[rid])
                steps[rid] += 1
                if steps[rid] == params.max_tokens:
                    sched.abort(rid)
    finally:
        for rid in rids:
            if rid in sched.requests:
                sched.abort(rid)
            engine.forget(rid)
    outputs = []
    for rid, prompt in zip(rids, prompts):
        pool = completed[rid] + list(beams[rid].values())
        pool.sort(key=lambda b: beam_score(len(prompt), b, params.length_penalty), reverse=True)
        outputs.append(BeamSearchOutput(prompt, pool[: params.beam_width]))
    return outputs


def _beam_sampling_params(params: BeamSearchParams) -> SamplingParams:
    # the scheduler must never stop a beam on its own: beam search decides when beams end
    return SamplingParams(max_tokens=params.max_tokens + 1, temperature=0, ignore_eos=True)


def _select(candidates, beams, completed, prompt_len, params, eos):
    """Picks the surviving extensions; returns {parent seq id: [(token, new beam), ...]}."""
    plan = {seq_id: [] for seq_id in beams}
    extended = []
    for seq_id, tok, cum in candidates:
        beam = BeamSearchSequence(beams[seq_id].tokens + [tok], cum)
        if tok == eos and not params.ignore_eos:
            beam.finished_by_eos = True
            completed.append(beam)
        else:
            extended.append((seq_id, tok, beam))
    extended.sort(key=lambda c: beam_score(prompt_len, c[2], params.length_penalty), reverse=True)
    for seq_id, tok, beam in extended[: params.beam_width]:
        plan[seq_id].append((tok, beam))
    return plan


def _apply(sched, plan, beams) -> dict[int, BeamSearchSequence]:
    new = {}
    for seq_id, children in plan.items():
        if not children:
            sched.drop_sequence(seq_id)
            continue
        new[seq_id] = children[0][1]
        for tok, beam in children[1:]:
            child = sched.fork_sequence(seq_id)  # shares every block; the first write copies the partial one
            child.output_token_ids[-1] = tok
            new[child.seq_id] = beam
    return new
