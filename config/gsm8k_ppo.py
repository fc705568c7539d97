# PPO on GSM8K (RLVR: the verifier's reward, a critic started from the policy), the same prompts,
# answers and evaluation as config/gsm8k_grpo.py.
#   python train.py config/gsm8k_ppo.py
algo = "ppo"
env = "gsm8k"
env_data = "openai/gsm8k:main"
init_from = "Qwen/Qwen2.5-0.5B-Instruct"
tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
block_size = 1024
max_new_tokens = 512
prompt_pool = 7473
batch_size = 4
gradient_accumulation_steps = 8
minibatches = 4           # 4 x 8 x 4 = 128 rollouts an iteration; policy + critic: LoRA on a 24 GB GPU
learning_rate, min_lr, warmup_iters = 1e-6, 1e-6, 0
kl_coef = 0.001
max_iters = 20
eval_interval, eval_problems, eval_batch_size = 10, 1319, 128
eval_samples = 0          # sampled figures on 1,319 problems x 8 long answers: off for the short run
out_dir = "out/gsm8k_ppo"
