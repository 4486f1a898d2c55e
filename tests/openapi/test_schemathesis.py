"""schemathesis against the live daemon, from the document each port serves.

Bounded: a few examples per operation (the document's own examples, the boundaries of every
field, then random ones), fixed seed, one worker. It fails on a status or content type the
document does not declare (no operation declares 500, so a 500 fails; 501, 503 and 507 are
declared where they can happen), on a body or stream event its schema rejects (errors:
the spec's shape), on schema-invalid data the daemon accepts, and on a request without the
key that is not refused.
"""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CHECKS = ("status_code_conformance,content_type_conformance,"
          "response_schema_conformance,negative_data_rejection,ignored_auth")
MAX_EXAMPLES = 5
SEED = 7


def run_schemathesis(port: int, key: str, cwd) -> subprocess.CompletedProcess:
    cli = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    return subprocess.run(
        [cli, "run", f"http://127.0.0.1:{port}/openapi.json",
         "--header", f"Authorization: Bearer {key}",
         "--checks", CHECKS, "--phases", "examples,coverage,fuzzing",
         "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1",
         "--request-timeout", "300", "--max-failures", "20", "--warnings", "off"],
        cwd=cwd, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "NO_COLOR": "1"})


@pytest.mark.slow
@pytest.mark.parametrize("port", ["inference", "cluster"])
def test_the_daemon_answers_as_its_document_says(live, port, tmp_path):
    done = run_schemathesis(getattr(live, f"{port}_port"), live.admin_key, tmp_path)
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-2000:]
    assert "Tested:" in done.stdout                # it did run the operations
    assert live.proc.poll() is None                # and the daemon is still there
