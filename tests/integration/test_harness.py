# SPDX-License-Identifier: MIT
"""Tests of the test harness itself: the counting behind `make check`'s
closing line (tests/tally.py) and the helpers in conftest.py."""
import json
import os
import subprocess
import sys

import conftest

TALLY = os.path.join(conftest.REPO_ROOT, "tests", "tally.py")


def tally(*args):
    cp = subprocess.run([sys.executable, TALLY, *map(str, args)],
                        capture_output=True, text=True, check=True)
    return tuple(int(x) for x in cp.stdout.split())


def write_testlog(build, entries):
    logs = build / "meson-logs"
    logs.mkdir(parents=True)
    with open(logs / "testlog.json", "w") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")


def test_meson_counts_tap_subtests_and_plain_results(tmp_path):
    write_testlog(tmp_path, [
        {"name": "tap_ok", "result": "OK",
         "stdout": "1..3\nok 1 a\nok 2 b\nok 3 c # SKIP no xfs\n"},
        {"name": "tap_fail", "result": "FAIL",
         "stdout": "1..2\nok 1 a\nnot ok 2 b\n"},
        {"name": "tap_todo", "result": "OK",
         "stdout": "1..1\nnot ok 1 later # TODO\n"},
        {"name": "plain_ok", "result": "OK", "stdout": ""},
        {"name": "plain_skip", "result": "SKIP", "stdout": ""},
        {"name": "plain_timeout", "result": "TIMEOUT", "stdout": ""},
    ])
    # passed: 2 + 1 + 1; failed: 1 + 1 (timeout); skipped: 1 + 1 + 1
    assert tally("meson", tmp_path) == (4, 2, 3)


def test_meson_crashed_tap_program_counts_one_failure(tmp_path):
    # All reported subtests passed, but the program died (wrong plan).
    write_testlog(tmp_path, [
        {"name": "crash", "result": "ERROR", "stdout": "1..5\nok 1 a\n"},
    ])
    assert tally("meson", tmp_path) == (1, 1, 0)


def test_meson_without_testlog_counts_nothing(tmp_path):
    assert tally("meson", tmp_path) == (0, 0, 0)


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3"
 tests="10" time="1.0"></testsuite></testsuites>
"""


def test_junit_counts(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(JUNIT)
    assert tally("junit", xml, 1) == (4, 3, 3)


def test_junit_no_tests_collected_is_not_a_failure(tmp_path):
    assert tally("junit", tmp_path / "missing.xml", 5) == (0, 0, 0)


def test_junit_missing_report_is_a_failure(tmp_path):
    assert tally("junit", tmp_path / "missing.xml", 2) == (0, 1, 0)


def test_junit_pytest_failed_without_failed_tests(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(JUNIT.replace('errors="1" failures="2"',
                                 'errors="0" failures="0"'))
    # exit 1 with no failing test recorded still counts as a failure
    assert tally("junit", xml, 1) == (7, 1, 3)


def test_sum(tmp_path):
    t = tmp_path / "tally"
    t.write_text("unit\t10\t0\t1\npytest\t5\t2\t0\nbuild\t0\t0\t0\n")
    assert tally("sum", t) == (15, 2, 1)


def test_mask_timing():
    out = ("wrote 512/512 bytes at offset 0\n"
           "512 bytes, 1 ops; 00.00 sec (245.513 KiB/sec and 491.0258 ops/sec)\n"
           "1 KiB, 1 ops; 0:00:01.50 sec (1004.986 KiB/sec and 1.0 ops/sec)\n")
    assert conftest.mask_timing_text(out) == (
        "wrote 512/512 bytes at offset 0\n"
        "512 bytes, 1 ops; X sec (X)\n"
        "1 KiB, 1 ops; X sec (X)\n")


def test_sanitizer_report_detection():
    assert conftest.sanitizer_report("blkimg: Could not open 'x'\n") is None
    line = "==1==ERROR: AddressSanitizer: heap-buffer-overflow on address"
    assert conftest.sanitizer_report("x\n" + line + "\n") == line
    ub = "io.c:12:5: runtime error: signed integer overflow"
    assert conftest.sanitizer_report(ub.encode()) == ub
