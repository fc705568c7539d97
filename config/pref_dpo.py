# DPO on the same conversational preference set as config/pref_rm.py (implicit prompt, the
# checkpoint's own chat template), from the instruct model.
#   python train.py config/pref_dpo.py
algo = "dpo"
beta = 0.1
data = "trl-lib/ultrafeedback_binarized"
init_from = "Qwen/Qwen2.5-0.5B-Instruct"
tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
block_size = 1024
skip_bad_rows = True      # a conversation longer than block_size is skipped and counted, not an error
heldout_prompts = 512
batch_size = 2
gradient_accumulation_steps = 16
learning_rate, min_lr, warmup_iters = 5e-7, 5e-7, 20
weight_decay = 0.0
max_iters = 500
eval_interval, eval_batch_size = 100, 16
out_dir = "out/pref_dpo"
