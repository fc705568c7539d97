# GRPO with LoRA of SmolLM2-135M-Instruct on the arithmetic task in chat form, from the LoRA SFT
# checkpoint of config/smollm2_sft.py (the instruct model alone never writes the "Answer: N" the
# verifier rewards, so every group would score 0 and carry no signal: docs/smollm2.md).
#   python train.py config/smollm2_sft.py && python train.py config/smollm2_grpo.py
#   python train.py config/smollm2_grpo.py --device=cuda                                  # a GPU (bf16 autocast)
# 64 rollouts an iteration (8 prompts x 8 answers of at most 48 tokens, 29 s on 2 idle cores: docs/smollm2.md,
# which has its lifts, seed by seed); greedy held-out accuracy at 0 and 15.
algo = "grpo"
init_from = "out/smollm2_sft"
tokenizer = "smollm2"
block_size = 256
lora_rank = 16
prompts_per_iter, group_size = 8, 8
batch_size = 16                   # answers per micro-batch of the update
max_new_tokens = 48
temperature = 1.0
kl_coef = 0.04
learning_rate, min_lr, warmup_iters = 2e-4, 2e-4, 2
max_iters = 15
eval_interval, eval_problems, eval_batch_size = 15, 200, 50
eval_samples = 0
out_dir = "out/smollm2_grpo"
