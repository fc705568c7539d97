# GRPO (DeepSeekMath): group mean / population-std advantages, per-response token mean then mean over
# responses, symmetric clipping, k3 KL to the reference as a separate loss term (β = 0.04): grpo.py's defaults.
#   python train.py config/grpo.py --init_from=out/sft
algo = "grpo"
clip_eps = 0.2
kl_coef = 0.04
