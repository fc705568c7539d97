"""
Benchmarks (speed figures, not tests). One JSON line per measurement, then one line per target, then
a summary table (figure, value, target, met?); every row also goes into one JSON file.

    python experiments/bench.py                     # every benchmark
    python experiments/bench.py sampler train_loop  # only these (names of the functions below)
    python experiments/bench.py --device=cuda       # on a GPU (default: cpu)
    python experiments/bench.py --out=FILE          # where the JSON file goes (default: out/bench.json)
    python experiments/bench.py --tiny              # every benchmark at a tiny size: checks they run, figures mean nothing
    python experiments/bench.py --init_from=out/sft # the RL benchmarks start from this checkpoint (default: a random
                                                    # model, whose responses all run to max_new_tokens)
    python experiments/bench.py sampler_against --against=old_sampler.py   # this sampler.py against another

Every ratio compares two things measured side by side in this one process: same model, same
inputs, warm-up first, then the median of several repeats (allocator's: alternating fresh
processes, as malloc's settings belong to a process). On a CPU that other jobs share, run
with OMP_NUM_THREADS=1: with one thread per core, every parallel op waits for a descheduled thread
(measured here: 6 tok/s instead of ~300 for batch-1 sampling).

Adding a benchmark: write `def name(args) -> list of summary rows` (use `report`, and `target` or
`figure` for the rows of the summary table) and put `@benchmark` above it; read its sizes from the
module constants, so that --tiny can shrink them (TINY_SIZES).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402  (after the path: the script runs from anywhere)
import torch.nn.functional as F  # noqa: E402

from nanopost import options  # noqa: E402
import sft  # noqa: E402
import train as T  # noqa: E402
from nanopost.checkpoints import build_model  # noqa: E402
from nanopost.hf import to_transformers  # noqa: E402
from nanopost.rollouts import Rollout, score_tokens, shard_problems  # noqa: E402
from sampler import draw, sample  # noqa: E402
from sft import masked_nll  # noqa: E402
from nanopost.tokenizer import Tokenizer  # noqa: E402

BENCHMARKS = {}  # name -> function(args) returning its summary rows; main() runs them in order
MEASUREMENTS = []  # every row `report` printed, for the JSON file


def benchmark(fn):
    BENCHMARKS[fn.__name__] = fn
    return fn


def report(**row):
    print(json.dumps(row, ensure_ascii=False), flush=True)
    MEASUREMENTS.append(row)
    return row


def target(name, value, goal, higher_is_better=True):
    """A summary row with a target: `value` against `goal` (a minimum, or a maximum when not higher_is_better)."""
    met = value >= goal if higher_is_better else value <= goal
    return dict(target=name, value=round(value, 3), goal=("≥ " if higher_is_better else "≤ ") + str(goal), met=met)


def figure(name, value):
    """A summary row without a target: a figure worth seeing in the table."""
    return dict(target=name, value=round(value, 3), goal=None, met=None)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def clocks():
    """(wall, process CPU) seconds: CPU time is the cross-check when other jobs share the cores."""
    return time.perf_counter(), time.process_time()


def median_seconds(fn, device, repeats, warmup=1):
    """Median wall time of fn() over `repeats` calls, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def alternating_medians(fns, device, repeats, warmup=1):
    """{name: (median wall s, median CPU s)} of several functions called in turn, so a change in
    machine load hits all of them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = clocks()
            fn()
            sync(device)
            end = clocks()
            times[name].append((end[0] - start[0], end[1] - start[1]))
    return {name: tuple(statistics.median(t[i] for t in ts) for i in (0, 1)) for name, ts in times.items()}


# ----------------------------------------------------------------------------------------------
# Sampling: the KV-cache sampler vs recomputing the whole sequence, and vs transformers' generate

PROMPT_LEN, NEW_TOKENS, SAMPLER_BATCHES = 32, 128, (1, 8, 64)


def default_model(device, block_size):
    """train.py's default (from-scratch) model, with block_size raised to at least `block_size`."""
    cfg = options.make_config(dict(block_size=max(options.DEFAULTS["block_size"], block_size)))
    return build_model(cfg, Tokenizer(cfg["tokenizer"])).to(device).eval()


@torch.no_grad()
def sample_recompute(model, prompts, new_tokens, seed):
    """The baseline without a cache: every step runs the whole sequence again. Same sampling rule
    as sampler.sample at temperature 1 (log-softmax of the logits, sampler.draw)."""
    idx = torch.tensor(prompts, device=next(model.parameters()).device)
    gen = torch.Generator(device=idx.device).manual_seed(seed)
    for _ in range(new_tokens):
        logp = F.log_softmax(model(idx)[:, -1].float(), dim=-1)
        idx = torch.cat([idx, draw(logp, gen)[:, None]], dim=1)
    return idx[:, len(prompts[0]):]


