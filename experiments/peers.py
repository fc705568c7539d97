"""
The project against transformers and TRL, side by side, on the peer workloads of
experiments/peer_bench/. The workloads are the ones it defines (peer_bench/peers/README.md: a tiny
GPT-2, vocab 512, 4 layers, 128 wide, seed 0); the peer side runs its scripts unmodified through
peer_bench/side_by_side (prep.py, gen_side.py, peer_run.py); this file runs the project's side of each
workload with the current code and interleaves the two (peer, project, peer, project, ...), every
measurement in a fresh process, one at a time, pinned to one core with one thread (sampling: also
two cores and two threads). Ratios are project / peer throughput (> 1: the project is faster),
median [min..max] over the pairs.

    python experiments/peers.py --peer_python=PEER_VENV/bin/python            # full size
    python experiments/peers.py --peer_python=PEER_VENV/bin/python --tiny     # checks that it runs
    python experiments/peers.py --peer_python=... --workloads=sampling,sft --repeats=5

PEER_VENV: torch 2.13 CPU with transformers, trl and datasets (experiments/peer_bench/peers/requirements.txt); this
script itself runs with the project's Python. Workloads:
  sampling  GPT.generate vs transformers' generate, batch 1, 8, 64, 32-token prompts, exactly 128
            new tokens, temperature 1; 1 thread and 2 threads (gen_side.py: both in one process)
  dpo       train.py --algo dpo (reference log-probs cached, the project's default) vs DPOTrainer
            (reference forward every step): 16 pairs of 65-token sequences per step, pairs/s
  grpo      train.py --algo grpo vs GRPOTrainer, P prompts x G responses x exactly L new tokens per
            step (2x8x32, and 16x8x64 unless --tiny), one optimizer step per iteration, completion
            tokens per second of step time; without KL (TRL's default beta 0, project kl=off)
  grpo_kl   the same with a KL term on both sides: TRL beta 0.04 vs project kl=k3_loss, kl_coef 0.04
  sft       train.py --algo sft vs SFTTrainer, and vs the bench's bare PyTorch loop (baseline_torch:
            transformers' model, and the 40-line MiniGPT2, both with clipping): 16 x 128 tokens, tokens/s
"""

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "experiments", "peer_bench")
WORKLOADS = ("sampling", "dpo", "grpo", "grpo_kl", "sft")
GRPO_SHAPES, TINY_GRPO_SHAPES = ((2, 8, 32), (16, 8, 64)), ((2, 8, 32),)
KL = dict(kl="k3_loss", kl_coef=0.04)  # the project's side of TRL's beta=0.04
# the peers' first steps are warm-up (their SKIP), and so are the project's
STEPS = dict(dpo=(31, 5), sft=(31, 5), grpo_small=(11, 5), grpo_large=(9, 3))
TINY_STEPS = dict(dpo=(5, 1), sft=(5, 1), grpo_small=(4, 1), grpo_large=(4, 1))


# ----------------------------------------------------------------------------------------------
# The project's side: one workload in this process (python experiments/peers.py --worker=...)

