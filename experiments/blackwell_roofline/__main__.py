from experiments.harness import main

main("blackwell_roofline")