@benchmark
def sampler(args):
    device = args["device"]
    model = default_model(device, PROMPT_LEN + NEW_TOKENS)
    prompts_for = lambda batch: torch.randint(0, 256, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(0)).tolist()
    targets = []
    hf = None
    try:
        hf = to_transformers(model)
    except ImportError:
        report(bench="sampler", note="transformers is not installed: no comparison with its generate")
    if hf is not None:  # identical weights: the same logits, else the comparison means nothing
        ids = torch.tensor(prompts_for(2), device=device)
        with torch.no_grad():
            diff = (hf(ids).logits - model(ids)).abs().max().item()
        report(bench="sampler", check="logits ours vs transformers", max_abs_diff=diff)
        if diff > 1e-4:
            raise RuntimeError(f"converted model's logits differ by {diff}")
    for batch in SAMPLER_BATCHES:
        prompts = prompts_for(batch)
        fast = dict(kv_cache=lambda: sample(model, prompts, NEW_TOKENS, temperature=1.0, seed=0))
        if hf is not None:
            input_ids = torch.tensor(prompts, device=device)
            fast["hf_generate"] = lambda: hf.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=1.0,
                top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
            out_len = fast["hf_generate"]().size(1) - PROMPT_LEN
            if out_len != NEW_TOKENS:
                raise RuntimeError(f"transformers generated {out_len} tokens, not {NEW_TOKENS}")
        t = alternating_medians(fast, device, repeats=5)
        # the recompute baseline is slow: fewer repeats, and at the largest batch (64: a minute per
        # call on a laptop core) no warm-up, since the smaller batches have already run the same code
        largest = batch == max(SAMPLER_BATCHES)
        t.update(alternating_medians(dict(recompute=lambda: sample_recompute(model, prompts, NEW_TOKENS, seed=0)),
                                     device, repeats=1 if largest else 3, warmup=0 if largest else 1))
        n = batch * NEW_TOKENS
        row = dict(bench="sampler", batch=batch, new_tokens=NEW_TOKENS, prompt_len=PROMPT_LEN,
                   **{f"{name}_tok_s": round(n / wall) for name, (wall, _) in t.items()},
                   cache_vs_recompute=round(t["recompute"][0] / t["kv_cache"][0], 2),
                   cache_vs_recompute_cpu=round(t["recompute"][1] / t["kv_cache"][1], 2))
        if hf is not None:
            row.update(ours_vs_hf=round(t["hf_generate"][0] / t["kv_cache"][0], 2),
                       ours_vs_hf_cpu=round(t["hf_generate"][1] / t["kv_cache"][1], 2))
        report(**row)
        targets.append(figure(f"sampler: KV cache tokens/s, batch {batch}", n / t["kv_cache"][0]))
        targets.append(target(f"sampler: KV cache vs full recompute, batch {batch}, {NEW_TOKENS} new tokens",
                              t["recompute"][0] / t["kv_cache"][0], 5))
        if hf is not None:
            targets.append(target(f"sampler: ours vs transformers generate, batch {batch}",
                                  t["hf_generate"][0] / t["kv_cache"][0], 2))
    return targets


AGAINST_GROUPS, AGAINST_PAIRS = (16, 8), 7  # the rows that finish: 16 prompts x 8 samples, as GRPO's rollouts


