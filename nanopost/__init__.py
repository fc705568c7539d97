"""
The machinery every algorithm shares, one module per concern; it never imports an algorithm, the lab
or an entry point (tests/test_layout.py):

    options       configuration: the shared keys, --key=value and config files, range checks, renamed keys
    usage         --help: every option the run can use, with its value and the comment beside its key
    resume        init_from=resume: the checkpoint a run continues, its config in this version's spelling
    distributed   devices, ranks, DDP and FSDP2, the collectives the algorithms call
    checkpoints   atomic checkpoints, exact resume, the frozen models (reference, teacher, reward model)
    run_dir       the files a run writes beside its checkpoint
    data          data files and their rows, the environment a run trains on
    tokenizer     the byte-level tokenizer, GPT-2's, a checkpoint's own; the chat template and its loss mask
    hf            transformers checkpoints in and out (GPT-2, Llama, Qwen2, Qwen3)
    rollouts      the one path from prompts to verified responses (sample, verify, mask)
    rollout_figures  what a GRPO run logs about its groups of rollouts every iteration
    evaluation    the one policy evaluation; metrics.jsonl read back and plotted
    rewards       the reward modes the RL algorithms share (process, RLVP), a vector reward's weights
    judge         a generative reward model: its judgements, the verdict's probability
    pairs         preference pairs: from files, or built from a policy's samples
    passports     every algorithm's passport, and the verifier's own error rate
    monitors      the alarms that read every run's log
    bands         the one band rule: a run's binomial band, t·SE across seeds, paired differences
"""
