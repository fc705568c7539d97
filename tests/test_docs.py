"""The README and docs/: every link resolves inside the repository, nothing points at what a reader
of the repository cannot open (a machine path, an issue tracker's numbers), no sentence speaks of
how the project was made, and every documented command uses options its script really takes."""

import argparse
import ast
import difflib
import glob
import os
import re
import runpy
import shlex
import sys
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def links(path):
    """The targets of the markdown links and images of a page: [text](target)."""
    return re.findall(r"\]\(([^)\s]+)\)", open(path).read())


def anchors(path):
    """The anchors of a markdown page's headings, as GitHub makes them: lower case, punctuation other
    than - and _ dropped, spaces as -, a repeated heading numbered -1, -2, ..."""
    seen, out = {}, set()
    fenced = False
    for line in open(path).read().splitlines():
        if re.match(r"\s*(```|~~~)", line):
            fenced = not fenced
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not fenced:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_link_resolves_inside_the_repository():
    broken = []
    for page in PAGES:
        for target in links(page):
            if target.startswith(("http://", "https://")):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0] or os.path.basename(page)))
            if not path.startswith(ROOT) or not os.path.exists(path):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
            elif "#" in target and path.endswith(".md") and target.split("#", 1)[1] not in anchors(path):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target} (no such heading)")
    assert not broken and len(PAGES) > 5, "links that do not resolve:\n" + "\n".join(broken)


def test_no_page_points_outside_the_repository():
    for page in PAGES:
        text = open(page).read()
        assert not re.search(r"/work/|\.\./shared|\bissue \d+", text), page


def test_the_readme_fits_on_a_few_screens():
    assert len(open(PAGES[0]).read().splitlines()) <= 250


# ----------------------------------------------------------------------------------------------
# No sentence speaks of how the project was made

# The pages describe the code and the measurements, not the people, machines, schedules and tasks
# that produced them: a reader cannot check "no further GPU was lent" or "six other engineers'
# jobs", and such sentences go stale the day they are written. What a measurement ran on ("2 cores
# at 1 thread beside other processes") is a fact about the measurement and stays allowed. Each
# pattern is matched case-insensitively; each is narrow enough that "the README", "the tests" or
# "the chapter" do not match.
BANNED = [
    r"\bwe\b", r"\bwe'(?:ve|re|d|ll)\b", r"\bour(?:s|selves)?\b", r"\bus\b",  # the makers as "we"
    r"\bengineers?\b", r"\bpeople's\b", r"\bcolleagues?\b",                   # the people who made it
    r"\btoday(?:'s)?\b", r"\btonight\b", r"\byesterday\b", r"\bthe day's\b", r"\bof the day\b",  # when
    r"\bsessions?\b", r"\bwas lent\b", r"\blent to\b", r"\bno (?:further |other )?gpu was\b",
    r"\bwhile writing\b", r"\bdeadline\b", r"\btime[- ]boxed\b", r"\bhad to start\b",
    r"\bthis round\b", r"\bworking environment\b", r"\bour environment\b",
    r"\bissue(?:'s|s)?\b", r"\btickets?\b", r"\bthe brief\b",  # the tasks it was made under
    r"\bnot run (?:yet|today)\b", r"\bnot (?:yet )?possible\b",
]


def prose(path):
    """(line number, line) of a page, inline code spans blanked (a quoted command is not a sentence)."""
    for number, line in enumerate(open(path).read().splitlines(), 1):
        yield number, re.sub(r"`[^`]*`", "``", line)


def banned_phrases(lines):
    """[(line number, phrase, pattern)] of the banned phrases in [(line number, line)], a phrase
    wrapped over two lines included (reported at its first line)."""
    found = []
    for i, (number, line) in enumerate(lines):
        following = lines[i + 1][1] if i + 1 < len(lines) else ""
        joined = line + " " + following.lstrip()
        for pattern in BANNED:
            for match in re.finditer(pattern, joined, re.IGNORECASE):
                if match.start() < len(line):  # starts on this line (one wholly on the next is its own)
                    found.append((number, match.group(0), pattern))
    return found


