"""``/metrics``: the engine loop's snapshot in Prometheus text format (``prometheus_client``), read at scrape
time. Names follow vLLM's (``vllm:num_requests_running`` -> ``jaxserve:num_requests_running``)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# metric name -> (stats key, help)
_GAUGES = {
    "num_requests_running": ("num_running", "Requests in the running batch"),
    "num_requests_waiting": ("num_waiting", "Requests waiting to be scheduled"),
    "kv_blocks_used": ("kv_blocks_used", "KV cache blocks referenced by a running sequence"),
    "kv_blocks_total": ("kv_blocks_total", "KV cache blocks in the pool"),
    "kv_blocks_cached": ("kv_blocks_cached", "KV cache blocks holding prefix-cache content"),
    "prefix_cache_hit_rate": ("prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / looked up"),
    "generation_tokens_per_second": ("tokens_per_s", "Generated tokens per second over the last 10 s"),
}
_COUNTERS = {
    "prompt_tokens": ("prompt_tokens_total", "Prompt tokens of accepted requests"),
    "generation_tokens": ("generation_tokens_total", "Generated tokens"),
    "requests_finished": ("requests_finished_total", "Requests that finished in the engine"),
    "requests_aborted": ("requests_aborted_total", "Requests aborted (client gone, stop string, shutdown)"),
    "num_preemptions": ("num_preemptions", "Sequences preempted for lack of KV blocks"),
    "engine_steps": ("steps_total", "Engine steps run"),
}


class _EngineCollector:
    def __init__(self, loop, model: str):
        self._loop, self._model = loop, model

    def collect(self):
        stats = self._loop.stats()
        for name, (key, help_) in _GAUGES.items():
            g = GaugeMetricFamily(f"jaxserve:{name}", help_, labels=["model_name"])
            g.add_metric([self._model], float(stats[key]))
            yield g
        for name, (key, help_) in _COUNTERS.items():
            c = CounterMetricFamily(f"jaxserve:{name}", help_, labels=["model_name"])
            c.add_metric([self._model], float(stats[key]))
            yield c


def registry(loop, model: str) -> CollectorRegistry:
    """A registry of its own (not the process-global one): several servers may live in one process."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_EngineCollector(loop, model))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
