from experiments.harness import main

main("moe_balance")
