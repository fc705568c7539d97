"""
The passports (SPEC §6, M14 §17): every algorithm's post-training passport (data and mode, reward and
verification, optimisation, infrastructure), written to out_dir/passport.md at setup (once it has
succeeded: run_dir.write_out); and what a passport reports of the verifier: its own error rate against
the environment's solver, and the parse-error check.
"""

from model import count_parameters
from nanopost.data import pretraining
from nanopost.rollouts import shard_size
from nanopost.run_dir import write_out


def write_passport(run, text):
    """The run's post-training passport (SPEC §6: data and mode, reward and verification, optimisation,
    infrastructure) as out_dir/passport.md, made at setup."""
    write_out(run, "passport.md", text)


def verification_text(check):
    """The passport's line on the verifier's own error rate (verifier_check's figures)."""
    if not check["verifier_probes"]:
        return "the verifier is unchecked: the environment has no solver to hold it against"
    return (f"the verifier's own error rate against the solver: {check['verifier_error_rate']:.3f} on "
            f"{check['verifier_probes']} probes ({check['verifier_false_negatives']} solver answers rejected, "
            f"{check['verifier_false_positives']} wrong answers accepted)")


def unparsed(env, response):
    """True when the response has no answer in the task's form (env.parses; SPEC §6's parse-error
    rate). An environment that defines no form never counts one."""
    return hasattr(env, "parses") and not env.parses(response)


def verifier_check(env, verify, n=64, seed=0):
    """The verifier's own error rate (SPEC §6, M14 §17), against the environment's solver on n train
    problems: each problem's solver answer must pass, and the solver answer of the next problem (where
    its answer differs) must fail. Returns dict(verifier_error_rate, verifier_false_negatives,
    verifier_false_positives, verifier_probes); NaN for an environment without a solver."""
    if not hasattr(env, "solve"):  # nothing to check against: the rate is unknown, not 0
        return dict(verifier_error_rate=float("nan"), verifier_false_negatives=0, verifier_false_positives=0,
                    verifier_probes=0)
    problems = env.problems("train", n, seed=seed)
    answers = [env.solve(p) for p in problems]
    rejected = sum(verify(p, a) != 1.0 for p, a in zip(problems, answers))
    nxt = [(i + 1) % n for i in range(n)]
    others = [(p, answers[j]) for p, i, j in zip(problems, range(n), nxt)  # a different answer to a different problem
              if answers[j] != answers[i] and problems[j].get("answer", j) != p.get("answer", i)]
    accepted = sum(verify(p, a) != 0.0 for p, a in others)
    probes = len(problems) + len(others)
    return dict(verifier_error_rate=(rejected + accepted) / probes, verifier_false_negatives=rejected,
                verifier_false_positives=accepted, verifier_probes=probes)


# ----------------------------------------------------------------------------------------------
# The passports, one per algorithm (each takes what its algorithm's setup made)

def sft_passport(run, n_train, n_val):
    """SFT's and pre-training's passport: n_train training rows, n_val held out for the loss."""
    c = run.cfg
    if c["data"]:
        data = f"`{c['data']}`: {n_train} training rows, the last {n_val} held out for the loss"
    elif pretraining(c):
        data = f"{c['corpus_docs']} documents of the `{c['env']}` environment's worked equations, packed into {c['block_size']}-token windows"
    else:
        data = (f"the `{c['env']}` solver's demonstrations of {c['train_problems']} *train* problems (a {c['env_direct_frac']} "
                f"share give only the answer"
                + (f"; a {c['reader_frac']} share instead read the worked solution in the prompt and write it out"
                   if c.get("reader_frac") else "") + "); validation on *heldout* problems, disjoint by equation")
    mask = "every token" if pretraining(c) else "the assistant's tokens only (prompt, template, tool output, padding masked)"
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo {c['algo']}`, started from `{c['init_from']}`

## Data and mode
- offline demonstrations: {data}
- answers written by the data (not by the policy); rows drawn again every epoch for {c['max_iters']} iterations

## Reward and verification
- none in training: the loss is the likelihood of the demonstrations; the verifier scores held-out answers at evaluation

## Optimisation
- offline next-token cross-entropy on {mask}, averaged over those tokens
- no reference, old policy, critic or reward model; no KL term

## Infrastructure
- {run.device} × {run.world_size}; no generation in training (evaluation samples with the KV-cache sampler)
"""


def preference_passport(run, loss, references, online=None):
    """The post-training passport (SPEC §6) of a run trained on preferences (rm.py, dpo.py and its
    variants): offline pairs, or with online=(data and mode, labels) online DPO's rounds (lab/online_dpo.py)."""
    c = run.cfg
    source = (f"`{c['data']}`" if c["data"] else
              f"built-in `{c['pairs']}` pairs: {c['group_size']} answers per *train* prompt sampled once by "
              f"`{c['init_from']}` at temperature {c['pair_temperature']} ({c['train_prompts']} prompts), labelled "
              f"by {dict(verifier='the verifier', style='a style rule', both='the verifier or a style rule')[c['pairs']]}"
              if online is None else "")
    mode = (f"- offline preferences: {source}; held-out pairs from *heldout* prompts (disjoint by equation)\n"
            f"- the pairs are fixed for the run: drawn again every epoch for {c['max_iters']} iterations, never resampled")
    labels, sampling = "the preference labels are the reward signal; no reward is computed in training", "no sampling in training"
    if online is not None:
        mode, labels = online
        sampling = "sampling at the start of each round"
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo {c['algo']}`, started from `{c['init_from']}`

