#!/usr/bin/env python3
"""Workshop mode: every step's core as a fill-in exercise (docs/workshop.md).

The maintained sources are the solutions. The lines a learner writes are
marked in them:

    // BEGIN EXERCISE ex01.1
    // STUB: LLM_EXERCISE_TODO("ex01.1");      (optional; one or more lines)
    ...the solution...
    // END EXERCISE ex01.1

exercises/exercises.json is the manifest: per exercise its title, device,
minutes, prerequisites, chapter section, the tests that check it, the run
that shows what it earned (the payoff) and four hints.

For a learner, in a student copy:
    workshop.py list                       the exercises and where you are
    workshop.py hint ex01.1                the next hint (idea, invariant, pseudo-code, trap)
    workshop.py check ex01.1               build, run its tests, then print the payoff
    workshop.py doctor                     is this machine ready?
For an instructor, in the course repository:
    workshop.py make-copy --out DIR [--exercises ex01.*,ex05.2] [--with-solutions]
For CI (.ci/run) and the GPU check (scripts/gpu_check.sh):
    workshop.py prove --build-dir build    CI's workshop tier: all of the below, in student copies
    workshop.py lint                       markers, manifest, hints and chapters agree
    workshop.py prove-solutions --bin-dir build/bin [--device cpu|cuda]
    workshop.py prove-stubs --bin-dir COPY/build/bin --copy COPY [--device cpu|cuda]

Python standard library only.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = Path("exercises/exercises.json")
STATE = Path(".workshop/state.json")  # hint levels and passed checks, per copy
SELECTION = Path("exercises/selection.json")  # written by make-copy into a copy
HINT_LEVELS = ["idea", "invariant", "pseudocode", "trap"]
HINT_TITLES = {"idea": "the idea", "invariant": "the invariant", "pseudocode": "pseudo-code",
               "trap": "the common trap"}
EXERCISE_ID = re.compile(r"^ex0[1-7]\.[1-9]$")
BEGIN = re.compile(r"^(?P<indent>\s*)// BEGIN EXERCISE (?P<id>\S+)\s*$")
END = re.compile(r"^\s*// END EXERCISE (?P<id>\S+)\s*$")
STUB = re.compile(r"^\s*// STUB: ?(?P<code>.*)$")
NOT_DONE = "ExerciseNotDone"
NOT_DONE_ID = re.compile(rf"{NOT_DONE}: exercise (ex\d\d\.\d)")  # the id in a stub's message
# Files the markers may live in.
SOURCE_SUFFIXES = {".cpp", ".hpp", ".cu", ".cuh", ".h"}


def fail(message: str) -> None:
    print(f"workshop.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def progress(message: str) -> None:
    print(f"[workshop] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# The manifest and the marked regions.

@dataclass
class Region:
    exercise_id: str
    path: Path           # relative to the repository root
    begin_line: int      # 1-based line of the BEGIN marker
    end_line: int        # 1-based line of the END marker
    indent: str
    stub_lines: list[str]      # the code after "// STUB: "
    solution_lines: list[str]  # the lines between the markers, STUB lines excluded


@dataclass
class Exercise:
    data: dict
    regions: list[Region] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def device(self) -> str:
        return self.data["device"]

    @property
    def requires(self) -> list[str]:
        return self.data.get("requires", [])


def repository_root() -> Path:
    here = Path(__file__).resolve().parent.parent
    if not (here / MANIFEST).is_file():
        fail(f"no {MANIFEST} under {here}")
    return here


def source_files(root: Path) -> list[Path]:
    """The files that may hold markers: the tracked sources when this is a git
    checkout, else every source file below the root's step and common folders."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True, text=True).stdout
        files = [Path(line) for line in listed.splitlines()]
    except (subprocess.CalledProcessError, FileNotFoundError):
        files = [p.relative_to(root) for p in root.rglob("*") if p.is_file() and not p.parts[len(root.parts)].startswith("build")]
    return sorted(p for p in files if p.suffix in SOURCE_SUFFIXES and (root / p).is_file())


def find_regions(root: Path, path: Path) -> list[Region]:
    lines = (root / path).read_text().splitlines()
    regions, open_region = [], None
    for number, line in enumerate(lines, start=1):
        if m := BEGIN.match(line):
            if open_region:
                fail(f"{path}:{number}: BEGIN EXERCISE {m['id']} inside {open_region.exercise_id} (line {open_region.begin_line})")
            open_region = Region(m["id"], path, number, 0, m["indent"], [], [])
        elif m := END.match(line):
            if not open_region or open_region.exercise_id != m["id"]:
                fail(f"{path}:{number}: END EXERCISE {m['id']} without its BEGIN")
            open_region.end_line = number
            regions.append(open_region)
            open_region = None
        elif open_region:
            if (m := STUB.match(line)) and not open_region.solution_lines:
                open_region.stub_lines.append(m["code"])
            else:
                open_region.solution_lines.append(line)
        elif re.search(r"(BEGIN|END) EXERCISE ex\d\d\.\d", line):
            fail(f"{path}:{number}: a marker not on a line of its own: {line.strip()}")
    if open_region:
        fail(f"{path}:{open_region.begin_line}: BEGIN EXERCISE {open_region.exercise_id} is never ended")
    return regions


