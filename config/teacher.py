# A teacher for on-policy distillation (opd.py): twice as deep and wide as the default student
# (8 layers × 256 vs 4 × 128), SFT on the same task with the same byte tokenizer, then GRPO:
#   python train.py config/teacher.py
#   python train.py --algo grpo config/grpo.py --init_from=out/teacher_sft --out_dir=out/teacher --max_iters=100
# Untuned guesses (a larger model, a lower lr, more steps); check heldout_acc is clearly above the student's.
algo = "sft"
n_layer, n_head, n_embd = 8, 8, 256
max_iters = 1500
learning_rate, min_lr = 1e-3, 1e-4
out_dir = "out/teacher_sft"
