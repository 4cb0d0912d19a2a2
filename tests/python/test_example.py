"""examples/python end to end (label python): a PyTorch trainer and two rollout processes.

Runs trainer.py with a small model for 3 optimizer steps and kills rollout 0 in the middle of the
second refit. Every refit must commit; after each one both rollouts' parameters must be
bit-identical to the trainer's BF16 export (digest of every bit) and their greedy generations equal
to those of a model loaded densely from the export; the killed rollout must have been restarted,
restored and rejoined (the killed refit needed a retry, the next ones commit at the first attempt).
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "trainer.py"


class Example(unittest.TestCase):
    def test_trainer_and_two_rollouts_with_a_kill(self):
        with tempfile.TemporaryDirectory(prefix="bitrefit-py-example-") as d:
            run = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "3", "--kill-at", "2", "--json", "--hidden", "64",
                                  "--dir", d], capture_output=True, text=True, timeout=170, env=dict(os.environ))
            sys.stderr.write(run.stderr)
            lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
            self.assertEqual(run.returncode, 0, run.stdout)
            steps, summary = lines[:-1], lines[-1]
            self.assertEqual([s["step"] for s in steps], [1, 2, 3])
            for s in steps:
                self.assertTrue(s["committed"] and s["bit_exact"] and s["generations_equal"], s)
                self.assertEqual(s["version"], s["step"])
                self.assertGreater(s["changed"], 0)
                self.assertLess(s["payload_bytes"], s["dense_bytes"])
            self.assertEqual(steps[1]["killed_rollout"], 0)
            self.assertGreaterEqual(steps[1]["attempts"], 2)  # the kill failed the first attempt
            self.assertEqual(steps[2]["attempts"], 1)  # ...and the restarted rollout is a member again
            self.assertEqual((summary["committed"], summary["kills"]), (3, 1))
            self.assertTrue(summary["bit_exact_all"] and summary["generations_equal_all"])
            report = json.loads((pathlib.Path(d) / "reports" / "rollout-0.json").read_text())
            self.assertEqual((report["version"], report["incarnation"]), (3, 2))


if __name__ == "__main__":
    unittest.main()
