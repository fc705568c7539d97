# A teacher for on-policy distillation (opd.py, experiments/distill.py): a larger model than the
# default student (6 layers × 192 vs 4 × 128: 2.8 M vs 0.85 M parameters), the same byte tokenizer,
# SFT from scratch on worked demonstrations only (env_direct_frac=0: every demonstration writes its
# steps), then GRPO. A one-time preparation:
#   python train.py config/teacher.py --out_dir=out/teacher_sft                           # 6.3 min on 2 idle cores
#   python train.py --algo grpo --init_from=out/teacher_sft --out_dir=out/teacher --max_iters=10 --eval_interval=5
# Measured on 2026-12-03 (docs/log.md): greedy held-out accuracy 0.97 after SFT, 0.96 after the 10 GRPO
# iterations (200 problems, ± 3): saturated. A snapshot after 500 SFT iterations scores 0.65 (200
# problems) and 0.632 (500; docs/distillation.md).
algo = "sft"
n_layer, n_head, n_embd = 6, 6, 192
env_direct_frac = 0.0
max_iters = 1000
learning_rate, min_lr = 1e-3, 1e-4
eval_interval = 250
out_dir = "out/teacher_sft"
