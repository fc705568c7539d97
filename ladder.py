"""
The post-training ladder in one command: pretrain → SFT → RM, DPO, PPO, GRPO, RFT, OPD, OPSD, and
the agentic branch (SFT then GRPO with a calculator tool), each stage a plain `python train.py ...`
run (printed, so you can type it yourself) from the right checkpoint, then an evaluation of every
stage and one report, OUT_ROOT/report.md.

    python ladder.py                                   # everything, into out/pretrain, out/sft, ...
    python ladder.py --out_root=runs/a --device=cuda   # any --key=value goes to every stage
    python ladder.py --grpo.learning_rate=1e-4         # --STAGE.key=value goes to one stage
    python ladder.py --stages=sft,grpo                 # run a subset (the report covers every stage found)
    python ladder.py --redo=grpo                        # run grpo again; --redo=sft,grpo or --redo=all

A stage is done when OUT_ROOT/STAGE/ladder.json exists: it is written after the stage's run succeeded
(its command and wall time) and deleted when a run starts. A done stage is skipped. Redoing a stage
does not redo the stages after it (a tuning loop reruns one stage at a time); the ladder then notes
which later stages started from an older checkpoint, so name them too (--redo=sft,rm,dpo) to refresh.
A stage that fails stops the ladder with its error; every finished stage is kept and reported.

Every language-model stage is evaluated on the environment after the runs (cached in
OUT_ROOT/STAGE/ladder_eval.json until the stage or the SFT stage is redone or the settings change):
greedy and sampled (T = 1) held-out accuracy, pass@k (Best-of-k by the verifier), OOD accuracy,
sampled length, the share of answers that show their work, and the KL to the SFT model of the
stage's task (sft, or calc_sft for the calculator branch) on the stage's own samples. The reward
model reports its held-out pair accuracy from its metrics.jsonl.
"""

import ast
import codecs
import json
import math
import os
import shlex
import subprocess
import sys
import time

import common as C
import train as T
from model import ScalarHeadGPT
from tokenizer import Tokenizer

# The ladder, in order: (stage = its directory under OUT_ROOT, train.py arguments beyond the
# algorithm's own defaults, the stage whose checkpoint it starts from). Add a stage with one line.
# "{out_root}" in a string argument is the ladder's --out_root (a stage named there must run first).
STAGES = [
    ("pretrain", dict(algo="pretrain", max_iters=200), None),  # short: the task is learnt in SFT (README)
    ("sft", dict(algo="sft", eval_interval=250), "pretrain"),  # fewer in-run evals: the ladder evaluates at the end
    ("rm", dict(algo="rm"), "sft"),
    ("dpo", dict(algo="dpo"), "sft"),
    ("ppo", dict(algo="ppo", reward="verifier"), "sft"),
    ("grpo", dict(algo="grpo", eval_interval=10), "sft"),
    ("rft", dict(algo="rft"), "sft"),
    # the GRPO stage as the teacher: how fast a dense per-token signal gets the SFT model there
    ("opd", dict(algo="opd", teacher="{out_root}/grpo"), "sft"),
    ("opsd", dict(algo="opd", teacher="self"), "sft"),  # its own weights, shown the answer
    # the agentic branch: the calculator task (numbers too large to add in the head) with tool calls
    ("calc_sft", dict(algo="sft", env="calculator", eval_interval=250), "pretrain"),
    ("calc_grpo", dict(algo="grpo", env="calculator", reward_mode="rlvp", eval_interval=10), "calc_sft"),
]

# train.py arguments every stage gets (the task, e.g. env_direct_frac=0.5), before the stage's own
LADDER_DEFAULTS = dict()

# The ladder's own keys (everything else on the command line goes to the stages)
OPTIONS = dict(
    out_root="out",      # stage directories, report.md and ladder.png go here
    stages="",           # comma-separated stages to run ("" = all)
    redo="",             # comma-separated stages to run again although done, or "all"
    eval_n=1000,         # held-out problems for greedy and sampled accuracy (and the KL to SFT)
    eval_ood_n=500,      # OOD problems (greedy)
    eval_pass_n=200,     # held-out problems for pass@k ...
    eval_pass_k=8,       # ... with k samples each at T = 1
)
KL_REFERENCES = ("sft", "calc_sft")  # the SFT stages a KL in the report is measured to (the stage's task's)
TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


