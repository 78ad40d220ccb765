#!/usr/bin/env python3
"""Judges a compute-sanitizer racecheck log: the course's kernels, not cuBLAS's.

racecheck reports shared-memory hazards in every kernel a program launches,
cuBLAS's GEMMs among them (the gpu tests use cuBLAS for references, and the
model's products of many rows run on it). Hazards inside a library's own
kernels are not this course's to fix, and an H200 run found some in cuBLAS's
nvjet GEMM with every product bit-exact. A later run with those kernels left
out (compute-sanitizer's --kernel-name-exclude) failed on that same test with
an internal sanitizer error (an illegal address it could not handle, every
test after it failing); whether the exclusion or the kernels changed in
between caused it is not known. So the run instruments every kernel, and this
script sorts what it reported:

  PASS  the run finished (its RACECHECK SUMMARY is there), gtest says every
        test passed and none failed, the program neither crashed nor hit a
        CUDA error, the sanitizer reported no error of its own, and every
        hazard it displayed has exactly two accesses, both inside a library
        kernel (the count of those is printed, by kernel);
  FAIL  anything else: a hazard with an access in one of the course's
        kernels (named), a hazard whose two accesses the log does not show, a
        failed or unfinished test run, a crash, an internal sanitizer error, a
        missing summary, or a summary that counts hazards the log does not
        show (raise compute-sanitizer's --print-limit).

A kernel is a library's when the first name of its signature (its namespace
and function, without "void", template arguments or parameters) contains one
of the --library names: nvjet_sm90_..., cublasLt::..., sm90_xmma_gemm_....

    scripts/racecheck_verdict.py racecheck_common_half_linear_gpu_test.log
    scripts/racecheck_verdict.py LOG --library nvjet,cublas,xmma

Prints one line, the verdict; exits 0 for PASS, 1 for FAIL, 2 when the log
cannot be read.
"""
import argparse
import collections
import re
import sys

# "========= Error: Race reported between Read access at nvjet_sm90_..+0xb00"
# "=========     and Write access at nvjet_sm90_..+0x2840 [64 hazards]"
# Older tools print "... access at 0x2840 in kernel_name" instead.
HAZARD_START = re.compile(r"^=+ +(Error|Warning): Race reported between (\w+) access at (.*)$")
HAZARD_OTHER = re.compile(r"^=+ +and (\w+) access at (.*)$")
SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed")
# What the sanitizer prints when the program itself failed: a non-zero exit, a
# CUDA error it caught, a crash.
PROGRAM_FAILED = ("Target application returned an error", "Program hit ", "Target application terminated")


def kernel_of(location):
    """The kernel's name in an access's location (its offset and the hazard count cut off)."""
    location = re.sub(r"\s*\[\d+ hazards?\]\s*$", "", location.strip())
    in_kernel = re.match(r"^0x[0-9a-fA-F]+ in (.*)$", location)
    if in_kernel:
        location = in_kernel.group(1)
    return re.sub(r"\+0x[0-9a-fA-F]+$", "", location).strip()


def first_name(kernel):
    """The kernel's namespace and function name: no "void", template arguments or parameters."""
    found = re.match(r"^(?:void\s+)?([\w:]+)", kernel)
    return found.group(1) if found else ""


def verdict(lines, library):
    def is_library(kernel):
        return any(name in first_name(kernel) for name in library)

    displayed = None
    gtest_passed = False
    failed_tests, internal_errors, program_failures = [], [], []
    hazards = []  # per hazard, the kernel of each access the log shows
    for line in lines:
        line = line.rstrip("\n")
        start = HAZARD_START.match(line)
        if start:
            hazards.append([kernel_of(start.group(3))])
            continue
        other = HAZARD_OTHER.match(line)
        if other and hazards and len(hazards[-1]) == 1:
            hazards[-1].append(kernel_of(other.group(2)))
            continue
        found = SUMMARY.search(line)
        if found:
            displayed = int(found.group(1))
        if line.startswith("[  FAILED  ]") and line not in failed_tests:
            failed_tests.append(line)
        if line.startswith("[  PASSED  ]"):
            gtest_passed = True
        if "Internal Sanitizer Error" in line:
            internal_errors.append(line.strip("= "))
        if any(sign in line for sign in PROGRAM_FAILED):
            program_failures.append(line.strip("= "))
    if internal_errors:
        return False, f"the sanitizer failed itself: {internal_errors[0]}"
    if failed_tests:
        return False, f"{len(failed_tests)} test line(s) failed under racecheck, the first: {failed_tests[0]}"
    if program_failures:
        return False, f"the program failed under racecheck: {program_failures[0]}"
    if displayed is None:
        return False, "no RACECHECK SUMMARY: the run did not finish"
    if not gtest_passed:
        return False, "no gtest [  PASSED  ] line: the tests did not all run to their end"
    if displayed != len(hazards):
        return False, (f"the summary counts {displayed} hazards, the log shows {len(hazards)} "
                       "(raise --print-limit)")
    unread = [kernels for kernels in hazards if len(kernels) != 2]
    if unread:
        return False, f"{len(unread)} hazard(s) without both of their accesses in the log, the first: {unread[0]}"
    course = [kernels for kernels in hazards if not all(is_library(kernel) for kernel in kernels)]
    if course:
        named = sorted({kernel for kernels in course for kernel in kernels if not is_library(kernel)})
        return False, f"{len(course)} hazard(s) in the course's kernels: {', '.join(named)}"
    if not hazards:
        return True, "0 hazards"
    by_kernel = collections.Counter(kernels[0] for kernels in hazards)
    listed = ", ".join(f"{kernel}: {count}" for kernel, count in sorted(by_kernel.items()))
    return True, (f"0 hazards in the course's kernels; {len(hazards)} inside library kernels, "
                  f"not judged ({listed})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", help="compute-sanitizer --tool racecheck's output")
    parser.add_argument("--library", default="nvjet,cublas,xmma",
                        help="comma-separated substrings of library kernels' names (default: cuBLAS's)")
    args = parser.parse_args()
    try:
        with open(args.log, encoding="utf-8", errors="replace") as log:
            lines = log.readlines()
    except OSError as error:
        print(f"racecheck_verdict.py: {error}", file=sys.stderr)
        return 2
    library = [name for name in args.library.split(",") if name]
    if not library:
        print("racecheck_verdict.py: --library names no kernel", file=sys.stderr)
        return 2
    passed, why = verdict(lines, library)
    print(f"{'PASS' if passed else 'FAIL'}: {why}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
