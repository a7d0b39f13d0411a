from experiments.harness import main

main("fp4_perplexity")
