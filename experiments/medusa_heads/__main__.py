from experiments.harness import main

main("medusa_heads")