def load(root: Path) -> dict[str, Exercise]:
    manifest = json.loads((root / MANIFEST).read_text())
    exercises: dict[str, Exercise] = {}
    for entry in manifest["exercises"]:
        if entry["id"] in exercises:
            fail(f"{MANIFEST}: {entry['id']} twice")
        exercises[entry["id"]] = Exercise(entry)
    for path in source_files(root):
        for region in find_regions(root, path):
            if region.exercise_id not in exercises:
                fail(f"{path}:{region.begin_line}: {region.exercise_id} is not in {MANIFEST}")
            exercises[region.exercise_id].regions.append(region)
    return exercises


def select(exercises: dict[str, Exercise], patterns: str | None) -> list[str]:
    if not patterns:
        return list(exercises)
    chosen = []
    for pattern in patterns.split(","):
        matched = [i for i in exercises if fnmatch.fnmatchcase(i, pattern.strip())]
        if not matched:
            fail(f"--exercises: {pattern!r} matches no exercise (workshop.py list shows them)")
        chosen += [i for i in matched if i not in chosen]
    return [i for i in exercises if i in chosen]


def refuse_broken_selection(exercises: dict[str, Exercise], chosen: list[str], keep_prerequisite_solutions: bool) -> None:
    """An exercise is taught on its prerequisites' code, and its checks run that
    code: a copy that asks for it must ask for its prerequisites too, unless it
    says to keep their solutions (a GPU session that starts at the kernels; the
    GPU check's proof that each cuda stub fails with its own message)."""
    if keep_prerequisite_solutions:
        return
    for exercise_id in chosen:
        missing = [r for r in exercises[exercise_id].requires if r not in chosen]
        if missing:
            fail(f"{exercise_id} requires {', '.join(missing)} (written first; its checks run that code): "
                 f"add {','.join(missing)} to --exercises, or keep their solutions with --keep-prerequisite-solutions")


# --------------------------------------------------------------------------
# The student copy.

def stub_text(region: Region, title: str) -> list[str]:
    stubs = region.stub_lines or [f'LLM_EXERCISE_TODO("{region.exercise_id}");']
    header = (f"// EXERCISE {region.exercise_id}: {title}. Replace the stub below with your code "
              f"(scripts/workshop.py hint {region.exercise_id}).")
    return [region.indent + header] + [region.indent + line for line in stubs]


def distinctive_solution_lines(region: Region, text_outside: str) -> list[str]:
    """Solution lines that prove a leak if found in the copy: long enough to be
    code, not comment-only, and nowhere else in the original file."""
    found = []
    for line in region.solution_lines:
        code = line.strip()
        if len(code) >= 16 and not code.startswith("//") and code not in text_outside:
            found.append(code)
    return found


def proof_text(region: Region) -> list[str]:
    """The region in CI's proof copy: the stub behind a switch the environment
    turns on (llm::exercise_stubbed), then the solution, unchanged."""
    stubs = region.stub_lines or [f'LLM_EXERCISE_TODO("{region.exercise_id}");']
    return ([f'{region.indent}if (::llm::exercise_stubbed("{region.exercise_id}")) {{  // the stub when '
             f'LLM_STUBBED_EXERCISES names {region.exercise_id} (scripts/workshop.py prove)']
            + [f"{region.indent}  {line}" for line in stubs] + [f"{region.indent}}}"] + region.solution_lines)


def write_copy(root: Path, out: Path, exercises: dict[str, Exercise], chosen: list[str], mode: str) -> None:
    """mode: "stubs" (the student copy), "solutions" (an instructor's copy,
    markers kept) or "proof" (every cpu region switchable at run time)."""
    with_solutions = mode == "solutions"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True, text=True).stdout
    files = [Path(p) for p in tracked.split("\0") if p]
    regions_by_file: dict[Path, list[Region]] = {}
    for exercise_id in chosen:
        if mode == "proof" and exercises[exercise_id].device != "cpu":
            continue  # a kernel cannot read the environment: the cuda regions keep their solutions
        for region in exercises[exercise_id].regions:
            regions_by_file.setdefault(region.path, []).append(region)
    for path in files:
        source = root / path
        if not source.is_file():
            continue  # deleted in the working tree
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if path not in regions_by_file or with_solutions:
            shutil.copy2(source, target)
            continue
        lines = source.read_text().splitlines(keepends=False)
        regions = sorted(regions_by_file[path], key=lambda r: r.begin_line)
        kept, cursor = [], 1
        for region in regions:
            kept += lines[cursor - 1:region.begin_line - 1]
            kept += (proof_text(region) if mode == "proof"
                     else stub_text(region, exercises[region.exercise_id].data["title"]))
            cursor = region.end_line + 1
        kept += lines[cursor - 1:]
        target.write_text("\n".join(kept) + "\n")
        shutil.copymode(source, target)
        if mode == "proof":
            continue
        # No solution line may survive in the copy.
        outside = "\n".join(kept)
        for region in regions:
            original_outside = "\n".join(lines[:region.begin_line - 1] + lines[region.end_line:])
            for code in distinctive_solution_lines(region, original_outside):
                if code in outside:
                    fail(f"{path}: a solution line of {region.exercise_id} leaked into the copy: {code}")
            if f"BEGIN EXERCISE {region.exercise_id}" in outside:
                fail(f"{path}: a marker of {region.exercise_id} is left in the copy")
    (out / SELECTION).write_text(json.dumps({"exercises": chosen, "mode": mode}, indent=2) + "\n")
    with open(out / ".gitignore", "a") as ignore:
        ignore.write("/.workshop/\n")


