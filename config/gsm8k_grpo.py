# GRPO on GSM8K from a small Llama-family checkpoint: prompts and reference answers from the
# dataset (envs/gsm8k.py), reward 1 when the number after the response's last "####" is the
# reference's. From the instruct model directly (it already answers), or from config/gsm8k_sft.py's
# out/gsm8k_sft. docs/llama.md gives the memory table and the published baselines.
#   python train.py config/gsm8k_grpo.py                                  # full fine-tuning
#   python train.py config/gsm8k_grpo.py --lora_rank=32 --learning_rate=2e-5 --min_lr=2e-5   # LoRA
# 20 iterations of 32 prompts x 8 answers (640 train problems); greedy accuracy on the 1,319 test rows.
algo = "grpo"
env = "gsm8k"
env_data = "openai/gsm8k:main"
init_from = "Qwen/Qwen2.5-0.5B-Instruct"
tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
block_size = 1024
max_new_tokens = 512
prompts_per_iter, group_size = 32, 8
batch_size = 4            # responses per micro-batch: the memory table in docs/llama.md is for 4
temperature = 1.0
kl_coef = 0.001
learning_rate, min_lr, warmup_iters = 1e-6, 1e-6, 0
max_iters = 20
eval_interval, eval_problems, eval_batch_size = 10, 1319, 128
eval_samples = 0          # pass@k on 1,319 problems x k long answers: off for the short run
out_dir = "out/gsm8k_grpo"
