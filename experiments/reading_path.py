"""
The reading path of a run: the source a learner must read to know what one training run executes.

    python experiments/reading_path.py                  # SFT, DPO and GRPO: lines, functions, files
    python experiments/reading_path.py --algo grpo -v   # one algorithm, every function on its path
    python experiments/reading_path.py --write-docs     # the reading map in docs/internals.md

Definition (the one tests/test_layout.py enforces): the project functions called while

    python train.py --algo X --init_from=out/sft --max_iters=1 --eval_interval=0

runs (SFT and pretraining from out/pretrain; OPD with --teacher=out/sft), each function once, counted as its whole `def` with
its docstring and decorators; lines are the union of those spans in each file (a closure is counted
inside the function that holds it, not twice). tests/ and experiments/ are not the project's path.
The starting checkpoints are made here by two short untraced runs (pretrain, then SFT), so that the
traced run is the one a learner would launch after the ladder. The house: the import graph over the
top-level files and folders (a folder is one room), its floors, cycles and arrows that run upward.
"""

import ast
import os
import runpy
import sys
import tempfile
import threading
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_THE_PATH = ("tests", "experiments")
BUDGETS = dict(grpo=(1000, 10), dpo=(800, 9), sft=(600, 7))  # the targets: (lines, files)


def project_file(path):
    """Whether `path` is the project's own source, on a reading path (not tests/, experiments/, nor a
    virtual environment or any installed package inside the checkout, such as CI's .venv)."""
    path = os.path.abspath(path)
    if not path.startswith(ROOT + os.sep) or not path.endswith(".py"):
        return False
    parts = os.path.relpath(path, ROOT).split(os.sep)
    return parts[0] not in NOT_THE_PATH and not parts[0].startswith(".") and "site-packages" not in parts


def definitions(path, cache={}):
    """[(first line with decorators, last line, name, def line)] of every function and lambda in a file."""
    if path not in cache:
        spans = []
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                spans.append((first, node.end_lineno, getattr(node, "name", "<lambda>"), node.lineno))
        cache[path] = spans
    return cache[path]


def enclosing(path, line, name):
    """The definition a code object that starts at `line` belongs to: its own def (or lambda), else the
    innermost function around it (a generator expression's); None at module level."""
    spans = definitions(path)
    own = [s for s in spans if s[3] == line and (s[2] == name or name == "<lambda>")]
    if own:
        return own[0]
    around = [s for s in spans if s[0] <= line <= s[1] and s[2] != "<lambda>"]
    return min(around, key=lambda s: s[1] - s[0]) if around else None


def trace_run(argv, cwd):
    """Run `python train.py ARGV` in this process from `cwd`; returns {(file, span)} of the project
    functions it called (every thread)."""
    called = set()
    seen_codes = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in seen_codes:
            return
        seen_codes.add(code)
        if project_file(code.co_filename):
            span = enclosing(code.co_filename, code.co_firstlineno, code.co_name)
            if span is not None:
                called.add((os.path.abspath(code.co_filename), span))

    old_argv, old_cwd, old_path = sys.argv, os.getcwd(), list(sys.path)
    sys.argv, sys.path[0:0] = [os.path.join(ROOT, "train.py")] + argv, [ROOT]
    os.chdir(cwd)
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise RuntimeError(f"train.py {' '.join(argv)} exited with {e.code}")
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        sys.argv, sys.path[:] = old_argv, old_path
        os.chdir(old_cwd)
    return called


def summarise(called):
    """{lines, functions, files, per_file: {file: (lines, functions)}, names: [file:name]} of a path."""
    spans = defaultdict(set)
    for path, span in called:
        spans[path].add(span)
    per_file = {}
    for path, file_spans in spans.items():
        lines = set()
        for first, last, _, _ in file_spans:
            lines.update(range(first, last + 1))
        functions = [s for s in file_spans if s[2] != "<lambda>" or not any(
            o[0] <= s[0] and s[1] <= o[1] and o is not s and o[2] != "<lambda>" for o in file_spans)]
        per_file[os.path.relpath(path, ROOT)] = (len(lines), len(functions))
    names = sorted(f"{os.path.relpath(p, ROOT)}:{s[0]}:{s[2]}" for p, s in called)
    return dict(lines=sum(v[0] for v in per_file.values()), functions=sum(v[1] for v in per_file.values()),
                files=len(per_file), per_file=dict(sorted(per_file.items(), key=lambda kv: -kv[1][0])), names=names)


def make_starts(workdir, tiny=False):
    """out/pretrain and out/sft in `workdir`: two short untraced runs of the default model (tiny: a
    model of one narrow layer, for the test; the functions a run calls do not depend on its size)."""
    from subprocess import run
    common = ["--max_iters=2", "--eval_interval=0", "--plot=False"]
    shape = ["--n_layer=1", "--n_head=1", "--n_embd=16"] if tiny else []
    for algo, start in (("pretrain", shape), ("sft", ["--init_from=out/pretrain"])):
        run([sys.executable, os.path.join(ROOT, "train.py"), f"--algo={algo}", *start, *common],
            cwd=workdir, check=True, capture_output=True)