## Data and mode
{mode}

## Reward and verification
- {labels}

## Optimisation
- {"offline" if online is None else "online"}: {loss}
- models: the trained one; references: {references}; no old policy, no critic, {sampling}
- units: one term per pair (per example for KTO), averaged over the batch

## Infrastructure
- {run.device} × {run.world_size}; generation {"only to build the built-in pairs" if online is None else "for each round's pairs"} and at evaluation
"""


def rft_passport(run, verifier_check):
    """RFT's passport."""
    c = run.cfg
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo rft` (rejection-sampling fine-tuning), started from `{c['init_from']}`

## Data and mode
- online in rounds, offline within one: {c['rounds']} rounds over {c['max_iters']} iterations; each samples {c['group_size']}
  answers to each of {c['round_prompts']} fresh `{c['env']}` *train* prompts with the current policy (temperature
  {c['temperature']}), keeps the verified ones, de-duplicated, at most {c['per_prompt_cap']} per prompt, and trains SFT
  steps on that pool until the next round; evaluation on *heldout* and *ood*

## Reward and verification
- the environment's rule verifier as a filter (1 keeps, 0 drops); an answer cut off by the length limit is dropped
- {verification_text(verifier_check)}; parse_error_rate logged every round

## Optimisation
- the SFT loss on the kept answers' own tokens (prompt and tool results masked); no reference, old policy,
  critic or reward model; no KL term; token-level loss

## Infrastructure
- sampling and training on the same device(s): {run.device} × {run.world_size}, synchronous
"""


def ppo_passport(run, verifier_check, old_logprobs):
    """PPO's passport, and its lab variants' (their keys, where they have them); old_logprobs: where
    π_old comes from (sampler or recompute)."""
    c = run.cfg
    reward = ("the environment's rule verifier, 1 or 0 per response (RLVR)" if not c.get("reward_model") else
              f"the reward model `{c['reward_model']}` at the last response token (RLHF); the verifier is logged")
    beta = f"adaptive towards {c['kl_target']} nats per response" if c.get("kl_target") else "fixed"
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo {c['algo']}`, started from `{c['init_from']}`

## Data and mode
- online: prompts from a pool of {c['prompt_pool']} `{c['env']}` *train* problems, {c['group_size']} answer(s)
  each, written by the current policy at temperature {c['temperature']}; evaluation on *heldout* and *ood*
- reuse: each rollout batch serves {c['inner_epochs']} epochs × {c['minibatches']} minibatches, then is dropped

## Reward and verification
- {reward}; a truncated answer gets what the reward gives it
- {verification_text(verifier_check)}; parse_error_rate logged every iteration

## Optimisation
- on-policy clipped surrogate (ε = {c['clip_eps']}) and clipped value loss (ε_v = {c['value_clip']}, c_v = {c['vf_coef']}),
  GAE γ = {c['gamma']}, λ = {c['lam']}, advantages whitened over the global batch; token-level loss
- roles: policy (trained), critic (trained, from `{c.get('critic_init', 'policy')}`), reference (frozen), π_old
  ({c['old_logprobs']} → {old_logprobs}){", reward model (frozen)" if c.get('reward_model') else ""}
- KL to π_ref: {'k3' if c['algo'] == 'ppo_k3' else 'k1'} per token folded into the reward, β = {c['kl_coef']} ({beta})
- no groups, so no degenerate-group rule

