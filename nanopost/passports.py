"""
The passports (SPEC §6, M14 §17): every algorithm's post-training passport (data and mode, reward and
verification, optimisation, infrastructure), written to out_dir/passport.md at setup (once it has
succeeded: run_dir.write_out); and what a passport reports of the verifier: its own error rate against
the environment's solver, and the parse-error check.
"""

from model import count_parameters
from nanopost.rewards import reward_weights
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
    elif c["algo"] == "pretrain":
        data = f"{c['corpus_docs']} documents of the `{c['env']}` environment's worked equations, packed into {c['block_size']}-token windows"
    else:
        data = (f"the `{c['env']}` solver's demonstrations of {c['train_problems']} *train* problems (a {c['env_direct_frac']} "
                f"share give only the answer"
                + (f"; a {c['reader_frac']} share instead read the worked solution in the prompt and write it out"
                   if c.get("reader_frac") else "") + "); validation on *heldout* problems, disjoint by equation")
    mask = "every token" if c["algo"] == "pretrain" else "the assistant's tokens only (prompt, template, tool output, padding masked)"
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


REWARD_TEXT = dict(
    outcome="one scalar per response, no partial credit",
    process="a reward at the last token of each verifiable step (env.step_rewards), normalised over the group's "
            "steps, each token's advantage the sum over the steps from it on",
    rlvp="R = O + β·Φ, β = {rlvp_beta}: the outcome and the rule engine's path signal (−{rlvp_penalty} per bad "
         "action, +{rlvp_bonus} per compliant one) normalised separately over the group, then combined",
    path="the path signal Φ alone, without the outcome (the inaction trap: an experiment, not a recipe)")


def reward_source(c):
    """Where GRPO's reward comes from (rewards.training_reward), in the passport's words."""
    verifier = f"the environment's rule verifier (`envs/`, `{c['env']}.verify`), 1 or 0 per response"
    if c["reward"] == "judge":
        k = c["judge_samples"]
        verifier = (f"a generative reward model, the judge `{c['judge']}` (judge.py): P(Verdict: correct) after "
                    + ("its greedy judgement" if not k else f"each of {k} judgements sampled at T = "
                       f"{c['judge_temperature']}, their mean") + "; the verifier's 0/1 logged beside it (judge_agree)")
    if not c["reward_weights"]:
        return verifier
    terms = " + ".join(f"{w:g}·{name}" for name, w in reward_weights(c["reward_weights"]).items())
    return f"a vector reward r = {terms} (rewards.DIMENSIONS, each logged as reward_<name>); correct: {verifier}"


