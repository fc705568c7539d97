# CISPO (MiniMax-M1, 2025): the importance weight is clipped and detached, the token kept:
# loss_it = -sg(clip(ρ_it, 1 - eps_low, 1 + eps_high)) * A_i * log π_θ(y_it), so a rare token whose ratio
# ran past the band still gets a gradient (PPO's clip would drop it). The paper sets no lower bound
# (eps_low = 1: the weight's floor is 0) and tunes only the upper one; 0.28 here, DAPO's Clip-Higher
# value. Token-level loss, group-normalised advantages, no KL term, 4 minibatches per rollout batch
# (at one step per batch ρ = 1 and CISPO is plain REINFORCE with A_i).
#   python train.py --algo grpo config/cispo.py --init_from=out/sft
algo = "grpo"
estimator = "grpo"
policy_loss = "cispo"
loss_agg = "token_mean"
eps_low, eps_high = 1.0, 0.28
kl = "off"
minibatches = 4
