"""
The post-training ladder in one command: pretrain → SFT → RM, DPO, PPO, GRPO, RFT, OPD, OPSD, and
the agentic branch (SFT then GRPO with a calculator tool), each stage a plain `python train.py ...`
run (printed, so you can type it yourself) from the right checkpoint, then an evaluation of every
stage and one report, OUT_ROOT/report.md, and in the browser OUT_ROOT/report.html (report.py: every
stage's held-out answers side by side, each stage's own report with its samples token by token).

    python ladder.py                                   # everything, into out/pretrain, out/sft, ...
    python ladder.py --out_root=runs/a --device=cuda   # any --key=value goes to every stage
    python ladder.py --grpo.learning_rate=1e-4         # --STAGE.key=value goes to one stage
    python ladder.py --stages=sft,grpo                 # run a subset (the report covers every stage found)
    python ladder.py --redo=grpo                        # run grpo again; --redo=sft,grpo or --redo=all
    python ladder.py --seeds=3                          # the whole ladder with 3 seeds: mean and band
    python ladder.py --help                             # the options and the stages

A stage is done when OUT_ROOT/STAGE/ladder.json exists and its ckpt.pt is the one the stage wrote:
ladder.json is written after the stage's run succeeded (its command, wall time and the checkpoint's
checksum) and deleted when a run starts. A done stage is skipped; one whose ckpt.pt another run
rewrote is said so and run again (each stage runs with --overwrite=True: its directory is the ladder's). Redoing a stage
does not redo the stages after it (a tuning loop reruns one stage at a time); the ladder then notes
which later stages started from an older checkpoint, so name them too (--redo=sft,rm,dpo) to refresh.
A stage that fails stops the ladder with its error; every finished stage is kept and reported.

Every language-model stage is evaluated on the environment after the runs (cached in
OUT_ROOT/STAGE/ladder_eval.json until the stage or the SFT stage is redone or the settings change):
(evaluation.evaluate_policy) greedy and sampled (T = 1) held-out accuracy, pass@k (Best-of-k by the verifier), OOD accuracy,
sampled length, the share of answers that show their work, and the KL to the SFT model of the
stage's task (sft, or calc_sft for the calculator branch) on the stage's own samples. The reward
model reports its held-out pair accuracy from its metrics.jsonl.
"""

import ast
import codecs
import json
import os
import shlex
import subprocess
import sys
import time

# OpenMP's waiting threads sleep instead of spinning: beside any other process a spinning run on two
# cores slows 3x or more (docs/benchmarks.md, "Beside other work"). Set before torch loads OpenMP;
# OMP_WAIT_POLICY=ACTIVE brings the spinning back, faster for SFT on idle cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

import report
from nanopost import bands
from nanopost.checkpoints import load_model, safe_load
from nanopost.options import config_env
from nanopost.distributed import setup_device
from nanopost.evaluation import evaluate_policy
from model import ScalarHeadGPT
from nanopost.monitors import alarms, fired_text
from nanopost.options import DEFAULTS, coerce, make_config, parse_args, renamed
from nanopost.usage import config_comments
from nanopost.tokenizer import Tokenizer

