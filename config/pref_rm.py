# A reward model on a preference set in TRL's conversational form with an implicit prompt
# (trl-lib/ultrafeedback_binarized: "chosen" and "rejected" are whole conversations that share
# their first messages), rendered through the checkpoint's own chat template (pairs.py).
#   python train.py config/pref_rm.py            # then config/pref_dpo.py, or --algo ppo_rm
algo = "rm"
data = "trl-lib/ultrafeedback_binarized"
init_from = "Qwen/Qwen2.5-0.5B-Instruct"
tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
block_size = 1024
skip_bad_rows = True      # a conversation longer than block_size is skipped and counted, not an error
heldout_prompts = 512
batch_size = 2
gradient_accumulation_steps = 16
learning_rate, min_lr, warmup_iters = 1e-5, 1e-6, 20
weight_decay = 0.0
max_iters = 500
eval_interval, eval_batch_size = 100, 16
out_dir = "out/pref_rm"