@benchmark
def sampler_against(args):
    """This sampler.py against another one (--against=FILE, e.g. `git show ed1ef94:sampler.py >
    old_sampler.py`), side by side on the same weights, alternated pairs, one thread: the peers'
    shape (32-token prompts, exactly NEW_TOKENS new tokens, batch 1, 8 and 64) and rows that finish
    (16 prompts x 8 samples of ragged prompts, shared prefill, a stop set a random model draws 2.5% of
    the time). Each case also reports whether both drew the same tokens and the largest log-prob gap."""
    import importlib.util
    import sampler as ours
    if not args.get("against"):
        report(bench="sampler_against", note="no --against=FILE: nothing to compare with")
        return []
    spec = importlib.util.spec_from_file_location("sampler_against", args["against"])
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    device = args["device"]
    model = default_model(device, PROMPT_LEN + NEW_TOKENS)
    gen = torch.Generator().manual_seed(0)
    prompts_for = lambda batch: torch.randint(0, 256, (batch, PROMPT_LEN), generator=gen).tolist()
    n_prompts, group = AGAINST_GROUPS
    ragged = [p[:PROMPT_LEN // 2 + i % (PROMPT_LEN // 2)] for i, p in enumerate(prompts_for(n_prompts))]
    cases = [(f"batch {b}, {NEW_TOKENS} new tokens", prompts_for(b), ()) for b in SAMPLER_BATCHES]
    cases.append((f"{n_prompts} prompts x {group}, rows finish", [p for p in ragged for _ in range(group)], tuple(range(8))))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    for name, prompts, stops in cases:
        run = lambda module, seed: module.sample(model, prompts, NEW_TOKENS, temperature=1.0, seed=seed, stop_tokens=stops)
        a, b = run(other, 0), run(ours, 0)
        gap = max((abs(x - y) for p, q in zip(a.logprobs, b.logprobs) for x, y in zip(p, q)), default=0.0)
        ratios = []
        for seed in range(AGAINST_PAIRS):
            t0 = time.perf_counter()
            run(other, seed)
            t1 = time.perf_counter()
            run(ours, seed)
            ratios.append((t1 - t0) / (time.perf_counter() - t1))
        report(bench="sampler_against", case=name, speedup_median=round(statistics.median(ratios), 3),
               speedup_min=round(min(ratios), 3), speedup_max=round(max(ratios), 3), same_tokens=a.tokens == b.tokens,
               max_logprob_gap=gap)
        rows.append(figure(f"sampler against {os.path.basename(args['against'])}: {name}, ×", statistics.median(ratios)))
    torch.set_num_threads(threads)
    return rows


ATTENTION_BATCH, ATTENTION_KEYS, ATTENTION_REPEATS = 64, (48, 96, 144), 20


@benchmark
def attention(args):
    """Why the KV cache attends over a narrowed view of its buffer: one decode step's attention per
    layer at batch 64, over a cache of 4 layers visited in turn as in a real step (so each layer's
    keys come from memory, not from the CPU's caches), three ways: SDPA over the slice of a max_len
    buffer, the cache's previous design (a dense buffer of the written columns plus up to a 32-column
    chunk, attended whole and masked by a bias) and sampler.KVCache.decode_attention (the columns
    written, a narrowed view). No target: it backs a design choice."""
    from model import GPTConfig
    from sampler import KVCache
    device, B, max_len, repeats = args["device"], ATTENTION_BATCH, PROMPT_LEN + NEW_TOKENS, ATTENTION_REPEATS
    cfg = GPTConfig(**{k: options.DEFAULTS[k] for k in ("n_layer", "n_head", "n_embd")})
    H, D = cfg.n_head, cfg.n_embd // cfg.n_head
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, 1, D, generator=gen).to(device) for _ in range(3))
    rows = []
    for L in ATTENTION_KEYS:
        buf_k, buf_v = (torch.randn(cfg.n_layer, B, H, max_len, D, generator=gen).to(device) for _ in range(2))
        cache = KVCache(cfg, torch.ones(B, L - 1, dtype=torch.bool, device=device), max_len)
        width = min(L + 16, max_len)  # the previous design's buffer: on average half a chunk past what is written
        whole_k, whole_v = (b[:, :, :, :width].reshape(cfg.n_layer, B * H, width, D) for b in (buf_k, buf_v))
        bias = torch.zeros(B * H, 1, width, device=device)
        bias[..., L:] = float("-inf")
        with torch.inference_mode():
            for layer in range(cfg.n_layer):
                cache.write_prompt(layer, buf_k[layer, :, :, :L - 1], buf_v[layer, :, :, :L - 1])

            def sdpa_slice():
                for layer in range(cfg.n_layer):
                    F.scaled_dot_product_attention(q, buf_k[layer, :, :, :L], buf_v[layer, :, :, :L])

            def whole_buffer():
                for layer in range(cfg.n_layer):
                    a = torch.baddbmm(bias, q.view(B * H, 1, D), whole_k[layer].transpose(1, 2), alpha=D ** -0.5)
                    torch.bmm(a.softmax(-1), whole_v[layer])

            def narrowed():
                for layer in range(cfg.n_layer):
                    cache.length = L - 1  # the same column every time: the timing is of one step
                    cache.decode_attention(layer, q, k, v)

            t = alternating_medians(dict(sdpa_slice=sdpa_slice, whole_buffer=whole_buffer, narrowed=narrowed),
                                    device, repeats=repeats, warmup=2)
        us = {name: 1e6 * wall / cfg.n_layer for name, (wall, _) in t.items()}
        report(bench="attention", batch=B, keys=L, **{f"{name}_us_per_layer": round(x, 1) for name, x in us.items()},
               narrowed_vs_whole_buffer=round(us["whole_buffer"] / us["narrowed"], 2),
               narrowed_vs_sdpa_slice=round(us["sdpa_slice"] / us["narrowed"], 2))
        rows.append(figure(f"attention: the narrowed cache vs the previous masked whole buffer, batch {B}, {L} keys, ×",
                           us["whole_buffer"] / us["narrowed"]))
    return rows


# ----------------------------------------------------------------------------------------------
# Training: the shared loop (train.train) vs a bare PyTorch loop on the same batches

# iterations of one shared run, the first TRAIN_WARMUP untimed: a fresh run's first ~6 iterations
# take minor page faults while the allocator settles (up to 44,000 in one iteration on this VM)
TRAIN_ITERS, TRAIN_WARMUP = 40, 8