# The ladder, in order: (stage = its directory under OUT_ROOT, train.py arguments beyond the
# algorithm's own defaults, the stage whose checkpoint it starts from). Add a stage with one line.
# "{out_root}" in a string argument is the ladder's --out_root (a stage named there must run first).
STAGES = [
    ("pretrain", dict(algo="pretrain", max_iters=200), None),  # short: the task is learnt in SFT (README)
    ("sft", dict(algo="sft", eval_interval=250), "pretrain"),  # fewer in-run evals: the ladder evaluates at the end
    ("rm", dict(algo="rm"), "sft"),
    ("dpo", dict(algo="dpo"), "sft"),
    ("ppo", dict(algo="ppo"), "sft"),
    ("grpo", dict(algo="grpo", eval_interval=10), "sft"),
    ("rft", dict(algo="rft"), "sft"),
    # the GRPO stage as the teacher: how fast a dense per-token signal gets the SFT model there
    ("opd", dict(algo="opd", teacher="{out_root}/grpo"), "sft"),
    # self-distillation that works (docs/distillation.md): OPSD given the answer collapses to bare answers, so the
    # ladder first teaches the SFT model to read a reference (half its rows show the worked solution before the
    # question), then distils it from its own weights shown that solution, anchored to where it started
    ("reader", dict(algo="sft", reader_frac=0.5, max_iters=300, learning_rate=3e-4, min_lr=3e-5, warmup_iters=10,
                    eval_interval=300), "sft"),
    ("opsd", dict(algo="opsd", privileged="solution", anchor_coef=1.0, max_iters=40, eval_interval=20),
     "reader"),
    # the agentic branch: the calculator task (numbers too large to add in the head) with tool calls
    # 2,000 iterations: at 1,000 one CPU class (AVX2 kernels and MKL) ended with a model that miscopied the
    # operators into its calls (sampled accuracy 0.06), and GRPO had little to select (docs/ladder.md)
    ("calc_sft", dict(algo="sft", env="calculator", max_iters=2000, eval_interval=500), "pretrain"),
    ("calc_grpo", dict(algo="rlvp", env="calculator", eval_interval=10), "calc_sft"),  # lab/rlvp.py
]

# train.py arguments every stage gets (the task, e.g. env_direct_frac=0.5), before the stage's own.
# A stage's own evaluations are greedy only and skip its start: the ladder's evaluation after the runs
# samples every stage, and its report has each start's figures (sampling k answers per problem at every
# in-run evaluation as well, and evaluating the SFT model again at iteration 0 of every stage after
# it, cost about 2 of the ladder's minutes: docs/ladder.md)
# overwrite: the ladder owns its stage directories, so a stage it runs again replaces what is there
# (train.py keeps the stage's earlier run until the new one has a checkpoint: a failed redo loses nothing)
LADDER_DEFAULTS = dict(eval_samples=0, eval_at_start=False, overwrite=True)

# The ladder's own keys (everything else on the command line goes to the stages)
OPTIONS = dict(
    out_root="out",      # stage directories, report.md and ladder.png go here
    stages="",           # comma-separated stages to run ("" = all)
    redo="",             # comma-separated stages to run again although done, or "all"
    eval_n=1000,         # held-out problems for greedy accuracy
    eval_ood_n=500,      # OOD problems (greedy)
    eval_pass_n=200,     # held-out problems sampled at T = 1 (accuracy, length, pass@k, the KL to SFT) ...
    eval_samples=8,      # ... k answers each (was eval_pass_k)
    seeds=1,             # run the whole ladder this many times, seed, seed+1, ... (pretraining and SFT too); seed k > 1 goes to OUT_ROOT/seedK/
    threads=0,           # torch threads of every stage and of the evaluation; 0 = torch's default (one per core)
)
# Minutes of the whole ladder from a fresh clone on 2 idle cores, the fastest and the slowest CPU class
# measured (docs/ladder.md "Time"): the range printed at the start, times --seeds
LADDER_MINUTES = (11, 40)
KL_REFERENCES = ("sft", "calc_sft")  # the SFT stages a KL in the report is measured to (the stage's task's)
TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


# ----------------------------------------------------------------------------------------------
# The command line and each stage's train.py arguments

def parse_command_line(argv):
    """-> (ladder options, train.py arguments for every stage, {stage: its own arguments})."""
    given = renamed(parse_args(argv))  # old key names say their new one (eval_pass_k is now eval_samples)
    options = {k: coerce(k, given.pop(k), v) if k in given else v for k, v in OPTIONS.items()}
    names = [name for name, _, _ in STAGES]
    wide, per_stage = {}, {name: {} for name in names}
    for key, value in given.items():
        stage, dot, stage_key = key.partition(".")
        if not dot:
            wide[key] = value
        elif stage in per_stage:
            per_stage[stage][stage_key] = value
        else:
            raise ValueError(f"--{key}: no stage {stage!r}; the stages are {', '.join(names)}")
    return options, wide, {name: renamed(keys) for name, keys in per_stage.items()}  # --grpo.OLD_KEY too


