"""
The project's one band rule: how sure a measured accuracy is, for one run, across seeds, and for two
arms compared on the same problems. The ladder and every study call these; nothing else computes a band.

    one evaluation of n problems:   Wilson's 95% interval (low, high) of p; as a band p ± the larger of
                                    p − low and high − p, so that 0/n and n/n still claim an error
                                    (0 of 1,000: 0.000 ± 0.004), where the Wald p ± 1.96·√(p(1 − p)/n)
                                    claims none
    k ≥ 3 seeds:                    mean ± √((t(0.975, k − 1)·s/√k)² + b²), b the one-evaluation band of
                                    the mean (a figure that is no accuracy, an entropy: the t band alone)
    2 seeds:                        both values and their range; no band is claimed
    two arms on the same problems:  the per-problem differences d_i ∈ {−1, 0, 1}:
                                    mean(d) ± 1.96·sd(d)/√n            (one seed, paired)
                                    the per-seed paired differences with the k-seed rule, b the seeds'
                                    per-problem paired band (root mean square) (several seeds)

Why the floor: seeds evaluated on the same n problems share those problems, so their agreement says
nothing about how the n problems were drawn: the seeds' spread and the problems' draw are two errors,
and independent errors add in variance (a max() of the two would claim less than either with the
other). The same holds for a paired difference over seeds: its floor is the per-problem paired band,
which only a script that keeps each problem's result can give (None: the t band alone, and the cell
says so). Why nothing for 2 seeds: t(0.975, 1) = 12.7, a band wider than the figure.
"""

import math

# t(0.975, df) for df = 1..30; beyond, the normal quantile's expansion (error < 1e-3 from df 30 on)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t_975(df):
    """The 97.5% quantile of Student's t with df degrees of freedom (two-sided 95%)."""
    if df < 1:
        raise ValueError(f"t quantile: df={df}, at least 1")
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


Z_975 = 1.959964


def wilson(p, n):
    """Wilson's 95% interval (low, high) of an accuracy p measured on n problems (n·p of them right):
    (p + z²/2n ∓ z·√(p(1 − p)/n + z²/4n²)) / (1 + z²/n); inside [0, 1], and wider than nothing at 0 and 1
    (0 of n: 0 to z²/(n + z²))."""
    z2 = Z_975 ** 2
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_975 / (1 + z2 / n) * math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n))
    return max(center - half, 0.0), min(center + half, 1.0)


def binomial(p, n):
    """95% half-width of an accuracy p measured on n problems: Wilson's interval written as p ± h, h the
    larger of its two sides (it covers the interval; near 0.5 it is the Wald 1.96·√(p(1 − p)/n))."""
    if not n:
        return float("nan")
    low, high = wilson(p, n)
    return max(p - low, high - p)


def across_seeds(values, n):
    """(mean, half-width) of one figure over k seeds' runs, each measured on n problems (the same n).
    k = 1: the binomial band; k = 2: half-width None (report both values and their range, claim
    nothing beyond them); k ≥ 3: t(0.975, k − 1)·SE and the binomial band of the mean added in variance.
    n = None: a figure that is no accuracy (an entropy): the t band alone (k = 1: none claimed)."""
    k = len(values)
    mean = sum(values) / k
    if k == 1:
        return mean, binomial(mean, n) if n else None
    if k == 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    return mean, math.hypot(t_975(k - 1) * sd / math.sqrt(k), binomial(mean, n) if n else 0.0)


def envelope(values, n):
    """(mean, low, high) of one figure over seeds, for a plot: the mean ± its band (across_seeds), or,
    where no band is claimed (two seeds; one seed of a figure that is no accuracy), the seeds' range."""
    mean, half = across_seeds(values, n)
    return (mean, min(values), max(values)) if half is None else (mean, mean - half, mean + half)


def paired(a, b):
    """(mean difference, half-width) of arm a minus arm b on the same problems, one seed: a and b are
    0/1 per problem (or any per-problem scores), in the same order. The band is 1.96 standard
    errors of the per-problem differences, far tighter than two independent bands where the arms
    mostly agree."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired: {len(a)} and {len(b)} problems; the arms must share their problems")
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    return mean, 1.96 * sd / math.sqrt(n)


def paired_across_seeds(differences, problem_bands):
    """(mean, half-width) of per-seed paired differences (seed k's arm a minus its arm b, on the same
    problems), `problem_bands` each seed's per-problem paired half-width (`paired`'s), or None where the
    script keeps no per-problem results: k ≥ 3: t(0.975, k − 1)·SE and the bands' root mean square added
    in variance (None: the t band alone); None for k = 2 (report both); the one seed's own value with no
    band for k = 1 (use `paired` on its per-problem results)."""
    k = len(differences)
    mean = sum(differences) / k
    if k < 3:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in differences) / (k - 1))
    floor = math.sqrt(sum(h * h for h in problem_bands) / len(problem_bands)) if problem_bands else 0.0
    return mean, math.hypot(t_975(k - 1) * sd / math.sqrt(k), floor)


def cell(values, n, digits=3):
    """A table cell for a figure over seeds: 'mean ± h' (k = 1 or k ≥ 3) or 'a, b (range r)' (k = 2)."""
    mean, half = across_seeds(values, n)
    if half is None and len(values) == 1:
        return f"{mean:.{digits}f}"
    if half is None:
        return f"{values[0]:.{digits}f}, {values[1]:.{digits}f} (range {abs(values[0] - values[1]):.{digits}f})"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def signed(mean, half):
    """A difference as text: '+mean ± half', or '+mean' where no band is claimed (half None)."""
    return f"{mean:+.3f}" + (f" ± {half:.3f}" if half is not None else "")


def beyond(mean, half):
    """How a difference is called: +1 where its band lies wholly above 0, −1 wholly below, 0 where it holds 0."""
    return 1 if mean - half > 0 else -1 if mean + half < 0 else 0


def paired_cell(differences, problem_bands):
    """A paired difference over seeds as text: '+mean ± h (per seed +a, +b, ...)', paired_across_seeds' band
    (none under 3 seeds; "no per-problem floor" where problem_bands is None)."""
    mean, half = paired_across_seeds(differences, problem_bands)
    unfloored = half is not None and problem_bands is None
    return (signed(mean, half) + (" (t band alone: no per-problem floor)" if unfloored else "")
            + f" (per seed {', '.join(f'{v:+.3f}' for v in differences)})")
