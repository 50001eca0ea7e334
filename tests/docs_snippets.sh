#!/usr/bin/env bash
# The snippets of README.md and docs/*.md cannot go stale:
#  1. every ```python block must appear in examples/pytorch_snippets.py as
#     consecutive lines (leading whitespace ignored), and that program runs
#     the way docs/pytorch.md says, with 2 ranks (terse_run_torch.sh);
#  2. the ```sh blocks are long benchmarks, so they are only checked: in
#     every command line (backslash continuations joined), each path under
#     build/, bench/, tools/, tests/, python/ or examples/ exists (in the
#     repository, or under the build directory for build/), and each
#     --long-option given to a terse program (build/bench/terse-bench
#     SUBCOMMAND, build/tools/terse-run, another program built under build/,
#     bench/**/*.sh or bench/**/*.py) is in that program's --help.
# (README.md's ```c blocks are tests/readme_snippets.sh's.)
# Usage: docs_snippets.sh REPO_DIR BUILD_DIR PATH/TO/terse-run
set -uo pipefail
repo=${1:?} bindir=${2:?} tr=${3:?}
fail=0
/usr/bin/python3 - "$repo" "$bindir" <<'PY' || fail=1
import glob, os, re, shlex, subprocess, sys

repo, bindir = sys.argv[1:3]
docs = [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "*.md")))
text = {p: open(p).read() for p in docs}
rel = lambda p: os.path.relpath(p, repo)
bad = []

# 1. The Python blocks, line for line in the example.
example = "examples/pytorch_snippets.py"
lines = [l.strip() for l in open(os.path.join(repo, example)).read().split("\n")]
nblocks = 0
for p in docs:
    for i, b in enumerate(re.findall(r"```python\n(.*?)```", text[p], re.S), 1):
        nblocks += 1
        want = [l.strip() for l in b.rstrip("\n").split("\n")]
        if not any(lines[k:k + len(want)] == want for k in range(len(lines))):
            bad.append("%s: python block %d is not in %s:\n%s" % (rel(p), i, example, b))
if nblocks < 4:
    bad.append("expected at least 4 python blocks in README.md and docs/, found %d" % nblocks)

# 2. The sh blocks: paths exist, long options are in their program's --help.
PREFIXES = ("build/", "bench/", "tools/", "tests/", "python/", "examples/")
SEPARATORS = {"&&", "||", "|", ";", "(", ")", "&"}
helps = {}

def where(tok):
    return os.path.join(bindir, tok[len("build/"):]) if tok.startswith("build/") \
        else os.path.join(repo, tok)

def is_terse_program(tok):
    path = where(tok)
    if tok.startswith("build/"):
        return os.path.isfile(path) and os.access(path, os.X_OK)
    return tok.startswith("bench/") and tok.endswith((".sh", ".py"))

def help_text(prog, sub):
    key = (prog, sub)
    if key not in helps:
        path = where(prog)
        cmd = ["bash", path] if prog.endswith(".sh") else \
              ["/usr/bin/python3", path] if prog.endswith(".py") else [path]
        cmd += ([sub] if sub else []) + ["--help"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=60)
        helps[key] = r.stdout.decode(errors="replace") if r.returncode == 0 else None
        if r.returncode != 0:
            bad.append("%s --help exited %d" % (" ".join([prog] + ([sub] if sub else [])),
                                                r.returncode))
    return helps[key]

ncmds = nopts = 0
for p in docs:
    for block in re.findall(r"```sh\n(.*?)```", text[p], re.S):
        for line in block.replace("\\\n", " ").split("\n"):
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            toks = list(lex)
            if not toks:
                continue
            ncmds += 1
            prog = sub = None   # the terse program the options go to, if any
            first = True        # the next word starts a command
            want_sub = False
            for tok in toks:
                if tok in SEPARATORS:
                    prog, first, want_sub = None, True, False
                    continue
                if first and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tok) or tok == "sudo"):
                    continue
                if want_sub:
                    sub, want_sub = tok, False
                    continue
                if tok.startswith(PREFIXES):
                    if not os.path.exists(where(tok)):
                        bad.append("%s: %r names %s, which does not exist"
                                   % (rel(p), line.strip(), tok))
                    elif is_terse_program(tok):
                        prog, sub = tok, None
                        want_sub = tok == "build/bench/terse-bench"
                        first = False
                        continue
                if first or "/" in tok:
                    # another program (or a path given to one): what follows is its own
                    prog, first = None, False
                    continue
                if tok.startswith("--") and len(tok) > 2 and prog:
                    opt = tok.split("=", 1)[0]
                    nopts += 1
                    h = help_text(prog, sub)
                    if h is not None and not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(opt), h):
                        bad.append("%s: %r passes %s to %s, whose --help does not list it"
                                   % (rel(p), line.strip(), opt,
                                      " ".join([prog] + ([sub] if sub else []))))

if ncmds < 20 or nopts < 20:
    bad.append("expected at least 20 sh command lines and 20 options, found %d and %d"
               % (ncmds, nopts))
for b in bad:
    print("FAIL:", b)
if bad:
    sys.exit(1)
print("ok: %d python blocks in %s; %d sh command lines, their paths and %d long options "
      "(%d --help texts) current" % (nblocks, example, ncmds, nopts, len(helps)))
PY
bash "$(dirname "$0")/terse_run_torch.sh" "$tr" "$repo" || fail=1
exit $fail
