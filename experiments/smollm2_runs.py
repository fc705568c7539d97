"""
SmolLM2-135M-Instruct post-trained by the recipes of config/smollm2_*.py, seed by seed, every stage measured
on the same held-out problems and joined into one record that later runs extend (docs/smollm2.md).

THE STAGES, fixed here before any run (each a recipe as written, evaluated once, at its last iteration):

    sft_lora     config/smollm2_sft.py                  LoRA r=16, 60 steps of 16 conversations, from the GGUF model
    grpo_lora    config/smollm2_grpo.py                 LoRA, 15 iterations of 8 prompts × 8 answers, from sft_lora
    dpo_lora     config/smollm2_dpo.py                  LoRA, 32 steps of 16 verifier pairs, from sft_lora
    sft_full     the SFT recipe, every weight trained    --lora_rank=0 --learning_rate=2e-5 --min_lr=2e-6
    grpo_full    the GRPO recipe, every weight trained   --lora_rank=0 --learning_rate=2e-5 --min_lr=2e-5, from sft_full
    sft_gsm8k    the SFT recipe on GSM8K-format rows     --env=gsm8k --env_data=arithmetic (rows the project writes) --max_new_tokens=96
    grpo_gsm8k   the GRPO recipe on the same rows        --max_new_tokens=96, from sft_gsm8k

(full fine-tuning at a tenth of LoRA's rate: LoRA's usual factor, docs/menu.md's LoRA without regret; the
GSM8K-format answers, worked steps with <<a+b=c>> and "#### n", are 69 to 85 tokens in SmolLM2's tokenizer, so
96 new tokens where the recipes' 48 cut every one short: the first try, on docs/smollm2.md.) A
chain (--chains) is the stages that start from one another: lora, dpo, full, gsm8k.

THE RULES:
- The start: the GGUF model itself, greedy, measured once per task (its answers do not depend on a seed).
- Evaluation: greedy accuracy on the first 200 held-out and 200 OOD problems of the task (the recipes' own
  evaluation; the GSM8K-format rows have no OOD split), and each held-out verdict kept.
- A stage's lift: its held-out verdicts minus its start's (the GGUF model for an SFT stage, the seed's SFT
  stage for GRPO and DPO), paired on the same problems: one seed, bands.paired; several,
  bands.paired_across_seeds floored by the seeds' paired bands (the project's band rule). A lift is
  claimed only where its band lies wholly above 0.
- Accuracy over seeds: bands.cell (one seed: its binomial band; two: both values; three: the t band).
- Slips: held-out answers with a written step whose arithmetic is wrong (a ± b = c where c is not a ± b): where
  a worked answer goes wrong in the arithmetic rather than the plan.
- Cost: seconds per iteration (the loop's iter_time, the update and its sampling, no evaluation), trained
  tokens per iteration, and the stage's wall minutes (loading, training, evaluation and checkpoint).
- Seeds 0, 1 and 2.

    python experiments/smollm2_runs.py --chains=lora --seeds=0                # one chain, one seed (17 min on 2 idle cores, and the untrained model's evaluation once)
    python experiments/smollm2_runs.py --join=docs/smollm2_runs.json --chains=dpo --seeds=1   # the record's runs, and more
    python experiments/smollm2_runs.py --report --join=docs/smollm2_runs.json # the table, transcripts and figure again
    python experiments/smollm2_runs.py --quick --model=tiny.gguf             # toy sizes on any GGUF file (the test)

A stage whose run finished in --out is read, not run again. Writes results.json, smollm2_runs.md (the table
and the transcripts) and smollm2_runs.png (held-out accuracy by stage) into --out after every stage.
"""

import argparse
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from nanopost.options import parse_args  # noqa: E402
from experiments.study import finished, pyplot, rows, run, save_figure, save_study  # noqa: E402

GSM8K = dict(env="gsm8k", env_data="arithmetic", max_new_tokens=96)
STAGES = {  # name: (recipe, its overrides, the stage it starts from: None is the GGUF model)
    "sft_lora": ("smollm2_sft", {}, None),
    "grpo_lora": ("smollm2_grpo", {}, "sft_lora"),
    "dpo_lora": ("smollm2_dpo", {}, "sft_lora"),
    "sft_full": ("smollm2_sft", dict(lora_rank=0, learning_rate=2e-5, min_lr=2e-6), None),
    "grpo_full": ("smollm2_grpo", dict(lora_rank=0, learning_rate=2e-5, min_lr=2e-5), "sft_full"),
    "sft_gsm8k": ("smollm2_sft", GSM8K, None),
    "grpo_gsm8k": ("smollm2_grpo", GSM8K, "sft_gsm8k"),
}
CHAINS = {"lora": ("sft_lora", "grpo_lora"), "dpo": ("sft_lora", "dpo_lora"),
          "full": ("sft_full", "grpo_full"), "gsm8k": ("sft_gsm8k", "grpo_gsm8k")}
