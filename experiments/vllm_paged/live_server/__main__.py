from experiments.harness import main

main("vllm_paged.live_server")
