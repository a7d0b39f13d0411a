"""Is a Pallas-vs-reference gap of W4A4 perplexity a kernel bug or rounding sensitivity?

    python experiments/fp4_perplexity/w4a4_check.py [model] [tokens]    (default smollm2-135m-instruct 64)

Prints ``kernel_check.kernel_vs_reference`` (the table the experiment reports) for every Dense kernel
of the first, middle and last layer and every NVFP4/MXFP4 variant of the config: Pallas (interpret)
vs reference on the same real input, beside the reference on an input nudged by 1e-6 relative noise.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.fp4_perplexity.config import CONFIG  # noqa: E402
from experiments.fp4_perplexity.kernel_check import kernel_vs_reference  # noqa: E402
from experiments.fp4_perplexity.run import load  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402
from jaxserve.quant import kernel_plan  # noqa: E402
from jaxserve.quant.params import QUANTIZE  # noqa: E402

model = sys.argv[1] if len(sys.argv) > 1 else CONFIG.models[0]
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
config, params, val, _ = load(model, CONFIG)
last = config.num_layers - 1
layers = [p.removesuffix("/kernel") for p, what in kernel_plan(params, "nvfp4").items()
          if what == QUANTIZE and p.split("/")[0] in (f"layers_{i}" for i in (0, last // 2, last))]
print(markdown_table(kernel_vs_reference(params, config, val[:1, :tokens], layers, CONFIG.variants)))