## Infrastructure
- generation and training on the same device(s): {run.device} × {run.world_size}, synchronous
"""


def opd_passport(run, verifier_check, teacher, privileged):
    """OPD's passport: teacher, the frozen teacher (or the student under --teacher=self); privileged, the
    template of the teacher's privileged prompt, or None."""
    c = run.cfg
    reads = f", reading a privileged prompt: `{privileged!r}`" if privileged else ", reading the student's prompt"
    if c["teacher"] == "self":
        teacher = "the student's own current weights (OPSD), detached" + reads
    else:
        t = teacher.config
        teacher = (f"`{c['teacher']}`, frozen, {t.n_layer} layers × {t.n_embd} "
                   f"({count_parameters(teacher)[1]:,} parameters)" + reads)
    signal = ("cross-entropy on the teacher's own samples (off-policy distillation)" if c["algo"] == "opd_teacher_samples"
              else "per-token reverse KL(π_student ‖ π_teacher) on the student's sampled positions")
    anchor = (f"anchor: + {c['anchor_coef']} · KL(π_student ‖ π_init) on the same positions, π_init = `{c['init_from']}` "
              f"frozen" if c.get("anchor_coef") else "no reward model, no critic, no KL to a reference beyond the teacher itself")
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo {c['algo']}`, on-policy distillation, started from `{c['init_from']}`

## Data and mode
- online: {c['prompts_per_iter']} prompts × {c['group_size']} answers per iteration sampled by the current student
  at temperature {c['temperature']}, {c['max_iters']} iterations, one optimizer step per batch
- prompts: the `{c['env']}` environment's *train* split; evaluation on *heldout* and *ood*
- the verifier's accuracy is logged (verifier_acc), never trained on; {verification_text(verifier_check)};
  parse_error_rate logged every iteration

## Optimisation
- teacher: {teacher}
- loss: {signal}{f", on the teacher's top k = {c['kl_topk']} tokens" if 'kl_topk' in c else ''}; both at temperature {c['temperature']}
- {anchor}

## Infrastructure
- {run.device} × {run.world_size}; rollouts in shards of {shard_size(run)} prompts, micro-batches of {c['batch_size']}
"""


def grpo_passport(run, verifier_check, old_logprobs, reward=None, changes=()):
    """GRPO's passport and its variants': old_logprobs: where π_old comes from (sampler or recompute);
    reward: where the reward comes from, in words (the verifier's 0/1 if None); changes: a variant's
    own options (the first line of its docstring is its title)."""
    c = run.cfg
    P, G, shard = c["prompts_per_iter"], c["group_size"], shard_size(run)
    steps = c["inner_epochs"] * c["minibatches"]
    mode = "on-policy (ρ = 1)" if steps == 1 else "off-policy after the first step (ρ ≠ 1)"
    reward = reward or f"the environment's rule verifier (`envs/`, `{c['env']}.verify`), 1 or 0 per response"
    title = " ".join(run.algo.__doc__.split(")")[0].split()) + ")"  # (a variant's docstring opens "NAME (paper)")
    variant = "" if c["algo"] == "grpo" else f"\nvariant: {title}\n" + \
        "".join(f"- {line}\n" for line in changes)
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo {c['algo']}`, started from `{c['init_from']}`
{variant}
## Data and mode
- online trajectories: {P} prompts × {G} responses per iteration, {c['max_iters']} iterations
- prompts: the `{c['env']}` environment's procedurally generated *train* split (fresh problems every iteration);
  evaluation on the *heldout* split (disjoint by equation) and *ood* (a digit more in the start value): no
  train/eval leakage by construction
- answers written by the current policy (π_old = the weights at the start of the iteration), temperature {c['temperature']}
- reuse of rollouts: {c['inner_epochs']} epoch(s) × {c['minibatches']} minibatch(es) = {steps} optimizer step(s) per batch, then discarded

## Reward and verification
- source: {reward}
- {verification_text(verifier_check)}; parse_error_rate is logged every iteration
- one scalar per response, no partial credit; a truncated answer (limit {c['max_new_tokens']} new tokens) simply fails the verifier

## Optimisation
- {mode}, clipped surrogate on token ratios with ε = {c['clip_eps']}; advantages (r − mean) / std of the group
- models: policy (trained), π_old ({c['old_logprobs']} log-probs → {old_logprobs}), π_ref (frozen `{c['init_from']}`);
  no critic, no reward model
- KL to π_ref: {f"a separate loss term β·k3 per token, β = {c['kl_coef']}, aggregated like the policy term" if c['kl_coef']
                else "no term in the loss (kl_coef = 0: π_ref runs only at evaluation, for heldout_kl_ref)"}
- loss aggregation: each response's token mean, over the responses of each optimizer step's global batch
- degenerate (all-equal-reward) groups: zero advantage, still counted

## Infrastructure
- generation and training on the same device(s): {run.device} × {run.world_size}, synchronous
- rollouts in shards of {shard} prompts (sampler batch {shard * G}), micro-batches of {c['batch_size']} responses
- time split per iteration in metrics.jsonl: time_decode, time_verify, time_score (π_ref/π_old forwards), time_update
"""