def test_no_sentence_speaks_of_how_the_project_was_made():
    found = [f"{os.path.relpath(page, ROOT)}:{number}: {phrase!r} ({pattern})"
             for page in PAGES for number, phrase, pattern in banned_phrases(list(prose(page)))]
    assert not found, "sentences about how the project was made:\n" + "\n".join(found)


def test_the_banned_patterns_catch_what_they_are_for():
    def caught(text):
        return any(re.search(p, text, re.IGNORECASE) for p in BANNED)
    for text in ["two cores shared by seven engineers", "six other engineers' jobs", "our working environment",
                 "no further GPU was lent", "the issue's targets", "Not run today", "Routes we considered",
                 "No GPU was available while writing this", "to fit the session"]:
        assert caught(text), text
    for text in ["the README says", "measured on 2 cores at 1 thread beside other processes; timings are "
                 "indicative", "the tests check it", "the chapter's claim", "i.e. the same", "credit assignment",
                 "status: one run", "the tests are fast", "a bonus"]:
        assert not caught(text), text
    assert {phrase for _, phrase, _ in banned_phrases([(1, "no further GPU was"), (2, "lent in the end")])} == {
        "no further GPU was", "was lent"}  # a phrase wrapped over two lines


# ----------------------------------------------------------------------------------------------
# Every documented command uses options its script takes

def documented_commands(path):
    """(line number, command text) of every line of a fenced or indented code block and of every
    inline code span of a page (a span may wrap over lines), continuation lines joined."""
    lines = open(path).read().splitlines()
    out, prose_lines, fenced, previous_blank, in_indented = [], [], False, True, False
    for number, line in enumerate(lines, 1):
        if re.match(r"\s*(```|~~~)", line):
            fenced = not fenced
            prose_lines.append((number, ""))
            continue
        indented = re.match(r"( {4,}|\t)\S", line) and (previous_blank or in_indented)
        if fenced or indented:
            out.append((number, line.strip()))
            prose_lines.append((number, ""))
        else:
            prose_lines.append((number, line))
        in_indented = bool(indented) and not fenced
        previous_blank = not line.strip()
    joined = []  # continuation lines (ending in a backslash) joined to the next
    for number, text in out:
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + text)
        else:
            joined.append((number, text))
    text = "\n".join(line for _, line in prose_lines)
    starts = [0]
    for _, line in prose_lines:
        starts.append(starts[-1] + len(line) + 1)
    for match in re.finditer(r"`([^`]+)`", text):
        number = next(i for i, start in enumerate(starts) if start > match.start())
        joined.append((number, " ".join(match.group(1).split())))
    return sorted(joined)


def split_commands(text):
    """The shell words of each simple command in a line: split at ;, &&, ||, | and after a comment."""
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words = list(lexer)
    except ValueError:  # an unbalanced quote in prose-like code: plain words
        words = text.split("#")[0].split()
    commands, current = [], []
    for word in words:
        if word and set(word) <= set(";&|"):
            commands.append(current)
            current = []
        else:
            current.append(word)
    return commands + [current]


def script_of(words):
    """(index of the script's word, its path) for `[env ...] python SCRIPT.py ...` or
    `torchrun ... train.py ...`, else None."""
    for i, word in enumerate(words):
        if os.path.basename(word) in ("python", "python3") and i + 1 < len(words):
            nxt = words[i + 1]
            return (i + 1, nxt) if nxt.endswith(".py") and not nxt.startswith("-") else None
        if os.path.basename(word) == "torchrun":
            return next(((j, w) for j, w in enumerate(words) if j > i and w.endswith(".py")), None)
    return None


def options_of(words):
    """[(key, value or None)] of the `--key=value` / `--key value` / `--flag` words after a script,
    and the positional words."""
    keys, positional, i = [], [], 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            key, eq, value = word[2:].partition("=")
            if not eq and i + 1 < len(words) and not words[i + 1].startswith("-") and key not in ("help", "quick",
                                                                                                      "tiny", "search"):
                value, i = words[i + 1], i + 1
            keys.append((key, value if (eq or value) else None))
        elif word not in ("...", "\\"):
            positional.append(word)
        i += 1
    return keys, positional