def stage_names(text, what):
    """A comma-separated list of stage names, checked."""
    names = [name for name, _, _ in STAGES]
    picked = [s for s in text.split(",") if s] if text != "all" else names
    for name in picked:
        if name not in names:
            raise ValueError(f"--{what}: no stage {name!r}; the stages are {', '.join(names)}")
    return picked


def seed_root(root, k):
    """Where seed k's stages go: OUT_ROOT itself for the first seed, OUT_ROOT/seedK else."""
    return root if k == 1 else os.path.join(root, f"seed{k}")


def stage_path(root, name, k):
    """A stage's directory: seed k's own, every stage retrained per seed (pretraining and SFT too)."""
    return os.path.join(seed_root(root, k), name)


def stage_arguments(root, name, args, start, wide, own, k=1):
    """What the stage's train.py gets: ladder defaults, the stage's arguments, its start checkpoint,
    the command line's arguments for every stage, seed k's seed, then its own arguments (which may
    even change init_from)."""
    here = seed_root(root, k)
    begin = dict(init_from=stage_path(root, start, k)) if start else {}
    args = {key: v.replace("{out_root}", here) if isinstance(v, str) else v for key, v in args.items()}
    seed = dict(seed=wide.get("seed", DEFAULTS["seed"]) + k - 1) if k > 1 else {}
    return {**LADDER_DEFAULTS, **args, **begin, **wide, **seed, **own, "out_dir": os.path.join(here, name)}


def prerequisites(name):
    """The stages a stage needs done first: its start and any stage named by "{out_root}/STAGE"."""
    args, start = next((args, start) for n, args, start in STAGES if n == name)
    named = [v.split("{out_root}/", 1)[1] for v in args.values() if isinstance(v, str) and "{out_root}/" in v]
    return [start] * bool(start) + named


def kl_reference(name):
    """The SFT stage of the stage's task: the nearest of KL_REFERENCES among it and its starts."""
    starts = {n: start for n, _, start in STAGES}
    while name and name not in KL_REFERENCES:
        name = starts[name]
    return name or KL_REFERENCES[0]


def command_line(args):
    """train.py's argument list: each value as a literal train.py parses back to the same value."""
    def literal(value):
        if isinstance(value, str):
            try:
                ast.literal_eval(value)  # a string that reads as a literal ("1e-3", "True") is quoted
            except (ValueError, SyntaxError):
                return value
        return repr(value)
    return [f"--{key}={literal(value)}" for key, value in args.items()]


# ----------------------------------------------------------------------------------------------
# Running the stages

def read_json(path):
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)


def checkpoint_stamp(stage_dir):
    """The checksum saved in ckpt.pt (checkpoints.checksum: of what it holds): a run that rewrites it
    changes it, a copy (cp -r, which gives new times) keeps it. Read without the tensors' bytes (mmap)."""
    return safe_load(os.path.join(stage_dir, "ckpt.pt")).get("checksum")


def done(stage_dir):
    """The stage's record (command, wall time) when its run finished and its ckpt.pt is still the one
    that run wrote (a record older than the stamp is trusted), else None."""
    record = read_json(os.path.join(stage_dir, "ladder.json"))
    if not record or not os.path.isfile(os.path.join(stage_dir, "ckpt.pt")):
        return None
    return record if record.get("checkpoint", checkpoint_stamp(stage_dir)) == checkpoint_stamp(stage_dir) else None


def changed(stage_dir):
    """Whether a finished stage's ckpt.pt was rewritten or removed since (by a run outside the ladder)."""
    return os.path.isfile(os.path.join(stage_dir, "ladder.json")) and not done(stage_dir)


def pass_through(stream):
    """Copy a child's stderr to ours as it comes (its progress bar); return the last 4,000 characters."""
    decoder, tail = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    while chunk := os.read(stream.fileno(), 4096):
        text = decoder.decode(chunk)
        sys.stderr.write(text)
        sys.stderr.flush()
        tail = (tail + text)[-4000:]
    return tail


