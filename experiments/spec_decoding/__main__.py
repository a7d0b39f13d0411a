from experiments.harness import main

main("spec_decoding")
