# CISPO (MiniMax-M1, 2025): the importance weight is clipped and detached, the token kept:
# loss_it = -sg(clip(ρ_it, 1 - clip_eps, 1 + clip_eps_high)) * A_i * log π_θ(y_it), so a rare token whose
# ratio ran past the band still gets a gradient (PPO's clip would drop it). The paper sets no lower bound
# (clip_eps = 1: the weight's floor is 0) and tunes only the upper one; 0.28 here, DAPO's Clip-Higher
# value. Group-normalised advantages, no KL term, 4 minibatches per rollout batch (at one step per batch
# ρ = 1 and CISPO is plain REINFORCE with A_i). lab/cispo.py.
#   python train.py config/cispo.py --init_from=out/sft
algo = "cispo"
clip_eps, clip_eps_high = 1.0, 0.28
kl_coef = 0.0
minibatches = 4
