# DPO with LoRA of SmolLM2-135M-Instruct on the arithmetic task in chat form, from the LoRA SFT checkpoint of
# config/smollm2_sft.py: verifier pairs of its own answers (4 sampled per prompt at T = 1, a right one
# chosen over a wrong one; the worked demonstration stands in as chosen where none is right, nanopost/pairs.py).
#   python train.py config/smollm2_sft.py && python train.py config/smollm2_dpo.py
#   python train.py config/smollm2_dpo.py --device=cuda           # a GPU (bf16 autocast)
# The pairs cost (256 + 64) x 4 sampled answers at setup; then 32 steps of 16 pairs, two passes over them.
algo = "dpo"
init_from = "out/smollm2_sft"
tokenizer = "smollm2"
block_size = 256
lora_rank = 16
train_prompts, heldout_prompts, group_size = 256, 64, 4
max_new_tokens = 48
beta = 0.1
batch_size = 8
gradient_accumulation_steps = 2   # 16 pairs a step
max_iters = 32
learning_rate, min_lr, warmup_iters = 1e-4, 1e-5, 3   # LoRA's rate (SFT's is 1e-3, GRPO's 2e-4)
weight_decay = 0.0
eval_interval, eval_problems, eval_batch_size = 32, 200, 50
out_dir = "out/smollm2_dpo"
