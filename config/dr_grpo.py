# Dr. GRPO ("Understanding R1-Zero-like training"): group mean without the std, a constant loss
# denominator G * L_max (L_max = max_new_tokens) instead of each response's length, no KL term (lab/dr_grpo.py).
#   python train.py config/dr_grpo.py --init_from=out/sft
algo = "dr_grpo"
clip_eps = 0.2
kl_coef = 0.0