def run_stage(label, stage_dir, args, threads):
    """Run one stage as a train.py process; returns None, or the error to stop the ladder with."""
    os.makedirs(stage_dir, exist_ok=True)
    for stale in ("ladder.json", "ladder_eval.json"):  # not done until this run succeeds
        if os.path.exists(os.path.join(stage_dir, stale)):
            os.remove(os.path.join(stage_dir, stale))
    arguments = command_line(args)
    command = shlex.join(["python", "train.py", *arguments])
    print(f"[ladder] {label}: {command}", flush=True)
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    t0 = time.time()
    process = subprocess.Popen([sys.executable, TRAIN_PY, *arguments], stderr=subprocess.PIPE, env=env)
    tail = pass_through(process.stderr)
    if process.wait() != 0:
        lines = [line for line in tail.replace("\r", "\n").splitlines() if line.strip()][-8:]
        return (f"[ladder] stage {label} failed (exit {process.returncode}): {command}\n  "
                + "\n  ".join(lines) + "\n[ladder] the finished stages are kept")
    write_json(os.path.join(stage_dir, "ladder.json"),
               dict(stage=label, command=command, wall_time=time.time() - t0, finished=time.time(),
                    torch=torch.__version__, threads=threads or torch.get_num_threads(),
                    checkpoint=checkpoint_stamp(stage_dir)))
    return None


def notes_on_skipping(start_dir, name, record, command):
    """Why a done stage may deserve a redo: its arguments changed, or its start was redone since."""
    notes = []
    if record["command"] != command:
        notes.append(f"its arguments changed since it ran (was: {record['command']})")
    start_record = done(start_dir) if start_dir else None
    if start_record and start_record["finished"] > record["finished"]:
        notes.append(f"{os.path.basename(start_dir)} was redone after it")
    return "".join(f"\n[ladder]   note: {note}; --redo={name} to rerun it" for note in notes)


# ----------------------------------------------------------------------------------------------
# Evaluation

def fired_monitors(stage_dir):
    """The monitors (monitors.ALARMS) that fired in the stage's metrics.jsonl, as "name (iter k), ..." or
    "none"."""
    path = os.path.join(stage_dir, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)] if os.path.isfile(path) else []
    return fired_text(alarms(rows, read_json(os.path.join(stage_dir, "config.json"))))


def last_logged(stage_dir, key):
    """The last value of `key` in the stage's metrics.jsonl, or None."""
    value = None
    path = os.path.join(stage_dir, "metrics.jsonl")
    if os.path.isfile(path):
        for line in open(path):
            value = json.loads(line).get(key, value)
    return value


def evaluate_stage(stage_dir, reference_dir, options, device):
    """The report's figures of one stage's checkpoint (see the module docstring)."""
    cfg = read_json(os.path.join(stage_dir, "config.json"))
    run = setup_device(dict(device=device))
    run.cfg = cfg
    run.tok, run.env = Tokenizer(cfg["tokenizer"]), config_env(cfg)
    model = load_model(stage_dir, run.device)
    if isinstance(model, ScalarHeadGPT):  # a reward model: no answers to grade, its pairs instead
        return dict(kind="reward_model", pair_acc=last_logged(stage_dir, "val_pair_acc"),
                    pairs=last_logged(stage_dir, "val_pairs"))
    reference = load_model(reference_dir, run.device) if reference_dir else None
    figures, transcripts = evaluate_policy(run, model, reference=reference, temperature=1.0, problems=options["eval_n"],
                                             ood_problems=options["eval_ood_n"], sampled_problems=options["eval_pass_n"],
                                             samples=options["eval_samples"])
    k = options["eval_samples"]
    return dict(kind="policy", greedy_acc=figures["heldout_acc"], sampled_acc=figures["heldout_sampled_acc"],
                pass_at_k=figures[f"heldout_pass@{k}"], ood_acc=figures["ood_acc"], length=figures["heldout_sampled_len"],
                work=figures["heldout_sampled_work"], kl_sft=figures.get("heldout_kl_ref"), samples=transcripts[:3])


