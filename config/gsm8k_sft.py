# GSM8K SFT of a small Llama-family checkpoint on the dataset's worked solutions ("... #### 72"),
# through the model's own tokenizer and chat template (the network once; the optional transformers
# and datasets packages). The first step of docs/llama.md's recipe: SFT, then config/gsm8k_grpo.py
# or config/gsm8k_ppo.py from out/gsm8k_sft.
#   python train.py config/gsm8k_sft.py
# One epoch of the 7,473 train rows (117 steps of 64); evaluation: greedy accuracy on all 1,319
# test rows (the "heldout" split), the figure verl's and Qwen's tables report.
algo = "sft"
env = "gsm8k"
env_data = "openai/gsm8k:main"
init_from = "Qwen/Qwen2.5-0.5B-Instruct"
tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
block_size = 512
train_problems = 7473
batch_size = 4                    # 4 x 16 = 64 conversations a step; 4 keeps the 151,936-wide logits
gradient_accumulation_steps = 16  # of a micro-batch near 4 GiB (docs/llama.md, memory)
max_iters = 117
learning_rate, min_lr, warmup_iters = 1e-5, 1e-6, 10
weight_decay = 0.0
val_examples = 256
eval_interval, eval_problems, eval_batch_size = 117, 1319, 64
max_new_tokens = 512
out_dir = "out/gsm8k_sft"