def make_copy(root: Path, exercises: dict[str, Exercise], chosen: list[str], out: Path, mode: str) -> None:
    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    write_copy(root, out, exercises, chosen, mode)
    git = ["git", "-c", "user.name=workshop", "-c", "user.email=workshop@localhost", "-c", "init.defaultBranch=main"]
    subprocess.run(git + ["init", "-q"], cwd=out, check=True)
    subprocess.run(git + ["add", "-A"], cwd=out, check=True)
    what = {"stubs": "stubs", "solutions": "solutions", "proof": "switchable stubs"}[mode]
    subprocess.run(git + ["commit", "-q", "-m", f"Workshop copy: {len(chosen)} exercises as {what}"], cwd=out, check=True)
    print(f"{out}: {len(chosen)} exercises ({', '.join(chosen)}) as {what}")


def command_make_copy(args) -> None:
    root = repository_root()
    exercises = load(root)
    chosen = select(exercises, args.exercises)
    refuse_broken_selection(exercises, chosen, args.keep_prerequisite_solutions)
    out = Path(args.out).resolve()
    make_copy(root, exercises, chosen, out, "solutions" if args.with_solutions else "stubs")
    print(f"next: cd {out} && scripts/workshop.py doctor && scripts/workshop.py list")


# --------------------------------------------------------------------------
# Running an exercise's checks.

@dataclass
class CheckRun:
    exercise_id: str
    passed: bool
    tests_run: int
    skipped: int
    output: str
    not_done_ids: list[str]


def run_checks(exercise: Exercise, bin_dir: Path, extra_env: dict[str, str] | None = None) -> CheckRun:
    output_parts, passed, tests_run, skipped = [], True, 0, 0
    env = dict(os.environ, **(extra_env or {}))
    for check in exercise.data["checks"]:
        binary = bin_dir / check["binary"]
        if not binary.is_file():
            fail(f"{binary} is not built (cmake --build <build dir> --target {check['binary']})")
        command = [str(binary), f"--gtest_filter={check['filter']}", "--gtest_color=no"]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        text = result.stdout + result.stderr
        output_parts.append(f"$ {check['binary']} --gtest_filter={check['filter']}\n{text}")
        if m := re.search(r"Running (\d+) tests? from", text):
            tests_run += int(m.group(1))
        skipped += len(re.findall(r"^\[  SKIPPED \] \S+\.\S+ \(", text, re.M))
        if result.returncode != 0 or "[  PASSED  ]" not in text:
            passed = False
    output = "\n".join(output_parts)
    ids = sorted(set(NOT_DONE_ID.findall(output)))
    # A skip is a failure: a check that did not run proves nothing.
    return CheckRun(exercise.id, passed and tests_run > 0 and skipped == 0, tests_run, skipped, output, ids)


def gpu_gate(exercise: Exercise) -> dict[str, str] | None:
    """The proofs' environment: a cuda exercise's gpu tests fail instead of
    skipping where no GPU is usable (tests/test_support.hpp)."""
    return {"LLM_EXPECT_GPU": "1"} if exercise.device == "cuda" else None


def build_targets(build_dir: Path, targets: list[str]) -> None:
    if not (build_dir / "CMakeCache.txt").is_file():
        progress(f"configuring {build_dir} (cmake -DLLM_EXERCISES=ON)")
        subprocess.run(["cmake", "-S", ".", "-B", str(build_dir), "-G", "Ninja", "-DLLM_EXERCISES=ON"],
                       cwd=repository_root(), check=True)
    progress(f"building {', '.join(targets)}")
    result = subprocess.run(["cmake", "--build", str(build_dir), "--target", *targets])
    if result.returncode != 0:
        fail("the build failed (the compiler's message is above)")


# --------------------------------------------------------------------------
# The payoff: the step on the learner's code, beside the published figure.

