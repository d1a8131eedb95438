"""What the repository ships beside the binary, checked without root: the Grafana dashboard
queries only metrics the daemon exports; the Kubernetes manifest is valid against the schemas
(kubernetes-validate, installed into build/venv by scripts/setup.sh)."""

import json
import re
import subprocess
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def exported_metrics():
    """Every metric name the daemon's exporter writes (declared on the status fields they come
    from, `#[metric(...)]` in crates/status/src), with a histogram's _bucket/_sum/_count series."""
    text = "\n".join(p.read_text() for p in sorted((REPO / "crates/status/src").glob("*.rs")))
    names = set(re.findall(r'name = "(cosched_[a-z_]+)"', text))
    histograms = set(re.findall(r'histogram,\s*name = "(cosched_[a-z_]+)"', text))
    return names | {f"{h}_{s}" for h in histograms for s in ("bucket", "sum", "count")}


class GrafanaDashboard(unittest.TestCase):
    def test_every_query_names_an_exported_metric(self):
        dash = json.loads((REPO / "packaging/grafana/cosched.json").read_text())
        known = exported_metrics()
        self.assertIn("cosched_hint_to_applied_seconds_bucket", known)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
        self.assertGreaterEqual(len(exprs), 10)
        for e in exprs:
            used = set(re.findall(r"cosched_[a-z_]+", e))
            self.assertTrue(used, e)
            self.assertLessEqual(used, known, f"{e}: not exported: {used - known}")
        # Panels are laid out and have unique ids (Grafana rejects duplicates).
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        self.assertTrue(all("gridPos" in p for p in dash["panels"]))


class KubernetesManifest(unittest.TestCase):
    VALIDATE = REPO / "build/venv/bin/kubernetes-validate"

    def validate(self, path):
        if not self.VALIDATE.exists():
            raise AssertionError(f"{self.VALIDATE} missing: run scripts/setup.sh")
        return subprocess.run([str(self.VALIDATE), "--strict", str(path)], capture_output=True, text=True)

    def test_the_daemonset_is_valid_and_runs_with_only_the_daemons_capabilities(self):
        manifest = REPO / "packaging/kubernetes/cosched.yaml"
        r = self.validate(manifest)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for kind in ("namespace/cosched", "configmap/cosched-host", "daemonset/cosched-host"):
            self.assertIn(f"passed for resource {kind}", r.stdout + r.stderr)
        text = manifest.read_text()
        self.assertIn("hostPID: true", text)
        self.assertIn("privileged: false", text)
        self.assertIn('drop: ["ALL"]', text)
        # The unit's bounding set and the pod's capabilities are the same list.
        unit = (REPO / "packaging/cosched-host.service").read_text()
        bounding = re.search(r"^CapabilityBoundingSet=(.*)$", unit, re.M).group(1).split()
        pod = re.search(r'add: \[([^]]*)\]', text, re.S).group(1)
        self.assertEqual(sorted(f"CAP_{c}" for c in re.findall(r'"([A-Z_]+)"', pod)), sorted(bounding))

    def test_the_validator_refuses_a_broken_manifest(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write((REPO / "packaging/kubernetes/cosched.yaml").read_text().replace("hostPID: true", "hostPid: true"))
            f.flush()
            self.assertNotEqual(self.validate(f.name).returncode, 0, "a misspelt field passes")


if __name__ == "__main__":
    unittest.main()
