"""Runs the harness and VM tests (bench/tests) as `python3 -m unittest discover -s bench/tests -v`
does, and prints each test's wall time at the end, slowest first (the CI time is spent here). A
test's time counts from the end of the one before it: the first test of a class that boots one
guest for all its tests (setUpClass) carries that boot.

    python3 bench/run_tests.py [unittest names, e.g. test_vm.EndToEnd]
"""

import sys
import time
import unittest
from pathlib import Path

TESTS = Path(__file__).resolve().parent / "tests"


class TimedResult(unittest.TextTestResult):
    times = []
    last = time.monotonic()

    def stopTest(self, test):
        super().stopTest(test)
        now = time.monotonic()
        self.times.append((now - TimedResult.last, test.id()))
        TimedResult.last = now


def main(names):
    sys.path.insert(0, str(TESTS))
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromNames(names) if names else loader.discover(str(TESTS))
    runner = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult)
    TimedResult.last = time.monotonic()
    result = runner.run(suite)
    total = sum(t for t, _ in TimedResult.times)
    print(f"\n== test times (slowest first, {total:.0f} s in all)", file=sys.stderr)
    for t, name in sorted(TimedResult.times, reverse=True):
        if t >= 1:
            print(f"{t:7.1f} s  {name}", file=sys.stderr)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