def find_row(document: dict, figure: dict) -> dict | None:
    if figure.get("in") == "config":
        return document.get("config", {})
    for row in document.get("rows", []):
        if all(row.get(key) == value for key, value in figure["row"].items()):
            return row
    return None


def figure_value(document: dict, figure: dict):
    row = find_row(document, figure)
    return None if row is None else row.get(figure["field"])


def show(value, form: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return form.format(value)


def payoff(root: Path, exercise: Exercise, bin_dir: Path) -> None:
    spec = exercise.data["payoff"]
    executable = bin_dir / spec["executable"]
    with tempfile.TemporaryDirectory() as scratch:
        json_path = Path(scratch) / "payoff.json"
        command = [str(executable), *spec["args"], "--json", str(json_path)]
        progress(f"payoff: {' '.join([spec['executable'], *spec['args']])} (your code, beside the step's baseline)")
        begin = time.monotonic()
        result = subprocess.run(command, cwd=root, capture_output=True, text=True)
        if result.returncode != 0:
            # The step runs all of its code: another exercise still stubbed
            # stops it, which is no failure of this one.
            others = sorted(set(NOT_DONE_ID.findall(result.stderr)) - {exercise.id})
            if others:
                print(f"\nNo payoff yet: the step also runs {', '.join(others)}, still a stub. "
                      f"Write {'it' if len(others) == 1 else 'them'}, then check {exercise.id} again for its payoff.")
                return
            print(result.stdout[-4000:] + result.stderr[-4000:])
            fail(f"the payoff run exited with status {result.returncode}")
        document = json.loads(json_path.read_text())
    seconds = time.monotonic() - begin
    print(f"\nWhat {exercise.id} earned ({spec['executable']} {' '.join(spec['args'])}, {seconds:.0f} s, "
          f"measured now on this machine):")
    for figure in spec["figures"]:
        mine = figure_value(document, figure)
        published_path = root / figure["published"]
        published = figure_value(json.loads(published_path.read_text()), figure) if published_path.is_file() else None
        form = figure.get("format", "{}")
        print(f"  {figure['what']}: {show(mine, form)}   (published: {show(published, form)}, {figure['published']})")


# --------------------------------------------------------------------------
# The learner's commands.

def read_state(root: Path) -> dict:
    path = root / STATE
    return json.loads(path.read_text()) if path.is_file() else {"hints": {}, "passed": {}}


def write_state(root: Path, state: dict) -> None:
    (root / STATE).parent.mkdir(exist_ok=True)
    (root / STATE).write_text(json.dumps(state, indent=2) + "\n")


def get_exercise(exercises: dict[str, Exercise], exercise_id: str) -> Exercise:
    if exercise_id not in exercises:
        fail(f"no exercise {exercise_id!r} (workshop.py list shows them)")
    return exercises[exercise_id]


def stub_places(root: Path, exercise_id: str) -> list[str]:
    """file:line of each stub make-copy left for the exercise (its header comment)."""
    header = f"// EXERCISE {exercise_id}: "
    places = []
    for path in source_files(root):
        for number, line in enumerate((root / path).read_text(errors="replace").splitlines(), start=1):
            if line.strip().startswith(header):
                places.append(f"{path}:{number + 1}")
    return places


def status_of(root: Path, exercise: Exercise, state: dict) -> str:
    if exercise.id in state["passed"]:
        return "passed"
    if exercise.regions:
        return "solution in place"
    stub_calls = (f'LLM_EXERCISE_TODO("{exercise.id}")', f'LLM_CUDA_EXERCISE_TODO("{exercise.id}")')
    for path in source_files(root):
        text = (root / path).read_text(errors="replace")
        if any(call in text for call in stub_calls):
            return "to do"
    return "written, not checked yet"


def command_list(args) -> None:
    root = repository_root()
    exercises, state = load(root), read_state(root)
    print(f"{'id':7} {'device':6} {'min':>4}  {'status':25} {'requires':15} title")
    for exercise in exercises.values():
        data = exercise.data
        print(f"{exercise.id:7} {exercise.device:6} {data['minutes']:>4}  {status_of(root, exercise, state):25} "
              f"{','.join(exercise.requires) or '-':15} {data['title']}")
    print("\nscripts/workshop.py hint ID gives the next hint; scripts/workshop.py check ID checks one.")


def command_hint(args) -> None:
    root = repository_root()
    exercise = get_exercise(load(root), args.id)
    state = read_state(root)
    shown = state["hints"].get(exercise.id, 0)
    level = args.level if args.level else min(shown + 1, len(HINT_LEVELS))
    if not 1 <= level <= len(HINT_LEVELS):
        fail(f"--level must be from 1 to {len(HINT_LEVELS)}")
    data = exercise.data
    places = ", ".join([f"{r.path}:{r.begin_line}" for r in exercise.regions] + stub_places(root, exercise.id))
    print(f"{exercise.id}: {data['title']} ({data['minutes']} min, {exercise.device}; chapter: {data['chapter']})")
    if level == 1:
        print(f"Where: {places}")
    for number in range(1 if args.all else level, level + 1):
        name = HINT_LEVELS[number - 1]
        print(f"\nHint {number} of {len(HINT_LEVELS)}, {HINT_TITLES[name]}:\n{data['hints'][name]}")
    if level < len(HINT_LEVELS):
        print(f"\n(run it again for hint {level + 1}: {HINT_TITLES[HINT_LEVELS[level]]})")
    state["hints"][exercise.id] = max(shown, level)
    write_state(root, state)


def command_check(args) -> None:
    root = repository_root()
    exercises = load(root)
    exercise = get_exercise(exercises, args.id)
    build_dir = (root / args.build_dir).resolve()
    targets = sorted({c["binary"] for c in exercise.data["checks"]})
    if not args.no_payoff:
        targets.append(exercise.data["payoff"]["executable"])
    if not args.no_build:
        build_targets(build_dir, targets)
    progress(f"running the checks of {exercise.id}")
    run = run_checks(exercise, build_dir / "bin")
    if not run.passed:
        print(run.output[-12000:])
        if run.not_done_ids:
            print(f"\n{exercise.id} is not done: the stub of {', '.join(run.not_done_ids)} was reached "
                  f"(scripts/workshop.py hint {run.not_done_ids[0]}).")
        elif run.skipped:
            print(f"\n{exercise.id}: {run.skipped} check(s) skipped, which counts as a failure "
                  f"(a {exercise.device} exercise needs {'a GPU' if exercise.device == 'cuda' else 'its model files'}).")
        elif run.tests_run == 0:
            print(f"\n{exercise.id}: no test matched its filters")
        sys.exit(1)
    print(f"{exercise.id} passes: {run.tests_run} tests.")
    state = read_state(root)
    state["passed"][exercise.id] = time.strftime("%Y-%m-%d %H:%M")
    write_state(root, state)
    if not args.no_payoff:
        payoff(root, exercise, build_dir / "bin")


def command_doctor(args) -> None:
    root = repository_root()
    problems = 0

    def report(ok: bool, what: str, detail: str, required: bool = True) -> None:
        nonlocal problems
        mark = "ok  " if ok else ("MISSING" if required else "no  ")
        problems += 0 if ok or not required else 1
        print(f"{mark:8} {what}: {detail}")

    def version_of(command: list[str]) -> str | None:
        try:
            return subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            return None

    for tool, command in [("cmake", ["cmake", "--version"]), ("ninja", ["ninja", "--version"]),
                          ("C++ compiler", ["c++", "--version"]), ("git", ["git", "--version"])]:
        version = version_of(command)
        report(version is not None, tool, version or f"{command[0]} not found (README, Prerequisites)")
    headers = {"Eigen": "/usr/include/eigen3/Eigen/Core", "fmt": "/usr/include/fmt/format.h",
               "CLI11": "/usr/include/CLI/CLI.hpp", "GoogleTest": "/usr/include/gtest/gtest.h",
               "Google Benchmark": "/usr/include/benchmark/benchmark.h", "cpp-httplib": "/usr/include/httplib.h",
               "nlohmann-json": "/usr/include/nlohmann/json.hpp"}
    for name, header in headers.items():
        present = Path(header).is_file()
        report(present, name, header if present else "not installed: CMake downloads it at configure time (needs internet)",
               required=False)
    models = root.parent / "shared" / "models"
    found = sorted(p.name for p in models.glob("*.bin")) if models.is_dir() else []
    report(bool(found), "model files", f"{models}: {', '.join(found)}" if found
           else f"none in {models}: the exercises use the built-in model, so they need none", required=False)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    report(nvcc is not None, "CUDA toolkit", nvcc or "no nvcc: the cuda exercises cannot be built here", required=False)
    gpu = version_of(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    report(gpu is not None, "GPU", gpu or "none visible: the cuda exercises' checks need one", required=False)
    build = root / "build" / "CMakeCache.txt"
    if build.is_file():
        on = "LLM_EXERCISES:BOOL=ON" in build.read_text()
        report(on, "build/", "configured with LLM_EXERCISES=ON" if on
               else "configured without LLM_EXERCISES=ON: cmake -S . -B build -DLLM_EXERCISES=ON", required=False)
    print("\nready for the cpu exercises" if problems == 0 else f"\n{problems} required tool(s) missing")
    sys.exit(1 if problems else 0)


# --------------------------------------------------------------------------
# CI: the exercises cannot rot.

def chapter_anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to '-'."""
    anchors = set()
    for line in markdown.splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def command_lint(args) -> None:
    root = repository_root()
    exercises = load(root)
    problems = []
    tests = {p.stem for p in (root / "tests").glob("*_test.cpp")}
    steps = {p.name for p in root.glob("step0*") if p.is_dir()}
    for exercise in exercises.values():
        data, where = exercise.data, f"{MANIFEST} {exercise.id}"
        if not EXERCISE_ID.match(exercise.id):
            problems.append(f"{where}: an id is exNN.M (step 01-07, M 1-9)")
        missing = [key for key in ["title", "step", "device", "minutes", "chapter", "checks", "payoff", "hints"]
                   if key not in data]
        if missing:
            problems.append(f"{where}: no {', '.join(missing)}")
            continue
        if data["step"] not in steps or not exercise.id.startswith("ex" + data["step"][4:6]):
            problems.append(f"{where}: step {data['step']!r} does not match the id")
        if exercise.device not in ("cpu", "cuda"):
            problems.append(f"{where}: device is cpu or cuda")
        if not 10 <= data["minutes"] <= 40:
            problems.append(f"{where}: {data['minutes']} minutes; an exercise takes 10 to 40")
        if not exercise.regions:
            problems.append(f"{where}: no BEGIN/END EXERCISE region in the sources")
        for region in exercise.regions:
            suffix_ok = region.path.suffix in (".cu", ".cuh") if exercise.device == "cuda" else region.path.suffix in (".cpp", ".hpp", ".h")
            if not suffix_ok:
                problems.append(f"{region.path}:{region.begin_line}: a {exercise.device} exercise in a {region.path.suffix} file")
            if exercise.device == "cuda" and not any(f'LLM_CUDA_EXERCISE_TODO("{exercise.id}")' in s for s in region.stub_lines):
                problems.append(f"{region.path}:{region.begin_line}: a cuda region's STUB lines call "
                                f'LLM_CUDA_EXERCISE_TODO("{exercise.id}") and write exercise_nan()')
            if exercise.device == "cpu" and region.stub_lines and not any(f'LLM_EXERCISE_TODO("{exercise.id}")' in s for s in region.stub_lines):
                problems.append(f"{region.path}:{region.begin_line}: the STUB lines never call LLM_EXERCISE_TODO(\"{exercise.id}\")")
            if not any(line.strip() and not line.strip().startswith("//") for line in region.solution_lines):
                problems.append(f"{region.path}:{region.begin_line}: the region holds no code")
        for level in HINT_LEVELS:
            if len(data["hints"].get(level, "").strip()) < 40:
                problems.append(f"{where}: hint {level!r} missing or shorter than a sentence")
        chapter, _, anchor = data["chapter"].partition("#")
        if not (root / chapter).is_file():
            problems.append(f"{where}: chapter {chapter} does not exist")
        else:
            text = (root / chapter).read_text()
            if anchor not in chapter_anchors(text):
                problems.append(f"{where}: {chapter} has no heading with the anchor #{anchor}")
            if exercise.id not in text:
                problems.append(f"{where}: {chapter} never names {exercise.id}")
        for check in data["checks"]:
            if check["binary"] not in tests:
                problems.append(f"{where}: check binary {check['binary']} is not tests/{check['binary']}.cpp")
            if exercise.device == "cuda" and not check["binary"].endswith("_gpu_test"):
                problems.append(f"{where}: a cuda exercise is checked by a _gpu_test binary")
        if data["payoff"]["executable"] not in steps:
            problems.append(f"{where}: payoff executable {data['payoff']['executable']} is not a step")
        for figure in data["payoff"]["figures"]:
            published = root / figure["published"]
            if not published.is_file():
                problems.append(f"{where}: published figure file {figure['published']} does not exist")
            elif figure_value(json.loads(published.read_text()), figure) is None:
                problems.append(f"{where}: {figure['published']} has no {figure['field']} in the row {figure.get('row')}")
        for required in exercise.requires:
            if required not in exercises:
                problems.append(f"{where}: requires unknown {required}")
    # Prerequisites come earlier in the manifest, so there is no cycle.
    order = list(exercises)
    for exercise in exercises.values():
        for required in exercise.requires:
            if required in exercises and order.index(required) > order.index(exercise.id):
                problems.append(f"{MANIFEST} {exercise.id}: requires {required}, listed after it")
    cuda = sum(e.device == "cuda" for e in exercises.values())
    covered = {e.data.get("step") for e in exercises.values()}
    if len(exercises) < 18 or cuda < 4 or not steps <= covered:
        problems.append(f"{MANIFEST}: {len(exercises)} exercises, {cuda} cuda, steps {sorted(steps - covered)} without one "
                        f"(the course has at least 18, at least 4 of them cuda, in every step)")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        fail(f"{len(problems)} problem(s) in the exercises")
    regions = sum(len(e.regions) for e in exercises.values())
    print(f"lint: {len(exercises)} exercises ({cuda} cuda), {regions} regions, hints and chapters agree")


def proven_exercises(exercises: dict[str, Exercise], args, chosen: list[str] | None = None) -> list[Exercise]:
    """The exercises a prove command covers: those of --device, within
    --exercises and the copy's selection."""
    patterns = select(exercises, args.exercises)
    return [e for e in exercises.values()
            if (args.device == "all" or e.device == args.device) and e.id in patterns and (chosen is None or e.id in chosen)]


def command_prove_solutions(args) -> None:
    """The maintained code is the solution: every check passes, none skips."""
    root = repository_root()
    bin_dir = Path(args.bin_dir).resolve()
    failures = []
    for exercise in proven_exercises(load(root), args):
        run = run_checks(exercise, bin_dir, gpu_gate(exercise))
        print(f"{exercise.id}: {'passes' if run.passed else 'FAILS'} ({run.tests_run} tests, {run.skipped} skipped)")
        if not run.passed:
            failures.append(exercise.id)
            print(run.output[-6000:])
    if failures:
        fail(f"the solutions of {', '.join(failures)} fail their checks")


def command_prove_stubs(args) -> None:
    """In a student copy, every stubbed exercise's checks fail, with the
    ExerciseNotDone message of the exercise itself: a check that passes under
    its stub checks nothing, and one that stops at another exercise's stub has
    not shown that it reaches this one."""
    root = repository_root()
    copy = Path(args.copy).resolve()
    exercises = load(root)
    selection = json.loads((copy / SELECTION).read_text())
    if selection["mode"] != "stubs":
        fail(f"{copy} is not a student copy with stubs (made as {selection['mode']})")
    bin_dir = Path(args.bin_dir).resolve()
    unproven = []
    for exercise in proven_exercises(exercises, args, selection["exercises"]):
        run = run_checks(exercise, bin_dir, gpu_gate(exercise))
        others = [i for i in run.not_done_ids if i != exercise.id]
        if run.passed:
            said = "PASSES under its stub"
        elif exercise.id in run.not_done_ids:
            said = "fails under its stub with its message"
        elif others:
            said = f"fails, but first with the stub of {', '.join(others)}"
        else:
            said = "fails without the message"
        print(f"{exercise.id}: {said} ({run.tests_run} tests)", flush=True)
        if run.passed or exercise.id not in run.not_done_ids:
            unproven.append(exercise.id)
            print(run.output[-6000:])
    if unproven:
        fail(f"not proven by their stubs: {', '.join(unproven)}")


def cmake_cache_value(build_dir: Path, name: str) -> str | None:
    for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split("=", 1)[1]
    return None


def build_copy(copy: Path, main_build: Path, targets: list[str] | None) -> None:
    """Configures a copy as the main build is (so that a compiler cache serves
    every file the copy did not change) and builds it, or some targets of it."""
    settings = ["-DLLM_EXERCISES=ON"]
    for name in ["LLM_DEFAULT_MODELS_DIR", "CMAKE_CUDA_ARCHITECTURES", "CMAKE_BUILD_TYPE",
                 "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_CUDA_COMPILER_LAUNCHER"]:
        value = cmake_cache_value(main_build, name)
        if value:
            settings.append(f"-D{name}={value}")
    subprocess.run(["cmake", "-S", str(copy), "-B", str(copy / "build"), "-G", "Ninja", *settings],
                   check=True, stdout=subprocess.DEVNULL)
    progress(f"building {copy.name}" + (f": {', '.join(targets)}" if targets else ": everything"))
    command = ["cmake", "--build", str(copy / "build"), "-j"] + (["--target", *targets] if targets else [])
    if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(command)  # again, to show the errors
        fail(f"the student copy {copy} does not build")


def command_prove(args) -> None:
    """CI's workshop tier in one command (docs/testing.md).

    1. lint, and the solutions pass their checks (the maintained build);
    2. the student copy of every exercise builds (the CUDA stubs too where
       nvcc is), the first exercise's ctest label fails there with its
       message, and no cpu exercise's checks pass under the stubs;
    3. in the proof copy, where every cpu region's stub is switched on by the
       environment, each cpu exercise's checks, with only its own stub on,
       fail with its own message (they reach its code); and, with the stubs
       of every exercise after it in the manifest on, they pass: a learner who
       works in order can pass each exercise when they reach it."""
    root = repository_root()
    main_build = Path(args.build_dir).resolve()
    command_lint(args)
    command_prove_solutions(argparse.Namespace(bin_dir=str(main_build / "bin"), device=args.device, exercises=None))
    exercises = load(root)
    work = Path(args.work).resolve()
    if work.exists():
        shutil.rmtree(work)
    proven = [e for e in exercises.values() if e.device == args.device]
    order = list(exercises)

    progress("the student copy: every exercise a stub")
    student = work / "student"
    make_copy(root, exercises, order, student, "stubs")
    build_copy(student, main_build, None)
    first = exercises[order[0]]
    ctest = subprocess.run(["ctest", "--test-dir", str(student / "build"), "-L", f"^{re.escape(first.id)}$",
                            "--output-on-failure"], capture_output=True, text=True)
    if ctest.returncode == 0 or f"{NOT_DONE}: exercise {first.id} is not written yet" not in ctest.stdout:
        print(ctest.stdout[-4000:])
        fail(f"ctest -L {first.id} in the student copy did not fail with the exercise's message")
    print(f"student copy: builds; ctest -L {first.id} fails with its message")
    for exercise in proven:
        run = run_checks(exercise, student / "build" / "bin")
        if run.passed or not run.not_done_ids:
            print(run.output[-6000:])
            fail(f"{exercise.id}'s checks {'pass' if run.passed else 'fail without an ' + NOT_DONE + ' message'} "
                 f"in the student copy")
    print(f"student copy: the checks of all {len(proven)} {args.device} exercises fail with {NOT_DONE}")

    progress("the proof copy: every cpu stub switched by LLM_STUBBED_EXERCISES")
    proof = work / "proof"
    make_copy(root, exercises, order, proof, "proof")
    build_copy(proof, main_build, sorted({c["binary"] for e in proven for c in e.data["checks"]}))
    problems = []
    for exercise in proven:
        alone = run_checks(exercise, proof / "build" / "bin", {"LLM_STUBBED_EXERCISES": exercise.id})
        later = order[order.index(exercise.id) + 1:]
        in_order = run_checks(exercise, proof / "build" / "bin", {"LLM_STUBBED_EXERCISES": ",".join(later)})
        alone_ok = not alone.passed and alone.not_done_ids == [exercise.id]
        print(f"{exercise.id}: its stub alone: {'fails with its message' if alone_ok else 'NOT PROVEN'}; "
              f"with the {len(later)} later ones stubbed: {'passes' if in_order.passed else 'FAILS'} "
              f"({alone.tests_run} tests)", flush=True)
        if not alone_ok:
            problems.append(f"{exercise.id}: with only its stub on, its checks "
                            f"{'pass: they check nothing' if alone.passed else 'fail without its message'}")
            print(alone.output[-4000:])
        if not in_order.passed:
            blockers = ", ".join(in_order.not_done_ids) or "no stub"
            problems.append(f"{exercise.id}: with it written, its checks still fail (at {blockers}): a later "
                            f"exercise's code is in its way; move the check or reorder the manifest")
            print(in_order.output[-4000:])
    if problems:
        print("\n".join(problems), file=sys.stderr)
        fail(f"{len(problems)} problem(s) in the exercises' checks")
    print(f"prove: every {args.device} exercise passes on its solution, fails with its own message under its "
          f"stub, and passes when written with every later exercise still a stub")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("list", help="the exercises and your progress")
    c.set_defaults(run=command_list)
    c = commands.add_parser("hint", help="the next hint of an exercise")
    c.add_argument("id")
    c.add_argument("--level", type=int, help="show this level (1 idea, 2 invariant, 3 pseudo-code, 4 trap)")
    c.add_argument("--all", action="store_true", help="every level up to the one shown")
    c.set_defaults(run=command_hint)
    c = commands.add_parser("check", help="build, run an exercise's tests, print its payoff")
    c.add_argument("id")
    c.add_argument("--build-dir", default="build")
    c.add_argument("--no-build", action="store_true", help="run what is built")
    c.add_argument("--no-payoff", action="store_true", help="the tests only")
    c.set_defaults(run=command_check)
    c = commands.add_parser("doctor", help="is this machine ready for the workshop?")
    c.set_defaults(run=command_doctor)
    c = commands.add_parser("make-copy", help="a student copy with the exercises stubbed")
    c.add_argument("--out", required=True)
    c.add_argument("--exercises", help="comma-separated ids or patterns (ex05.*); default: all")
    c.add_argument("--with-solutions", action="store_true", help="keep the solutions and markers (an instructor's copy)")
    c.add_argument("--keep-prerequisite-solutions", action="store_true",
                   help="allow a selection without some exercises' prerequisites: their solutions stay")
    c.set_defaults(run=command_make_copy)
    c = commands.add_parser("lint", help="markers, manifest, hints and chapters agree (CI)")
    c.set_defaults(run=command_lint)
    for name, run, about in [("prove-solutions", command_prove_solutions, "the maintained code passes every check (CI)"),
                             ("prove-stubs", command_prove_stubs, "every stub fails its checks (CI)")]:
        c = commands.add_parser(name, help=about)
        c.add_argument("--bin-dir", required=True, help="where the test binaries are")
        c.add_argument("--device", choices=["cpu", "cuda", "all"], default="cpu")
        c.add_argument("--exercises", help="comma-separated ids or patterns; default: all of --device")
        if name == "prove-stubs":
            c.add_argument("--copy", required=True, help="the student copy (made without --with-solutions)")
        c.set_defaults(run=run)
    c = commands.add_parser("prove", help="CI's workshop tier: lint, solutions, student copies, stubs")
    c.add_argument("--build-dir", default="build", help="the maintained build (its bin/ and its CMake settings)")
    c.add_argument("--work", default="build-workshop", help="where the student copies are made (emptied first)")
    c.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    c.set_defaults(run=command_prove, exercises=None)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
