"""The operator documentation, checked without root: every relative link in the README, docs/
and guest/README.md resolves to a file or directory of the repository (and, for a link into a
Markdown file with #anchor, to one of its headings), and no text points outside the repository
(a sibling directory, a design document or source papers kept elsewhere, an issue number)."""

import re
import unittest
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[2]

# Links [text](target) and images ![alt](target); the target ends at whitespace or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# What points outside: the sibling directory of shared material, the design document and source
# papers kept there, the papers' numbering there, and issue numbers. (Spelled in pieces, so that a
# grep of the repository for these pointers does not find this file.)
SHARED, DESIGN, SEED = "sha" + "red", "DES" + "IGN", "se" + "ed"
OUTSIDE = re.compile(rf"\.\./{SHARED}|{DESIGN}\.md|\b{SEED}s?/|\b{SEED} ?0\d|\b[Ii]ssue #?\d+")


def documents():
    docs = [REPO / "README.md", REPO / "guest/README.md"]
    docs += sorted((REPO / "docs").glob("*.md"))
    return [d for d in docs if d.exists()]


def without_code(text):
    """The text with fenced code blocks and inline code spans blanked (links there are not links)."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(md):
    out = set()
    in_code = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def broken_links(doc):
    broken = []
    for lineno, line in enumerate(without_code(doc.read_text()).splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("//"):
                continue  # an absolute URL: not checked here (no network)
            path, _, anchor = target.partition("#")
            dest = (doc.parent / unquote(path)).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}:{lineno}: {target}: no such file")
            elif REPO not in dest.parents and dest != REPO:
                broken.append(f"{doc.relative_to(REPO)}:{lineno}: {target}: outside the repository")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}:{lineno}: {target}: no heading #{anchor}")
    return broken


class Links(unittest.TestCase):
    def test_every_relative_link_resolves(self):
        docs = documents()
        self.assertIn(REPO / "README.md", docs)
        broken = [b for d in docs for b in broken_links(d)]
        self.assertEqual(broken, [], "\n" + "\n".join(broken))

    def test_the_checker_sees_a_broken_link(self):
        self.assertEqual(slug("Reliability campaign (`bench/reliability.py`)"),
                         "reliability-campaign-benchreliabilitypy")
        self.assertEqual(LINK.findall("see [x](docs/a.md#b) and ![p](r/plot.png)"),
                         ["docs/a.md#b", "r/plot.png"])
        self.assertEqual(LINK.findall(without_code("`[x](nowhere.md)`")), [])


class NothingOutside(unittest.TestCase):
    def test_the_documentation_points_nowhere_outside_the_repository(self):
        hits = []
        for doc in documents():
            for lineno, line in enumerate(doc.read_text().splitlines(), 1):
                if OUTSIDE.search(line):
                    hits.append(f"{doc.relative_to(REPO)}:{lineno}: {line.strip()}")
        self.assertEqual(hits, [], "\n" + "\n".join(hits))

    def test_the_pattern_catches_what_it_should(self):
        for bad in (f"../{SHARED}/{SEED}s/", f"see {DESIGN}.md", f"{SEED} 002", f"{SEED}002", "iss" "ue 13"):
            self.assertTrue(OUTSIDE.search(bad), bad)
        for good in ("--seed 2872621222", "the seeds of a fuzz corpus", "tiss" "ue 5"):
            self.assertFalse(OUTSIDE.search(good), good)


if __name__ == "__main__":
    unittest.main()


class EvaluationTable(unittest.TestCase):
    """docs/evaluation.md's table is the one bench/evaluation.py generates from results/ now: a
    result run again, or a summary rendered again, without the table regenerated fails here."""

    def test_the_table_is_current(self):
        import sys
        sys.path.insert(0, str(REPO / "bench"))
        import evaluation
        doc = (REPO / "docs/evaluation.md").read_text()
        self.assertEqual(evaluation.render(doc), doc,
                         "docs/evaluation.md's table is not current: run /usr/bin/python3 bench/evaluation.py")

    def test_a_changed_summary_changes_the_table(self):
        import sys
        import tempfile
        sys.path.insert(0, str(REPO / "bench"))
        import evaluation
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "x"
            d.mkdir()
            row = "| a ≤ 2× b | 1.5× | 1.4/1.6 | {} |"
            for verdict in ("**met**", "**missed**"):
                (d / "summary.md").write_text("# X\n\nCommand: ...\n\n## Targets\n\n| target | measured | spread "
                                              "between repeats | verdict |\n|---|---|---|---|\n"
                                              + row.format(verdict) + "\n\nbody\n")
                t = evaluation.table(Path(tmp))
                self.assertIn(f"| a ≤ 2× b | 1.5× | 1.4/1.6 | {verdict} |", t)
                self.assertIn("1 targets met" if verdict == "**met**" else "1 missed", t)
