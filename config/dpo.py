# Preference tuning of the SFT model on the built-in task (a few CPU minutes):
#   python train.py --algo dpo config/dpo.py --init_from=out/sft --loss=dpo   # ipo | kto | simpo | orpo
# Offline pairs are a small, fixed set: a gentle learning rate and a few epochs, far below SFT's 2e-3.
learning_rate = 1e-4
min_lr = 1e-5
warmup_iters = 10
max_iters = 150
batch_size = 32
eval_interval = 50
eval_problems = 200
