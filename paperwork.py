"""
The run's paperwork (SPEC §6, M14 §17): its post-training passport, the verifier's own error rate
against the environment's solver, and the parse-error check.
"""

import os


def write_passport(run, text):
    """The run's post-training passport (SPEC §6: data and mode, reward and verification, optimisation,
    infrastructure) as out_dir/passport.md, written by rank 0 at setup."""
    if run.master:
        with open(os.path.join(run.cfg["out_dir"], "passport.md"), "w") as f:
            f.write(text)


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