def bare_step(model, optimizer, micro_batches, cfg, autocast):
    """One optimizer step of the loop a person writes first: the same model, hyperparameters and
    masked loss, PyTorch's default AdamW on every parameter, mean loss, clipping, no logging."""
    for ids, mask in micro_batches:
        with autocast:  # bf16 on CUDA, as in train.train
            loss_sum, count = masked_nll(model, ids, mask)
        (loss_sum / count / len(micro_batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def interleaved_loop_times(overrides):
    """train.train with one bare-loop step, on the same batches, run between each two of its
    iterations: per iteration, ((wall, CPU) seconds of the shared loop's iteration, the same of the
    bare step), pairs taken moments apart so that a change in machine load hits both alike. A shared
    iteration is timed from the end of the bare step before it to the start of the one after it, so
    everything the loop does per iteration (batches, lr schedule, accumulation, clipping, logging,
    progress bar) is inside. Also returns the mean model input tokens of an iteration, and the run."""
    marks, bare_times, tokens, bare = [], [], [], {}

    def interleaved_batches(run, state, it):
        sync(run.device)
        start = clocks()
        if not bare:  # (torch's RNG forked: building it leaves the shared run's randomness alone)
            with torch.random.fork_rng(devices=[]):
                bare["model"] = build_model(run.cfg, run.tok).to(run.device).train()
            bare["optimizer"] = torch.optim.AdamW(bare["model"].parameters(), lr=run.cfg["learning_rate"],
                                                  betas=(run.cfg["beta1"], run.cfg["beta2"]),
                                                  weight_decay=run.cfg["weight_decay"])
        micro_batches = sft.batches(run, state, it)[0][0]  # this iteration's batches (they depend only on seed and it)
        tokens.append(sum(ids[:, :-1].numel() for ids, _ in micro_batches))  # model input tokens
        sync(run.device)
        bare_start = clocks()
        bare_step(bare["model"], bare["optimizer"], micro_batches, run.cfg, run.autocast)
        sync(run.device)
        end = clocks()
        bare_times.append((end[0] - bare_start[0], end[1] - bare_start[1]))
        marks.append((start, end))
        return sft.batches(run, state, it)

    # sft as the loop sees it, its batches wrapped: passed to train, nothing patched
    run = T.train(overrides, algo=types.SimpleNamespace(**{**vars(sft), "batches": interleaved_batches}))
    shared = [(b[0][0] - a[1][0], b[0][1] - a[1][1]) for a, b in zip(marks, marks[1:])]
    return list(zip(shared, bare_times)), statistics.mean(tokens), run


@benchmark
def train_loop(args):
    with tempfile.TemporaryDirectory(prefix="bench_train_") as out_dir:
        overrides = dict(algo="sft", max_iters=TRAIN_ITERS, eval_interval=0, checkpoint=False, device=args["device"],
                         train_problems=2000, val_examples=16, out_dir=out_dir)  # small pools: short setup
        pairs, tokens, run = interleaved_loop_times(overrides)
    pairs = pairs[TRAIN_WARMUP:]
    wall_ratio = statistics.median(b[0] / s[0] for s, b in pairs)  # bare / shared time: shared throughput, ×
    cpu_ratio = statistics.median(b[1] / s[1] for s, b in pairs)
    quartiles = statistics.quantiles([b[0] / s[0] for s, b in pairs], n=4)
    wall_shared, wall_bare = (statistics.median(p[k][0] for p in pairs) for k in (0, 1))
    report(bench="train_loop", batch_size=run.cfg["batch_size"], tokens_per_iter=round(tokens), pairs_timed=len(pairs),
           shared_loop_tok_s=round(tokens / wall_shared), bare_loop_tok_s=round(tokens / wall_bare),
           shared_iter_ms=round(1000 * wall_shared, 2), bare_iter_ms=round(1000 * wall_bare, 2),
           shared_vs_bare=round(wall_ratio, 4), quartiles=[round(q, 4) for q in (quartiles[0], quartiles[2])],
           shared_vs_bare_cpu=round(cpu_ratio, 4))
    return [target("train loop: train.train throughput vs a bare loop, × (wall clock, median of pairs)", wall_ratio, 1.0),
            figure("train loop: the same in CPU time, ×", cpu_ratio)]


# ----------------------------------------------------------------------------------------------
# The allocator: SFT steps with glibc's thresholds raised (distributed.keep_freed_memory) and without

ALLOC_ITERS, ALLOC_WARMUP, ALLOC_ROUNDS = 48, 8, 3

# one run in a fresh process (malloc's settings are the process's): SFT from scratch on one thread,
# seconds per iteration (from one batches() call to the next), the logged losses, minor page faults
ALLOC_RUN = """
import json, resource, sys, time, types
sys.path.insert(0, {root!r})
import torch, sft, train
from nanopost import distributed
torch.set_num_threads(1)
if not {keep}:
    distributed.keep_freed_memory = lambda: None  # glibc's own thresholds
stamps, faults = [], []
def batches(run, state, it):
    stamps.append(time.perf_counter())
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    return sft.batches(run, state, it)
run = train.train({overrides!r}, algo=types.SimpleNamespace(**{{**vars(sft), "batches": batches}}))
losses = [json.loads(line).get("loss") for line in open({metrics!r})]
w = {warmup}
print(json.dumps(dict(periods=[b - a for a, b in zip(stamps[w:], stamps[w + 1:])], losses=losses,
                      faults_per_iter=(faults[-1] - faults[w]) / (len(faults) - 1 - w))))
"""


@benchmark
def allocator(args):
    """SFT steps of the default model with malloc keeping the memory each step frees, against glibc's
    own thresholds, in alternating fresh processes: s/step, minor page faults per step, and whether
    the logged losses are equal to the last digit (they must be: torch aligns every tensor alike)."""
    runs = dict(glibc=[], kept=[])
    with tempfile.TemporaryDirectory(prefix="bench_alloc_") as out_dir:
        overrides = dict(algo="sft", max_iters=ALLOC_ITERS, eval_interval=0, checkpoint=False, plot=False,
                         device=args["device"], train_problems=2000, val_examples=16, out_dir=out_dir)
        code = lambda keep: ALLOC_RUN.format(root=ROOT, keep=keep, overrides=overrides, warmup=ALLOC_WARMUP,
                                             metrics=os.path.join(out_dir, "metrics.jsonl"))
        for _ in range(ALLOC_ROUNDS):
            for name in runs:
                out = subprocess.run([sys.executable, "-c", code(name == "kept")], capture_output=True, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))
                if out.returncode != 0:
                    raise RuntimeError(f"allocator run ({name}) failed:\n{out.stderr[-2000:]}")
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    step = {name: statistics.median(statistics.median(r["periods"]) for r in rs) for name, rs in runs.items()}
    faults = {name: statistics.median(r["faults_per_iter"] for r in rs) for name, rs in runs.items()}
    same = all(r["losses"] == runs["glibc"][0]["losses"] for rs in runs.values() for r in rs)
    report(bench="allocator", rounds=ALLOC_ROUNDS, iters_timed=ALLOC_ITERS - ALLOC_WARMUP - 1,
           **{f"{name}_step_ms": round(1000 * s, 2) for name, s in step.items()},
           **{f"{name}_minor_faults_per_step": round(f) for name, f in faults.items()},
           kept_vs_glibc=round(step["glibc"] / step["kept"], 4), losses_equal=same)
    return [figure("allocator: SFT steps with the freed memory kept vs glibc's thresholds, × (1 thread)",
                   step["glibc"] / step["kept"]),
            target("allocator: the same losses to the last digit, 1 = yes", float(same), 1.0)]


# ----------------------------------------------------------------------------------------------
# DPO: one step with cached reference log-probs vs one SFT step on the same rows

DPO_PAIRS, DPO_REPEATS = 32, 5


@benchmark
def dpo_step(args):
    """A DPO optimizer step never runs π_ref (its log-probs are cached at setup), so it should cost
    what an SFT step on the same chosen + rejected rows costs: same forward, same backward."""
    import dpo
    from nanopost import pairs
    out_dir = tempfile.mkdtemp(prefix="bench_dpo_")
    # style pairs need no sampling: setup is just the pairs and their cached reference log-probs
    run = T.train(dict(algo="dpo", pairs="style", train_prompts=DPO_PAIRS, heldout_prompts=2,
                       max_iters=0, eval_interval=0, checkpoint=False, device=args["device"], out_dir=out_dir))
    batch = pairs.collate(run, run.state.train_examples[:DPO_PAIRS])
    sft_mask = F.pad(batch["mask"], (1, 0))  # masked_nll wants the mask aligned with ids, not ids[:, 1:]
    model = build_model(run.cfg, run.tok).to(run.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=run.device.startswith("cuda"))

    def step(loss_fn):
        optimizer.zero_grad(set_to_none=True)
        with run.autocast:
            loss_sum, count = loss_fn()
        (loss_sum / count).backward()
        optimizer.step()

    def dpo_fn(share):
        def fn():
            run.cfg["share_prompt"] = share
            step(lambda: dpo.loss(run, run.state, model, batch)[:2])
        return fn

    sft_fn = lambda: step(lambda: masked_nll(model, batch["ids"], sft_mask))
    times = {"dpo": [], "dpo_shared": [], "sft": []}
    for _ in range(3):  # alternate, so a change in machine load hits all alike
        for name, fn in (("dpo", dpo_fn(False)), ("dpo_shared", dpo_fn(True)), ("sft", sft_fn)):
            times[name].append(median_seconds(fn, run.device, DPO_REPEATS))
    t_dpo, t_shared, t_sft = (statistics.median(times[k]) for k in ("dpo", "dpo_shared", "sft"))
    tokens = batch["ids"][:, :-1].numel()
    prompt = float(batch["prompt_lens"].float().mean())
    report(bench="dpo_step", pairs=DPO_PAIRS, rows=batch["ids"].size(0), tokens_per_step=tokens,
           mean_prompt_tokens=round(prompt, 1), dpo_step_ms=round(1000 * t_dpo, 2),
           dpo_shared_prompt_step_ms=round(1000 * t_shared, 2), sft_step_ms=round(1000 * t_sft, 2),
           dpo_tok_s=round(tokens / t_dpo), sft_tok_s=round(tokens / t_sft), dpo_vs_sft=round(t_dpo / t_sft, 3),
           shared_prompt_speedup=round(t_dpo / t_shared, 3))
    # the target compares the same forward and backward (share_prompt off); sharing is its own figure
    return [target("dpo step (cached reference) vs sft step on the same tokens, ×", t_dpo / t_sft, 1.15,
                   higher_is_better=False),
            figure(f"dpo step, share_prompt off / on ({prompt:.0f}-token prompts of {tokens // len(batch['ids'])}), ×",
                   t_dpo / t_shared)]


# ----------------------------------------------------------------------------------------------
# RL: rollout throughput inside a GRPO step vs the bare sampler on the same prompts

RL_ITERS, RL_WARMUP, RL_PROMPTS, RL_GROUP, RL_NEW_TOKENS = 4, 1, 16, 8, 64
RL_PHASES = ("decode", "verify", "score", "update")


def rl_update(run, optimizer, steps):
    """The optimizer steps of one GRPO iteration, as train.train takes them (one process: the loss
    divided by the step's count, clipping, AdamW)."""
    import grpo
    params = [p for p in run.raw_model.parameters() if p.requires_grad]
    for micro_batches in steps:
        optimizer.zero_grad(set_to_none=True)
        with run.autocast:  # bf16 on CUDA, as in train.train
            losses = [grpo.loss(run, run.state, run.model, mb)[:2] for mb in micro_batches]
        (sum(s for s, _ in losses) / max(sum(float(n) for _, n in losses), 1e-8)).backward()
        torch.nn.utils.clip_grad_norm_(params, run.cfg["grad_clip"])
        optimizer.step()


@benchmark
def rl_rollout(args):
    """Decode tokens/s inside a GRPO step (the step's own decode clock, as logged in decode_tok_per_s)
    against model.generate alone on the same prompts with the same seed (so the same tokens),
    alternating. Also the whole rollout phase (sampling, verifying, π_ref scoring, advantages,
    micro-batches: everything grpo.batches does before the update), which the target does not cover,
    and the time split of the whole step (the update timed after the bare sampler, which must see
    the weights that sampled)."""
    import grpo
    out_dir = tempfile.mkdtemp(prefix="bench_rl_")
    run = T.train(dict(algo="grpo", max_iters=0, eval_interval=0, checkpoint=False, device=args["device"],
                       prompts_per_iter=RL_PROMPTS, group_size=RL_GROUP, max_new_tokens=RL_NEW_TOKENS,
                       out_dir=out_dir, init_from=args["init_from"]))
    optimizer = torch.optim.AdamW(run.raw_model.parameters(), lr=run.cfg["learning_rate"])
    in_step, phase, bare, tokens, split = [], [], [], [], []
    cfg = run.cfg
    for it in range(RL_ITERS):  # one shard: the problems and seed are grpo.sample_groups's
        sync(run.device)
        t0 = time.perf_counter()
        steps, figures = grpo.batches(run, run.state, it)  # returns before the update: the rollout phase only
        sync(run.device)
        t_rollout = time.perf_counter() - t0
        problems, seed = shard_problems(run, it, 0, 0)
        prompts = [run.tok.prompt_ids(p["prompt"]) for p in problems for _ in range(cfg["group_size"])]
        t0 = time.perf_counter()
        out = sample(run.raw_model, prompts, cfg["max_new_tokens"], temperature=cfg["temperature"],
                     stop_tokens=(run.tok.eos,), seed=seed, pad_id=run.tok.pad).tokens
        sync(run.device)
        t_bare = time.perf_counter() - t0
        n = sum(len(t) for t in out)
        if n != figures["len_mean"] * len(prompts):
            raise RuntimeError("the bare sampler did not reproduce the step's tokens: not the same work")
        t0 = time.perf_counter()
        rl_update(run, optimizer, steps)
        sync(run.device)
        t_update = time.perf_counter() - t0
        if it >= RL_WARMUP:
            in_step.append(n / figures["time_decode"]), phase.append(n / t_rollout), bare.append(n / t_bare)
            tokens.append(n)
            seconds = dict(update=t_update, **{k: figures[f"time_{k}"] for k in RL_PHASES[:3]})
            split.append({k: v / (t_rollout + t_update) for k, v in seconds.items()})
    step_tok_s, phase_tok_s, bare_tok_s = (statistics.median(x) for x in (in_step, phase, bare))
    split_pct = {k: 100 * statistics.mean(s[k] for s in split) for k in RL_PHASES}
    report(bench="rl_rollout", batch=len(prompts), max_new_tokens=cfg["max_new_tokens"],
           tokens_per_step=round(statistics.mean(tokens)), iterations_timed=len(in_step),
           rl_step_decode_tok_s=round(step_tok_s), bare_sampler_tok_s=round(bare_tok_s),
           in_step_vs_bare_pct=round(100 * step_tok_s / bare_tok_s, 1),
           rollout_phase_tok_s=round(phase_tok_s), rollout_phase_vs_bare_pct=round(100 * phase_tok_s / bare_tok_s, 1),
           step_split_pct={k: round(v, 1) for k, v in split_pct.items()})
    return [target(f"rl rollout: decode tokens/s inside the GRPO step vs the bare sampler, batch {len(prompts)}, %",
                   100 * step_tok_s / bare_tok_s, 80)] + \
        [figure(f"rl step: {k} share of the GRPO step (kl_coef {run.cfg['kl_coef']}), %", v) for k, v in split_pct.items()]


SHARED_REPEATS, STALE_ITERS, STALE_WARMUP = 5, 5, 1
GRPO_SIZES = {}  # the default grpo config (16 prompts × 16 responses, 64 new tokens); --tiny shrinks it


@benchmark
def rl_shared_prompt(args):
    """What a GRPO iteration spends outside the sampler, π_ref scoring plus the update (forward,
    backward, AdamW), with share_prompt on and off: the default grpo config (16 prompts × 16
    responses), the same rollouts and weights for both (restored before every call), alternating."""
    import grpo
    run = T.train(dict(algo="grpo", max_iters=0, eval_interval=0, checkpoint=False, device=args["device"],
                       out_dir=tempfile.mkdtemp(prefix="bench_shared_"), init_from=args["init_from"], **GRPO_SIZES))
    steps, _ = grpo.batches(run, run.state, 0)
    rows = Rollout.cat([mb for step in steps for mb in step], run.tok.pad)
    start = {k: v.clone() for k, v in run.raw_model.state_dict().items()}
    optimizer = torch.optim.AdamW(run.raw_model.parameters(), lr=run.cfg["learning_rate"])

    def iteration(share):
        def fn():
            run.cfg["share_prompt"] = share  # (π_ref's scoring and the loss's grpo.policy_logprobs read it)
            run.raw_model.load_state_dict(start)
            score_tokens(run, run.state.reference, rows.ids, rows.prompt_lens)
            rl_update(run, optimizer, steps)
        return fn

    times = alternating_medians(dict(shared=iteration(True), unshared=iteration(False)), run.device, SHARED_REPEATS)
    (shared, cpu_shared), (unshared, cpu_unshared) = times["shared"], times["unshared"]
    prompt, length = float(rows.prompt_lens.float().mean()), float(rows.lengths.float().mean())
    report(bench="rl_shared_prompt", responses=len(rows.ids), mean_prompt_tokens=round(prompt, 1),
           mean_response_tokens=round(length, 1), shared_ms=round(1000 * shared, 1),
           unshared_ms=round(1000 * unshared, 1), speedup=round(unshared / shared, 3),
           cpu_speedup=round(cpu_unshared / cpu_shared, 3))

    # the sampler: the rollouts' prompts, G copies of each (one prefill per distinct prompt), against
    # as many distinct prompts of the same lengths (their first token made unique: a prefill per row);
    # exactly max_new_tokens each (no stop token), so the decode steps are the same work
    prompts = [row[:n].tolist() for row, n in zip(rows.ids, rows.prompt_lens.tolist())]
    distinct = [[i % run.raw_model.config.vocab_size] + p[1:] for i, p in enumerate(prompts)]
    assert len(set(map(tuple, distinct))) == len(distinct) and len(set(map(tuple, prompts))) < len(prompts)
    new_tokens = run.cfg["max_new_tokens"]
    sampling = alternating_medians({name: (lambda p=p: sample(run.raw_model, p, new_tokens, seed=0))
                                    for name, p in (("repeated", prompts), ("distinct", distinct))},
                                   run.device, SHARED_REPEATS)
    (repeated, _), (unique, _) = sampling["repeated"], sampling["distinct"]
    report(bench="rl_shared_prefill", responses=len(prompts), distinct_prompts=len(set(map(tuple, prompts))),
           new_tokens=new_tokens, repeated_ms=round(1000 * repeated, 1), distinct_ms=round(1000 * unique, 1),
           speedup=round(unique / repeated, 3))
    return [figure("grpo scoring + update, share_prompt off / on (same rollouts), ×", unshared / shared),
            figure("grpo sampling, G copies of each prompt (one prefill each) vs distinct prompts, ×",
                   unique / repeated)]


@benchmark
def rl_staleness(args):
    """The default grpo config through train.train for STALE_ITERS iterations, synchronous (--algo grpo) and
    one-step-off (--algo one_step_off, staleness 1):
    median wall time per iteration after the first STALE_WARMUP (the first staleness-1 iteration
    waits for its rollouts). With one torch thread per Python thread, staleness 1 can use a second
    core that the synchronous loop leaves idle: compare with the thread count the real runs use."""
    seconds = {}
    for staleness, algo in ((0, "grpo"), (1, "one_step_off")):
        out_dir = tempfile.mkdtemp(prefix="bench_stale_")
        T.train(dict(algo=algo, max_iters=STALE_ITERS, eval_interval=0, checkpoint=False, plot=False,
                     device=args["device"], out_dir=out_dir, init_from=args["init_from"], **GRPO_SIZES))
        rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
        seconds[staleness] = statistics.median(r["iter_time"] for r in rows if "iter_time" in r and r["iter"] > STALE_WARMUP)
    report(bench="rl_staleness", iterations_timed=STALE_ITERS - STALE_WARMUP, threads=torch.get_num_threads(),
           sync_iter_s=round(seconds[0], 3), one_step_off_iter_s=round(seconds[1], 3),
           speedup=round(seconds[0] / seconds[1], 3))
    return [figure("grpo iteration time, staleness 0 / 1, ×", seconds[0] / seconds[1])]


# ----------------------------------------------------------------------------------------------

# Sizes small enough that every benchmark runs in seconds (--tiny): a check that they run, not figures
TINY_SIZES = dict(PROMPT_LEN=8, NEW_TOKENS=8, SAMPLER_BATCHES=(1, 2), ATTENTION_BATCH=2, ATTENTION_KEYS=(8, 12),
                  ATTENTION_REPEATS=2, TRAIN_ITERS=4, TRAIN_WARMUP=1, DPO_PAIRS=2, DPO_REPEATS=1,
                  RL_ITERS=2, RL_PROMPTS=2, ALLOC_ITERS=4, ALLOC_WARMUP=1, ALLOC_ROUNDS=1, RL_GROUP=2, RL_NEW_TOKENS=8, SHARED_REPEATS=1, STALE_ITERS=3,
                  GRPO_SIZES=dict(prompts_per_iter=2, group_size=2, max_new_tokens=8), AGAINST_GROUPS=(2, 2),
                  AGAINST_PAIRS=1)


def summary_table(rows):
    """The summary rows as an aligned text table: figure, value, target, met?"""
    lines = [("figure", "value", "target", "met?")] + [
        (r["target"], f"{r['value']:,.3f}".rstrip("0").rstrip("."), r["goal"] or "–",
         "–" if r["met"] is None else "yes" if r["met"] else "NO") for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
                     for line in lines)


def main(argv):
    args = dict(device="cpu", out=os.path.join("out", "bench.json"), init_from="scratch")
    names = []
    if "--help" in argv or "-h" in argv:
        return print(__doc__.strip() + f"\n\nbenchmarks: {', '.join(BENCHMARKS)}")
    for arg in argv:
        if arg.startswith(("--device=", "--out=", "--init_from=", "--against=")):
            key, value = arg[2:].split("=", 1)
            args[key] = value
        elif arg == "--tiny":
            globals().update(TINY_SIZES)
        elif arg in BENCHMARKS:
            names.append(arg)
        else:
            sys.exit(f"unknown argument {arg!r}: benchmarks are {list(BENCHMARKS)}, options --device=, --out=, "
                     f"--init_from=, --against= (sampler_against), --tiny")
    machine = report(torch=torch.__version__, threads=torch.get_num_threads(), device=args["device"],
                     cpu_count=os.cpu_count(), tiny="--tiny" in argv)
    summary, seconds = [], {}
    for name in names or BENCHMARKS:
        t0 = time.time()
        summary += BENCHMARKS[name](args)
        seconds[name] = round(time.time() - t0, 1)
        report(bench=name, seconds=seconds[name])
    targets = [row for row in summary if row["met"] is not None]
    for row in targets:
        report(**row)
    os.makedirs(os.path.dirname(args["out"]) or ".", exist_ok=True)
    with open(args["out"], "w") as f:
        json.dump(dict(machine=machine, seconds=seconds, summary=summary, measurements=MEASUREMENTS), f,
                  indent=1, ensure_ascii=False)
    print("\n" + summary_table(summary))
    print(f"\ntargets met: {sum(r['met'] for r in targets)} of {len(targets)}; every figure in {args['out']}")


if __name__ == "__main__":
    main(sys.argv[1:])
