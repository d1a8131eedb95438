"""Runs the harness and VM tests (bench/tests) as `python3 -m unittest discover -s bench/tests -v`
does, and prints each test's wall time at the end, slowest first (the CI time is spent here).

    python3 bench/run_tests.py [unittest names, e.g. test_vm.EndToEnd]
"""

import sys
import time
import unittest
from pathlib import Path

TESTS = Path(__file__).resolve().parent / "tests"


class TimedResult(unittest.TextTestResult):
    times = []

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.times.append((time.monotonic() - self._t0, test.id()))


def main(names):
    sys.path.insert(0, str(TESTS))
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromNames(names) if names else loader.discover(str(TESTS))
    runner = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult)
    result = runner.run(suite)
    total = sum(t for t, _ in TimedResult.times)
    print(f"\n== test times (slowest first, {total:.0f} s in all)", file=sys.stderr)
    for t, name in sorted(TimedResult.times, reverse=True):
        if t >= 1:
            print(f"{t:7.1f} s  {name}", file=sys.stderr)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