class _Parsed(Exception):
    pass


_PARSERS = {}


def script_flags(path):
    """The option strings an argparse script accepts (its parser, captured as the script's main
    reaches parse_args), or None for a script that does not use argparse."""
    if path not in _PARSERS:
        if "argparse" not in open(path).read():
            _PARSERS[path] = None
            return None
        parsers = []

        def grab(self, *args, **kwargs):
            parsers.append(self)
            raise _Parsed

        with mock.patch.object(argparse.ArgumentParser, "parse_args", grab), \
                mock.patch.object(argparse.ArgumentParser, "parse_known_args", grab), \
                mock.patch.object(sys, "argv", [path]), mock.patch.object(sys, "path", list(sys.path)):
            try:
                runpy.run_path(path, run_name="__main__")
            except _Parsed:
                pass
        assert parsers, f"{path}: its parser was never reached"
        _PARSERS[path] = {s for action in parsers[0]._actions for s in action.option_strings}
    return _PARSERS[path]


def train_keys():
    """{algo: the keys train.py accepts for it}, RENAMED and REMOVED (from train.py)."""
    from nanopost import options as T
    return ({algo: set(T.make_config(dict(algo=algo))) for algo in T.available_algos()},
            dict(getattr(T, "RENAMED", {})), dict(getattr(T, "REMOVED", {})))


def key_problem(key, accepted, renamed, removed):
    """Why `--key` is wrong (a renamed or removed key, or an unknown one), or None."""
    if key in renamed:
        return f"--{key} was renamed: use --{renamed[key]}"
    if key in removed:
        return f"--{key} was removed ({removed[key]})"
    if key not in accepted:
        close = difflib.get_close_matches(key, accepted, n=2)
        return f"--{key} is not an option" + (f" (did you mean {', '.join('--' + c for c in close)}?)" if close else "")
    return None


def command_problems(words):
    """What is wrong with one documented command (a list of shell words): [why, ...]."""
    import ladder
    from nanopost import options as T
    found = script_of(words)
    if not found:
        return []
    index, script = found
    path = os.path.normpath(os.path.join(ROOT, script))
    if os.path.isabs(script) or not path.startswith(ROOT):
        return []
    if not os.path.isfile(path):
        return [f"{script} does not exist"]
    keys, positional = options_of(words[index + 1:])
    by_algo, renamed, removed = train_keys()
    every_train_key = set().union(*by_algo.values())
    problems = []
    name = os.path.relpath(path, ROOT)
    if name == "train.py":
        algo = T.DEFAULTS["algo"]
        for word in positional:
            if word.endswith(".py"):
                config = os.path.join(ROOT, word)
                if not os.path.isfile(config):
                    problems.append(f"{word} does not exist")
                    continue
                scope = {}
                exec(open(config).read(), scope)
                algo = scope.get("algo", algo)
        algo = dict(keys).get("algo") or algo
        if re.fullmatch(r"[A-Z_]+|<.*>", algo):  # a placeholder (--algo X): any algorithm's key
            by_algo[algo] = every_train_key
        if algo not in by_algo:
            return problems + [f"--algo {algo} is not an algorithm ({', '.join(sorted(by_algo))})"]
        accepted = by_algo[algo] | {"help"}
        problems += [p for key, _ in keys if (p := key_problem(key, accepted, renamed, removed))]
    elif name == "ladder.py":
        stage_algos = {stage: (args.get("algo"), args.get("env")) for stage, args, _ in ladder.STAGES}
        for key, _ in keys:
            stage, dot, stage_key = key.partition(".")
            if key in ladder.OPTIONS or key == "help":
                continue
            if dot:
                if stage not in stage_algos:
                    problems.append(f"--{key}: no stage {stage!r} ({', '.join(stage_algos)})")
                    continue
                algo, env = stage_algos[stage]
                accepted = set(T.make_config(dict(algo=algo, **({"env": env} if env else {}))))
                problem = key_problem(stage_key, accepted, renamed, removed)
                if problem:
                    problems.append(f"--{key}: stage {stage} ({algo}): {problem}")
            elif problem := key_problem(key, every_train_key | set(ladder.OPTIONS), renamed, removed):
                problems.append(problem)
    elif name == os.path.join("experiments", "bench.py"):  # its own parsing: benchmark names, then --device=, --out=, --init_from=, --tiny
        from experiments import bench
        problems += [f"{word}: no such benchmark ({', '.join(bench.BENCHMARKS)})" for word in positional
                     if word not in bench.BENCHMARKS]
    else:
        flags = script_flags(path)
        if flags is None:  # a script with its own parsing (qlearn.py, export.py): it exists
            return problems
        for key, value in keys:
            if f"--{key}" not in flags:
                close = difflib.get_close_matches(f"--{key}", sorted(flags), n=2)
                problems.append(f"--{key} is not an option of {name}" + (f" (did you mean {', '.join(close)}?)"
                                                                         if close else ""))
            elif key == "set" and value:  # --set KEY=VALUE: a train.py key for every run
                problem = key_problem(value.split("=", 1)[0], every_train_key, renamed, removed)
                if problem:
                    problems.append(f"--set {value}: {problem}")
    return problems


