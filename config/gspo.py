# GSPO (Group Sequence Policy Optimization, Zheng et al. 2025): one importance ratio per response,
# s_i = exp(mean_t log(π_θ/π_old)), clipped per response with the paper's range [1 - 3e-4, 1 + 4e-4]
# (a mean of token log-ratios moves far less than one token's, hence a band ~500x narrower than
# GRPO's 0.2); group-normalised advantages, per-response token mean, no KL term; the rollout batch
# split into 4 minibatches (the paper's off-policy setting: at one step per batch s_i = 1 and the
# ratio does nothing).
#   python train.py --algo grpo config/gspo.py --init_from=out/sft
algo = "grpo"
estimator = "grpo"
ratio_level = "sequence"
loss_agg = "seq_mean_token_mean"
eps_low, eps_high = 3e-4, 4e-4
kl = "off"
minibatches = 4
