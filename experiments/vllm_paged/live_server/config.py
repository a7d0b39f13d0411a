"""Configuration of the live-server variant of the vLLM paper reproduction (override with key=value).

Time is wall-clock seconds against a running ``jaxserve serve`` process (one per KV policy), rates in
requests per second. The KV pool is small enough that the policy decides how many requests run at once,
and the model is big enough (SmolLM2-135M) that its decode throughput grows with the batch on the CPU (as on
a GPU): with the 8M-parameter tiny-code every policy topped out at the same token rate on 2 cores, whatever
its batch, and the policy hardly mattered (``results/vllm_paged/live_server/tiny_code``).
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class LiveServerConfig:
    model: str = "smollm2-135m-instruct"  # what `jaxserve serve` loads: a zoo name or a path
    policies: tuple[str, ...] = ("paged", "orca_oracle", "orca_pow2", "orca_max")  # EngineConfig.kv_allocation
    # --- the server's engine (engine.* overrides of `jaxserve serve`; prefix caching off: every rate
    # replays the same prompts, which must not hit the cache the previous rate filled) ---
    kv_slots: int = 768  # KV memory in token slots (num_kv_blocks = kv_slots // block_size)
    block_size: int = 16
    max_model_len: int = 256  # Orca-Max reserves this much per request: 3 requests in 768 slots
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256  # chunked prefill budget per step
    warmup: bool = True  # compile every step program before serving (else on first use, inside the timings)
    warm_requests: int = 8  # sent at once, untimed, before each policy's sweep (first-use costs)
    # --- the workload: ShareGPT-like log-normal lengths (jaxserve.bench.workload), Poisson arrivals ---
    dataset: str = "sharegpt"
    length_scale: float = 0.1  # multiplies ShareGPT's mean lengths (161 in, 338 out): ~16 in, ~34 out
    num_requests: int = 40  # per rate (the same requests at every rate)
    rates: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # requests / s, swept lowest first
    stop_factor: float = 8.0  # a policy's sweep stops past this x its lowest rate's mean normalized latency
    seed: int = 0
    # --- reading: a rate is sustained while the normalized latency (s per output token) stays under
    # latency_knee x the best policy's value at the lowest rate (per statistic: mean and p99) ---
    latency_knee: float = 2.0


CONFIG = LiveServerConfig()

# Well under a minute on a 2-core CPU: one policy, two rates, a few short requests, few step programs. The
# smallest zoo model (tiny-code-draft: 2 layers, 64 wide; tiny-code's 6 x 256 compiled each step program ~2x slower),
# and 2 sequences a step: 3 step programs (one mixed, decode batches 1 and 2), all compiled inside the first rate.
SMOKE = ("model=jaxserve/tiny-code-draft", "policies=[orca_oracle]", "warm_requests=0", "kv_slots=256",
         "max_model_len=128", "max_num_seqs=2", "max_num_batched_tokens=32", "warmup=false", "length_scale=0.03",
         "num_requests=4", "rates=[2.0,8.0]")
