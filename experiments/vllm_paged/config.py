"""Configuration of the vLLM paper reproduction (override with key=value; lists as [a,b]).

Time is counted in engine steps (one iteration of continuous batching), rates in requests per
step. The memory is the paper's: OPT-13B on one A100-40GB holds 15.7K KV slots (Kwon et al.,
Table 1); max_model_len 2048 and max_num_seqs 256 are the paper's (and vLLM's) settings.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class VLLMPagedConfig:
    sections: tuple[str, ...] = ("memory", "sharing", "prefix", "block_size", "model")
    # --- the simulated serving engine (jaxserve's scheduler + block manager, NullRunner device) ---
    kv_slots: int = 15_696  # KV memory in token slots (num_kv_blocks = kv_slots // block_size)
    block_size: int = 16
    max_model_len: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048  # chunked prefill budget per step
    probe_every: int = 8  # steps between two samples of the KV memory breakdown
    seed: int = 0
    # --- Figure 2 + Figure 12/13: memory use, latency and batch vs request rate, per policy ---
    policies: tuple[str, ...] = ("paged", "orca_oracle", "orca_pow2", "orca_max")
    datasets: tuple[str, ...] = ("sharegpt", "alpaca")  # jaxserve.bench.workload log-normals
    length_scale: float = 1.0  # multiplies the datasets' mean lengths
    sharegpt_requests: int = 200
    sharegpt_rates: tuple[float, ...] = (0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.2)
    alpaca_requests: int = 1000
    alpaca_rates: tuple[float, ...] = (0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 10.0)
    # a rate is sustained while the mean normalized latency (steps per output token) stays below
    # this multiple of the best policy's value at the lowest rate (the same limit for every policy)
    latency_knee: float = 2.0
    # --- block sharing (paged): parallel sampling and beam search, memory saved vs no sharing ---
    sharing_n: tuple[int, ...] = (2, 4, 6)
    sharing_requests: int = 120  # parallel sampling requests per run (at the dataset's sharing rate)
    sharing_rate_sharegpt: float = 0.02
    sharing_rate_alpaca: float = 0.4
    beam_widths: tuple[int, ...] = (2, 4, 6)
    beam_prompts: int = 16  # prompts searched one after another
    # --- shared prefix (Fig. 16: WMT16 translation with a 1-shot / 5-shot example prefix) ---
    prefix_lens: tuple[int, ...] = (80, 341)  # the paper's 1-shot and 5-shot prefix lengths
    prefix_input_mean: float = 30.0  # the sentence to translate, log-normal (sigma 0.5)
    prefix_output_mean: float = 30.0
    prefix_requests: int = 400
    prefix_rate: float = 8.0  # overload: the throughput is the capacity
    # --- block size sweep (Fig. 18), paged ---
    block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128)
    block_rates_sharegpt: tuple[float, ...] = (0.08,)
    block_rates_alpaca: tuple[float, ...] = (4.0,)
    # --- the same engine with the real model forward (wall time; scaled down) ---
    model: str = "random:tiny-llama"  # random:<preset> (random weights) or a zoo name, e.g. jaxserve/tiny-code
    model_policies: tuple[str, ...] = ("paged", "orca_oracle", "orca_max")
    model_dataset: str = "sharegpt"
    model_length_scale: float = 0.25
    model_kv_slots: int = 2_048  # tight enough that memory binds at these lengths
    model_max_model_len: int = 512
    model_max_num_seqs: int = 64
    model_max_num_batched_tokens: int = 256
    model_requests: int = 48
    model_rate: float = 0.5  # overload
    model_warmup: bool = True  # run once untimed first, so the timed run compiles nothing


CONFIG = VLLMPagedConfig()

# Well under a minute on a 2-core CPU: few requests, few rates, a small pool, tiny model shapes; the model section
# at most 4 sequences a step (4 step programs to compile: one mixed, decode batches 1, 2 and 4).
SMOKE = ("kv_slots=2048", "max_model_len=512", "max_num_seqs=64", "max_num_batched_tokens=512",
         "length_scale=0.25", "sharegpt_requests=24", "sharegpt_rates=[0.05,0.4]",
         "alpaca_requests=60", "alpaca_rates=[0.5,4.0]", "sharing_n=[2]", "sharing_requests=12",
         "beam_widths=[2]", "beam_prompts=2", "prefix_lens=[80]", "prefix_requests=24",
         "block_sizes=[16,64]", "block_rates_sharegpt=[0.4]", "block_rates_alpaca=[4.0]",
         "model_kv_slots=512", "model_max_model_len=128", "model_max_num_seqs=4",
         "model_max_num_batched_tokens=64", "model_requests=6", "model_length_scale=0.1",
         "model_policies=[orca_oracle]", "model_warmup=false")
