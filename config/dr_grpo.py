# Dr. GRPO ("Understanding R1-Zero-like training"): group mean without the std, a constant loss
# denominator G * L_max (L_max = max_new_tokens) instead of each response's length, no KL term.
#   python train.py --algo grpo config/dr_grpo.py --init_from=out/sft
algo = "grpo"
estimator = "dr_grpo"
loss_agg = "seq_mean_token_sum_norm"
eps_low, eps_high = 0.2, 0.2
kl = "off"
on_degenerate = "zeros"         # r - mean is already 0 there
