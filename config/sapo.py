# SAPO (soft adaptive policy optimisation, Qwen 2025; TRL's loss_type="sapo"): the clip replaced by a soft
# gate (4/τ)·σ(τ(ρ - 1))·A, whose gradient weight falls smoothly as ρ leaves 1, faster for negative
# advantages (τ_neg = 1.05 > τ_pos = 1.0); group-normalised advantages, no KL term (lab/sapo.py).
#   python train.py config/sapo.py --init_from=out/sft
algo = "sapo"
sapo_tau_pos, sapo_tau_neg = 1.0, 1.05
kl_coef = 0.0