def every_documented_command():
    """("page:line", the command's shell words) of every command of every page."""
    for page in PAGES:
        for number, text in documented_commands(page):
            for words in split_commands(text):
                yield f"{os.path.relpath(page, ROOT)}:{number}", words


def test_every_documented_command_uses_options_its_script_takes():
    found, checked = [], 0
    for where, words in every_documented_command():
        checked += bool(script_of(words))
        found += [f"{where}: `{' '.join(words)[:90]}`: {why}" for why in command_problems(words)]
    assert not found, "documented commands with options their scripts do not take:\n" + "\n".join(found)
    assert checked > 50


def test_the_command_checker_catches_what_it_is_for():
    from nanopost import options as T
    def problems(text):
        return [why for words in split_commands(text) for why in command_problems(words)]
    assert not problems("python train.py --algo grpo config/dapo.py --init_from=out/sft --max_iters=40  # a comment")
    assert not problems("torchrun --standalone --nproc_per_node=8 train.py --algo grpo --fsdp=True")
    assert not problems("python ladder.py --seeds=3 --grpo.learning_rate=3e-4 --threads=1 --max_iters=5")
    assert not problems('python sample.py out/grpo "What is 7 + 8 - 3 + 5?" --temperature=1')
    assert problems("python train.py --algo grpo --lr=3e-4")                         # an unknown key
    assert problems("python train.py --algo sft --group_size=8")                      # another algorithm's key
    assert problems("python ladder.py --dpo.kl_coef=8")                               # a key the stage does not take
    assert problems("python ladder.py --nostage.max_iters=8")
    assert problems("python experiments/opd_vs_grpo.py --student=out/sft")           # a script that is gone
    assert problems("python experiments/gpu_check.py --device=cpu --tiny")            # a flag it does not have
    assert problems("python experiments/ood.py --init_from=out/sft && python experiments/ood.py --split=x --bogus=1")
    assert problems("python experiments/agentic.py --set no_such_key=1")
    assert problems("python train.py --algo grpo config/no_such_recipe.py")
    assert problems("python experiments/bench.py no_such_benchmark")
    assert not problems("python experiments/bench.py rl_rollout --tiny")
    assert problems("python bench.py rl_rollout")                                      # where it used to live
    for old, new in T.RENAMED.items():
        assert any(new in why for why in problems(f"python train.py --algo grpo --{old}=8")), old


# ----------------------------------------------------------------------------------------------
# Every documented `python -c "..."` imports what exists

