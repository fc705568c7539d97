# RLOO (REINFORCE leave-one-out, Ahmadian et al. 2024): baseline = mean of the other G-1 rewards,
# one on-policy step per batch (ratio = 1: plain REINFORCE, clipping never acts), the sequence's
# summed log-prob (scaled by the constant 1/L_max), KL folded into the reward (k1, unbiased).
#   python train.py --algo grpo config/rloo.py --init_from=out/sft
algo = "grpo"
estimator = "rloo"
loss_agg = "seq_mean_token_sum_norm"
kl = "k1_reward"
kl_coef = 0.01
on_degenerate = "zeros"         # the leave-one-out advantage is already 0 there
minibatches = 1                  # one on-policy step per rollout batch