def peer_common(bench):
    """The bench's common.py (rand_text, machine_probe) under a name of its own, apart from the project's modules."""
    spec = importlib.util.spec_from_file_location("peer_common", os.path.join(bench, "peers", "common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RandTextEnv:
    """The peers' GRPO task: random 28-character [a-z ] prompts (32 tokens with the chat template's
    4, as the peers' 32 characters), reward 1 when the completion holds an 'a'."""
    name = "rand_text"

    def __init__(self, peer):
        self.peer = peer

    def problems(self, split, n, seed=0):
        rng = random.Random(seed)
        return [dict(prompt=self.peer.rand_text(rng, 28)) for _ in range(n)]

    def verify(self, problem, text):
        return 1.0 if "a" in text else 0.0

    def solve(self, problem):
        return "a"  # an answer the reward accepts (grpo checks its verifier against the solver)

    @staticmethod
    def parses(text):
        return True  # any text is an answer here: no parse errors to count

    def shows_work(self, text):
        return False


def worker(args):
    sys.path.insert(0, ROOT)
    import torch
    from nanopost import options
    from nanopost import rollouts
    import train as T
    torch.set_num_threads(1)
    peer = peer_common(args.bench)
    perf = args.perf_dir
    name, shape = args.worker.split(":") if ":" in args.worker else (args.worker, "")
    out_dir = os.path.join(perf, "out", args.worker.replace(":", "_"))
    shutil.rmtree(out_dir, ignore_errors=True)
    cfg = dict(init_from=os.path.join(perf, "hf_tiny"), tokenizer="byte", eval_interval=0, checkpoint=False,
               plot=False, weight_decay=0.0, learning_rate=1e-4, min_lr=1e-4, warmup_iters=0, grad_clip=1.0,
               gradient_accumulation_steps=1, device="cpu", out_dir=out_dir, seed=0, log_interval=1)  # GRPO: every step, as TRL
    steps = TINY_STEPS if args.tiny else STEPS
    if name == "dpo":
        iters, skip = steps["dpo"]
        cfg.update(algo="dpo", beta=0.1, data=os.path.join(perf, "data", "dpo_pairs.jsonl"),
                   batch_size=16, max_iters=iters, log_interval=10)  # TRL's logging_steps there
    elif name == "sft":
        iters, skip = steps["sft"]
        cfg.update(algo="sft", data=os.path.join(perf, "data", "sft_text.jsonl"), batch_size=16, block_size=128,
                   max_iters=iters, log_interval=10)
    elif name in ("grpo", "grpo_kl"):
        P, G, L = (int(x) for x in shape.split("x"))
        iters, skip = steps["grpo_small" if P * G * L <= 1024 else "grpo_large"]
        cfg.update(algo="grpo", prompts_per_iter=P, group_size=G, max_new_tokens=L, batch_size=P * G, minibatches=1,
                   inner_epochs=1, loss_agg="token_mean", estimator="grpo", on_degenerate="zeros", temperature=1.0,
                   max_iters=iters, **(KL if name == "grpo_kl" else dict(kl="off")))
        T.config_env = lambda cfg: RandTextEnv(peer)  # the environment train.setup builds
        sample = rollouts.sample

        def exactly_l_tokens(*a, **kw):  # the peers force min_new_tokens=L: no stop token here either
            return sample(*a, **dict(kw, stop_tokens=()))
        rollouts.sample = exactly_l_tokens  # the sampler rollouts.generate calls
    else:
        sys.exit(f"unknown worker {args.worker!r}")
    algo = options.algo_module(cfg["algo"])
    stamps, batches = [], algo.batches

    def stamped(run, state, it):  # an iteration's period: from one batches() call to the next, as TRL's step period
        stamps.append(time.perf_counter())
        return batches(run, state, it)
    algo.batches = stamped
    run = T.train(cfg)
    periods = [b - a for a, b in zip(stamps, stamps[1:])][skip:]
    seconds = statistics.median(periods)
    result = dict(workload=args.worker, median_seconds_per_step=seconds, steady_periods=periods,
                  threads=torch.get_num_threads(), machine_probe=peer.machine_probe())
    if name == "dpo":
        result["pairs_per_s"] = 16 / seconds
    elif name == "sft":
        ids = batches(run, run.state, 0)[0][0][0][0]
        result["tokens_per_s"] = ids[:, :-1].numel() / seconds
    else:
        rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
        tokens = [r["len_mean"] * P * G for r in rows if "len_mean" in r][skip:skip + len(periods)]
        result["completion_tokens_per_s"] = sum(tokens) / sum(periods)
    print(json.dumps(result))


# ----------------------------------------------------------------------------------------------
# The driver: prepare, interleave, summarise

# The targets: project / peer throughput, median of the pairs, at least this
TARGETS = {"sampling batch 1, 1 thread": 2.0, "sampling batch 8, 1 thread": 2.0, "sampling batch 64, 1 thread": 2.0,
           "dpo vs TRL DPOTrainer": 3.0, "grpo 16x8x64 vs TRL GRPOTrainer, no KL": 2.5,
           "sft vs a bare PyTorch loop (40-line MiniGPT2": 1.0}
BEGIN, END = "<!-- experiments/peers.py writes from here -->", "<!-- experiments/peers.py: end -->"
HEADER = "| workload | unit | project | peer | project / peer, median [min..max] (pairs) |"


def target(workload):
    return next((value for prefix, value in TARGETS.items() if workload.startswith(prefix)), None)


def machine():
    """What the figures depend on: the CPU, torch's kernel level on it, the cores, torch."""
    import torch
    model = "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        model = names[0] if names else model
    return dict(cpu=model, cores=os.cpu_count(), capability=torch.backends.cpu.get_cpu_capability(),
                capability_env=os.environ.get("ATEN_CPU_CAPABILITY", ""), torch=torch.__version__)


def ratio_cell(r, pairs=True):
    """project / peer: median [min..max] (pairs)."""
    return f"{r['ratio']:.2f} [{r['ratio_min']:.2f}..{r['ratio_max']:.2f}]" + (f" ({r['pairs']})" if pairs else "")


def table_row(r):
    """A row of the ratio table: workload, unit, both throughputs, the ratio."""
    return f"| {r['workload']} | {r['unit']} | {r['project']:,.1f} | {r['peer']:,.1f} | {ratio_cell(r)} |"


def doc_block(result, previous):
    """The markdown docs/benchmarks.md holds between BEGIN and END: the run's table, each ratio
    beside its target and the previous run's (previous: an earlier result, or None)."""
    m = result["machine"]
    before = {r["workload"]: r for r in (previous or {}).get("rows", [])}
    when = f"{previous['date']}, {previous.get('commit') or previous['machine']['capability']}" if previous else None
    lines = [BEGIN, "",
             f"`python experiments/peers.py --peer_python=PEER_VENV/bin/python` on {result['date']}"
             + (f" at {result['commit']}" if result.get("commit") else "") + f": {m['cpu']}, "
             f"{m['cores']} cores, torch {m['torch']} with CPU capability {m['capability']}"
             + (f" (ATEN_CPU_CAPABILITY={m['capability_env']})" if m["capability_env"] else "")
             + f"; every measurement a fresh process pinned to one core with one thread (sampling: also two), "
               f"peer and project interleaved, {result['repeats']} pairs per workload (sampling: {max(result['repeats'], 5)} "
               f"pairs in one process), {result['minutes']:.0f} minutes in all, nothing else running.", "",
             HEADER + " target | met | " + (f"previous ({when})" if when else "previous") + " |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        goal, old = target(r["workload"]), before.get(r["workload"])
        lines.append(table_row(r) + (f" ≥ {goal:g}× | {'yes' if r['ratio'] >= goal else '**no**'} |" if goal else " – | – |")
                     + (f" {ratio_cell(old, pairs=False)} |" if old else " – |"))
    return "\n".join(lines + ["", END])


def write_doc(path, result, previous):
    """Replace the block between BEGIN and END in the page (or append it) with this run's."""
    text = open(path).read() if os.path.exists(path) else ""
    block = doc_block(result, previous)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path + ".tmp", "w") as f:  # (replaced whole: a crash never leaves half a page)
        f.write(text)
    os.replace(path + ".tmp", path)


def run_json(cmd, env, log, cwd=None):
    """Run one measurement; returns the last JSON line it printed (stderr goes to `log`)."""
    with open(log, "w") as err:
        out = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}): see {log}")
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer_python", default=sys.executable, help="a Python with transformers and trl")
    parser.add_argument("--bench", default=BENCH, help="the peer workloads (peers/ and side_by_side/)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3, help="peer/project pairs per workload")
    parser.add_argument("--tiny", action="store_true", help="few steps, one pair: checks that it runs")
    parser.add_argument("--perf_dir", default=os.path.join("out", "peers"), help="scratch: model, data, logs")
    parser.add_argument("--out", default=os.path.join("out", "peers.json"))
    parser.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                        help="the page whose peers block this run rewrites (not with --tiny or --workloads; '' = none)")
    parser.add_argument("--record", default=os.path.join(ROOT, "docs", "peers.json"),
                        help="the figures the page shows: read as the previous run's, then replaced by this run's")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: the project's side of one workload
    args = parser.parse_args()
    args.perf_dir = os.path.abspath(args.perf_dir)
    if args.worker:
        return worker(args)
    side = os.path.join(args.bench, "side_by_side")
    repeats = 1 if args.tiny else args.repeats
    logs = os.path.join(args.perf_dir, "logs")
    os.makedirs(os.path.join(args.perf_dir, "data"), exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    env = dict(os.environ, PERF_DIR=args.perf_dir, PROJECT_DIR=ROOT, PYTHONDONTWRITEBYTECODE="1",
               TOKENIZERS_PARALLELISM="false", PEERS_RESULTS_DIR=os.path.join(args.perf_dir, "peer_results"))
    pin = lambda cores: ["taskset", "-c", cores] if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1 else []

    def measure(tag, cmd, threads=1, cwd=None, **extra_env):
        print(f"{time.strftime('%H:%M:%S')} {tag}", flush=True)
        e = dict(env, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **extra_env)
        return run_json(pin("0" if threads == 1 else f"0-{threads - 1}") + cmd, e, os.path.join(logs, tag + ".err"), cwd)

    def peer(tag, module, *script_args, overrides=None):
        extra = dict(PEER_OVERRIDES=json.dumps(overrides)) if overrides else {}
        return measure(tag, [args.peer_python, os.path.join(side, "peer_run.py"), module, *script_args], **extra)

    def project(tag, workload):
        cmd = [sys.executable, os.path.abspath(__file__), f"--worker={workload}", f"--bench={args.bench}",
               f"--perf_dir={args.perf_dir}"] + (["--tiny"] if args.tiny else [])
        return measure(tag, cmd)

    stack = subprocess.run([args.peer_python, "-c", "import transformers, trl, datasets"], capture_output=True, text=True)
    if stack.returncode != 0:  # the peer stack is optional: say what it needs in one line
        missing = stack.stderr.strip().splitlines()[-1] if stack.stderr.strip() else "it failed to import"
        sys.exit(f"error: --peer_python={args.peer_python} has no peer stack ({missing}): "
                 "pip install -r experiments/peer_bench/peers/requirements.txt in a second environment, "
                 "then pass --peer_python=THAT_ENV/bin/python")
    t_start = time.time()
    # the model (the peers' seed-0 GPT-2, save_pretrained) and the data files, as the harness makes them
    subprocess.run([args.peer_python, os.path.join(side, "prep.py")], env=env, check=True, stdout=subprocess.DEVNULL)
    rows, raw, bare_runs = [], {}, {}

    def peer_steps(key):
        """The peer's STEPS and SKIP for the project's (iterations, skip): STEPS counts steps, the project's
        iterations count stamps, one more than periods (at full size: the peers' own defaults)."""
        iters, skip = (TINY_STEPS if args.tiny else STEPS)[key]
        return dict(STEPS=iters - 1, SKIP=skip)

    def bare_loops(i):
        """baseline_torch's training step (transformers' model and MiniGPT2, with clipping): one process per round."""
        if i not in bare_runs:
            bare_runs[i] = peer(f"sft_bare_{i}", "baseline_train")
        return bare_runs[i]

    def pairs(label, unit, peer_fn, project_fn, peer_fig, project_fig, extra_peers=()):
        """`repeats` rounds of peer, project (then any extra peer baselines), and one row per comparison."""
        figures = {"peer": [], "project": [], **{name: [] for name, _, _ in extra_peers}}
        for i in range(1, repeats + 1):
            a, b = peer_fn(i), project_fn(i)
            figures["peer"].append(peer_fig(a))
            figures["project"].append(project_fig(b))
            raw.setdefault(label, []).append(dict(peer=a, project=b))
            for name, fn, fig in extra_peers:
                c = fn(i)
                figures[name].append(fig(c))
                raw[label][-1][name] = c
        for name in ["peer"] + [name for name, _, _ in extra_peers]:
            ratios = [p / q for p, q in zip(figures["project"], figures[name])]
            rows.append(dict(workload=label if name == "peer" else name, unit=unit,
                             project=statistics.median(figures["project"]), peer=statistics.median(figures[name]),
                             ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                             pairs=len(ratios)))

    chosen = args.workloads.split(",")
    unknown = set(chosen) - set(WORKLOADS)
    if unknown:
        sys.exit(f"unknown workloads {sorted(unknown)}: choose from {WORKLOADS}")
    if "sampling" in chosen:
        for threads in (1, 2):
            # gen_side.py sets one thread: keep its code, and give it `threads` (as peer_run.py keeps 1)
            code = (f"import torch, runpy, sys; set_threads = torch.set_num_threads; "
                    f"torch.set_num_threads = lambda n: set_threads({threads}); "
                    f"sys.argv = ['gen_side.py', '{1 if args.tiny else max(repeats, 5)}']; "
                    f"runpy.run_path('gen_side.py', run_name='__main__')")
            g = measure(f"sampling_{threads}t", [args.peer_python, "-c", code], threads, cwd=side)
            raw[f"sampling_{threads}t"] = g
            for case in g["cases"].values():
                rows.append(dict(workload=f"sampling batch {case['batch']}, {threads} thread{'s' * (threads > 1)}",
                                 unit="new tokens/s", project=case["project_median_tok_s"], peer=case["peer_median_tok_s"],
                                 ratio=case["ratio_median"], ratio_min=case["ratio_min"], ratio_max=case["ratio_max"],
                                 pairs=len(case["pairs"])))
    if "dpo" in chosen:
        pairs("dpo vs TRL DPOTrainer (TRL runs π_ref every step, the project caches it)", "pairs/s",
              lambda i: peer(f"dpo_peer_{i}", "dpo_trl", overrides=peer_steps("dpo")),
              lambda i: project(f"dpo_project_{i}", "dpo"), lambda d: d["samples_per_s"], lambda d: d["pairs_per_s"])
    for kind in ("grpo", "grpo_kl"):
        if kind not in chosen:
            continue
        for P, G, L in TINY_GRPO_SHAPES if args.tiny else GRPO_SHAPES:
            key = "grpo_small" if P * G * L <= 1024 else "grpo_large"
            overrides = dict(BATCH=P * G, COMPLETION_LEN=L, **peer_steps(key))
            beta = ["--beta", "0.04"] if kind == "grpo_kl" else []
            pairs(f"grpo {P}x{G}x{L} vs TRL GRPOTrainer, " + ("KL 0.04 (TRL beta, project k3_loss)" if kind == "grpo_kl" else "no KL"),
                  "completion tokens/s",
                  lambda i: peer(f"{kind}_{P}x{G}x{L}_peer_{i}", "grpo_trl", "--repeats", "1", *beta, overrides=overrides),
                  lambda i: project(f"{kind}_{P}x{G}x{L}_project_{i}", f"{kind}:{P}x{G}x{L}"),
                  lambda d: d["completion_tokens_per_s"], lambda d: d["completion_tokens_per_s"])
    if "sft" in chosen:
        pairs("sft vs TRL SFTTrainer", "tokens/s",
              lambda i: peer(f"sft_peer_{i}", "sft_trl", overrides=peer_steps("sft")),
              lambda i: project(f"sft_project_{i}", "sft"), lambda d: d["tokens_per_s"], lambda d: d["tokens_per_s"],
              extra_peers=[(f"sft vs a bare PyTorch loop ({model} model, clipping)", bare_loops,
                            lambda d, k=kind: d["train"][k]["tokens_per_s"])
                           for kind, model in (("hf+clip", "transformers'"), ("minimal+clip", "40-line MiniGPT2"))])

    minutes = (time.time() - t_start) / 60
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True)
    result = dict(rows=rows, minutes=minutes, tiny=args.tiny, repeats=repeats, date=time.strftime("%Y-%m-%d"),
                  commit=commit.stdout.strip(), machine=machine())
    with open(args.out, "w") as f:
        json.dump(dict(result, raw=raw), f, indent=1)
    if args.doc and not args.tiny and set(chosen) == set(WORKLOADS):  # (only a whole run replaces the page's figures)
        previous = json.load(open(args.record)) if os.path.exists(args.record) else None
        write_doc(args.doc, result, previous)
        with open(args.record, "w") as f:
            json.dump(result, f, indent=1)
        print(f"{args.doc}: its peers table rewritten; {args.record}: these figures, the next run's 'previous'")
    print(f"\n{HEADER}\n|---|---|---|---|---|")
    for r in rows:
        print(table_row(r))
    print(f"\n{minutes:.1f} minutes; every figure in {args.out}" + (" (--tiny: the figures mean nothing)" if args.tiny else ""))


if __name__ == "__main__":
    main()
