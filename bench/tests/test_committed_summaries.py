"""The committed results' targets tables are the ones their committed data render now (unprivileged:
no guest, no measurement). Each experiment with a data.csv in results/ is rendered again from a copy
of its stored files into a temporary directory, beside the other committed results (a summary may
quote another result: startup quotes startup-misses' repeats), and its targets table must equal
the committed summary's. A result measured again without the summaries that quote it rendered again,
or a change to an experiment's judging code without its results rendered again, fails here;
`bench/experiment.py render NAME` (then bench/evaluation.py) puts it right."""

import contextlib
import io
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
import evaluation  # noqa: E402
import experiment  # noqa: E402
from experiments import common  # noqa: E402

# What a rendering may not reproduce from data.csv alone: a summary's first lines (command, dates)
# and its set-up text are not in the targets table, which is all that is compared.
KEEP = ("summary.md", "plot.png")


class CommittedSummaries(unittest.TestCase):
    def test_each_targets_table_follows_the_committed_data(self):
        names = [n for n in experiment.EXPERIMENTS if (common.RESULTS / n / "data.csv").exists()]
        self.assertTrue(names, "no committed result to check")
        for name in names:
            with self.subTest(result=name), tempfile.TemporaryDirectory(prefix="cosched-committed-") as tmp:
                src = common.RESULTS / name
                out = Path(tmp) / name
                out.mkdir()
                for f in src.iterdir():
                    if f.is_file() and f.name not in KEEP:
                        shutil.copy2(f, out / f.name)
                mod = experiment.load(name)
                # The set-up line names the accelerator by probing it; the targets never depend on it.
                with mock.patch.object(common, "accel_text", lambda: ("TCG", "not probed")), \
                        contextlib.redirect_stdout(io.StringIO()):
                    mod.main(False, out=str(out), rows=mod.stored(out))
                again = evaluation.parse_targets((out / "summary.md").read_text())
                committed = evaluation.parse_targets((src / "summary.md").read_text())
                self.assertEqual(again, committed,
                                 f"results/{name}/summary.md's targets are not what its data.csv renders now: "
                                 f"run /usr/bin/python3 bench/experiment.py render {name}, then bench/evaluation.py")


if __name__ == "__main__":
    unittest.main()
