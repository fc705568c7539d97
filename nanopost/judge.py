"""
A generative reward model, the judge [Ch7 "The evolution of reward paradigms": a reward model that
writes its reasoning, then its verdict, and that gets better with more judgements sampled at
inference]; SPEC §3 "Reward model" (the Bradley–Terry one it stands beside), "Process vs outcome
rewards" (the step check its judgements write out).

The judge is the project's own tiny GPT, trained by SFT (sft.py, --data) on rows made by a rule from
the policy's own answers, each labelled by the verifier (experiments/judge_agreement.py makes them and trains it):

    prompt      Check 7+8-3+5: 7+8=15. 15-3=11. 11+5=16. Answer: 16
    judgement   7+8=15 ok. 15-3=12 no. 12+5=17 no. Verdict: incorrect

The judgement re-derives each step of the problem's worked solution (env.solve) and marks it "ok"
where the answer wrote that very equation at that place, "no" where it wrote another one there, and
nothing where it wrote none (a bare answer): the process reward's check (env.step_rewards). It ends
in the verifier's label. The prompt shows the problem as its equation, "7+8-3+5", a word problem too,
so that prompt and judgement fit the tiny model's 128 tokens; an answer longer than ANSWER_CHARS
characters is shown by its last ANSWER_CHARS after "...".

The reward of an answer y to a problem x: the judge writes a judgement j (greedy, or k of them
sampled), cut after "Verdict:"; of the two ways it can go on,

    P(correct | x, y, j) = π_J(" correct" | x, y, j) / (π_J(" correct" | x, y, j) + π_J(" incorrect" | x, y, j))
                         = σ(ℓ_correct − ℓ_incorrect),     ℓ_v = Σ_t log π_J(v_t | x, y, j, v_<t)
    r(x, y) = (1/k) Σ_{i=1..k} P(correct | x, y, j_i)        (judge_samples = k; 0: one greedy judgement)

The mean of the verdict probabilities is the expected share of "correct" among k sampled verdicts
(a vote), without the noise of drawing each verdict. A judgement that never writes "Verdict:" gets it
appended, so every judgement has a verdict to read; how often that happens is counted.
"""

import zlib

import torch

from nanopost.distributed import chunks
from model import sequence_logprobs
from sampler import sample

# the judge's keys, one definition for the scripts that read a judge (grpo: reward=judge; dpo: online_labeler=judge)
JUDGE_KEYS = dict(
    judge="",                   # the judge's checkpoint dir (python experiments/judge_agreement.py trains one)
    judge_samples=0,            # 0 = one greedy judgement per answer; k = the mean over k judgements sampled at
                                # judge_temperature (the chapter's inference-time scaling)
    judge_temperature=1.0,      # the temperature of sampled judgements
)
ANSWER_CHARS = 40  # the judge sees at most this much of an answer (its end: the answer line); 40 covers every
                   # worked answer of the default task (at most 37) and leaves room in 128 tokens for the judgement
MARKER = "Verdict:"
VERDICTS = ("correct", "incorrect")  # the two ways a judgement ends; the first is the reward's


def problem_line(problem):
    """The problem as the judge reads it, its equation without the result: "7+8-3+5" (the arithmetic
    task's start and steps, whichever way the question was worded)."""
    if "start" not in problem or "steps" not in problem:
        raise ValueError(f"the judge reads arithmetic problems (a start and steps); this problem has fields "
                         f"{sorted(problem)}: use --env=arithmetic")
    return f"{problem['start']}" + "".join(f"{op}{b}" for op, b in problem["steps"])


def shown_answer(answer):
    """The answer as the judge sees it: whole, or its last ANSWER_CHARS characters after "..."."""
    return answer if len(answer) <= ANSWER_CHARS else "..." + answer[-ANSWER_CHARS:]


def judge_prompt(problem, answer):
    """The judge's question: "Check 7+8-3+5: <the answer as shown>"."""
    return f"Check {problem_line(problem)}: {shown_answer(answer)}"


def judgement(env, problem, answer):
    """The judgement the judge learns to write about `answer` (the rule above): each step of the
    worked solution re-derived, marked " ok" where the shown answer wrote that equation at that place,
    " no" where it wrote another there, unmarked where it wrote none; then the verifier's verdict."""
    if not hasattr(env, "step_rewards"):
        raise ValueError(f"the judge's judgements check each written step (env.step_rewards): env {env.name!r} "
                         f"has none; use --env=arithmetic")
    steps = env.solve(problem).split(" Answer:")[0].split()  # ["7+8=15.", "15-3=12.", "12+5=17."]
    written = [ok for _, ok in env.step_rewards(problem, shown_answer(answer))[:-1]]  # 1 or 0 per written equation
    marks = [(" ok" if written[i] else " no") if i < len(written) else "" for i in range(len(steps))]
    verdict = VERDICTS[0] if env.verify(problem, answer) > 0 else VERDICTS[1]
    return " ".join(f"{step[:-1]}{mark}." for step, mark in zip(steps, marks)) + f" {MARKER} {verdict}"


