"""Per-file reading of a committed fp4_perplexity run: are the per-window differences the same in every text?

    python experiments/fp4_perplexity/by_file.py [results/fp4_perplexity/smollm2/results.json] [variant ref ...]

Windows of one file are correlated, so the per-window standard errors of RESULTS.md are optimistic. This
re-tokenizes the run's text (as ``run.load`` does) to find which file each window starts in, then prints the
paired perplexity change of each variant against ``ref`` per file (default pairs: NVFP4 and MXFP4 against
fp8_tensor, weights from float32).
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.fp4_perplexity.run import text_files  # noqa: E402
from jaxserve.models.loading import resolve_model  # noqa: E402

path = sys.argv[1] if len(sys.argv) > 1 else "results/fp4_perplexity/smollm2/results.json"
pairs = list(zip(sys.argv[2::2], sys.argv[3::2])) or [(v, "fp8_tensor") for v in
                                                     ("nvfp4", "nvfp4_w4a4", "mxfp4_ceil", "mxfp4_floor")]
res = json.load(open(path))
cfg, model = res["config"], res["config"]["models"][0]
tokenizer = resolve_model(model)[2]
ends = np.cumsum([len(tokenizer.encode(open(f, encoding="utf-8").read())) + 1 for f in text_files(cfg["text"])])
n_windows = (int(ends[-1]) - 1) // cfg["seq_len"]
picked = np.linspace(0, n_windows - 1, cfg["num_windows"]).round().astype(int) if cfg["spread_windows"] \
    else np.arange(cfg["num_windows"])
file_of = np.searchsorted(ends, picked * cfg["seq_len"], side="right")
names = [os.path.basename(f).removesuffix(".txt") for f in text_files(cfg["text"])]
rows = {r["variant"]: np.asarray(r["window_loss"]) for r in res["tables"][f"ppl/{model}/{cfg['weight_sources'][0]}"]}
print("| variant vs ref | " + " | ".join(f"{n} ({(file_of == i).sum()})" for i, n in enumerate(names)) + " | all |")
print("|---|" + "---|" * (len(names) + 1))
for variant, ref in pairs:
    d = rows[variant] - rows[ref]
    cells = [f"{100 * math.expm1(d[file_of == i].mean()):+.1f}%" if (file_of == i).any() else "–"
             for i in range(len(names))]
    print(f"| {variant} vs {ref} | " + " | ".join(cells) + f" | {100 * math.expm1(d.mean()):+.1f}% |")
