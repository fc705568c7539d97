# GSPO (Group Sequence Policy Optimization, Zheng et al. 2025): one importance ratio per response,
# s_i = exp(mean_t log(π_θ/π_old)), clipped per response with a band ~500x narrower than GRPO's 0.2 (a mean
# of token log-ratios moves far less than one token's); group-normalised advantages, per-response token
# mean, no KL term; the rollout batch split into 4 minibatches (the paper's off-policy setting: at one step
# per batch s_i = 1 and the ratio does nothing). lab/gspo.py.
#   python train.py config/gspo.py --init_from=out/sft
algo = "gspo"
clip_eps = 3e-4
kl_coef = 0.0
minibatches = 4