def judge_rows(run, problems, answers):
    """SFT rows for the judge (sft.py reads "prompt" and "completion"; "label" is the verifier's 0/1,
    kept for the record): one per (problem, answer), each checked to fit the model's block_size, an
    error naming the row where one does not."""
    rows, limit = [], run.cfg["block_size"] + 1
    for i, (problem, answer) in enumerate(zip(problems, answers), start=1):
        row = dict(prompt=judge_prompt(problem, answer), completion=judgement(run.env, problem, answer),
                   label=run.env.verify(problem, answer))
        n = len(run.tok.prompt_ids(row["prompt"])) + len(run.tok.response_ids(row["completion"]))
        if n > limit:
            raise ValueError(f"judge row {i}: prompt and judgement are {n} tokens, more than block_size+1={limit}: "
                             f"lower judge.ANSWER_CHARS ({ANSWER_CHARS}) or use a model with a longer block_size")
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# The reward: judgements, cut at the verdict, and the verdict's probability

def cut_at_verdict(tok, tokens):
    """(a judgement's ids through "Verdict:", whether the judge wrote it): its ids up to the token
    that completes the marker; where it wrote none, its ids before the end token with " Verdict:"
    appended, so that its verdict is read all the same."""
    text = ""
    for n, t in enumerate(tokens, start=1):
        if t == tok.eos:
            break
        text += tok.decode([t])
        if MARKER in text:
            return list(tokens[:n]), True
    return [t for t in tokens if t != tok.eos] + tok.encode(" " + MARKER), False


@torch.no_grad()
def verdict_probabilities(judge, tok, prefixes, batch_size=64):
    """P(correct) after each prefix (prompt + judgement through "Verdict:", ids): σ(ℓ_correct − ℓ_incorrect),
    ℓ_v the summed log-probs of the verdict's tokens " correct" | " incorrect" after the prefix. (N,) on the
    judge's device."""
    words = [tok.encode(" " + v) for v in VERDICTS]
    rows = [(prefix, word) for prefix in prefixes for word in words]  # each prefix twice: correct, incorrect
    device = next(judge.parameters()).device
    totals = []
    for chunk in chunks(rows, 2 * batch_size):
        width = max(len(p) + len(w) for p, w in chunk)
        ids = torch.tensor([p + w + [tok.pad] * (width - len(p) - len(w)) for p, w in chunk], device=device)
        mask = torch.zeros(len(chunk), width - 1, device=device)  # 1 on the verdict's tokens (targets ids[:, 1:])
        for i, (p, w) in enumerate(chunk):
            mask[i, len(p) - 1:len(p) - 1 + len(w)] = 1.0
        totals.append((sequence_logprobs(judge, ids).float() * mask).sum(1))
    ell = torch.cat(totals).view(-1, 2)
    return torch.sigmoid(ell[:, 0] - ell[:, 1])  # = π(correct) / (π(correct) + π(incorrect))


@torch.no_grad()
def judge_scores(run, judge, problems, answers, samples=0, temperature=1.0, seed=0):
    """The judge's P(correct) of each (problem, answer) for each of its judgements: (N, k) on the run's
    device, k = samples judgements drawn at `temperature` (samples = 0: one greedy judgement, k = 1),
    and (N, k) True where the judge wrote "Verdict:" itself. The reward is the mean over k (above)."""
    tok, k = run.tok, max(samples, 1)
    prompts = [tok.prompt_ids(judge_prompt(p, a)) for p, a in zip(problems, answers) for _ in range(k)]
    # room for the judgement, and after it " Verdict:" (if the judge wrote none) and the longer verdict
    tail = len(tok.encode(" " + MARKER)) + max(len(tok.encode(" " + v)) for v in VERDICTS)
    room = judge.config.block_size - max(map(len, prompts)) - tail
    if room < 1:
        raise ValueError(f"the judge's prompt of {max(map(len, prompts))} tokens leaves no room for a judgement in "
                         f"its block_size={judge.config.block_size}")
    size, prefixes, wrote = run.cfg["eval_batch_size"], [], []
    for i, chunk in enumerate(chunks(prompts, size)):
        with run.autocast:
            tokens = sample(judge, chunk, room, temperature=temperature if samples else 0.0, stop_tokens=(tok.eos,),
                            pad_id=tok.pad, seed=seed + i * size).tokens
        for prompt, judged in zip(chunk, tokens):
            cut, found = cut_at_verdict(tok, judged)
            prefixes.append(prompt + cut)
            wrote.append(found)
    with run.autocast:
        p = verdict_probabilities(judge, tok, prefixes, size)
    shape = (len(problems), k)
    return p.to(run.device).view(shape), torch.tensor(wrote, device=run.device).view(shape)


def rollout_seed(ids):
    """The seed of a rollout's sampled judgements: a hash of its ids, so that a resumed run draws the same."""
    return zlib.crc32(ids.cpu().numpy().tobytes())


def judge_text(tok, judge, problem, answer, samples=1, temperature=1.0, seed=0):
    """The judge's judgements of one answer, as text, for a person to read (experiments/judge_agreement.py's examples)."""
    prompt = tok.prompt_ids(judge_prompt(problem, answer))
    tokens = sample(judge, [prompt] * samples, judge.config.block_size - len(prompt), temperature=temperature,
                    stop_tokens=(tok.eos,), pad_id=tok.pad, seed=seed).tokens
    return [tok.decode([t for t in row if t != tok.eos]) for row in tokens]
