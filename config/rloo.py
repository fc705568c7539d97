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
prompts_per_iter, group_size = 16, 8
inner_epochs, minibatches = 1, 1
learning_rate, min_lr, warmup_iters = 1e-4, 1e-4, 0
max_iters, eval_interval, log_interval = 100, 25, 1
