"""benchmarks/attention_backends.py runs (smoke sizes, on the CPU) and writes what it says: every
contender timed or refused with PyTorch's reason, the bytes saved for backward, PyTorch's default
kernel; the pure functions behave."""

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention_backends as bench  # noqa: E402


def test_smoke_run_writes_every_contender(tmp_path: Path) -> None:
    out = tmp_path / "backends.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_backends.py"), "--smoke",
                           "--device", "cpu", "--out", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, f"the smoke run failed:\n{proc.stdout}\n{proc.stderr}"
    assert "forward+backward, median ms" in proc.stdout, f"no table printed:\n{proc.stdout}"
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["config"]["smoke"] is True, f"where it ran: {data['device']}"
    assert [r["length"] for r in data["rows"]] == [32, 64], "the smoke lengths"
    for row in data["rows"]:
        c = row["contenders"]
        assert {"explicit", "sdpa", "sdpa MATH", "tiled"} <= c.keys(), f"contenders {sorted(c)}"
        for name in ("explicit", "sdpa", "sdpa MATH", "tiled"):
            assert c[name]["ms"] > 0 and c[name]["max_abs_diff"] < 1e-4, f"{name}: {c[name]}"
        for name, entry in c.items():
            assert ("ms" in entry) != ("refused" in entry), f"{name} is neither timed nor refused: {entry}"
            if "refused" in entry:
                assert entry["refused"].startswith("refused: ") and len(entry["refused"]) > 12, entry
        assert c["explicit"]["saved_bytes"] > c["tiled"]["saved_bytes"] > 0, \
            "the explicit attention saves the (T, T) weights, the tiled one does not"
        kernel = row["default_kernel"]
        assert kernel and not kernel.startswith("unknown"), f"default kernel not found: {kernel}"


def test_cells_and_refusals() -> None:
    assert bench.cell({"ms": 1.234}, "ms", 1.0, ".2f") == "1.23"
    assert bench.cell({"refused": "refused: x"}, "ms", 1.0, ".2f") == "refused"
    assert bench.cell({"skipped": "out of memory"}, "ms", 1.0, ".2f") == "OOM"
    assert bench.cell({"ms": 1.0, "peak_bytes": None}, "peak_bytes", 1.0, ".1f") == "-"
    assert bench.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not bench.is_oom(RuntimeError("No viable backend"))
    q = torch.randn(1, 1, 8, 4)
    assert bench.default_kernel(q, q, q).split()[0] in bench.OPERATORS.values(), "a known backend on the CPU"
