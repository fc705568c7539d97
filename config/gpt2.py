# GPT-2 (124M) SFT on a real instruction dataset, on GPUs (needs the network once, and the optional
# transformers package for the weights): GPT-2's weights and BPE (tiktoken), the chat template's
# special tokens appended to its vocabulary, and HuggingFaceH4/no_robots (9.5k human-written
# instruction/answer conversations, {"messages": [{"role", "content"}, ...]}) through `datasets`.
#   python train.py config/gpt2.py                                      # one GPU
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py    # eight (NCCL)
# A step is 16 conversations x 4 accumulation steps per rank (64 on one GPU: 300 steps are about
# 2 epochs of the 9.5k rows; on eight GPUs divide max_iters by 8). Conversations longer than
# block_size are skipped and counted. Not run in CI: tests/test_gpt2.py trains this config offline
# with a tiny local GPT-2, a local GPT-2-format tokenizer and a local copy of the data layout.
algo = "sft"
init_from = "gpt2"
tokenizer = "gpt2"
data = "HuggingFaceH4/no_robots"
skip_bad_rows = True      # a row longer than block_size is skipped and counted, not an error
block_size = 512
batch_size = 16
gradient_accumulation_steps = 4
max_iters = 300
learning_rate, min_lr, warmup_iters = 3e-5, 3e-6, 50
weight_decay = 0.0
dropout = 0.0
val_examples = 256
eval_interval, eval_batch_size, log_interval = 100, 32, 10
compile = True
out_dir = "out/gpt2_sft"