def evaluation(root, name, k, options, device):
    """Seed k's figures of the stage, from ladder_eval.json while the stage, the SFT stage and the
    settings are those it was computed with; else computed now and cached."""
    stage_dir, reference_dir = stage_path(root, name, k), stage_path(root, kl_reference(name), k)
    reference = done(reference_dir)
    key = dict({k: v for k, v in options.items() if k.startswith("eval_")},
               stage_finished=done(stage_dir)["finished"], reference_finished=reference and reference["finished"])
    path = os.path.join(stage_dir, "ladder_eval.json")
    cached = read_json(path)
    if cached and cached["key"] == key:
        return cached
    t0 = time.time()
    figures = evaluate_stage(stage_dir, reference_dir if reference else None, options, device)
    figures.update(key=key, eval_time=time.time() - t0)
    write_json(path, figures)
    return figures


# ----------------------------------------------------------------------------------------------
# The report

def fmt(value, spec, missing="–"):
    return missing if value is None else format(value, spec)


def accuracy_cell(p, n):
    return "–" if p is None else f"{p:.3f} ± {bands.binomial(p, n):.3f}"


def table_row(root, name, record, figures, options):
    stage_dir = os.path.join(root, name)
    start = read_json(os.path.join(stage_dir, "config.json"))["init_from"]
    if os.path.isfile(os.path.join(start, "ckpt.pt")) and os.path.dirname(os.path.abspath(start)) == os.path.abspath(root):
        start = os.path.basename(start)  # a stage of this ladder: its name
    seconds = record["wall_time"]
    wall = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    if figures["kind"] == "reward_model":
        pair = accuracy_cell(figures["pair_acc"], figures["pairs"] or 0)
        cells = [f"pair acc {pair}", "–", "–", "–", "–", "–", "–"]
    else:
        n = options["eval_n"]
        cells = [accuracy_cell(figures["greedy_acc"], n), accuracy_cell(figures["sampled_acc"], options["eval_pass_n"]),
                 fmt(figures["pass_at_k"], ".3f"), accuracy_cell(figures["ood_acc"], options["eval_ood_n"]),
                 fmt(figures["length"], ".1f"), fmt(figures["work"], ".2f"), fmt(figures["kl_sft"], ".3f")]
    tokens = last_logged(stage_dir, "train_tokens")
    return f"| {name} | {start} | " + " | ".join(cells) + f" | {fmt(tokens, ',.0f')} | {wall} | {fired_monitors(stage_dir)} |"


def across_seeds(runs, key, n):
    """(mean, half-width or None) of a figure over the seeds' runs [(k, record, figures)], by the
    project's band rule (bands.across_seeds: t·SE from 3 seeds and the binomial band, added in variance)."""
    return bands.across_seeds([figures[key] for _, _, figures in runs], n)


def seeds_row(name, runs, options):
    """A stage's row of the across-seeds table: each figure's mean (± its band) and every seed's value."""
    figures = runs[0][2]
    if figures["kind"] == "reward_model":
        return f"| {name} | {len(runs)} | pair acc " + " ".join(fmt(f["pair_acc"], ".3f") for _, _, f in runs) + " |" + " – |" * 7
    cells = [bands.cell([f[key] for _, _, f in runs], n) for key, n in (("greedy_acc", options["eval_n"]),
                                                                          ("sampled_acc", options["eval_pass_n"]))]
    cells += [" ".join(f"{f['greedy_acc']:.3f}" for _, _, f in runs), " ".join(f"{f['sampled_acc']:.3f}" for _, _, f in runs)]
    for key, spec in (("pass_at_k", ".3f"), ("ood_acc", ".3f"), ("length", ".1f"), ("kl_sft", ".3f")):
        known = [f[key] for _, _, f in runs if f[key] is not None]
        cells.append(fmt(sum(known) / len(known) if known else None, spec))
    return f"| {name} | {len(runs)} | " + " | ".join(cells) + " |"