QUICK = dict(max_iters=1, warmup_iters=0, env_ops=1, eval_problems=2, eval_batch_size=2, max_new_tokens=8, batch_size=2,
             gradient_accumulation_steps=1, train_problems=8, val_examples=2, prompts_per_iter=2, group_size=2,
             train_prompts=4, heldout_prompts=2)
SHOWN = 4  # transcripts kept per stage: the first held-out questions


def task(stage):
    return "gsm8k" if STAGES[stage][1].get("env") == "gsm8k" else "arithmetic"


def first_stage(task_name):
    """The task's first SFT stage: the one whose keys measure the GGUF model on that task."""
    return next(name for name, (_, _, source) in STAGES.items() if source is None and task(name) == task_name)


def stage_config(name, args, init_from):
    """The train.py keys of one stage: its recipe, its overrides, evaluated once at the end."""
    recipe, overrides, _ = STAGES[name]
    cfg = dict(parse_args([os.path.join(ROOT, "config", f"{recipe}.py")]), **overrides, init_from=init_from,
               tokenizer=args.model, plot=False, eval_at_start=False)
    cfg.update(QUICK if args.quick else {})
    cfg["eval_interval"] = cfg["max_iters"]
    return cfg


STEP = re.compile(r"([0-9]+)\s*([+-])\s*([0-9]+)\s*=\s*(-?[0-9]+)")  # a written step, "6-2=4" (GSM8K's "<<6-2=4>>" holds one)


def slipped(response):
    """True when one of the answer's written steps has its arithmetic wrong: a ± b = c with c not a ± b."""
    return any(int(c) != (int(a) + int(b) if sign == "+" else int(a) - int(b)) for a, sign, b, c in STEP.findall(response))


def measured(out_dir, minutes=None):
    """A finished run's figures: its last evaluation, its held-out verdicts (a string of 0s and 1s, in the
    problems' order), how many held-out answers slipped in a step's arithmetic, its cost, and its first answers."""
    logged = rows(out_dir)
    evaluation = [r for r in logged if "heldout_acc" in r][-1]
    steps = [r for r in logged if "iter_time" in r]
    with open(os.path.join(out_dir, "answers.jsonl")) as f:
        answers = [json.loads(line) for line in f][-1]["answers"]
    return dict(heldout_acc=evaluation["heldout_acc"], ood_acc=evaluation.get("ood_acc"),
                heldout_len=evaluation["heldout_len"], heldout_work=evaluation["heldout_work"],
                verdicts="".join(str(int(a["verdict"])) for a in answers),
                slips=sum(slipped(a["response"]) for a in answers),
                seconds_per_iter=sum(r["iter_time"] for r in steps) / len(steps) if steps else None,
                tokens_per_iter=steps[-1]["train_tokens"] / steps[-1]["iter"] if steps else None, minutes=minutes,
                transcripts=[dict(prompt=a["prompt"], response=a["response"], verdict=a["verdict"]) for a in answers[:SHOWN]])


def train_stage(cfg, out_dir):
    """out_dir's figures, its run made first unless it finished there with these keys."""
    if finished(out_dir, cfg, "heldout_acc"):
        return measured(out_dir)
    started = time.time()
    run(dict(cfg, out_dir=out_dir, overwrite=True))
    return measured(out_dir, minutes=(time.time() - started) / 60)


def measure_start(name, args):
    """The GGUF model's own greedy figures on a stage's task: the task's first SFT stage with no iteration,
    evaluated at 0 (that stage's keys, whichever chain asks: a rate or a LoRA rank changes no answer of
    the untrained model, so every chain reads the one run)."""
    cfg = dict(stage_config(first_stage(task(name)), args, args.model), max_iters=0, eval_at_start=True, checkpoint=False)
    cfg["eval_interval"] = 1
    return train_stage(cfg, os.path.join(args.out, f"start_{task(name)}"))


