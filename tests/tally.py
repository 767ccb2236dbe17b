#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Counts test results for tests/run_all.sh.

  tally.py meson BUILD_DIR            counts from BUILD_DIR/meson-logs/testlog.json
  tally.py junit FILE.xml RC          counts from a pytest JUnit XML file
  tally.py sum TALLY_FILE             totals of a tally file

Each of the first two prints one line "PASSED FAILED SKIPPED".

meson: a TAP test program counts each of its subtests ("ok", "not ok",
"# SKIP"); a program whose result is not OK but reported no failing subtest
(crashed, timed out, wrong plan) adds one failure. Other programs count
once by their result.

junit: pytest's own totals; if the file is missing or unreadable although
pytest ran, that counts as one failure (pytest's exit code 5, "no tests
collected", counts as nothing).
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

TAP_LINE = re.compile(r"^(not )?ok\b(.*)$")


def tap_counts(stdout):
    p = f = s = 0
    seen = False
    for line in stdout.splitlines():
        m = TAP_LINE.match(line.strip())
        if not m:
            continue
        seen = True
        rest = m.group(2)
        directive = ""
        if "#" in rest:
            directive = rest.split("#", 1)[1].strip().upper()
        if directive.startswith("SKIP"):
            s += 1
        elif directive.startswith("TODO"):
            # TODO tests are expected to fail; they never count as failures.
            s += 1
        elif m.group(1):
            f += 1
        else:
            p += 1
    return seen, p, f, s


def meson_counts(build_dir):
    path = os.path.join(build_dir, "meson-logs", "testlog.json")
    p = f = s = 0
    if not os.path.exists(path):
        return p, f, s
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                t = json.loads(line)
            except ValueError:
                f += 1
                continue
            result = t.get("result", "ERROR")
            seen, tp, tf, ts = tap_counts(t.get("stdout") or "")
            if seen:
                p, f, s = p + tp, f + tf, s + ts
                if result not in ("OK", "SKIP", "EXPECTEDFAIL") and tf == 0:
                    f += 1
            elif result in ("OK", "EXPECTEDFAIL"):
                p += 1
            elif result == "SKIP":
                s += 1
            else:
                f += 1
    return p, f, s


def junit_counts(path, rc):
    if rc == 5:  # pytest: no tests collected
        return 0, 0, 0
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return 0, 1, 0
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests = errors = failures = skipped = 0
    for su in suites:
        tests += int(su.get("tests", 0))
        errors += int(su.get("errors", 0))
        failures += int(su.get("failures", 0))
        skipped += int(su.get("skipped", 0))
    failed = errors + failures
    passed = max(tests - failed - skipped, 0)
    if rc not in (0, 1, 5) and failed == 0:
        # pytest itself failed (internal error, usage error, interrupted).
        failed = 1
    elif rc == 1 and failed == 0:
        failed = 1
    return passed, failed, skipped


def sum_counts(path):
    p = f = s = 0
    with open(path) as fh:
        for line in fh:
            parts = line.split("\t")
            if len(parts) < 4:
                continue
            p += int(parts[1])
            f += int(parts[2])
            s += int(parts[3])
    return p, f, s


def main(argv):
    if len(argv) >= 3 and argv[1] == "meson":
        r = meson_counts(argv[2])
    elif len(argv) >= 4 and argv[1] == "junit":
        r = junit_counts(argv[2], int(argv[3]))
    elif len(argv) >= 3 and argv[1] == "sum":
        r = sum_counts(argv[2])
    else:
        sys.stderr.write(__doc__)
        return 2
    print("%d %d %d" % r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