# ----------------------------------------------------------------------------------------------
# The command line and each stage's train.py arguments

def parse_command_line(argv):
    """-> (ladder options, train.py arguments for every stage, {stage: its own arguments})."""
    given = T.parse_args(argv)
    options = {k: T._coerce(k, given.pop(k), v) if k in given else v for k, v in OPTIONS.items()}
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
    return options, wide, per_stage


def stage_names(text, what):
    """A comma-separated list of stage names, checked."""
    names = [name for name, _, _ in STAGES]
    picked = [s for s in text.split(",") if s] if text != "all" else names
    for name in picked:
        if name not in names:
            raise ValueError(f"--{what}: no stage {name!r}; the stages are {', '.join(names)}")
    return picked


def stage_arguments(root, name, args, start, wide, own):
    """What the stage's train.py gets: ladder defaults, the stage's arguments, its start checkpoint,
    the command line's arguments for every stage, then its own (which may even change init_from)."""
    begin = dict(init_from=os.path.join(root, start)) if start else {}
    args = {k: v.replace("{out_root}", root) if isinstance(v, str) else v for k, v in args.items()}
    return {**LADDER_DEFAULTS, **args, **begin, **wide, **own, "out_dir": os.path.join(root, name)}


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


def done(stage_dir):
    """The stage's record (command, wall time) when its run finished, else None."""
    record = read_json(os.path.join(stage_dir, "ladder.json"))
    return record if record and os.path.isfile(os.path.join(stage_dir, "ckpt.pt")) else None


def pass_through(stream):
    """Copy a child's stderr to ours as it comes (its progress bar); return the last 4,000 characters."""
    decoder, tail = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    while chunk := os.read(stream.fileno(), 4096):
        text = decoder.decode(chunk)
        sys.stderr.write(text)
        sys.stderr.flush()
        tail = (tail + text)[-4000:]
    return tail


def run_stage(name, stage_dir, args):
    """Run one stage as a train.py process; returns None, or the error to stop the ladder with."""
    os.makedirs(stage_dir, exist_ok=True)
    for stale in ("ladder.json", "ladder_eval.json"):  # not done until this run succeeds
        if os.path.exists(os.path.join(stage_dir, stale)):
            os.remove(os.path.join(stage_dir, stale))
    arguments = command_line(args)
    command = shlex.join(["python", "train.py", *arguments])
    print(f"[ladder] {name}: {command}", flush=True)
    t0 = time.time()
    process = subprocess.Popen([sys.executable, TRAIN_PY, *arguments], stderr=subprocess.PIPE)
    tail = pass_through(process.stderr)
    if process.wait() != 0:
        lines = [line for line in tail.replace("\r", "\n").splitlines() if line.strip()][-8:]
        return (f"[ladder] stage {name} failed (exit {process.returncode}): {command}\n  "
                + "\n  ".join(lines) + "\n[ladder] the finished stages are kept")
    write_json(os.path.join(stage_dir, "ladder.json"),
               dict(stage=name, command=command, wall_time=time.time() - t0, finished=time.time()))
    return None


def notes_on_skipping(root, name, start, record, command):
    """Why a done stage may deserve a redo: its arguments changed, or its start was redone since."""
    notes = []
    if record["command"] != command:
        notes.append(f"its arguments changed since it ran (was: {record['command']})")
    start_record = done(os.path.join(root, start)) if start else None
    if start_record and start_record["finished"] > record["finished"]:
        notes.append(f"{start} was redone after it")
    return "".join(f"\n[ladder]   note: {note}; --redo={name} to rerun it" for note in notes)


# ----------------------------------------------------------------------------------------------
# Evaluation