def stage(name, seed, args, record):
    """One seed's stage: its figures and its start's verdicts, its run made in --out unless it finished
    there. Its start first: the GGUF model (measured once per task, kept in the record), or the stage it
    starts from, read from --out or made again (another machine: its lift is over the start it had)."""
    source = STAGES[name][2]
    if source:
        start, init_from = stage(source, seed, args, record), os.path.join(args.out, f"seed{seed}", source)
    else:
        if task(name) not in record["starts"]:
            record["starts"][task(name)] = measure_start(name, args)
        start, init_from = record["starts"][task(name)], args.model
    cfg = dict(stage_config(name, args, init_from), seed=int(seed))
    return dict(train_stage(cfg, os.path.join(args.out, f"seed{seed}", name)), start_verdicts=start["verdicts"])


def difference(verdicts, others):
    """(mean, half-width) of one string of held-out verdicts minus another, paired on the same problems."""
    return bands.paired([int(v) for v in verdicts], [int(v) for v in others])


def lift(result):
    """A stage's held-out verdicts minus its start's."""
    return difference(result["verdicts"], result["start_verdicts"])


def seeds_cell(pairs):
    """Paired differences, one (mean, half-width) per seed, as a cell: one seed's signed band; several, the
    seeds' band floored by theirs (bands.paired_cell)."""
    if len(pairs) == 1:
        return bands.signed(*pairs[0])
    return bands.paired_cell([m for m, _ in pairs], [h for _, h in pairs])


def join(record, path):
    """Another record's finished stages read into `record` (a run kept first where both have one). Its figures
    must rest on the stages as defined here: the stages it holds, the stages they start from, and each start's
    first SFT stage (a stage it never ran may have changed since)."""
    with open(path) as f:
        other = json.load(f)
    mine, theirs = record["settings"], other["settings"]
    for key in ("model", "quick"):
        if theirs[key] != mine[key]:
            sys.exit(f"error: {path} holds runs with {key}={theirs[key]}, not {mine[key]}; join only equal settings")
    used = {first_stage(name) for name in other["starts"]}
    for stages in other["seeds"].values():
        for name in stages:
            while name:
                used.add(name)
                name = STAGES[name][2]
    for name in sorted(used):
        if theirs["stages"].get(name) != mine["stages"][name]:
            sys.exit(f"error: {path} ran {name} as {theirs['stages'].get(name)}, defined here as {mine['stages'][name]};"
                     " join only runs of the stages as defined")
    for key, value in other["starts"].items():
        record["starts"].setdefault(key, value)
    for seed, stages in other["seeds"].items():
        for name, result in stages.items():
            record["seeds"].setdefault(seed, {}).setdefault(name, result)


def stage_rows(record):
    """{stage: [(seed, its result)]} over the record, in STAGES' order."""
    table = {}
    for name in STAGES:
        for seed, stages in sorted(record["seeds"].items()):
            if name in stages:
                table.setdefault(name, []).append((seed, stages[name]))
    return table


