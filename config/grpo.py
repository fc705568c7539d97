# GRPO (DeepSeekMath): group mean / population-std advantages, per-response token mean then mean over
# responses, symmetric clipping, k3 KL to the reference as a separate loss term (β = 0.04).
#   python train.py --algo grpo config/grpo.py --init_from=out/sft
algo = "grpo"
estimator = "grpo"
loss_agg = "seq_mean_token_mean"
eps_low, eps_high = 0.2, 0.2
kl = "k3_loss"
kl_coef = 0.04
on_degenerate = "zeros"         # (r - mean) / std is 0/0 there: zero advantage, still counted