def reading_path(algo, workdir):
    """The summary of `algo`'s reading path, run in `workdir` (which make_starts prepared), traced in a
    fresh process as a learner launches it: in a process that has imported the project already, what runs
    at import time (a module's constants computed by a function) would be missed."""
    import json
    from subprocess import run
    out = run([sys.executable, os.path.abspath(__file__), "--trace", algo, workdir], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"tracing --algo {algo} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def traced(algo, workdir):
    """`algo`'s reading path traced in this process (reading_path runs it in a fresh one)."""
    start = "out/pretrain" if algo in ("sft", "pretrain") else "out/sft"
    argv = [f"--algo={algo}", f"--init_from={start}", "--max_iters=1", "--eval_interval=0",
            f"--out_dir=out/path_{algo}", "--overwrite=True"] + (["--teacher=out/sft"] if algo == "opd" else [])
    return summarise(trace_run(argv, workdir))


# ----------------------------------------------------------------------------------------------
# The house: rooms (top-level files and folders), their import arrows, floors

def rooms():
    """{room: [its .py files]}: every top-level .py file, and every top-level folder with .py files
    (tests/ left out: a test is not part of the house)."""
    found = {}
    for entry in sorted(os.listdir(ROOT)):
        path = os.path.join(ROOT, entry)
        if entry.endswith(".py"):
            found[entry[:-3]] = [path]
        elif os.path.isdir(path) and entry not in ("tests", ".git", "docs", "out") and not entry.startswith("."):
            files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".py")]
            if files:
                found[entry] = sorted(files)
    return found


def imported_rooms(path, names):
    """The rooms a file imports, at any depth in it (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found.update(m.split(".")[0] for m in modules if m.split(".")[0] in names)
    return found


def house():
    """{arrows: {room: rooms it imports}, floors: {room: floor}, cycle: [rooms] or None}. A room's floor
    is one above the highest room it imports (a room that imports none: floor 1)."""
    found = rooms()
    arrows = {room: set().union(*(imported_rooms(f, found) for f in files)) - {room} for room, files in found.items()}
    floors, on_path = {}, []

    def floor(room):
        if room in on_path:
            raise ValueError("import cycle: " + " -> ".join(on_path[on_path.index(room):] + [room]))
        if room not in floors:
            on_path.append(room)
            floors[room] = 1 + max((floor(r) for r in arrows[room]), default=0)
            on_path.pop()
        return floors[room]
    for room in arrows:
        floor(room)
    return dict(arrows=arrows, floors=floors)


def reading_map(results):
    """The markdown table of docs/internals.md's reading map."""
    lines = ["| run | lines | functions | files | budget (lines, files) | the files, by lines on the path |",
             "|---|---|---|---|---|---|"]
    for algo, r in results.items():
        budget = BUDGETS.get(algo)
        files = ", ".join(f"{f} {n}" for f, (n, _) in r["per_file"].items())
        lines.append(f"| `--algo {algo}` | {r['lines']:,} | {r['functions']} | {r['files']} | "
                     f"{'%s, %s' % budget if budget else ''} | {files} |")
    return "\n".join(lines)


def write_docs(results, path=os.path.join(ROOT, "docs", "internals.md")):
    """Replace the table between the reading map's markers in docs/internals.md."""
    begin, end = "<!-- reading map: experiments/reading_path.py --write-docs -->", "<!-- end of the reading map -->"
    text = open(path).read()
    if begin not in text or end not in text:
        raise ValueError(f"{path}: the markers {begin!r} and {end!r} are missing")
    head, rest = text.split(begin, 1)
    text = head + begin + "\n" + reading_map(results) + "\n" + end + rest.split(end, 1)[1]
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv):
    if argv[:1] == ["--trace"]:  # (reading_path's fresh process: the summary as JSON on the last line)
        import json
        summary = traced(argv[1], argv[2])
        print("\n" + json.dumps(summary))
        return
    algos = [a.split("=", 1)[1] for a in argv if a.startswith("--algo=")] or \
        ([argv[argv.index("--algo") + 1]] if "--algo" in argv else ["sft", "dpo", "grpo"])
    if "--write-docs" in argv:  # (not rft: a start of two SFT iterations verifies no candidate to keep)
        algos = ["sft", "rm", "dpo", "ppo", "grpo", "opd"]
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        make_starts(workdir)
        for algo in algos:
            results[algo] = reading_path(algo, workdir)
    for algo, r in results.items():
        budget = BUDGETS.get(algo)
        print(f"{algo}: {r['lines']:,} lines in {r['functions']} functions over {r['files']} files"
              + (f" (budget {budget[0]:,} lines in {budget[1]} files)" if budget else ""))
        for f, (n, k) in r["per_file"].items():
            print(f"  {f:28s} {n:5d} lines, {k:3d} functions")
        if "-v" in argv:
            print("\n".join("    " + name for name in r["names"]))
    h = house()
    print(f"house: {len(h['floors'])} rooms on {max(h['floors'].values())} floors, "
          f"{sum(len(a) for a in h['arrows'].values())} arrows")
    for level in sorted(set(h["floors"].values()), reverse=True):
        print(f"  floor {level}: " + ", ".join(sorted(r for r, f in h["floors"].items() if f == level)))
    if "--write-docs" in argv:
        write_docs(results)
        print("wrote the reading map into docs/internals.md")


if __name__ == "__main__":
    main(sys.argv[1:])