def python_c_code(words):
    """The code of `python -c CODE` in a command's words (also inside `$(...)`), else None."""
    for i, word in enumerate(words[:-2]):
        if os.path.basename(word.lstrip("$(")) in ("python", "python3") and words[i + 1] == "-c":
            # (in `$(python -c '...')` the closing parenthesis joins the quoted code as one shell word)
            return words[i + 2][:-1] if word.startswith("$(") and words[i + 2].endswith(")") else words[i + 2]
    return None


def import_problems(code):
    """What in a `python -c` line's code would fail before it runs: a syntax error, a module that does
    not exist, a name a module lacks (`from M import name`, or `alias.name` after `import M as alias`)."""
    import importlib
    import importlib.util
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return [f"not Python: {e.msg}"]
    problems, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if importlib.util.find_spec(alias.name.split(".")[0]) is None:
                    problems.append(f"no module {alias.name}")
                else:
                    modules[alias.asname or alias.name] = importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if importlib.util.find_spec(node.module.split(".")[0]) is None:
                problems.append(f"no module {node.module}")
                continue
            module = importlib.import_module(node.module)
            problems += [f"{node.module} has no {a.name}" for a in node.names if not hasattr(module, a.name)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if not hasattr(modules[node.value.id], node.attr):
                problems.append(f"{modules[node.value.id].__name__} has no {node.attr}")
    return problems


def test_every_documented_python_c_line_imports_what_exists():
    found, checked = [], 0
    for where, words in every_documented_command():
        code = python_c_code(words)
        if code is not None:
            checked += 1
            found += [f"{where}: {why}" for why in import_problems(code)]
    assert not found, "documented `python -c` lines that fail:\n" + "\n".join(found)
    assert checked >= 2


def test_the_python_c_checker_catches_what_it_is_for():
    code = lambda text: python_c_code(split_commands(text)[0])
    assert import_problems(code('''python -c "import common as C; print(C.gpu_memory_gib(8e9, 'ppo', 8, True))"''')) == [
        "no module common"]
    assert import_problems(code('python -c "from nanopost.distributed import gpu_memory_gib; print(1)"')) == []
    assert import_problems(code('python -c "from nanopost.distributed import gone"')) == ["nanopost.distributed has no gone"]
    assert import_problems(code('python -c "import nanopost.bands as B; B.nope(1)"')) == ["nanopost.bands has no nope"]
    assert import_problems(code("echo $(python -c 'import site; print(site.getsitepackages()[0])')")) == []
    assert import_problems(code('python -c "print(("')) == ["not Python: '(' was never closed"]


def test_the_gpu_pages_commands_run_in_the_order_shown():
    """docs/gpu.md's "Running on GPUs" opens with the CUDA install line, and each train.py command in it
    starts from what an earlier one wrote and writes where none did: a refused start (RL from a
    random model) or a refused out_dir (one that holds a run) would stop a reader there."""
    from nanopost import options
    text = open(os.path.join(ROOT, "docs", "gpu.md")).read()
    block = text.split("## Running on GPUs\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert block[0].split()[:3] == ["pip", "install", "torch==2.13.0"]
    written, runs = [], 0
    for line in block:
        words = split_commands(line)[0]
        found = script_of(words)
        if not found:
            continue
        cfg = options.make_config(options.parse_args(words[found[0] + 1:]))
        needs = getattr(options.algo_module(cfg["algo"]), "starts_from", {}).get("init_from")
        assert cfg["init_from"] in written or (cfg["init_from"] == "scratch" and not needs), line
        assert cfg["out_dir"] not in written, line
        written.append(cfg["out_dir"])
        runs += 1
    assert runs == 3


def test_every_test_the_guarantees_name_exists():
    """docs/guarantees.md backs each promise with a test by name: each name is a test of the suite."""
    named = set(re.findall(r"`(test_\w+)`", open(os.path.join(ROOT, "docs", "guarantees.md")).read()))
    defined = set(re.findall(r"^def (test_\w+)\(", "".join(open(f).read() for f in glob.glob(os.path.join(ROOT, "tests", "*.py"))), re.M))
    assert len(named) > 40 and not named - defined, sorted(named - defined)
