# RLOO (REINFORCE leave-one-out, Ahmadian et al. 2024): baseline = mean of the other G-1 rewards, no std,
# one on-policy step per batch (ratio = 1: plain REINFORCE, clipping never acts), grpo's loss and KL term
# (lab/rloo.py; the KL in the reward instead: --algo kl_reward).
#   python train.py config/rloo.py --init_from=out/sft
algo = "rloo"
minibatches = 1                  # one on-policy step per rollout batch