def passport(stage_dir, record, link):
    """The run's own passport.md, linked; else a short one from its config; with the ladder's record
    of the torch version and thread count it ran with."""
    cfg = read_json(os.path.join(stage_dir, "config.json"))
    runtime = f"torch {record.get('torch', '?')}, {record.get('threads', '?')} threads, seed {cfg['seed']}"
    if os.path.isfile(os.path.join(stage_dir, "passport.md")):
        return f"passport: [{link}/passport.md]({link}/passport.md); {runtime}"
    samples = f", [samples.txt]({link}/samples.txt)" if os.path.isfile(os.path.join(stage_dir, "samples.txt")) else ""
    return (f"passport: `--algo {cfg['algo']}` from `{cfg['init_from']}`, {cfg['max_iters']} iterations of "
            f"{cfg['batch_size']} × {cfg['gradient_accumulation_steps']} rows at lr {cfg['learning_rate']:g}; "
            f"{runtime}; task {', '.join(f'{k}={v}' for k, v in cfg.items() if k.startswith('env'))}; "
            f"[config.json]({link}/config.json){samples}")


def plot_ladder(root, results, options):
    """Left: held-out accuracy of every language-model stage, greedy and sampled with their bands,
    grouped by branch (the main task, the calculator task). Right: when each stage of the first seed
    ran, on the cumulative training wall time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    policies = [(name, runs) for name, runs in results.items() if runs[0][2]["kind"] == "policy"]
    branches = [("main task", [p for p in policies if kl_reference(p[0]) == KL_REFERENCES[0]]),
                ("calculator task", [p for p in policies if kl_reference(p[0]) != KL_REFERENCES[0]])]
    fig, (ax, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw=dict(width_ratios=[2, 1]))
    x, ticks, labels = 0, [], []
    for branch, stages in branches:
        if not stages:
            continue
        if x:
            ax.axvline(x - 0.8, color="grey", linestyle=":", linewidth=1)  # between the branches
        first = x
        for name, runs in stages:
            for offset, key, n, color in ((-0.2, "greedy_acc", options["eval_n"], "C0"),
                                          (0.2, "sampled_acc", options["eval_pass_n"], "C1")):
                mean, half = across_seeds(runs, key, n)
                ax.bar(x + offset, mean, 0.4, yerr=half, color=color, capsize=2)
                if len(runs) > 1:  # every seed's value, so that two seeds (no band) still show their spread
                    ax.plot([x + offset] * len(runs), [f[key] for _, _, f in runs], "k.", markersize=3)
            ticks.append(x)
            labels.append(name)
            x += 1
        ax.text((first + x - 1) / 2, -0.28, branch, ha="center", transform=ax.get_xaxis_transform(), fontsize=10)
        x += 0.6  # a gap between the branches
    seeds = sorted({len(runs) for name, runs in policies})
    ax.bar(0, 0, color="C0", label="greedy"), ax.bar(0, 0, color="C1", label="sampled, T = 1")
    ax.set_xticks(ticks, labels, rotation=30, ha="right")
    ax.set_ylabel(f"held-out accuracy ({options['eval_n']} problems)")
    counts = f"{seeds[0]}" if seeds and seeds[0] == seeds[-1] else f"{seeds[0]}–{seeds[-1]}" if seeds else "1"
    ax.set_title(f"mean ± band over {counts} seeds (dots: each seed)" if seeds and seeds[-1] > 1
                 else "± the binomial band of one run", fontsize=10)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    start = 0.0
    for row, (name, runs) in enumerate(results.items()):
        minutes = runs[0][1]["wall_time"] / 60
        ax_time.barh(row, minutes, left=start, color="C2")
        start += minutes
    ax_time.set_yticks(range(len(results)), list(results))
    ax_time.invert_yaxis()
    ax_time.set_xlabel("cumulative training wall time (min)")
    ax_time.set_title("when each stage ran (first seed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(root, "ladder.png"), dpi=90)
    plt.close(fig)


def write_report(root, results, options):
    """OUT_ROOT/report.md and ladder.png from results: {stage: [(seed k, record, figures)]} of done runs."""
    k = options["eval_samples"]
    firsts = [(name, runs[0][1]) for name, runs in results.items()]
    runtime = ", ".join(sorted({f"torch {r.get('torch', '?')}, {r.get('threads', '?')} threads" for _, r in firsts}))
    seeds = max(len(runs) for runs in results.values())
    lines = ["# The post-training ladder", "",
             f"Held-out accuracy greedy on {options['eval_n']} problems and sampled at T = 1, {k} answers to each of "
             f"{options['eval_pass_n']} (their mean, and pass@{k}), OOD greedy on {options['eval_ood_n']}; ± is the 95% "
             f"binomial band (Wilson's 95% interval as p ± its larger side, bands.py), n the problems. Length (tokens) and work share (answers that write a step before the answer) "
             f"are of the T = 1 samples; KL to SFT: mean over the stage's own T = 1 samples of "
             f"Σ_t log π_stage − log π_SFT (nats per answer), π_SFT the SFT stage of its task "
             f"({' or '.join(KL_REFERENCES)}). "
             f"pass@{k} is Best-of-{k} by the verifier: the ceiling of reranking the stage's own samples. "
             f"Tokens: target tokens with loss weight, "
             f"summed over the run's optimizer steps. Wall time: the stage's train.py run. Monitors fired: the "
             f"alarms of monitors.py over the stage's metrics.jsonl and the first iteration of each, \"none\" on a "
             f"healthy stage (docs/failures.md). Ran with {runtime}.", ""]
    if seeds > 1:
        lines += ["## Across seeds", "",
                  f"The whole ladder run with {seeds} seeds (pretraining and SFT retrained for each). Each figure is "
                  f"the mean over the seeds; ± is t(0.975, k−1) standard errors across the k seeds and the binomial "
                  f"band of the mean (n = {options['eval_n']} problems greedy, {options['eval_pass_n']} sampled) "
                  f"added in variance; with two seeds, both values and their range (bands.py).", "",
                  f"| stage | seeds | held-out greedy | sampled | greedy per seed | sampled per seed | pass@{k} | "
                  f"OOD greedy | length | KL to SFT |", "|---" * 10 + "|"]
        lines += [seeds_row(name, runs, options) for name, runs in results.items()]
        lines += ["", "## The first seed", ""]
    lines += [f"| stage | starts from | held-out greedy | sampled | pass@{k} | OOD greedy | length | shows work "
              f"| KL to SFT | tokens trained on | wall time | monitors fired |", "|---" * 12 + "|"]
    sections = []
    for name, runs in results.items():
        _, record, figures = runs[0]
        stage_dir = os.path.join(root, name)
        lines.append(table_row(root, name, record, figures, options))
        sections += [f"## {name}", "", f"    {record['command']}", ""]
        if os.path.isfile(os.path.join(stage_dir, "metrics.png")):
            sections.append(f"![{name} metrics]({name}/metrics.png)  ")
        sections += [passport(stage_dir, record, name), ""]
        for seed, record, _ in runs[1:]:
            link = os.path.relpath(stage_path(root, name, seed), root)
            sections += [f"seed {seed}: `{record['command']}`; " + passport(stage_path(root, name, seed), record, link), ""]
        if figures.get("samples"):
            sections += ["Sampled answers (T = 1):", "", "```", *figures["samples"], "```", ""]
    if any(runs[0][2]["kind"] == "policy" for runs in results.values()):
        plot_ladder(root, results, options)
        lines += ["", "![held-out accuracy of every stage, by branch, and when each stage ran](ladder.png)"]
    with open(os.path.join(root, "report.md"), "w") as f:
        f.write("\n".join(lines + [""] + sections))


# ----------------------------------------------------------------------------------------------

def make_plan(options, wide, per_stage):
    """[(label, stage, seed k, its directory, its train.py arguments, its start's directory)] in the
    order they run: the whole ladder with the first seed, then the whole ladder with every other
    seed; every stage's configuration checked before anything runs."""
    root, seeds = options["out_root"], options["seeds"]
    to_run = stage_names(options["stages"], "stages") or [name for name, _, _ in STAGES]
    plan = []
    for k in range(1, seeds + 1):
        for name, args, start in STAGES:
            if name not in to_run:
                continue
            label = name if k == 1 else f"{name} (seed {k})"
            args = stage_arguments(root, name, args, start, wide, per_stage[name], k)
            try:
                make_config(args)
            except ValueError as e:
                raise ValueError(f"stage {label}: {e}") from None
            for need in prerequisites(name):
                path = stage_path(root, need, k)
                if path in args.values() and need not in to_run and not done(path):  # (unless overridden away)
                    raise ValueError(f"stage {name} needs {need}, which has not run: add it to --stages")
            plan.append((label, name, k, stage_path(root, name, k), args, start and stage_path(root, start, k)))
    return plan


def help_text():
    """--help: the module's docstring, the ladder's own options and the stages."""
    described = config_comments(sys.modules[__name__], "OPTIONS")
    options = [f"  --{key}={value!r}".ljust(28) + " " + described[key] for key, value in OPTIONS.items()]
    stages = [f"  {name:10s} python train.py --algo {args['algo']}" + (f" from {start}" if start else "")
              for name, args, start in STAGES]
    return "\n".join([__doc__.strip(), "", "the ladder's options:", *options, "",
                      "the stages (--STAGE.key=value goes to one; `python train.py --algo X --help` lists a stage's keys):",
                      *stages])


def main(argv):
    if "--help" in argv or "-h" in argv:
        return print(help_text())
    options, wide, per_stage = parse_command_line(argv)
    root, seeds, threads = options["out_root"], options["seeds"], options["threads"]
    if seeds < 1:
        raise ValueError(f"--seeds={seeds}: at least 1")
    if threads:
        torch.set_num_threads(threads)  # the evaluation here; the stages get OMP_NUM_THREADS
    plan = make_plan(options, wide, per_stage)
    redo = stage_names(options["redo"], "redo")
    low, high = (minutes * seeds for minutes in LADDER_MINUTES)
    print(f"[ladder] {'the whole ladder takes' if seeds == 1 else f'{seeds} whole ladders take'} {low} to {high} min on "
          f"2 idle cores, by CPU (done stages are skipped)", flush=True)
    failure = None
    for label, name, k, stage_dir, args, start_dir in plan:
        record = done(stage_dir)
        if changed(stage_dir):
            print(f"[ladder] {label}: {os.path.join(stage_dir, 'ckpt.pt')} changed since the ladder ran this stage "
                  f"(another run wrote it): running it again", flush=True)
        if record and name not in redo:
            command = shlex.join(["python", "train.py", *command_line(args)])
            print(f"[ladder] {label}: done, skipped ({record['command']})"
                  + notes_on_skipping(start_dir, name, record, command), flush=True)
            continue
        failure = run_stage(label, stage_dir, args, threads)
        if failure:
            break

    device = {**LADDER_DEFAULTS, **wide}.get("device", "auto")
    results = {}
    for name, _, _ in STAGES:
        for k in range(1, seeds + 1):
            record = done(stage_path(root, name, k))
            if changed(stage_path(root, name, k)):
                print(f"[ladder] {name}: {os.path.join(stage_path(root, name, k), 'ckpt.pt')} changed since the ladder "
                      f"ran this stage: left out of the report (--redo={name} to run it again)", flush=True)
            if record and (k == 1 or name in results):
                figures = evaluation(root, name, k, options, device)
                results.setdefault(name, []).append((k, record, figures))
                shown = {key: v for key, v in figures.items() if isinstance(v, float)}
                label = name if k == 1 else f"{name} (seed {k})"
                print(f"[ladder] {label}: " + ", ".join(f"{key} {v:.3g}" for key, v in shown.items()), flush=True)
    if results:
        write_report(root, results, options)
        print(f"[ladder] report: {os.path.join(root, 'report.md')}; in the browser, every stage's samples token by "
              f"token: {report.write_report(root, [name for name, _, _ in STAGES])}", flush=True)
    if failure:
        raise SystemExit(failure)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
