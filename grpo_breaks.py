"""
--break_it: a classic failure of an RL pipeline wired into GRPO on purpose, each with the monitor
(monitors.ALARMS) that must name it. break_it replaces one piece of grpo's state with the bug, so
grpo.py's core path runs the same code broken or not. docs/failures.md has each failure's symptom,
figure, fix and the public threads where practitioners met it; experiments/failures.py runs them all.
"""

import dataclasses
import functools
import re

import torch

from nanopost.checkpoints import frozen
from grpo_family import shaping
from grpo_rollouts import old_logprobs, truncation
from nanopost.rollouts import layout

# --break_it: a classic failure wired in on purpose (break_it, below), and the monitor (monitors.ALARMS) that names
# it; docs/failures.md has each one's symptom, figure, fix and the public threads where it was met
BREAKS = dict(
    fp8_sampler="ratio_drift",          # the rollouts from an FP8 (e4m3) copy of the weights
    sampler_temperature="ratio_drift",  # the sampler divides the logits by T = 0.7, the trainer scores at T = 1
    top_p_uncorrected="ratio_drift",    # top-p / top-k sampling, the trainer scoring the whole softmax
    retokenize="retokenized",           # each transcript decoded to text and encoded again before training
    prompt_format="parse_errors",       # the RL prompt's template differs from SFT's: it prefills "Answer:"
    kl_twice="kl_twice",                # −β·KL in the reward and +β·k3 in the loss
    nan_logprob="nonfinite",            # −inf on 1% of the sampler's log-probs, unguarded
    shifted_advantages="misaligned_advantages",  # each group given the previous group's advantages
    all_equal="degenerate_groups",      # every reward 0 (a task out of reach)
    length_bonus="length_bias",         # +0.01 reward per response token
    format_exploit="verifier_errors",   # the right number anywhere in the response passes
)
SAMPLER_ONLY_TEMPERATURE = 0.7  # break_it=sampler_temperature's
CHOICES = dict(break_it=("none", *BREAKS))


def check_config(run):
    """The switch's name, and the runs a switch cannot break, as errors that say why."""
    cfg = run.cfg
    if cfg["break_it"] not in CHOICES["break_it"]:
        raise ValueError(f"config break_it={cfg['break_it']!r}: choose from {CHOICES['break_it']}")
    if cfg["break_it"] == "format_exploit" and not isinstance(run.env.problems("train", 1)[0].get("answer"), int):
        raise ValueError(f"break_it=format_exploit looks for the answer's number: env={cfg['env']} has no integer answer")
    if cfg["break_it"] == "top_p_uncorrected" and not truncation(cfg):
        raise ValueError("break_it=top_p_uncorrected scores the whole softmax of a truncated sampler: set top_p < 1 "
                         "or top_k > 0")
    if cfg["break_it"] == "kl_twice" and cfg["kl"] != "k3_loss":
        raise ValueError("break_it=kl_twice adds the reward's KL to the loss's: it needs kl='k3_loss'")
    if cfg["break_it"] in ("all_equal", "length_bonus", "format_exploit") and (cfg["reward"] != "verifier"
                                                                              or cfg["reward_weights"]):
        raise ValueError(f"break_it={cfg['break_it']} replaces the training reward: not with reward=judge or "
                         f"reward_weights")


def break_it(run, state):
    """--break_it: one piece of grpo's state replaced by the bug a pipeline gets wrong (setup calls it
    last; grpo's core path runs the same code broken or not)."""
    cfg, kind = run.cfg, run.cfg["break_it"]
    if kind == "fp8_sampler":
        state.sampling_model = fp8_copy
    elif kind == "sampler_temperature":
        state.sampling_model = tempered_copy
    elif kind == "top_p_uncorrected":  # the sampler draws from the nucleus, the trainer scores the whole softmax
        state.truncation = {}
        state.old_logprobs, state.rescore = old_logprobs(run, state.truncation)
    elif kind == "retokenize":
        state.sample = retokenizing(run, state.sample)
    elif kind == "prompt_format":
        state.sample = functools.partial(state.sample, prompt_ids=prefilled_prompt(run))
    elif kind == "kl_twice":  # the loss keeps its +β·k3 (kl=k3_loss)
        state.kl_in_reward = True
        state.shape = shaping(run, kl_in_reward=True)
    elif kind == "nan_logprob":
        state.old_logprobs = with_nonfinite(state.old_logprobs)
    elif kind == "shifted_advantages":
        state.advantages = shifted_advantages(state.advantages, cfg["group_size"])
    elif kind in ("all_equal", "length_bonus", "format_exploit"):
        state.training_reward = broken_reward(kind)


def broken_reward(kind):
    """The training reward from the rows under break_it (and no figures of its own: grpo's contract,
    rewards.training_reward)
        all_equal       0 for every response (a task out of reach) -> degenerate_frac
        length_bonus    + 0.01 per response token -> reward_len_corr (and the length)
        format_exploit  the right number anywhere in the response (several guesses pass) ->
                        verifier_error_rate; held-out accuracy is still the strict verifier's"""
    if kind == "all_equal":
        return lambda ro: (torch.zeros_like(ro.verified), {})
    if kind == "length_bonus":
        return lambda ro: (ro.verified + 0.01 * ro.lengths.to(ro.verified), {})
    return lambda ro: (torch.tensor([lax_verify(p, t) for p, t in zip(ro.problems, ro.texts)],
                                    device=ro.verified.device), {})