def grpo_passport(run, verifier_check, old_logprobs, adv_scale, catches=None):
    """GRPO's passport; old_logprobs: where π_old comes from (sampler or recompute), adv_scale: the
    advantage's divisor (group, batch or none); catches: under break_it, the monitor that must fire."""
    c = run.cfg
    P, G, shard = c["prompts_per_iter"], c["group_size"], shard_size(run)
    kl = {"off": "not used (π_ref runs only at evaluation, for the logged heldout_kl_ref)", "k1_reward": f"in the reward: r − β·Σ_t log(π_old/π_ref), β = {c['kl_coef']}",
          "k3_loss": f"a separate loss term β·k3 per token, β = {c['kl_coef']}, aggregated like the policy term"}[c["kl"]]
    steps = c["inner_epochs"] * c["minibatches"]
    degenerate = ("not applicable (batch-mean baseline, no groups)" if c["estimator"] == "reinforce" else
                  {"drop": "dropped: out of every sum and denominator", "zeros": "zero advantage, still counted",
                   "raise": "an error"}[c["on_degenerate"]])
    if c["dynamic_sampling_rounds"]:
        degenerate += f"; dynamic sampling refills them with up to {c['dynamic_sampling_rounds']} extra rollouts per shard"
    overlong = (f"soft penalty over the last {c['overlong_cache']} tokens before the limit" if c["overlong_cache"]
                else "no penalty (a truncated answer simply fails the verifier)")
    sync = ("one-step-off (staleness 1): the rollouts of iteration k + 1 are sampled by the weights of k, in a second "
            "thread, while k updates; the loss's ratio is against the sampler's log-probs" if c["staleness"]
            else "synchronous (staleness 0)")
    loss = "CISPO (capped, detached ratio × log π)" if c["policy_loss"] == "cispo" else "clipped surrogate"
    mode = "on-policy (ρ = 1)" if steps == 1 and not c["staleness"] else "off-policy after the first step (ρ ≠ 1)"
    scale = {"group": "the group's std", "batch": "the global batch's std", "none": "nothing"}[adv_scale]
    tis = (f"truncated importance sampling, weight min(π_old/π_sampler, {c['tis_cap']})" if c["tis_cap"]
           else "no correction (sampler_logprob_gap logged with old_logprobs=recompute)")
    prompts = ("fresh problems every iteration" if c["prompt_sampling"] == "uniform" else
               f"edge sampling from a fixed pool of {c['prompt_pool']}, success band [{c['edge_low']}, {c['edge_high']}]")
    broken = ("" if c["break_it"] == "none" else
              f"; BROKEN ON PURPOSE: break_it={c['break_it']}, which the monitor `{catches}` must catch")
    cut = ", ".join(f"{k} {c[k]}" for k in ("top_k", "top_p") if c[k] and c[k] != 1.0)
    scored = ("the whole softmax (break_it)" if c["break_it"] == "top_p_uncorrected"
              else "the same renormalised distribution, π_ref on its whole one")
    sampling = f"temperature {c['temperature']}" + (f", truncated ({cut}): π_θ and π_old scored on {scored}" if cut else "")
    entropy = ", ".join([f"Clip-Cov on the {c['clip_cov']} share of tokens of largest cov(log π, A)"] * bool(c["clip_cov"])
                        + [f"policy gradient on the top {c['top_entropy_quantile']} of tokens by entropy"]
                        * (c["top_entropy_quantile"] < 1)) or "none (entropy logged)"
    return f"""# Post-training passport: {c['out_dir']}

algorithm: `--algo grpo` with estimator **{c['estimator']}**, loss aggregation **{c['loss_agg']}**, started from `{c['init_from']}`

## Data and mode
- online trajectories: {P} prompts × {G} responses per iteration, {c['max_iters']} iterations
- prompts: the `{c['env']}` environment's procedurally generated *train* split ({prompts}); evaluation on the *heldout* split
  (disjoint by equation) and *ood* (a digit more in the start value): no train/eval leakage by construction
- answers written by the current policy (π_old = the weights at the start of the iteration), {sampling}
- reuse of rollouts: {c['inner_epochs']} epoch(s) × {c['minibatches']} minibatch(es) = {steps} optimizer step(s) per batch, then discarded

## Reward and verification
- source: {reward_source(c)}{broken}
- {verification_text(verifier_check)}; parse_error_rate is logged every iteration
- reward_mode {c['reward_mode']}: {REWARD_TEXT[c['reward_mode']].format(**c)}; overlong answers: {overlong}
  (limit {c['max_new_tokens']} new tokens{"; a cut answer gets no loss term" if c["mask_truncated"] else ""})

## Optimisation
- {mode}, {loss} on {c['ratio_level']} ratios with ε_low = {c['eps_low']}, ε_high = {c['eps_high']};
  advantages: {c['estimator']} baseline, divided by {scale}
- sampler/trainer mismatch: {tis}
- models: policy (trained), π_old ({c['old_logprobs']} log-probs → {old_logprobs}), π_ref (frozen `{c['init_from']}`);
  no critic, {'the judge (frozen `' + c['judge'] + '`)' if c['reward'] == 'judge' else 'no reward model'}
- KL to π_ref: {kl}
- entropy controls: {entropy}
- loss aggregation units: {c['loss_agg']} over each optimizer step's global batch
- degenerate (all-equal-reward) groups: {degenerate}

## Infrastructure
- generation and training on the same device(s): {run.device} × {run.world_size}, {sync}
- rollouts in shards of {shard} prompts (sampler batch {shard * G}), micro-batches of {c['batch_size']} responses
- time split per iteration in metrics.jsonl: time_decode, time_verify, time_score (π_ref/π_old forwards), time_update
"""