def table(record):
    n = len(next(iter(record["starts"].values()))["verdicts"]) if record["starts"] else 0
    lines = [f"Greedy accuracy on the first {n} held-out and OOD problems; lift: held-out verdicts minus the stage's "
             "start's on the same problems, paired (one seed: its per-problem band; two: both values; three: the "
             "seeds' t band floored by their per-problem bands).", "",
             "| stage | seeds | held-out | OOD | lift over its start | answers with a slip | s / iteration | "
             "trained tokens / iteration | minutes |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, start in record["starts"].items():
        ood = bands.cell([start["ood_acc"]], n) if start["ood_acc"] is not None else "(none)"
        minutes = f"{start['minutes']:.1f}" if start["minutes"] is not None else ""
        lines.append(f"| the GGUF model ({key}) | | {bands.cell([start['heldout_acc']], n)} | {ood} | | {slips([start])} "
                     f"| | | {minutes} |")
    for name, entries in stage_rows(record).items():
        seeds = ", ".join(seed for seed, _ in entries)
        results = [r for _, r in entries]
        gain = seeds_cell([lift(r) for r in results])
        ood = [r["ood_acc"] for r in results if r["ood_acc"] is not None]
        cost = [f"{sum(vals) / len(vals):.1f}" if vals else "" for vals in
                ([r[k] for r in results if r[k] is not None] for k in ("seconds_per_iter", "tokens_per_iter", "minutes"))]
        lines.append(f"| {name} | {seeds} | {bands.cell([r['heldout_acc'] for r in results], n)} | "
                     f"{bands.cell(ood, n) if ood else '(none)'} | {gain} | {slips(results)} | {' | '.join(cost)} |")
    lines += rivals(record)
    lines += ["", "The first held-out questions, greedy answers (the first seed of each stage):", ""]
    for key, start in record["starts"].items():
        for i, shown in enumerate(start["transcripts"]):
            lines.append(f"    [{key}] {shown['prompt']}")
            lines.append(f"      the GGUF model -> {shown['response']!r} ({shown['verdict']:.0f})")
            for name, entries in stage_rows(record).items():
                if task(name) == key:
                    answer = entries[0][1]["transcripts"][i]
                    lines.append(f"      {name} -> {answer['response']!r} ({answer['verdict']:.0f})")
    return "\n".join(lines) + "\n"


def slips(results):
    """Each seed's count of held-out answers with a slipped step (a record made before it was counted: blank)."""
    return ", ".join(str(r["slips"]) for r in results if r.get("slips") is not None)


def rivals(record):
    """Lines comparing two stages of one task that start from the same place (GRPO and DPO from one SFT; LoRA
    and full SFT from the GGUF model): the first's held-out verdicts minus the second's, paired on the same
    problems in each seed where both ran."""
    lines, by_stage = [], stage_rows(record)
    names = list(by_stage)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            if STAGES[first][2] != STAGES[second][2] or task(first) != task(second):
                continue
            other = dict(by_stage[second])
            seeds = [seed for seed, _ in by_stage[first] if seed in other]
            if seeds:
                ours = dict(by_stage[first])
                gain = seeds_cell([difference(ours[seed]["verdicts"], other[seed]["verdicts"]) for seed in seeds])
                lines.append(f"{first} minus {second}, both from {STAGES[first][2] or 'the GGUF model'}, paired on the "
                             f"same held-out problems (seeds {', '.join(seeds)}): {gain}")
    return [""] + lines if lines else []


def plot(record, path):
    """Held-out accuracy by stage: the seeds' mean with its band (or range), each seed a dot."""
    bars = [(f"start ({key})", [start]) for key, start in record["starts"].items()]
    bars += [(name, [r for _, r in entries]) for name, entries in stage_rows(record).items()]
    fig, ax = pyplot().subplots(figsize=(1.2 * len(bars) + 2.4, 3.6))
    for x, (name, results) in enumerate(bars):
        values = [r["heldout_acc"] for r in results]
        mean, low, high = bands.envelope(values, len(results[0]["verdicts"]))
        ax.bar(x, mean, color="#cccccc" if name.startswith("start") else "#8fb3d9")
        ax.errorbar(x, mean, yerr=[[mean - low], [high - mean]], color="black", capsize=4)
        ax.plot([x] * len(values), values, "k.", alpha=0.6)
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], rotation=30, ha="right")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("SmolLM2-135M-Instruct: the recipes' stages")
    save_figure(fig, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chains", default="lora", help=f"comma-separated, from {', '.join(CHAINS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--model", default="smollm2", help="the GGUF model: smollm2 (the pip package's file) or a path")
    parser.add_argument("--out", default="out/smollm2_runs")
    parser.add_argument("--join", default="", help="comma-separated records (results.json) whose stages are read in")
    parser.add_argument("--report", action="store_true", help="no training: the table and the figure from the records")
    parser.add_argument("--quick", action="store_true", help="toy sizes, for a smoke test (numbers mean nothing)")
    args = parser.parse_args(argv)
    for chain in args.chains.split(","):
        if chain not in CHAINS:
            sys.exit(f"error: --chains={chain}: no such chain; choose from {', '.join(CHAINS)}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    record = dict(settings=dict(model=args.model, quick=args.quick, stages=STAGES), starts={}, seeds={})
    record = json.loads(json.dumps(record))  # (tuples as JSON has them: a record read back compares equal)
    for other in filter(None, [path if os.path.isfile(path) else "", *args.join.split(",")]):
        join(record, other)

    def save():
        save_study(args.out, "smollm2_runs", record, table, plot)

    if args.report:
        return save()
    for seed in args.seeds.split(","):
        for chain in args.chains.split(","):
            for name in CHAINS[chain]:
                stages = record["seeds"].setdefault(seed, {})
                if name not in stages:
                    stages[name] = stage(name, seed, args, record)
                    save()


if __name__ == "__main__":
    main()