def training_verifier(run):
    """The verifier the rewards come from (evaluation always uses the environment's own)."""
    return lax_verify if run.cfg["break_it"] == "format_exploit" else run.env.verify


def lax_verify(problem, response):
    """break_it=format_exploit: the right number anywhere in the response passes, so listing
    several guesses (or copying one from the prompt) earns the reward."""
    return 1.0 if str(problem["answer"]) in re.findall(r"-?[0-9]+", response) else 0.0


@torch.no_grad()
def fp8_copy(model):
    """break_it=fp8_sampler: the weights as an FP8 inference engine holds them (e4m3, one scale
    per tensor so that its largest entry maps to e4m3's largest, 448)."""
    copy = frozen(model)
    for p in copy.parameters():
        scale = p.abs().max().clamp(min=1e-12) / 448
        p.copy_((p / scale).to(torch.float8_e4m3fn).float() * scale)
    return copy


@torch.no_grad()
def tempered_copy(model):
    """break_it=sampler_temperature: the sampler's copy has its head divided by T = 0.7, so its logits
    are h·(W/T)ᵀ = z/T: it draws from softmax(z/T) and reports those log-probs, while the trainer
    scores softmax(z) at the run's temperature (a temperature set on the inference engine alone)."""
    copy = frozen(model)
    copy.lm_head.weight = torch.nn.Parameter(copy.lm_head.weight / SAMPLER_ONLY_TEMPERATURE, requires_grad=False)
    return copy  # (a new head parameter: a tied embedding keeps its own weights)


def retokenizing(run, sample):
    """break_it=retokenize: each transcript decoded to text and encoded again before training, as a
    pipeline does that keeps messages rather than token ids. Text does not round-trip to the same
    ids: a tool's tags (special tokens) come back as the bytes of their text, so the tool's result can
    no longer be told apart and is trained on as if the policy wrote it (mask 1), and the sampler's
    log-probs, laid over the new tokens in order, belong to other tokens. The rows keep the sampled
    ids in `responses` (what the retokenized monitor compares)."""
    def sample_then_retokenize(*args, **kwargs):
        ro = sample(*args, **kwargs)
        prompts = [ids[:n] for ids, n in zip(ro.ids.tolist(), ro.prompt_lens.tolist())]
        room = [run.raw_model.config.block_size + 1 - len(p) for p in prompts]  # (cut to the context, as a pipeline does)
        tokens = [(run.tok.encode(text) + ([] if cut else [run.tok.eos]))[:n]
                  for text, cut, n in zip(ro.texts, ro.truncated.tolist(), room)]
        sampled = [lp[n - 1:n - 1 + len(t)] for lp, n, t in zip(ro.old_logprobs.tolist(), ro.prompt_lens.tolist(),
                                                                 ro.responses)]
        logprobs = [(lp + [0.0] * len(t))[:len(t)] for lp, t in zip(sampled, tokens)]
        rows = layout(run, prompts, tokens, logprobs, [[0] * len(t) for t in tokens])
        return dataclasses.replace(ro, **{**rows, "responses": ro.responses})
    return sample_then_retokenize


def prefilled_prompt(run):
    """break_it=prompt_format: the RL prompts' template differs from SFT's: it opens the assistant's turn
    with the answer's marker already written ("<|assistant|>Answer:", as a chat template that opens a
    reasoning block for the model does), so the policy, which writes the marker itself, answers
    " 17": the response lacks the form the verifier asks for and every reward is 0. A function
    problem -> prompt ids."""
    marker = run.tok.encode("Answer:")
    return lambda problem: run.tok.prompt_ids(problem["prompt"]) + marker


def with_nonfinite(old_logprobs, share=0.01):
    """break_it=nan_logprob: −inf on 1% of the response tokens' π_old (a fixed pattern; an engine's
    log 0 for a token it should not have drawn, an fp16 underflow), unguarded: ρ = exp(log π_θ + inf)
    is inf, the loss NaN, and after one optimizer step every weight NaN."""
    def broken(run, model, ro):
        old_logprobs(run, model, ro)
        hit = torch.rand(ro.mask.shape, generator=torch.Generator().manual_seed(0)).to(ro.mask.device) < share
        ro.old_logprobs = ro.old_logprobs.masked_fill(hit & (ro.mask > 0), float("-inf"))
    return broken


def shifted_advantages(advantages, G):
    """break_it=shifted_advantages: each group gets the previous group's advantages (an off-by-one in
    the row -> group index): every response is pushed up or down for another prompt's outcome."""
    def shifted(run, ro):
        degenerate = advantages(run, ro)
        ro.advantages = ro.advantages.roll(G, 0)
        return degenerate
    return shifted