def band(p, n):
    """95% binomial half-width of an accuracy p measured on n problems."""
    return 1.96 * math.sqrt(p * (1 - p) / n) if n else float("nan")


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
    run = C.setup_device(dict(device=device))
    run.cfg = dict(cfg, eval_problems=options["eval_n"])  # (sampled_reference_kl samples eval_problems)
    run.tok, run.env = Tokenizer(cfg["tokenizer"]), C.config_env(cfg)
    model = C.load_model(stage_dir, run.device)
    if isinstance(model, ScalarHeadGPT):  # a reward model: no answers to grade, its pairs instead
        return dict(kind="reward_model", pair_acc=last_logged(stage_dir, "val_pair_acc"),
                    pairs=last_logged(stage_dir, "val_pairs"))
    n, k = options["eval_n"], options["eval_pass_k"]
    greedy, _ = C.env_accuracy(run, model, "heldout", n)
    sampled, transcripts = C.env_accuracy(run, model, "heldout", n, temperature=1.0, seed=1)
    passed, _ = C.env_accuracy(run, model, "heldout", options["eval_pass_n"], temperature=1.0, samples=k, seed=2)
    ood, _ = C.env_accuracy(run, model, "ood", options["eval_ood_n"])
    kl = None
    if reference_dir:
        kl = C.sampled_reference_kl(run, model, C.load_model(reference_dir, run.device))["kl_ref"]
    return dict(kind="policy", greedy_acc=greedy["heldout_acc"], sampled_acc=sampled["heldout_acc"],
                pass_at_k=passed[f"heldout_pass@{k}"], ood_acc=ood["ood_acc"], length=sampled["heldout_len"],
                work=sampled.get("heldout_work"), kl_sft=kl, samples=transcripts[:3])


def evaluation(root, name, options, device):
    """The stage's figures, from ladder_eval.json while the stage, the SFT stage and the settings
    are those it was computed with; else computed now and cached."""
    stage_dir, reference_dir = os.path.join(root, name), os.path.join(root, kl_reference(name))
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
    return "–" if p is None else f"{p:.3f} ± {band(p, n):.3f}"


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
        cells = [accuracy_cell(figures["greedy_acc"], n), accuracy_cell(figures["sampled_acc"], n),
                 fmt(figures["pass_at_k"], ".3f"), accuracy_cell(figures["ood_acc"], options["eval_ood_n"]),
                 fmt(figures["length"], ".1f"), fmt(figures["work"], ".2f"), fmt(figures["kl_sft"], ".3f")]
    tokens = last_logged(stage_dir, "train_tokens")
    return f"| {name} | {start} | " + " | ".join(cells) + f" | {fmt(tokens, ',.0f')} | {wall} |"


def passport(stage_dir):
    """The run's own passport.md, linked; else a short one from its config."""
    name = os.path.basename(stage_dir)
    if os.path.isfile(os.path.join(stage_dir, "passport.md")):
        return f"passport: [{name}/passport.md]({name}/passport.md)"
    cfg = read_json(os.path.join(stage_dir, "config.json"))
    samples = f", [samples.txt]({name}/samples.txt)" if os.path.isfile(os.path.join(stage_dir, "samples.txt")) else ""
    return (f"passport: `--algo {cfg['algo']}` from `{cfg['init_from']}`, {cfg['max_iters']} iterations of "
            f"{cfg['batch_size']} × {cfg['gradient_accumulation_steps']} rows at lr {cfg['learning_rate']:g}; "
            f"task {', '.join(f'{k}={v}' for k, v in cfg.items() if k.startswith('env'))}; "
            f"[config.json]({name}/config.json){samples}")


def plot_ladder(root, points):
    """Held-out accuracy (greedy and sampled) of every stage against cumulative wall time, each
    stage joined to the stage it started from (DPO, PPO and GRPO all start from SFT: siblings,
    not a chain)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    at = {name: (minutes, figures) for name, start, minutes, figures in points}
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, color in (("greedy_acc", "greedy", "C0"), ("sampled_acc", "sampled, T = 1", "C1")):
        for name, start, minutes, figures in points:
            if start in at:
                ax.plot([at[start][0], minutes], [at[start][1][key], figures[key]], color=color, linewidth=1)
        ax.plot([p[2] for p in points], [p[3][key] for p in points], "o", color=color, label=label)
    for name, start, minutes, figures in points:
        ax.annotate(name, (minutes, figures["greedy_acc"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("cumulative training wall time (min)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(root, "ladder.png"), dpi=90)
    plt.close(fig)


def write_report(root, results, options):
    """OUT_ROOT/report.md and ladder.png from results: [(stage, record, figures)] of done stages."""
    k = options["eval_pass_k"]
    lines = ["# The post-training ladder", "",
             f"Held-out accuracy on {options['eval_n']} problems (greedy, and one sample at T = 1), pass@{k} on "
             f"{options['eval_pass_n']}, OOD greedy on {options['eval_ood_n']}; ± is the 95% binomial half-width "
             f"1.96·sqrt(p(1−p)/n). Length (tokens) and work share (answers that write a step before the answer) "
             f"are of the T = 1 samples; KL to SFT: mean over the stage's own T = 1 samples of "
             f"Σ_t log π_stage − log π_SFT (nats per answer), π_SFT the SFT stage of its task "
             f"({' or '.join(KL_REFERENCES)}). "
             f"pass@{k} is Best-of-{k} by the verifier: the ceiling of reranking the stage's own samples. "
             f"Tokens: target tokens with loss weight, "
             f"summed over the run's optimizer steps. Wall time: the stage's train.py run.", "",
             f"| stage | starts from | held-out greedy | sampled | pass@{k} | OOD greedy | length | shows work "
             f"| KL to SFT | tokens trained on | wall time |",
             "|---" * 11 + "|"]
    points, minutes, sections = [], 0.0, []
    for name, record, figures in results:
        stage_dir = os.path.join(root, name)
        lines.append(table_row(root, name, record, figures, options))
        minutes += record["wall_time"] / 60
        if figures["kind"] == "policy":
            points.append((name, dict((n, st) for n, _, st in STAGES).get(name), minutes, figures))
        sections += [f"## {name}", "", f"    {record['command']}", ""]
        if os.path.isfile(os.path.join(stage_dir, "metrics.png")):
            sections.append(f"![{name} metrics]({name}/metrics.png)  ")
        sections += [passport(stage_dir), ""]
        if figures.get("samples"):
            sections += ["Sampled answers (T = 1):", "", "```", *figures["samples"], "```", ""]
    if points:
        plot_ladder(root, points)
        lines += ["", "![held-out accuracy of every stage against cumulative wall time](ladder.png)"]
    with open(os.path.join(root, "report.md"), "w") as f:
        f.write("\n".join(lines + [""] + sections))


# ----------------------------------------------------------------------------------------------

def main(argv):
    options, wide, per_stage = parse_command_line(argv)
    root = options["out_root"]
    to_run = stage_names(options["stages"], "stages") or [name for name, _, _ in STAGES]
    redo = stage_names(options["redo"], "redo")
    plan = {name: (stage_arguments(root, name, args, start, wide, per_stage[name]), start)
            for name, args, start in STAGES if name in to_run}
    for name, (args, start) in plan.items():  # every stage's configuration checked before anything runs
        try:
            T.make_config(args)
        except ValueError as e:
            raise ValueError(f"stage {name}: {e}") from None
        for need in prerequisites(name):
            path = os.path.join(root, need)
            if path in args.values() and need not in plan and not done(path):  # (unless overridden away)
                raise ValueError(f"stage {name} needs {need}, which has not run: add it to --stages")

    failure = None
    for name, (args, start) in plan.items():
        stage_dir = os.path.join(root, name)
        record = done(stage_dir)
        if record and name not in redo:
            command = shlex.join(["python", "train.py", *command_line(args)])
            print(f"[ladder] {name}: done, skipped ({record['command']})"
                  + notes_on_skipping(root, name, start, record, command), flush=True)
            continue
        failure = run_stage(name, stage_dir, args)
        if failure:
            break

    device = {**LADDER_DEFAULTS, **wide}.get("device", "auto")
    results = []
    for name, _, _ in STAGES:
        record = done(os.path.join(root, name))
        if record:
            figures = evaluation(root, name, options, device)
            results.append((name, record, figures))
            shown = {k: v for k, v in figures.items() if isinstance(v, float)}
            print(f"[ladder] {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in shown.items()), flush=True)
    if results:
        write_report(root, results, options)
        print(f"[ladder] report: {os.path.join(root, 'report.md')}", flush=True)
    if failure:
        raise SystemExit(failure)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
